"""The operator's view is the truth (issue 13), against the real daemon and its launched tritonserver.

One daemon, one model per test. What these prove: `status` says whether what serves is the source's
newest content (`sync`, `source_digest`, `sync_reason`) and the daemon converges as soon as nothing
holds a model (unpin, policy auto); a rollback holds until the source changes; pins hold for rollback;
`load --digest` of collected content is refused before any deploy; an environment fault (a backend
this tritonserver lacks) ends `failed`, is never quarantined and is retried with backoff; a
quarantined digest that comes back to the source is audited once and shown `invalid`; a model whose
source is on hold (or settling, or being captured) is `pending`, never `synced`.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator

import pytest
import tritonclient.grpc as grpcclient

from tests.harness import (
    TRITONCTL,
    DaemonProcess,
    answers,
    copy_example,
    example_daemon,
    triton_client,
    wait_for,
    write_gen_model,
)

EXIT_USAGE = 2


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with example_daemon(tmp_path_factory.mktemp("operator-view"), bare=True) as proc:
        yield proc


@pytest.fixture(scope="module")
def client(daemon: DaemonProcess) -> Iterator[grpcclient.InferenceServerClient]:
    with triton_client(daemon) as c:
        yield c


def serving(daemon: DaemonProcess, client: grpcclient.InferenceServerClient, name: str, gen: int) -> None:
    wait_for(lambda: answers(client, name, gen), 60, 0.1, f"{name} serving generation {gen}")


def row_when(daemon: DaemonProcess, name: str, predicate: object, what: str) -> dict[str, object]:
    return dict(wait_for(lambda: (r := daemon.model_status(name)) and predicate(r) and r,  # type: ignore[operator]
                         60, 0.2, what))


def test_pin_holds_unpin_converges_and_rollback_holds(
    daemon: DaemonProcess, client: grpcclient.InferenceServerClient
) -> None:
    write_gen_model(daemon.repository, "held", 1)
    serving(daemon, client, "held", 1)
    row = row_when(daemon, "held", lambda r: r["sync"] == "synced", "synced")
    assert row["source_digest"] == row["digest"]
    gen1 = str(row["digest"])

    assert daemon.run("pin", "held").exit_code == 0
    write_gen_model(daemon.repository, "held", 2)
    # recorded, then decided: `pending` while the watcher's path still handles it (CI read it there once)
    row = row_when(daemon, "held", lambda r: r["source_digest"] != gen1 and r["sync"] != "pending",
                   "gen 2 recorded and decided")
    assert row["sync"] == "held" and "pinned" in str(row["sync_reason"]), row
    assert row["digest"] == gen1 and answers(client, "held", 1)
    refused = daemon.run("rollback", "held")
    assert refused.exit_code == EXIT_USAGE and "pinned" in refused.output, refused.output

    assert daemon.run("unpin", "held").exit_code == 0  # nothing holds it now: the daemon converges
    serving(daemon, client, "held", 2)
    row = row_when(daemon, "held", lambda r: r["sync"] == "synced", "synced after unpin")
    gen2 = str(row["digest"])

    assert daemon.run("rollback", "held").exit_code == 0
    row = row_when(daemon, "held", lambda r: r["digest"] == gen1, "rolled back")
    assert row["sync"] == "held" and "rolled back by" in str(row["sync_reason"]), row
    assert row["source_digest"] == gen2
    # gc keeps only what serves: gen 2's content goes; loading it by digest is refused before any deploy.
    assert daemon.run("gc", "--keep", "0").exit_code == 0
    collected = daemon.run("load", "held", "--digest", gen2[:12])
    assert collected.exit_code == EXIT_USAGE and "collected by gc at" in collected.output, collected.output
    assert not [v for v in daemon.json("versions", "held") if v["quarantined"]]
    assert answers(client, "held", 1)

    write_gen_model(daemon.repository, "held", 3)  # the source changes again: the hold ends
    serving(daemon, client, "held", 3)


def test_sync_is_pending_while_the_source_is_on_hold_then_synced(
    daemon: DaemonProcess, client: grpcclient.InferenceServerClient
) -> None:
    write_gen_model(daemon.repository, "slow", 1)
    serving(daemon, client, "slow", 1)
    row_when(daemon, "slow", lambda r: r["sync"] == "synced", "synced")
    hold = daemon.repository / "slow" / ".tritonctl-hold"
    hold.write_text("")
    write_gen_model(daemon.repository, "slow", 2)  # written under the hold: nothing may deploy it yet
    row_when(daemon, "slow", lambda r: "on hold" in str(r["sync_reason"]), "the capture put off")
    # The settle window is 0.2 s: for ten windows every look says pending (settling or capturing,
    # never "synced", though gen 1's digest is still what the registry records as the source's newest).
    deadline = time.monotonic() + 2.0
    reasons = set()
    while time.monotonic() < deadline:
        row = daemon.model_status("slow")
        assert row["sync"] == "pending", row
        reasons.add(str(row["sync_reason"]).split(" (")[0])
        time.sleep(0.05)
    assert all(r.startswith("settling: ") or r == "capturing" for r in reasons), reasons
    assert "settling: on hold" in reasons, reasons
    assert answers(client, "slow", 1)
    hold.unlink()
    serving(daemon, client, "slow", 2)
    row = row_when(daemon, "slow", lambda r: r["sync"] == "synced", "synced after the hold")
    assert row["source_digest"] == row["digest"]


def test_policy_auto_converges(daemon: DaemonProcess, client: grpcclient.InferenceServerClient) -> None:
    write_gen_model(daemon.repository, "manual", 1)
    serving(daemon, client, "manual", 1)
    assert daemon.run("policy", "manual", "manual").exit_code == 0
    write_gen_model(daemon.repository, "manual", 2)
    row = row_when(daemon, "manual", lambda r: r["source_digest"] != r["digest"], "gen 2 recorded")
    assert row["sync"] == "held" and "policy manual" in str(row["sync_reason"])
    assert daemon.run("policy", "manual", "inherit").exit_code == 0
    serving(daemon, client, "manual", 2)


def test_quarantined_digest_back_in_the_source_is_audited_once(
    daemon: DaemonProcess, client: grpcclient.InferenceServerClient
) -> None:
    write_gen_model(daemon.repository, "flaky", 1)
    serving(daemon, client, "flaky", 1)
    write_gen_model(daemon.repository, "flaky", 2, init="raise RuntimeError('boom')")
    wait_for(lambda: daemon.audit("--model", "flaky", "--outcome", "rolled_back"), 60, 0.2, "rolled back")
    write_gen_model(daemon.repository, "flaky", 3)
    serving(daemon, client, "flaky", 3)
    write_gen_model(daemon.repository, "flaky", 2, init="raise RuntimeError('boom')")  # the same content again
    skipped = wait_for(lambda: daemon.audit("--model", "flaky", "--action", "skip"), 60, 0.2, "skip event")
    assert len(skipped) == 1 and skipped[0]["message"].startswith("skipped: quarantined since "), skipped
    assert "boom" in skipped[0]["message"]
    row = row_when(daemon, "flaky", lambda r: r["sync"] == "invalid", "invalid")
    assert "quarantined" in str(row["sync_reason"]) and answers(client, "flaky", 3)


def test_missing_backend_is_not_quarantined_and_is_retried(daemon: DaemonProcess) -> None:
    model = daemon.repository / "torchy"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.pt").write_bytes(b"not a model")
    (model / "config.pbtxt").write_text(
        'name: "torchy"\nbackend: "pytorch"\nmax_batch_size: 0\n'
        'input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
    )
    row = row_when(daemon, "torchy", lambda r: r["next_retry_s"] is not None or r["sync"] == "invalid",
                   "failed deploy")
    assert row["sync"] == "pending", row
    assert "next retry in" in str(row["sync_reason"]) and "backend" in str(row["sync_reason"])
    assert not [v for v in daemon.json("versions", "torchy") if v["quarantined"]]
    failed = [e for e in daemon.audit("--model", "torchy") if e["action"] == "deploy"]
    assert failed and failed[0]["outcome"] == "failed"
    # `load --failed` retries it (and it fails again, for the same reason: exit 1, still not quarantined).
    result = daemon.run("load", "--failed")
    assert result.exit_code == 1 and "torchy" in result.output, result.output
    assert not [v for v in daemon.json("versions", "torchy") if v["quarantined"]]



ENSEMBLE = ("sentiment_tokenizer", "sentiment_classifier", "sentiment_pipeline")


def test_ensemble_members_load_first_and_unload_with_dependents(
    daemon: DaemonProcess, client: grpcclient.InferenceServerClient
) -> None:
    for name in ENSEMBLE:
        copy_example(name, daemon.repository)
    for name in ENSEMBLE:
        row_when(daemon, name, lambda r: r["state"] == "serving", f"{name} serving")
    # If the ensemble settled before its members served, Triton refused it ("contains models that are not
    # available"): an environment fault, retried, never quarantined.
    assert not [v for v in daemon.json("versions", "sentiment_pipeline") if v["quarantined"]]
    refused = daemon.run("unload", "sentiment_tokenizer")
    assert refused.exit_code == EXIT_USAGE and "member of serving ensemble(s) sentiment_pipeline" in refused.output
    assert client.is_model_ready("sentiment_tokenizer")

    result = daemon.run("unload", "sentiment_pipeline", "--dependents")
    assert result.exit_code == 0, result.output
    printed = [line.split()[2] for line in result.output.splitlines() if line.split()[:2] == ["ok", "unload"]]
    assert sorted(printed) == sorted(ENSEMBLE), result.output
    for name in ENSEMBLE:
        assert not client.is_model_ready(name), name
        assert daemon.model_status(name)["state"] == "unloaded"
        assert daemon.audit("--model", name, "--action", "unload")[0]["outcome"] == "ok"

    loaded = daemon.run("load", "sentiment_pipeline")
    assert loaded.exit_code == 0, loaded.output
    for name in ENSEMBLE:
        assert client.is_model_ready(name), name
        assert daemon.model_status(name)["state"] == "serving"
    members_first = [line for line in loaded.output.splitlines() if line.split()[:2] == ["ok", "commit"]]
    assert [line.split()[2] for line in members_first][-1] == "sentiment_pipeline", loaded.output


def test_status_watch_off_a_terminal_prints_every_interval(daemon: DaemonProcess) -> None:
    for args, count in ((["--json"], lambda out: len(out.splitlines())), ([], lambda out: out.count("MODEL"))):
        proc = subprocess.Popen([TRITONCTL, "status", "--watch", "--interval", "0.5", "--state-dir",
                                 str(daemon.state_dir), *args], stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout is not None
            out = ""
            while count(out) < 2:
                line = proc.stdout.readline()
                assert line, "status --watch stopped printing"
                out += line
        finally:
            proc.terminate()
            proc.wait(10)
        if args:
            documents = [json.loads(line) for line in out.splitlines()]  # one JSON document per line
            assert all("models" in d and "triton_grpc_url" in d for d in documents)


def test_the_daemon_refuses_what_validate_refuses_with_source_paths(daemon: DaemonProcess) -> None:
    staging = daemon.repository.parent / "staging"
    model = write_gen_model(staging, "typo", 1)
    (model / "1" / "model.py").write_text("import numpy\nx = = 1\n")
    model.rename(daemon.repository / "typo")  # published whole, as a rename
    event = wait_for(lambda: daemon.audit("--model", "typo", "--action", "snapshot"), 60, 0.2, "snapshot")[0]
    assert event["outcome"] == "invalid" and "typo/1/model.py:2: invalid syntax" in event["message"], event
    assert not daemon.audit("--model", "typo", "--action", "deploy")
    row = daemon.model_status("typo")
    assert row["sync"] == "invalid" and "typo/1/model.py:2" in str(row["sync_reason"])
