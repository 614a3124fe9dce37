"""The start-up scan's deploys go to Triton several at once, as many as Triton's own model-load thread
count (`triton_load_threads`), never more; ensembles one at a time (their load in Triton is bookkeeping
alone, which it does slower for requests sent together: docs/benchmarks.md "Start-up deploys"), each
only after every one of its steps loaded; and every one of them recorded as a deploy alone is (issue 26,
item 2).

Counted, not timed: the stand-in Triton (tests/unit/standin_triton.py) holds each load until as many
loads are in flight as the daemon is expected to send at once (or 5 s passed), and counts the most it
saw. A daemon that sent one load at a time would show 1. The real tritonserver cannot be held mid-load
on demand, so this is the stand-in's job; tests/test_daemon_e2e.py and tests/test_restart_scan.py run the
same scan against a real server.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from controlplane.control_plane import ControlPlane
from controlplane.daemon import Daemon
from controlplane.deploy.publish import ServingRepository
from controlplane.parts import build_parts
from controlplane.settings.config import Settings
from controlplane.snapshot import ContentStore
from controlplane.source.local import LocalSource
from controlplane.store import migrate
from controlplane.store.registry import AuditQuery, Registry
from controlplane.vocab import ModelState, Result
from tests.harness import gen_config, python_model
from tests.unit.standin_triton import StandinTriton

pytestmark = pytest.mark.unit

LOAD_THREADS = 3
STEPS = ("base", "p1", "p2", "p3", "p4")
ENSEMBLES = tuple(f"e{i}" for i in range(7))

ENSEMBLE = """name: "{name}"
platform: "ensemble"
max_batch_size: 8
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "gen" data_type: TYPE_FP32 dims: [ 1 ] }} ]
ensemble_scheduling {{ step [ {{ model_name: "base" model_version: -1 input_map {{ key: "x" value: "x" }}
  output_map {{ key: "gen" value: "gen" }} }} ] }}
"""


class CountingTriton(StandinTriton):
    """The stand-in Triton, counting the loads in flight at once: each load waits (at most 5 s) until
    `gather` loads were in flight together once, so loads sent together are seen together."""

    def __init__(self, serving: ServingRepository, gather: int) -> None:
        super().__init__(serving)
        self.gather = gather
        self.in_flight = 0
        self.most_in_flight = 0
        self.events: list[tuple[str, str]] = []  # ("start" | "end", model), in order
        self._cond = threading.Condition()

    def load(self, model: str, timeout_s: float | None = None) -> None:
        with self._cond:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            self.events.append(("start", model))
            self._cond.notify_all()
            self._cond.wait_for(lambda: self.most_in_flight >= self.gather, timeout=5.0)
            if model in ENSEMBLES:  # a moment for a second ensemble's load to arrive, if one is sent meanwhile
                self._cond.wait_for(lambda: self._ensembles_in_flight() >= 2, timeout=0.2)
        try:
            super().load(model, timeout_s)
        finally:
            with self._cond:
                self.in_flight -= 1
                self.events.append(("end", model))
                self._cond.notify_all()


    def _ensembles_in_flight(self) -> int:
        started = sum(1 for kind, model in self.events if kind == "start" and model in ENSEMBLES)
        return started - sum(1 for kind, model in self.events if kind == "end" and model in ENSEMBLES)


def _repository(repo: Path) -> None:
    for i, name in enumerate(STEPS, start=1):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(gen_config(name, i))
        (repo / name / "1" / "model.py").write_text(python_model("np.full_like(x, 1, dtype=np.float32)"))
    for name in ENSEMBLES:
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(ENSEMBLE.format(name=name))


def test_startup_deploys_go_to_triton_as_many_at_once_as_its_load_threads(tmp_path: Path) -> None:
    repo, state = tmp_path / "repo", tmp_path / "state"
    _repository(repo)
    time.sleep(0.3)  # settled: older than the settle window, so the scan records every model at once
    settings = Settings(repository=repo, state_dir=state, policy="auto", triton_load_threads=LOAD_THREADS)
    state.mkdir()
    registry = Registry(f"sqlite:///{state / 'registry.db'}")
    migrate.upgrade(registry)
    serving = ServingRepository(state / "serving", state / "published")
    triton = CountingTriton(serving, gather=LOAD_THREADS)
    source = LocalSource(repo, settle_s=0.05, watch="poll")  # listed and read, never watched here
    daemon = Daemon(settings)
    daemon.registry, daemon.source = registry, source
    daemon.plane = ControlPlane(build_parts(settings, registry, ContentStore(state / "store", fsync=False), serving,
                                triton, source=source))  # type: ignore[arg-type]
    try:
        daemon._initial_scan()
    finally:
        registry.close()
        daemon.executor.shutdown(wait=False)

    # as many at once as Triton's load threads, never more (the steps' wave: 5 loads over 3 threads)
    assert triton.most_in_flight == LOAD_THREADS
    # the ensembles one at a time: their load in Triton is bookkeeping, slower for requests sent together
    in_flight, most = 0, 0
    for kind, model in triton.events:
        if model in ENSEMBLES:
            in_flight += 1 if kind == "start" else -1
            most = max(most, in_flight)
    assert most == 1
    # every ensemble's load starts after every step's load ended
    last_step_end = max(i for i, (kind, model) in enumerate(triton.events) if kind == "end" and model in STEPS)
    first_ensemble = min(i for i, (kind, model) in enumerate(triton.events) if kind == "start" and model in ENSEMBLES)
    assert last_step_end < first_ensemble
    # each one deployed, serving and audited as a deploy of its own
    registry = Registry(f"sqlite:///{state / 'registry.db'}")
    try:
        for name in (*STEPS, *ENSEMBLES):
            deployment = registry.last_deployment(name)
            assert deployment is not None and deployment.outcome == Result.OK, (name, deployment)
            assert registry.get_model(name).state == ModelState.SERVING
            actions = [e.action for e in registry.query_audit(AuditQuery(model=name, limit=20))]
            assert "deploy" in actions, (name, actions)
    finally:
        registry.close()
