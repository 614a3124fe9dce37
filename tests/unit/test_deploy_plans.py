"""The deploy engine's plans (controlplane/deploy/plans.py via `Deployer.run`) against the stand-in Triton:
a model deployed inside a change set is recorded exactly as it is deployed alone; a set's staged loads
take the host's capability check and load wrapper like any load, and the memory budget's admission like
a deploy; crash recovery resumes an interrupted set; and no module outside the engine and triton/ drives
Triton. The real-server tests (tests/test_changesets.py, tests/test_crash.py) cover the same paths end to
end."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from controlplane.deploy import steps as deploy_steps
from controlplane.deploy.engine import Deployer, Outcome
from controlplane.deploy.plans import Admissions, Member, Plan, private_name
from controlplane.deploy.publish import ServingRepository
from controlplane.deploy.steps import BringUp, Step, TritonSteps
from controlplane.errors import BudgetError, HostCapabilityError
from controlplane.snapshot import ContentStore
from controlplane.store import migrate
from controlplane.store.registry import AuditQuery, Registry
from controlplane.validation.modelconfig import validate_model_dir
from controlplane.vocab import Cause, Result
from tests.harness import gen_config, python_model
from tests.unit.standin_triton import StandinTriton

ROOT = Path(__file__).resolve().parents[2]

PIPE = """name: "pipe"
platform: "ensemble"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "gen" data_type: TYPE_FP32 dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "a" model_version: -1 input_map { key: "x" value: "x" } output_map { key: "gen" value: "TENSOR" } },
  { model_name: "b" model_version: -1 input_map { key: "x" value: "TENSOR" } output_map { key: "gen" value: "gen" } }
] }
"""


class Host:
    """A stand-in for triton/host.TritonHost: records the capability checks and wrapped loads."""

    def __init__(self) -> None:
        self.checked: list[str] = []
        self.loaded: list[str] = []
        self.refuse: str | None = None  # a model name whose check fails

    def check(self, config: dict[str, Any] | None, tree: Path) -> None:
        name = str((config or {}).get("name"))
        self.checked.append(name)
        if name == self.refuse:
            raise HostCapabilityError(f"model '{name}' needs backend 'onnxruntime', which this server lacks")

    def load(self, model: str, load: Callable[[], None]) -> None:
        self.loaded.append(model)
        load()


class Bench:
    def __init__(self, tmp: Path) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        self.repo = tmp / "repo"
        self.registry = Registry(f"sqlite:///{tmp / 'registry.db'}")
        migrate.upgrade(self.registry)
        self.store = ContentStore(tmp / "store", fsync=False)
        self.serving = ServingRepository(tmp / "serving", tmp / "published")
        self.triton = StandinTriton(self.serving)
        self.host = Host()
        self.outcomes: list[Outcome] = []
        self.deployer = Deployer(self.registry, self.store, self.serving, self.triton, load_timeout_s=5.0,
                                 on_outcome=self.outcomes.append, host=self.host)  # type: ignore[arg-type]

    def record(self, model: str, config: str, gen: int = 0) -> str:
        d = self.repo / model
        (d / "1").mkdir(parents=True, exist_ok=True)
        (d / "config.pbtxt").write_text(config)
        if gen:
            (d / "1" / "model.py").write_text(python_model("np.full_like(x, GEN, dtype=np.float32)",
                                                           prelude=f"\nGEN = {gen}\n"))
        snap = self.store.capture(d, model)
        result = validate_model_dir(self.store.tree_path(snap.digest), name=model)
        assert result.ok, result.problems
        record, _ = self.registry.record_snapshot(
            model, snap.digest, snap.manifest_json(), config=result.config, versions=result.versions,
            served_versions=result.served_versions, valid=True, problems=[], total_bytes=snap.total_bytes)
        return record.digest

    def serving_pipeline(self) -> dict[str, str]:
        """a, b and pipe serving their first content; the second content of a and pipe recorded."""
        first = {"a": self.record("a", gen_config("a", 1), 1), "b": self.record("b", gen_config("b", 1), 1),
                 "pipe": self.record("pipe", PIPE)}
        for model in ("a", "b", "pipe"):
            assert self.deployer.deploy(model, first[model], "alice").outcome == Result.OK
        return {"a": self.record("a", gen_config("a", 2), 2),
                "pipe": self.record("pipe", PIPE.replace("TENSOR", "RENAMED"))}

    def plan(self, digests: dict[str, str]) -> Plan:
        members = []
        for model, digest in digests.items():
            current = self.registry.get_model(model)
            members.append(Member(model, digest, current.active_digest, model == "pipe",
                                  ["a", "b"] if model == "pipe" else []))
        return Plan.of(members)

    def rows(self, model: str) -> list[tuple[Any, ...]]:
        """What the registry records of `model`'s deployments and audit events, timing aside."""
        d = self.registry.last_deployment(model)
        assert d is not None
        deployments = [(d.kind, d.digest, d.previous_digest, d.step, d.outcome, d.error, d.actor)]
        record = self.registry.get_model(model)
        deployments.append((record.active_digest, record.state))
        deployments += [(e.digest,) for e in self.registry.serving_history(model, limit=10)]
        events = [(e.action, e.outcome, e.digest, e.actor)
                  for e in self.registry.query_audit(AuditQuery(model=model, limit=100))]
        return [*deployments, *events]


