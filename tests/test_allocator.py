"""The daemon caps glibc's malloc arenas before its threads start (controlplane/runtime/allocator.py; what it saves
of a first start's peak RSS, side by side: bench/arena_ab.py, docs/benchmarks.md "Memory at 10,000 models");
an operator's own MALLOC_ARENA_MAX stands instead. A real daemon is read from outside: its arenas, counted in
/proc/PID/maps."""

from __future__ import annotations

import platform
import threading
import time
from pathlib import Path

import pytest

from controlplane.api.client import ControlClient
from controlplane.runtime.allocator import ARENAS, cap_arenas, secondary_arenas
from tests.harness import DaemonProcess, copy_example, wait_for


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_arenas_are_capped_on_glibc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    assert cap_arenas() is True


def test_the_environments_malloc_arena_max_stands(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_ARENA_MAX", "8")
    assert cap_arenas() is False


@pytest.mark.triton
@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's arenas")
def test_a_real_daemon_runs_with_its_arenas_capped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 57: replacing `cap_arenas()` in cli/daemon_cmd.py with `pass` left the tests above green (they call
    the function inside pytest). Here a real `tritonctl daemon` process, its threads driven by eight clients
    at once for a few seconds, is read from outside: at most ARENAS arenas (the main one and one heap). Without
    the cap the same load makes one per thread that contends, up to 8 per core (measured here: 15 heaps)."""
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    repo = tmp_path / "repo"
    repo.mkdir()
    copy_example("linear", repo)
    daemon = DaemonProcess(repo, tmp_path / "state").start()
    try:
        wait_for(lambda: daemon.model_status("linear").get("state") == "serving", 90, 0.3, "linear serving")
        assert daemon.proc is not None

        def clients() -> None:
            client = ControlClient(socket=daemon.state_dir / "tritonctl.sock")
            deadline = time.monotonic() + 4.0
            while time.monotonic() < deadline:
                client.status()
                client.call("GET", "/openapi.json")

        workers = [threading.Thread(target=clients) for _ in range(8)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(60)
        assert secondary_arenas(daemon.proc.pid) <= ARENAS - 1, Path(f"/proc/{daemon.proc.pid}/maps").read_text()
    finally:
        assert daemon.stop() == 0, daemon.log_tail()
