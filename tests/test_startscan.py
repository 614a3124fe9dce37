"""The start-up scan's decisions (controlplane/startup/scan.py) against a real SQLite registry: which
models a start captures (new, changed, signature not trusted, back in the source), which one auto
policy owes a deploy without a capture, and which cost nothing; the stat signature itself
(controlplane/source/poller.py): the same in another process, changed by an edit, not trusted within the racy
window."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from controlplane.intake import recording as intake
from controlplane.source.poller import RACY_RECORD_NS, DirectorySource, recordable_signature, stable_signature
from controlplane.source.recorded import SourceGraph
from controlplane.startup.scan import plan_start
from controlplane.store import schema
from controlplane.store.records import SnapshotContent
from controlplane.store.registry import Registry

ENSEMBLE = {"platform": "ensemble", "ensemble_scheduling": {"step": [{"model_name": "base"}]}}


def record(registry: Registry, model: str, digest: str, signature: str | None, *, trusted: bool = True,
           config: dict | None = None, valid: bool = True) -> None:
    content = SnapshotContent("{}", config, [1], [1], valid, [], 0)
    intake.record(registry, model, digest, content, "test",
                    intake.source_entry(model, digest, content, signature, trusted))


def plan(registry: Registry, names: list[str], signatures: dict[str, str], policy: str = "auto"):  # noqa: ANN201
    return plan_start(names, signatures, SourceGraph(registry).entries(), registry, lambda m: m.policy or policy)


def test_unchanged_models_cost_nothing_and_changed_ones_are_captured(registry: Registry) -> None:
    for name, digest in (("base", "a" * 64), ("m1", "b" * 64), ("m2", "c" * 64), ("racy", "d" * 64)):
        record(registry, name, digest, f"sig-{name}", trusted=name != "racy")
        registry.update_model(name, state="serving")
    registry.update_model("base", state="serving")
    for name, digest in (("base", "a" * 64), ("m1", "b" * 64), ("m2", "c" * 64), ("racy", "d" * 64)):
        with registry.session() as session:  # what a deploy leaves: the model serves its recorded content
            row = session.query(schema.Model).filter_by(name=name).one()
            row.active_digest = digest
    signatures = {"base": "sig-base", "m1": "sig-m1", "m2": "edited", "racy": "sig-racy", "new": "sig-new"}
    result = plan(registry, ["base", "m1", "m2", "racy", "new"], signatures)
    assert result.unchanged == ["base", "m1"]
    assert sorted(result.changed) == ["m2", "new", "racy"]  # edited, never seen, recorded racily
    assert result.redeploy == []


def test_auto_policy_owes_a_deploy_the_gate_allows(registry: Registry) -> None:
    record(registry, "owed", "a" * 64, "s1")  # recorded, never deployed
    record(registry, "bad", "b" * 64, "s2", valid=False)  # invalid: the gate refuses it
    record(registry, "manual", "c" * 64, "s3")
    registry.update_model("manual", policy="manual")
    record(registry, "unloaded", "d" * 64, "s4")
    registry.update_model("unloaded", state="unloaded")
    names = ["owed", "bad", "manual", "unloaded"]
    result = plan(registry, names, {"owed": "s1", "bad": "s2", "manual": "s3", "unloaded": "s4"})
    assert result.redeploy == ["owed"] and result.changed == []
    assert sorted(result.unchanged) == ["bad", "manual", "unloaded"]
    assert plan(registry, names, {"owed": "s1", "bad": "s2", "manual": "s3", "unloaded": "s4"},
                policy="manual").redeploy == []


def test_a_model_back_in_the_source_is_captured(registry: Registry) -> None:
    record(registry, "m", "a" * 64, "s")
    registry.update_model("m", removed_at=registry.clock())
    assert plan(registry, ["m"], {"m": "s"}).changed == ["m"]


def test_the_graph_follows_every_record(registry: Registry) -> None:
    graph = SourceGraph(registry)
    record(registry, "e", "a" * 64, "s", config=ENSEMBLE)
    assert graph.steps("e") == ["base"] and graph.ensembles_over("base") == {"e"}
    entry = intake.source_entry("e", "b" * 64, SnapshotContent("{}", {"backend": "python"}, [1], [1], True, [], 0),
                                  "s2")
    graph.recorded(entry)  # the ensemble became a python model
    assert graph.steps("e") is None and graph.ensembles_over("base") == set()
    assert SourceGraph(registry).steps("e") == ["base"]  # the registry holds what was recorded there


def test_stat_signature_is_stable_across_processes_and_sees_an_edit(tmp_path: Path) -> None:
    model = tmp_path / "m"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text('name: "m"\n')
    here = stable_signature(DirectorySource(tmp_path).signature("m"))
    signature, trusted = recordable_signature(tmp_path, "m")
    assert signature == here and not trusted  # just written: within the racy window
    code = ("import sys; from controlplane.source.poller import DirectorySource, stable_signature; "
            f"print(stable_signature(DirectorySource({str(tmp_path)!r}).signature('m')))")
    there = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": "12345"}).stdout.strip()
    assert here == there  # Python's str hash is salted per process; the recorded signature is not
    time.sleep(RACY_RECORD_NS / 1e9 + 0.1)
    assert recordable_signature(tmp_path, "m") == (here, True)
    (model / "config.pbtxt").write_text('name: "m"\nmax_batch_size: 1\n')
    assert stable_signature(DirectorySource(tmp_path).signature("m")) != here
