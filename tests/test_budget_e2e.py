"""The host-memory budget against the real daemon and its tritonserver: eviction order and the refusal.

Python models that allocate 60 MB in initialize (measured footprint about 100 MB each: the array and
the stub) under a budget of 350 MB, which holds three of them and not four. The three loaded first are
used (an inference each) in the order: loaded last, loaded first, loaded second; a fourth model then
evicts the one loaded last and a fifth the one loaded first: least recently used first, not the order
they were loaded in. Once every model that holds memory is pinned or protected (tag `stable`), the
next deploy ends `failed`, its message naming the budget and the holders. The budget's rules alone
(every kind of model never evicted, the GPU budget): tests/unit/test_budget.py.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from tests.harness import DaemonProcess, gen_config, infer_gen, python_model, triton_client, wait_for

ALLOC = "self.hold = np.ones(60 * 1024 * 1024 // 8)"


def write_big(repo: Path, name: str) -> None:
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    (repo / name / "config.pbtxt").write_text(gen_config(name, 1))
    (repo / name / "1" / "model.py").write_text(
        python_model("np.full_like(x, GEN, dtype=np.float32)", init=ALLOC, prelude="\nGEN = 1\n"))


def states(daemon: DaemonProcess) -> dict[str, str]:
    return {m["model"]: m["state"] for m in daemon.status()["models"]}


@pytest.mark.triton
def test_the_budget_evicts_least_recently_used_first_then_refuses_naming_the_holders(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("a", "b", "c"):
        write_big(repo, name)
    daemon = DaemonProcess(repo, tmp_path / "state", extra_args=["--memory-budget-mb", "350"]).start()
    try:
        wait_for(lambda: all(states(daemon).get(m) == "serving" for m in "abc"), 90, 0.3, "a, b and c serving")
        footprints = {m: daemon.model_status(m)["footprint"] for m in "abc"}
        assert all(f["source"] == "measured" and 60 <= f["memory_mb"] <= 116 for f in footprints.values()), footprints
        # loaded in some order (first, second, last); used in the order last, first, second: the least
        # recently used is the one loaded last, then the one loaded first; load order would say otherwise
        first, second, last = [e["model"] for e in reversed(daemon.audit("--action", "deploy"))]
        with triton_client(daemon) as client:
            for name in (last, first, second):
                assert infer_gen(client, name) == 1
                time.sleep(0.1)

        def evicted() -> list[str]:
            return [e["model"] for e in reversed(daemon.audit("--action", "evict")) if e["outcome"] == "ok"]

        for new, victims in (("d", [last]), ("e", [last, first])):
            write_big(repo, new)
            wait_for(lambda new=new: states(daemon).get(new) == "serving", 90, 0.3, f"{new} serving")  # type: ignore[misc]
            assert evicted() == victims, (first, second, last, daemon.audit("--action", "evict"))
        assert states(daemon) == {second: "serving", first: "unloaded", last: "unloaded", "d": "serving",
                                  "e": "serving"}

        # every model that holds memory pinned or protected: no room, the deploy fails naming the budget
        assert daemon.run("tag", second, "stable").exit_code == 0
        assert daemon.run("pin", "d").exit_code == 0 and daemon.run("pin", "e").exit_code == 0
        write_big(repo, "f")

        def refused() -> str:
            failed = [e for e in daemon.audit("--model", "f") if e["outcome"] == "failed"]
            return failed[0]["message"] if failed else ""

        message = wait_for(refused, 60, 0.3, "f refused")
        assert "memory_budget_mb = 350 MB" in message and "cannot be evicted" in message, message
        listed = message.rsplit("(pinned, protected, leased or busy): ", 1)[-1]
        assert sorted(re.findall(r"(\w+) [\d.,]+ MB", listed)) == sorted([second, "d", "e"]), message
        assert evicted() == [last, first]  # nothing more was evicted for it
        assert states(daemon)[second] == "serving"
    finally:
        assert daemon.stop() == 0, daemon.log_tail()
