"""/v1/ready, /v1/models/{model}/ready and /v1/live against a real daemon and its launched tritonserver.

Ready means converged: through an edit (503 naming the model while the new content settles and deploys,
200 once it serves), a rollback (held: ready), a pin (an edit of a pinned model, once recorded, is held:
ready without deploying it), a killed tritonserver (503 until the daemon restarted it and restored the
model). Live answers while the main loop turns.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import DaemonProcess, api_get, wait_for, write_gen_model


class ReadyRecorder:
    """Polls /v1/ready every 20 ms in a thread and keeps every answer that differs from the one before."""

    def __init__(self, daemon: DaemonProcess) -> None:
        self.daemon = daemon
        self.seen: list[tuple[int, dict[str, Any]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                answer = api_get(self.daemon, "/v1/ready")
            except OSError:
                answer = (0, {})
            if not self.seen or self.seen[-1] != answer:
                self.seen.append(answer)
            self._stop.wait(0.02)

    def __enter__(self) -> ReadyRecorder:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def not_ready(self) -> list[dict[str, Any]]:
        return [doc for status, doc in self.seen if status == 503]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    base = tmp_path_factory.mktemp("ready")
    repo = base / "repo"
    repo.mkdir()
    write_gen_model(repo, "gen", 1)
    proc = DaemonProcess(repo, base / "state", settle_s=0.5,
                         env={"TRITONCTL_RECONCILE_INTERVAL_S": "60"}).start()
    wait_for(lambda: api_get(proc, "/v1/ready")[0] == 200, 60, 0.2, "ready")
    yield proc
    assert proc.stop() == 0, proc.log_tail()


def _serves(daemon: DaemonProcess, digest_prefix: str = "") -> bool:
    row = daemon.model_status("gen")
    return row.get("state") == "serving" and str(row.get("digest", "")).startswith(digest_prefix)


def test_live_answers_while_the_loop_turns(daemon: DaemonProcess) -> None:
    status, document = api_get(daemon, "/v1/live")
    assert status == 200 and document["live"] is True  # live while starting too (loop_age_s None then)
    # /v1/ready can answer 200 a moment before start-up hands over to the main loop (the initial scan's
    # last models served): the loop then turns within a tick
    document = wait_for(lambda: (d := api_get(daemon, "/v1/live")[1])["loop_age_s"] is not None and d, 10, 0.1,
                        "the main loop turning")
    assert document["live"] is True and document["loop_age_s"] < 2


def test_an_edit_is_not_ready_until_it_serves(daemon: DaemonProcess) -> None:
    with ReadyRecorder(daemon) as recorder:
        write_gen_model(daemon.repository, "gen", 2)
        wait_for(lambda: recorder.not_ready() and recorder.seen[-1][0] == 200, 60, 0.1, "not ready, then ready")
    waiting = recorder.not_ready()[0]["not_ready"]
    assert [w["model"] for w in waiting] == ["gen"] and waiting[0]["sync"] == "pending", waiting
    assert waiting[0]["reason"]
    assert daemon.model_status("gen")["sync"] == "synced"
    assert api_get(daemon, "/v1/models/gen/ready")[0] == 200


def test_a_rollback_and_a_pin_are_held_and_ready(daemon: DaemonProcess) -> None:
    daemon.cli("rollback", "gen")
    status, document = api_get(daemon, "/v1/models/gen/ready")
    assert status == 200, document
    assert daemon.model_status("gen")["sync"] == "held"
    assert api_get(daemon, "/v1/ready")[0] == 200
    daemon.cli("load", "gen")  # back to the source's newest
    daemon.cli("pin", "gen")
    with ReadyRecorder(daemon) as recorder:
        write_gen_model(daemon.repository, "gen", 3)
        wait_for(lambda: daemon.audit("--model", "gen", "--action", "snapshot", "--limit", "1")
                 and daemon.model_status("gen").get("source_digest") != daemon.model_status("gen").get("digest"),
                 60, 0.1, "the pinned model's edit recorded")
        wait_for(lambda: recorder.seen[-1][0] == 200, 30, 0.1, "ready with the edit recorded")
        time.sleep(1.0)
    # While the edit settles and is captured the model is pending (as `status` says); once recorded it is
    # held by the pin and the daemon is ready without deploying it.
    assert recorder.seen[-1][0] == 200, recorder.seen
    assert daemon.model_status("gen")["sync"] == "held"
    assert all(w["model"] == "gen" for d in recorder.not_ready() for w in d["not_ready"])
    daemon.cli("unpin", "gen")
    wait_for(lambda: api_get(daemon, "/v1/ready")[0] == 200 and daemon.model_status("gen")["sync"] == "synced",
             60, 0.2, "unpinned and converged")


def test_a_killed_tritonserver_is_not_ready_until_restored(daemon: DaemonProcess) -> None:
    pid = daemon.triton_pid()
    assert pid is not None
    with ReadyRecorder(daemon) as recorder:
        os.killpg(pid, signal.SIGKILL)
        wait_for(lambda: recorder.not_ready(), 30, 0.05, "not ready")
        wait_for(lambda: recorder.seen[-1][0] == 200 and daemon.triton_pid() not in (None, pid), 90, 0.2,
                 "ready again")
    assert any(not d["triton_reachable"] or d["not_ready"] for d in recorder.not_ready())
    assert _serves(daemon)
    status, document = api_get(daemon, "/v1/models/nothing/ready")
    assert status == 404 and document["error"]["class"] == "NotFoundError"


def test_ready_text_for_a_probe(daemon: DaemonProcess, tmp_path: Path) -> None:
    import shutil
    import subprocess

    curl = shutil.which("curl")
    if curl is None:
        pytest.skip("curl is not installed")
    # the README's ExecStartPost wait: curl --fail exits 0 only on 200
    done = subprocess.run([curl, "-sf", "--unix-socket", str(daemon.state_dir / "tritonctl.sock"),
                           "http://x/v1/ready"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and json.loads(done.stdout)["ready"] is True
