"""One direction (issue 37): a settled edit flows source → intake → plan → target → outcome, and nothing
below the control plane calls back into it.

Traced, not read: every call between controlplane/ modules while the plane handles one settled edit of
one model is recorded (`sys.setprofile`), and the test asserts who called whom. The stand-in Triton
(tests/unit/standin_triton.py) serves the load, so the walk is the daemon's own code from the plane
down; tests/test_daemon_e2e.py runs the same path against a real tritonserver.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from controlplane.control_plane import ControlPlane
from controlplane.deploy.publish import ServingRepository
from controlplane.parts import build_parts
from controlplane.settings.config import Settings
from controlplane.snapshot import ContentStore
from controlplane.source.local import LocalSource
from controlplane.store import migrate
from controlplane.store.registry import Registry
from controlplane.vocab import Result
from tests.harness import write_gen_model
from tests.unit.standin_triton import StandinTriton

pytestmark = pytest.mark.unit

PACKAGE = Path(__file__).resolve().parents[2] / "controlplane"


def _module(frame: FrameType | None) -> str | None:
    """The controlplane module a frame runs in ("controlplane/deploy/engine.py"), None outside it."""
    if frame is None:
        return None
    path = Path(frame.f_code.co_filename)
    if PACKAGE not in path.parents:
        return None
    return str(path.relative_to(PACKAGE.parent))


def _calling_module(frame: FrameType) -> str | None:
    """The nearest controlplane module up the stack from `frame` (through the standard library's frames:
    a context manager's `__enter__`, a thread pool), None when the call came from outside (the test)."""
    up = frame.f_back
    while up is not None:
        module = _module(up)
        if module is not None:
            return module
        if "tests" in Path(up.f_code.co_filename).parts:
            return None
        up = up.f_back
    return None


class CallTrace:
    """Every call from one controlplane module into another, in order (caller, callee)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def __call__(self, frame: FrameType, event: str, _arg: Any) -> None:
        if event != "call":
            return
        callee = _module(frame)
        caller = _calling_module(frame)
        if callee is not None and caller is not None and callee != caller:
            self.calls.append((caller, callee))


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[ControlPlane]:
    repo, state = tmp_path / "repo", tmp_path / "state"
    state.mkdir()
    write_gen_model(repo, "linear", 1)
    settings = Settings(repository=repo, state_dir=state, policy="auto", settle_s=0.05)
    registry = Registry(f"sqlite:///{state / 'registry.db'}")
    migrate.upgrade(registry)
    serving = ServingRepository(state / "serving", state / "published")
    source = LocalSource(repo, settle_s=0.05, watch="poll")  # listed and read, never watched here
    built = ControlPlane(build_parts(settings, registry, ContentStore(state / "store", fsync=False), serving,
                         StandinTriton(serving), source=source))  # type: ignore[arg-type]
    try:
        yield built
    finally:
        registry.close()


def test_a_settled_edit_flows_down_and_never_calls_back_into_the_plane(plane: ControlPlane) -> None:
    time.sleep(0.2)  # older than the settle window
    trace = CallTrace()
    sys.setprofile(trace)
    try:
        outcome = plane.handle_settled("linear")
    finally:
        sys.setprofile(None)

    assert outcome is not None and outcome.outcome == Result.OK, outcome
    entered = [callee for _caller, callee in trace.calls]
    # the walk of docs/architecture.md "One direction", in its order: intake, change sets, record, decide,
    # then the target, the deploy engine, its bring-up and the outcome's subscribers
    order = ["controlplane/intake/flow.py", "controlplane/intake/changeset.py", "controlplane/intake/recording.py",
             "controlplane/intake/decision.py", "controlplane/target/targets.py", "controlplane/deploy/engine.py",
             "controlplane/deploy/steps.py", "controlplane/outcomes/bus.py", "controlplane/outcomes/bookkeeping.py"]
    firsts = [entered.index(module) for module in order]
    assert firsts == sorted(firsts), list(zip(order, firsts, strict=True))
    # nothing below the plane calls back into it; the intake is entered from the plane alone
    back_up = [(caller, callee) for caller, callee in trace.calls
               if callee in ("controlplane/control_plane.py", "controlplane/daemon.py")]
    assert back_up == []
    into_intake = {caller for caller, callee in trace.calls if callee == "controlplane/intake/flow.py"}
    assert into_intake == {"controlplane/control_plane.py"}, into_intake
    # the intake plans and deploys nothing: it never reaches the deploy engine or Triton
    intake_side = {"controlplane/intake/flow.py", "controlplane/intake/changeset.py",
                   "controlplane/intake/recording.py"}
    assert not [c for c in trace.calls if c[0] in intake_side and c[1].startswith("controlplane/deploy/engine")]
    assert plane.registry.find_model("linear").active_digest == outcome.active_digest  # type: ignore[union-attr]