@pytest.fixture
def benches(tmp_path: Path) -> Iterator[tuple[Bench, Bench]]:
    one, two = Bench(tmp_path / "one"), Bench(tmp_path / "two")
    yield one, two
    one.registry.close()
    two.registry.close()


def test_a_model_deployed_inside_a_change_set_is_recorded_as_deployed_alone(benches: tuple[Bench, Bench]) -> None:
    alone, together = benches
    new = alone.serving_pipeline()
    assert together.serving_pipeline() == new  # the same content, the same digests
    for model in ("a", "pipe"):  # one by one
        assert alone.deployer.deploy(model, new[model], "alice").outcome == Result.OK
    outcome = together.deployer.run(together.plan(new), "alice")
    assert outcome.outcome == Result.OK and "old pipeline answering" in outcome.message, outcome.message
    staged = private_name("a", new["a"])
    assert ("load", staged) in {(c, m) for c, m, _ in together.triton.calls}  # it was staged, not in order
    assert staged not in together.triton.models and staged not in together.serving.models()  # and cleaned up
    for model in ("a", "pipe"):
        assert together.rows(model) == alone.rows(model), model
        assert together.triton.served_digest(model) == new[model]
    [event] = together.registry.query_audit(AuditQuery(action="changeset", limit=5))
    assert event.outcome == "deployed"


def test_a_set_of_one_is_the_model_s_own_deploy(benches: tuple[Bench, Bench]) -> None:
    bench, _ = benches
    new = bench.serving_pipeline()
    outcome = bench.deployer.run(bench.plan({"a": new["a"]}), "alice")
    assert (outcome.action, outcome.outcome, outcome.digest) == ("deploy", Result.OK, new["a"])


def test_staged_loads_take_the_host_check_and_load_wrapper(benches: tuple[Bench, Bench]) -> None:
    bench, _ = benches
    new = bench.serving_pipeline()
    bench.host.checked.clear()
    bench.host.loaded.clear()
    staged = private_name("a", new["a"])
    assert bench.deployer.run(bench.plan(new), "alice").outcome == Result.OK
    assert staged in bench.host.loaded and bench.host.loaded.count("pipe") >= 2  # interim, then switched back
    assert "a" in bench.host.checked and "pipe" in bench.host.checked

    # A host that cannot place the new step: refused at the staged load, the old pipeline untouched.
    other = bench.record("a", gen_config("a", 3) + 'parameters { key: "x" value { string_value: "y" } }\n', 3)
    third = bench.record("pipe", PIPE.replace("TENSOR", "THIRD"))
    bench.host.refuse = "a"
    before = {m: bench.triton.served_digest(m) for m in ("a", "b", "pipe")}
    outcome = bench.deployer.run(bench.plan({"a": other, "pipe": third}), "alice")
    assert outcome.outcome == Result.ROLLED_BACK and "lacks" in outcome.message, outcome.message
    assert private_name("a", other) not in bench.host.loaded  # refused before anything was published
    assert {m: bench.triton.served_digest(m) for m in ("a", "b", "pipe")} == before
    assert not bench.registry.get_snapshot("a", other).quarantined  # the host's fault, not the content's


