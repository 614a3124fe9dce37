"""Footprints and the memory budget against the real daemon and its tritonserver.

Models that allocate 60 MB in initialize: their measured footprint shows in `versions` and `status -o
wide`; a budget that holds two of them makes room for a third by evicting the least recently used
model that is not protected (tag `stable`); when only pinned and protected models hold the memory the
deploy ends `failed` with an environment cause naming the budget.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.harness import DaemonProcess, gen_config, python_model, triton_client, wait_for

ALLOC = "self.hold = np.ones(60 * 1024 * 1024 // 8)"


def write_big(repo: Path, name: str, gen: int) -> None:
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    (repo / name / "config.pbtxt").write_text(gen_config(name, gen))
    (repo / name / "1" / "model.py").write_text(
        python_model("np.full_like(x, GEN, dtype=np.float32)", init=ALLOC, prelude=f"\nGEN = {gen}\n"))


def serving(daemon: DaemonProcess, name: str) -> bool:
    return daemon.model_status(name).get("state") == "serving"


@pytest.mark.triton
def test_footprints_and_the_budget_evict_the_least_recently_used(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("a", "b"):
        write_big(repo, name, 1)
    daemon = DaemonProcess(repo, tmp_path / "state", extra_args=["--memory-budget-mb", "230"]).start()
    try:
        wait_for(lambda: serving(daemon, "a") and serving(daemon, "b"), 90, 0.3, "a and b serving")
        # measured at load: the stub's resident memory holds the 60 MB array
        footprint = daemon.json("versions", "a")[0]["footprint"]
        assert footprint["source"] == "measured" and 60 <= footprint["memory_mb"] <= 180, footprint
        assert daemon.model_status("b")["footprint"]["memory_mb"] >= 60
        wide = daemon.run("status", "-o", "wide")
        assert " MB" in wide.output and "MEMORY" in wide.output, wide.output
        daemon.run("tag", "b", "stable")  # protected: never evicted
        with triton_client(daemon) as client:  # a was used last: still, b is protected, so a goes
            from tests.harness import infer_gen
            infer_gen(client, "a")
        time.sleep(0.2)
        write_big(repo, "c", 1)
        wait_for(lambda: serving(daemon, "c"), 90, 0.3, "c serving")
        assert daemon.model_status("a")["state"] == "unloaded"
        assert serving(daemon, "b")
        evictions = daemon.audit("--action", "evict")
        assert [e["model"] for e in evictions] == ["a"] and evictions[0]["outcome"] == "ok", evictions
        # only a pinned and a protected model hold the memory: no room, failed, the budget named
        assert daemon.run("pin", "c").exit_code == 0
        write_big(repo, "d", 1)

        def refused() -> str:
            failed = [e for e in daemon.audit("--model", "d") if e["outcome"] == "failed"]
            return failed[0]["message"] if failed else ""

        message = wait_for(refused, 60, 0.3, "d refused")
        assert "memory_budget_mb = 230 MB" in message and "b " in message and "c " in message, message
        assert "unloaded" != daemon.model_status("b")["state"]
    finally:
        assert daemon.stop() == 0, daemon.log_tail()
