"""Supervision is separate from the reconcile interval: with reconcile every 60 s, a killed launched
tritonserver is restarted and its models answer again within seconds (README Guarantees: 5 s on an
idle machine; the default-suite bound is looser because CI machines are shared), and a restarted
external one is noticed within 2 s and its models restored (docs/operations.md: where the time goes)."""

from __future__ import annotations

import os
import signal
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient

from tests.harness import DaemonProcess, infer_gen, wait_for, write_gen_model


def _killed_and_back(tmp_path: Path) -> float:
    repo = tmp_path / "repo"
    repo.mkdir()
    write_gen_model(repo, "phoenix", 7)
    daemon = DaemonProcess(repo, tmp_path / "state", env={"TRITONCTL_RECONCILE_INTERVAL_S": "60"}).start()
    try:
        wait_for(lambda: daemon.model_status("phoenix").get("state") == "serving", 60, 0.2, "serving")
        url = daemon.triton_url()
        pid = daemon.triton_pid()
        assert pid is not None
        os.killpg(pid, signal.SIGKILL)
        killed_at = time.monotonic()

        def back() -> bool:
            try:
                client = grpcclient.InferenceServerClient(url)
                return infer_gen(client, "phoenix") == 7.0 and daemon.triton_pid() not in (None, pid)
            except Exception:  # noqa: BLE001 - not yet
                return False

        wait_for(back, 60, 0.1, "phoenix answering again")
        elapsed = time.monotonic() - killed_at
        assert daemon.triton_url() == url, "the restarted server keeps its ports"
        return elapsed
    finally:
        assert daemon.stop() == 0


def test_killed_tritonserver_answers_again_without_waiting_for_reconcile(tmp_path: Path) -> None:
    elapsed = _killed_and_back(tmp_path)
    assert elapsed < 20, f"{elapsed:.1f} s (the reconcile interval is 60 s: supervision did not act)"


@pytest.mark.slow
def test_killed_tritonserver_answers_again_within_5_s(tmp_path: Path) -> None:
    elapsed = _killed_and_back(tmp_path)
    assert elapsed < 5, f"{elapsed:.1f} s"


def _external_restart(tmp_path: Path) -> tuple[float, float, float]:
    """An external tritonserver serving `phoenix` for the daemon (reconcile every 60 s) is restarted on
    its ports, then, once restored, has `phoenix` unloaded behind the daemon's back (what a restart too
    quick for a supervision round to see it down leaves: a live server serving nothing). Returns the
    seconds from the restart first answering live to the restore beginning (the audit's time less its duration),
    from live to phoenix answering, and from the unload to the second restore beginning."""
    from controlplane.triton.launcher import TritonServer

    state = tmp_path / "state"
    (state / "serving").mkdir(parents=True)
    server = TritonServer(model_repository=state / "serving", workdir=tmp_path / "triton").start()
    repo = tmp_path / "repo"
    repo.mkdir()
    write_gen_model(repo, "phoenix", 3)
    daemon = DaemonProcess(repo, state, launch=False, extra_args=["--triton-url", server.grpc_url],
                           env={"TRITONCTL_RECONCILE_INTERVAL_S": "60"}).start()
    try:
        wait_for(lambda: daemon.model_status("phoenix").get("state") == "serving", 60, 0.2, "serving")
        server.stop()
        client = grpcclient.InferenceServerClient(server.grpc_url)
        live: list[float] = []
        watcher = threading.Thread(target=_first_live, args=(server.grpc_url, live))
        watcher.start()
        server.start()  # same ports, nothing loaded (explicit mode)
        watcher.join()
        live_at = live[0]  # the first moment it answered live, polled every 20 ms
        wait_for(lambda: _answers(client), 60, 0.02, "phoenix restored on the restarted server")
        answering_s = time.time() - live_at
        noticed_s = _restore_began(daemon, 1) - live_at
        assert "answers again (restarted?); reconciling now" in daemon.log_tail(), daemon.log_tail()

        client.unload_model("phoenix")
        unloaded_at = time.time()
        wait_for(lambda: _answers(client), 60, 0.1, "phoenix restored after the unload")
        assert "no longer serves phoenix (restarted?)" in daemon.log_tail(), daemon.log_tail()
        behind_back_s = _restore_began(daemon, 2) - unloaded_at
        print(f"restart noticed {noticed_s:.2f} s after live, phoenix answering {answering_s:.2f} s after live; "
              f"an unload behind its back noticed after {behind_back_s:.2f} s")
        return noticed_s, answering_s, behind_back_s
    finally:
        daemon.stop()
        server.stop()


def _first_live(url: str, live: list[float]) -> None:
    """Poll every 20 ms, each time on a fresh channel (a channel that failed waits out gRPC's
    reconnect backoff, which would report the server live late)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        client = grpcclient.InferenceServerClient(url)
        try:
            if client.is_server_live(client_timeout=1.0):
                live.append(time.time())
                return
        except Exception:  # noqa: BLE001 - not up yet
            pass
        finally:
            client.close()
        time.sleep(0.02)


def _restore_began(daemon: DaemonProcess, count: int) -> float:
    restores = wait_for(lambda: len(r := daemon.audit("--model", "phoenix", "--action", "restore")) >= count
                        and r, 10, 0.1, f"{count} restore(s) audited")
    newest = restores[0]
    assert newest["outcome"] == "ok", newest
    return datetime.fromisoformat(newest["time"]).timestamp() - newest["duration_ms"] / 1000


def test_restarted_external_tritonserver_is_noticed_and_reconciled(tmp_path: Path) -> None:
    """Issue 13: noticed within 2 s (the `-m slow` bound below; this default-suite bound is looser, CI
    machines are shared); the models answer again after Triton's own load of them."""
    noticed_s, answering_s, behind_back_s = _external_restart(tmp_path)
    assert noticed_s < 5 and behind_back_s < 5, (noticed_s, behind_back_s)
    assert answering_s < 20, f"{answering_s:.1f} s (the reconcile interval is 60 s: supervision did not act)"


@pytest.mark.slow
def test_restarted_external_tritonserver_is_noticed_within_2_s(tmp_path: Path) -> None:
    noticed_s, answering_s, behind_back_s = _external_restart(tmp_path)
    assert noticed_s < 2 and behind_back_s < 2, (noticed_s, behind_back_s)
    assert answering_s < 5, f"{answering_s:.1f} s"


def _answers(client: grpcclient.InferenceServerClient) -> bool:
    try:
        return infer_gen(client, "phoenix") == 3.0
    except Exception:  # noqa: BLE001 - not yet
        return False