class Guard:
    """A stand-in for the memory budget (controlplane/memory/budget.py's MemoryGuard, whose accounting of a staged
    copy is tested over a real registry in tests/unit/test_budget.py): it writes what it admits and settles
    into the host's list of loads, so the order of admissions, loads and settlements is one list."""

    def __init__(self, bench: Bench, refuse: str | None = None) -> None:
        self.log, self.triton, self.refuse = bench.host.loaded, bench.triton, refuse

    def admit(self, model: str, digest: str, config: object, previous: str | None, name: str | None = None) -> str:
        loads = name or model
        if loads == self.refuse:
            raise BudgetError(f"{loads} needs 600 MB but memory_budget_mb = 1000 MB and 900 MB is held")
        self.log.append(f"admit {loads}" + (" beside the serving one" if previous is None else ""))
        return loads

    def settle(self, ticket: str, loaded: bool) -> None:
        self.log.append(f"settle {ticket} {loaded}" + (" while loaded" if ticket in self.triton.models else ""))


def test_every_load_of_a_change_set_is_admitted_by_the_memory_budget(benches: tuple[Bench, Bench]) -> None:
    """The staged copy of a step is admitted beside the serving step (previous None: counted in full) before
    its load and settled while still loaded (measured) just before it is dropped; the ensemble's switch is
    admitted before its interim load and settled after its switch back; the public step deploys as alone.
    With no room for the staged copy, nothing is published, the old pipeline keeps serving, the content is
    not quarantined and the step's deployment ends failed, not the content's fault (retried)."""
    bench, _ = benches
    new = bench.serving_pipeline()
    bench.host.loaded.clear()
    bench.deployer.guard = Guard(bench)
    staged = private_name("a", new["a"])
    assert bench.deployer.run(bench.plan(new), "alice").outcome == Result.OK
    assert bench.host.loaded == [
        f"admit {staged} beside the serving one", staged,  # the staged copy
        "admit pipe", "pipe",  # the interim switch to the staged copy
        "admit a", "a", "settle a True while loaded",  # the public step, deployed as alone
        "pipe", "settle pipe True while loaded",  # the switch back
        f"settle {staged} True while loaded",  # measured, then dropped
    ]
    assert staged not in bench.triton.models

    other = bench.record("a", gen_config("a", 3), 3)
    third = bench.record("pipe", PIPE.replace("TENSOR", "THIRD"))
    bench.deployer.guard = Guard(bench, refuse=private_name("a", other))
    before = {m: bench.triton.served_digest(m) for m in ("a", "b", "pipe")}
    bench.host.loaded.clear()
    outcome = bench.deployer.run(bench.plan({"a": other, "pipe": third}), "alice")
    assert outcome.outcome == Result.ROLLED_BACK and "memory_budget_mb = 1000 MB" in outcome.message, outcome.message
    assert bench.host.loaded == []  # nothing was admitted, nothing loaded
    assert private_name("a", other) not in bench.serving.models()
    assert {m: bench.triton.served_digest(m) for m in ("a", "b", "pipe")} == before
    assert not bench.registry.get_snapshot("a", other).quarantined  # the budget's fault, not the content's
    [failed] = [o for o in bench.outcomes if o.model == "a" and o.digest == other]
    assert (failed.outcome, failed.cause) == (Result.FAILED, Cause.ENVIRONMENT)  # retried when room appears


def test_recovery_rolls_an_interrupted_set_forward(benches: tuple[Bench, Bench]) -> None:
    """A daemon killed after the switch to the private step names: the restarted daemon's one recovery
    deploys the public step and points the ensemble back (rolled forward), then the sweep removes the
    private name."""
    bench, _ = benches
    new = bench.serving_pipeline()
    plan = bench.plan(new)
    runner = bench.deployer._plans  # noqa: SLF001 - drive the plan to the moment of the crash
    step, pipe = plan.members
    staged = private_name("a", step.digest)
    runner._load_private(step, staged, lambda p: None, Admissions(bench.deployer.guard))  # noqa: SLF001
    op = runner.operation(pipe, "alice", None)
    deployment = op.begin()
    runner._switch(pipe, {"a": staged}, f"{pipe.digest}+changeset-dead", "interim", lambda p: None)  # noqa: SLF001

    outcome = bench.deployer.recover(deployment)
    assert outcome is not None and outcome.outcome == Result.OK and "rolled forward" in outcome.message
    assert bench.triton.served_digest("pipe") == new["pipe"] and bench.triton.served_digest("a") == new["a"]
    assert bench.registry.get_model("pipe").active_digest == new["pipe"]
    assert bench.deployer.sweep(["pipe"]) and staged not in bench.serving.models()


