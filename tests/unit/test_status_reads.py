"""`status` reads a model's last deployment only where its sync can depend on it (issue 26, item 3).

Counted, not timed: at 5,000 models reading every model's last deployment was a third of a `status`
call in the daemon, yet `sync_state` looks at it only for a model that does not serve its source's
newest content. Here every model of a small repository is deployed through the stand-in Triton
(tests/unit/standin_triton.py; tests/test_operator_view.py shows the same reasons on the real server),
then one is unloaded by an operator: `status` asks for no deployment while all are synced, then for
that one model's alone, and still says who unloaded it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from controlplane.control_plane import ControlPlane
from controlplane.daemon import Daemon
from controlplane.deploy.publish import ServingRepository
from controlplane.parts import build_parts
from controlplane.settings.config import Settings
from controlplane.snapshot import ContentStore
from controlplane.source.local import LocalSource
from controlplane.store import migrate
from controlplane.store.records import DeploymentRecord
from controlplane.store.registry import Registry
from tests.harness import gen_config, python_model
from tests.unit.standin_triton import StandinTriton

pytestmark = pytest.mark.unit

MODELS = ("alpha", "beta", "gamma", "delta")


class CountingRegistry(Registry):
    """The registry, recording which models each `last_deployments` call asked for (None: all)."""

    asked: list[list[str] | None]

    def last_deployments(self, models: Sequence[str] | None = None) -> dict[str, DeploymentRecord]:
        self.asked.append(None if models is None else sorted(models))
        return super().last_deployments(models)


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[tuple[ControlPlane, CountingRegistry]]:
    repo, state = tmp_path / "repo", tmp_path / "state"
    for i, name in enumerate(MODELS, start=1):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(gen_config(name, i))
        (repo / name / "1" / "model.py").write_text(python_model("np.full_like(x, 1, dtype=np.float32)"))
    time.sleep(0.3)  # settled: older than the settle window, so the scan records every model at once
    settings = Settings(repository=repo, state_dir=state, policy="auto")
    state.mkdir()
    registry = CountingRegistry(f"sqlite:///{state / 'registry.db'}")
    registry.asked = []
    migrate.upgrade(registry)
    serving = ServingRepository(state / "serving", state / "published")
    source = LocalSource(repo, settle_s=0.05, watch="poll")  # listed and read, never watched here
    daemon = Daemon(settings)
    daemon.registry, daemon.source = registry, source
    daemon.plane = ControlPlane(build_parts(settings, registry, ContentStore(state / "store", fsync=False), serving,
                                StandinTriton(serving), source=source))  # type: ignore[arg-type]
    try:
        daemon._initial_scan()
        yield daemon.plane, registry
    finally:
        registry.close()
        daemon.executor.shutdown(wait=False)


def _rows(plane: ControlPlane, models: list[str] | None = None) -> dict[str, dict[str, Any]]:
    return {row["model"]: row for row in plane.status(models).to_json()["models"]}


def test_status_of_synced_models_reads_no_deployment(plane: tuple[ControlPlane, CountingRegistry]) -> None:
    control, registry = plane
    registry.asked.clear()
    rows = _rows(control)
    assert {name: row["sync"] for name, row in rows.items()} == {name: "synced" for name in MODELS}
    assert registry.asked == []  # the old status read all four models' last deployments here


def test_a_model_out_of_sync_has_its_own_deployment_read(plane: tuple[ControlPlane, CountingRegistry]) -> None:
    control, registry = plane
    outcome = control.unload("gamma", "oncall")
    assert outcome.outcome == "ok", outcome.message
    registry.asked.clear()
    rows = _rows(control)
    assert rows["gamma"]["sync"] == "held"
    assert str(rows["gamma"]["sync_reason"]).startswith("unloaded by oncall;"), rows["gamma"]
    assert [rows[name]["sync"] for name in ("alpha", "beta", "delta")] == ["synced"] * 3
    assert registry.asked == [["gamma"]]
    registry.asked.clear()
    assert _rows(control, ["gamma"])["gamma"]["sync_reason"].startswith("unloaded by oncall;")
    assert registry.asked == [["gamma"]]
