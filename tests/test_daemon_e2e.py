"""End to end: the real daemon (subprocess) with its launched tritonserver, driven through the source
repository and the installed `tritonctl` CLI. Each test uses its own model so they share one daemon.

What these prove (the daemon issue's "done when"): an edit is served within settle + load time; a
model whose initialize raises is rolled back while the old version answers throughout, with Triton's
error in the audit log and the same content never retried; an invalid config never reaches Triton;
a smoke mismatch rolls back; 0 failed requests over 20 swaps and 5 rollbacks under a request loop.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient

from tests.harness import DaemonProcess, answers, example_daemon, infer_gen, request_loop, wait_for, write_gen_model


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with example_daemon(tmp_path_factory.mktemp("e2e")) as proc:
        yield proc


@pytest.fixture(scope="module")
def client(daemon: DaemonProcess) -> Iterator[grpcclient.InferenceServerClient]:
    c = grpcclient.InferenceServerClient(daemon.triton_url())
    yield c
    c.close()


def serving_gen(daemon: DaemonProcess, client: grpcclient.InferenceServerClient, name: str, gen: int,
                timeout_s: float = 30.0) -> None:
    wait_for(lambda: answers(client, name, gen), timeout_s, 0.05, f"{name} serving generation {gen}")
    # Triton answers once the load is verified; the registry commits after the smoke run: wait for that too.
    wait_for(lambda: daemon.model_status(name).get("sync") == "synced", timeout_s, 0.1, f"{name} synced")


def test_examples_linear_served_at_start(daemon: DaemonProcess) -> None:
    row = wait_for(lambda: (r := daemon.model_status("linear")).get("state") == "serving" and r, 30, what="linear")
    assert row["state"] == "serving"
    assert row["versions"] == [{"version": "1", "state": "READY", "reason": ""}]
    assert row["policy"] == "auto" and row["drift"] is None


def test_edit_is_served_and_recorded(daemon: DaemonProcess, client: grpcclient.InferenceServerClient) -> None:
    write_gen_model(daemon.repository, "edited", 1)
    serving_gen(daemon, client, "edited", 1)
    started = time.monotonic()
    write_gen_model(daemon.repository, "edited", 2)
    serving_gen(daemon, client, "edited", 2)
    assert time.monotonic() - started < 15, "an edit must be served within settle + load time"
    versions = daemon.json("versions", "edited")
    assert len(versions) == 2 and versions[0]["active"] and not versions[1]["active"]
    deploys = daemon.audit("--model", "edited", "--action", "deploy")
    assert [d["outcome"] for d in deploys] == ["ok", "ok"]
    assert deploys[0]["actor"] == "watcher"
    status = daemon.model_status("edited")
    assert status["digest"] == versions[0]["digest"]


def test_failed_initialize_rolls_back_and_is_not_retried(
    daemon: DaemonProcess, client: grpcclient.InferenceServerClient
) -> None:
    write_gen_model(daemon.repository, "broken", 1)
    serving_gen(daemon, client, "broken", 1)
    good = daemon.model_status("broken")["digest"]
    with request_loop(daemon.triton_url(), "broken") as stats:
        write_gen_model(daemon.repository, "broken", 2, init="raise RuntimeError('weights missing')")
        events = wait_for(lambda: daemon.audit("--model", "broken", "--outcome", "rolled_back"), 30,
                          what="rolled_back audit event")
        time.sleep(0.5)
    assert stats["failed"] == 0, stats["errors"]
    assert stats["gens"].get(2.0) is None and stats["ok"] > 0
    assert "weights missing" in events[0]["message"]
    assert daemon.model_status("broken")["digest"] == good
    assert infer_gen(client, "broken") == 1.0
    bad = [v for v in daemon.json("versions", "broken") if v["quarantined"]]
    assert len(bad) == 1 and "weights missing" in bad[0]["quarantine_reason"]
    # The identical content seen again is not retried.
    model_py = daemon.repository / "broken" / "1" / "model.py"
    model_py.write_text(model_py.read_text())
    time.sleep(1.5)
    assert len(daemon.audit("--model", "broken", "--action", "deploy")) == 2
    # `tritonctl load --force` retries it on purpose (and it fails again, exit 1).
    forced = daemon.cli("load", "broken", "--force", check=False)
    assert forced.returncode == 1
    assert "weights missing" in forced.stdout + forced.stderr
    # A fix with new content deploys normally.
    write_gen_model(daemon.repository, "broken", 3)
    serving_gen(daemon, client, "broken", 3)


def test_invalid_config_never_reaches_triton(daemon: DaemonProcess, client: grpcclient.InferenceServerClient) -> None:
    write_gen_model(daemon.repository, "badcfg", 1)
    serving_gen(daemon, client, "badcfg", 1)
    loads_before = len(daemon.audit("--model", "badcfg", "--action", "deploy"))
    config = daemon.repository / "badcfg" / "config.pbtxt"
    config.write_text(config.read_text().replace("max_batch_size: 8", "max_batch_size: -3"))
    invalid = wait_for(lambda: daemon.audit("--model", "badcfg", "--outcome", "invalid"), 15, what="invalid snapshot")
    assert "max_batch_size" in invalid[0]["message"]
    time.sleep(0.5)
    assert len(daemon.audit("--model", "badcfg", "--action", "deploy")) == loads_before
    assert infer_gen(client, "badcfg") == 1.0
    result = daemon.cli("load", "badcfg", check=False)
    assert result.returncode == 1 and "max_batch_size" in result.stdout + result.stderr


def test_smoke_mismatch_rolls_back(daemon: DaemonProcess, client: grpcclient.InferenceServerClient) -> None:
    write_gen_model(daemon.repository, "smoky", 1, smoke_gen=1)
    serving_gen(daemon, client, "smoky", 1)
    # generation 2 code, but the smoke file still expects 1: a behaviour change nobody approved
    (daemon.repository / "smoky" / "1" / "model.py").write_text(
        (daemon.repository / "smoky" / "1" / "model.py").read_text().replace("GEN = 1", "GEN = 2")
    )
    events = wait_for(lambda: daemon.audit("--model", "smoky", "--outcome", "rolled_back"), 30, what="rollback")
    assert "smoke" in events[0]["message"]
    assert infer_gen(client, "smoky") == 1.0


def test_zero_failed_requests_over_20_swaps_and_5_rollbacks(
    daemon: DaemonProcess, client: grpcclient.InferenceServerClient
) -> None:
    write_gen_model(daemon.repository, "swappy", 0)
    serving_gen(daemon, client, "swappy", 0)
    gen = 0
    with request_loop(daemon.triton_url(), "swappy", threads=2) as stats:
        for i in range(25):
            if i % 5 == 4:  # a failing version: rolled back, generation unchanged
                write_gen_model(daemon.repository, "swappy", 1000 + i, init="raise RuntimeError('bad')")
                wait_for(lambda n=i: len(daemon.audit("--model", "swappy", "--outcome", "rolled_back")) >= (n + 1) // 5,
                         30, what="rollback")
            else:
                gen += 1
                write_gen_model(daemon.repository, "swappy", gen)
                serving_gen(daemon, client, "swappy", gen)
    assert stats["failed"] == 0, stats["errors"]
    assert stats["ok"] > 100
    assert not any(g >= 1000 for g in stats["gens"]), "a failing version must never answer"
    outcomes = [e["outcome"] for e in daemon.audit("--model", "swappy", "--action", "deploy", "--limit", "100")]
    assert outcomes.count("ok") == 21 and outcomes.count("rolled_back") == 5


def test_cli_load_digest_rollback_and_at(daemon: DaemonProcess, client: grpcclient.InferenceServerClient) -> None:
    daemon.cli("policy", "manual_model", "manual", check=False)  # unknown yet: creates the record
    daemon.cli("policy", "manual_model", "manual")
    write_gen_model(daemon.repository, "manual_model", 1)
    wait_for(lambda: daemon.audit("--model", "manual_model", "--action", "snapshot"), 15, what="snapshot")
    assert daemon.model_status("manual_model")["state"] == "new"  # manual: recorded, not deployed
    loaded = daemon.cli("load", "manual_model")
    assert "ok" in loaded.stdout
    assert infer_gen(client, "manual_model") == 1.0
    first = daemon.model_status("manual_model")["digest"]
    moment = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 1))
    time.sleep(1.5)
    write_gen_model(daemon.repository, "manual_model", 2)
    wait_for(lambda: len(daemon.json("versions", "manual_model")) == 2, 15, what="second snapshot")
    second = daemon.json("versions", "manual_model")[0]["digest"]
    out = daemon.json("load", "manual_model", "--digest", second[:10])
    assert out["outcome"] == "ok" and infer_gen(client, "manual_model") == 2.0
    back = daemon.json("rollback", "manual_model")
    assert back["outcome"] == "ok" and back["digest"] == first
    assert infer_gen(client, "manual_model") == 1.0
    at = daemon.json("audit", "--at", moment, "--model", "manual_model")
    assert [m["digest"] for m in at["models"]] == [first]
    diff = daemon.json("diff", "manual_model", first[:8], second[:8])
    assert [c["path"] for c in diff["changed"]] == ["1/model.py", "config.pbtxt"]
    unloaded = daemon.json("unload", "manual_model")
    assert unloaded["outcome"] == "ok"
    assert not client.is_model_ready("manual_model")
    assert daemon.cli("rollback", "nope_model", check=False).returncode == 2  # unknown model: usage
    assert daemon.cli("load", "../etc", check=False).returncode == 2


def test_pin_holds_a_model(daemon: DaemonProcess, client: grpcclient.InferenceServerClient) -> None:
    write_gen_model(daemon.repository, "pinned", 1)
    serving_gen(daemon, client, "pinned", 1)
    daemon.cli("pin", "pinned")
    write_gen_model(daemon.repository, "pinned", 2)
    wait_for(lambda: len(daemon.json("versions", "pinned")) == 2, 15, what="recorded while pinned")
    time.sleep(0.5)
    assert infer_gen(client, "pinned") == 1.0
    assert daemon.cli("load", "pinned", check=False).returncode == 2
    daemon.cli("unpin", "pinned")
    daemon.cli("load", "pinned")
    assert infer_gen(client, "pinned") == 2.0


def test_source_removal_is_recorded_and_keeps_serving(
    daemon: DaemonProcess, client: grpcclient.InferenceServerClient, tmp_path: Path
) -> None:
    write_gen_model(daemon.repository, "gone", 1)
    serving_gen(daemon, client, "gone", 1)
    import shutil

    shutil.rmtree(daemon.repository / "gone")
    wait_for(lambda: daemon.audit("--model", "gone", "--action", "remove"), 15, what="remove event")
    assert infer_gen(client, "gone") == 1.0
    assert daemon.model_status("gone")["removed"] is True
