"""A restart with nothing changed costs what changed: nothing. Counted, not timed: the daemon's own
Prometheus counters (tritonctl_source_captures_total, ..._validations_total, ..._records_total,
tritonctl_startup_models_total) say that the second start captured, validated and recorded no model and
found every one unchanged by its stat signature; the audit says it deployed nothing. Then one edit made
while the daemon was stopped is the only model the next start captures (issue 26)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.harness import DaemonProcess, copy_example, wait_for
from tests.test_metrics import free_port, scrape, value

MODELS = ("linear", "sentiment_tokenizer", "sentiment_classifier", "sentiment_pipeline")


def counts(port: int) -> dict[str, float]:
    samples = scrape(port)
    return {
        "captures": value(samples, "tritonctl_source_captures_total"),
        "validations": value(samples, "tritonctl_source_validations_total"),
        "records": value(samples, "tritonctl_source_records_total"),
        "unchanged": value(samples, "tritonctl_startup_models_total", result="unchanged"),
        "changed": value(samples, "tritonctl_startup_models_total", result="changed"),
        "deploys": sum(value(samples, "tritonctl_deploys_total", outcome=o) for o in ("ok", "failed", "rolled_back")),
    }


def rescanned(daemon: DaemonProcess, starts: int) -> None:
    """Wait for the evidence that the `starts`-th start's inotify watches are in place and the rescan
    after them ran (both run behind READY; the log holds every start's lines), then one settle window
    more, for a change that rescan found to be captured: counters read after this count what it did."""
    wait_for(lambda: daemon.log_tail(1 << 24).count("inotify watches in place") >= starts, 60, 0.2,
             f"start {starts}: the inotify watches in place and the rescan after them done")
    time.sleep(daemon.settle_s + 1.0)


def serving(daemon: DaemonProcess) -> set[str]:
    return {m["model"] for m in daemon.status()["models"] if m["state"] == "serving"}


@pytest.mark.triton
def test_restart_with_nothing_changed_captures_nothing(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in MODELS:
        copy_example(name, repo)
    time.sleep(1.2)  # older than the racy window: the first start can vouch for every signature
    port = free_port()
    args = ["--metrics-port", str(port), "--keep-triton"]
    # --keep-triton: each stop leaves the tritonserver serving and the next start adopts it (the third
    # start, without the flag, stops it); whatever fails on the way, none outlives the test
    try:
        daemon = DaemonProcess(repo, tmp_path / "state", extra_args=args).start()
        try:
            wait_for(lambda: serving(daemon) == set(MODELS), 120, 0.5, "every model serving")
            rescanned(daemon, 1)
            first = counts(port)
            assert first["changed"] == len(MODELS) and first["unchanged"] == 0
            assert first["captures"] >= len(MODELS)
        finally:
            assert daemon.stop() == 0, daemon.log_tail()

        daemon = DaemonProcess(repo, tmp_path / "state", extra_args=args).start()  # adopts the tritonserver
        try:
            assert "adopted the running tritonserver" in daemon.log_tail(100_000), daemon.log_tail()
            rescanned(daemon, 2)
            assert "found changes without an event" not in daemon.log_tail(1 << 24), daemon.log_tail()
            again = counts(port)
            assert again == {"captures": 0, "validations": 0, "records": 0, "unchanged": len(MODELS), "changed": 0,
                             "deploys": 0}, daemon.log_tail()
            assert serving(daemon) == set(MODELS)
            # since the last stop: the start's own `daemon_start` entry is written after its start-up scan
            since_stop = daemon.audit("--action", "daemon_stop")[0]["time"]
            work = [e for e in daemon.audit("--since", since_stop)
                    if e["action"] in ("snapshot", "deploy", "restore", "changeset")]
            assert work == [], work
        finally:
            assert daemon.stop() == 0, daemon.log_tail()

        # one model edited while no daemon ran: the next start captures it alone
        config = repo / "linear" / "config.pbtxt"
        config.write_text(config.read_text() + "\n# edited while stopped\n")
        time.sleep(1.2)
        daemon = DaemonProcess(repo, tmp_path / "state", extra_args=["--metrics-port", str(port)]).start()
        try:
            third = counts(port)
            assert third["changed"] == 1 and third["unchanged"] == len(MODELS) - 1, daemon.log_tail()
            # the edit may still be inside its settle window at start-up (a loaded machine): its capture is then
            # refused as still changing and taken again; wait for the daemon's own record of it
            wait_for(lambda: counts(port)["records"] >= 1, 60, 0.2, "the edited model recorded")
            rescanned(daemon, 3)  # and the rescan behind READY captured nothing more
            since_stop = daemon.audit("--action", "daemon_stop")[0]["time"]
            snapshots = [e["model"] for e in daemon.audit("--since", since_stop) if e["action"] == "snapshot"]
            assert snapshots == ["linear"], snapshots  # captured and recorded alone
            assert counts(port)["records"] == 1
        finally:
            assert daemon.stop() == 0, daemon.log_tail()
    finally:
        DaemonProcess(repo, tmp_path / "state").kill_tritonserver()