def test_a_step_added_to_the_bring_up_runs_on_every_path(benches: tuple[Bench, Bench],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/architecture.md "Add a deploy step": a step is one entry of deploy/steps.py's BRING_UP, and every
    path that brings a digest up takes it: a model deployed alone, each load of a change set (the staged
    copy, the interim switch, the public step, the switch back), a restore's reload and a crash recovery."""
    bench, _ = benches
    taken: list[tuple[str, str]] = []

    def note(steps: TritonSteps, b: BringUp) -> str:
        taken.append((b.served_as, b.digest))
        return "noted"

    monkeypatch.setattr(deploy_steps, "BRING_UP", (*deploy_steps.BRING_UP, Step("note", note)))
    new = bench.serving_pipeline()  # a, b and pipe deployed alone
    first_b = bench.registry.get_model("b").active_digest
    assert [model for model, _ in taken] == ["a", "b", "pipe"]

    taken.clear()
    assert bench.deployer.run(bench.plan(new), "alice").outcome == Result.OK
    staged = private_name("a", new["a"])
    assert taken == [(staged, new["a"]), ("pipe", new["pipe"]), ("a", new["a"]), ("pipe", new["pipe"])]

    taken.clear()
    bench.triton.unload("b")  # Triton lost it: reconcile's restore loads it again
    restored = bench.deployer.restore("b", first_b, "reconcile")
    assert restored is not None and restored.outcome == Result.OK
    assert taken == [("b", first_b)]

    taken.clear()  # a deploy of b's new content killed after its load: recovery rolls it forward
    second_b = bench.record("b", gen_config("b", 2), 2)
    begun = bench.registry.begin_deployment("b", "deploy", second_b, first_b, "alice")
    bench.deployer.steps.publish("b", second_b)
    bench.triton.load("b")
    bench.registry.advance(begun.id, "loaded")
    [deployment] = bench.registry.open_deployments()
    recovered = bench.deployer.recover(deployment)
    assert recovered is not None and recovered.message.startswith("rolled forward"), recovered
    assert taken == [("b", second_b)]


def test_a_sweep_with_no_private_names_reads_no_ensemble(benches: tuple[Bench, Bench],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Every start's first reconcile sweeps private step names; with none left behind (the usual start)
    it reads no ensemble's served config: at 5,000 serving ensembles that was one gRPC call each, seconds
    before READY."""
    bench, _ = benches
    bench.serving_pipeline()
    reads: list[str] = []
    real = bench.triton.served_config

    def counted(model: str) -> dict[str, Any]:
        reads.append(model)
        return real(model)

    monkeypatch.setattr(bench.triton, "served_config", counted)
    assert bench.deployer.sweep(["pipe"]) and reads == []


def test_only_the_deploy_engine_and_triton_drive_triton() -> None:
    """No module outside the deploy engine (deploy/engine.py, deploy/plans.py, deploy/steps.py) and triton/
    calls Triton's load, unload or infer: a deploy step changed there is changed for every path."""
    engine = {"controlplane/deploy/engine.py", "controlplane/deploy/plans.py", "controlplane/deploy/steps.py"}
    # a Triton client (ours: `.triton.load(`; tritonclient's: `load_model(`), never the control API's client
    call = re.compile(r"triton\w*\.(load|unload|infer)\(|\b(load_model|unload_model)\(|\.infer\(")
    offenders = []
    for path in sorted([*(ROOT / "controlplane").rglob("*.py"), *(ROOT / "cli").rglob("*.py")]):
        rel = path.relative_to(ROOT)
        if rel.parts[1] == "triton" or rel.as_posix() in engine:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if call.search(line):
                offenders.append(f"{rel}:{number}: {line.strip()}")
    assert offenders == [], offenders
