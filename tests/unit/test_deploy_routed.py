"""The deploy engine through the gateway (controlplane/deploy/routed.py), against a stand-in Triton and a
stand-in route table: every digest is loaded under its own private name, a switch is one route update, a
failure before the switch changes nothing a client sees, and nothing is ever loaded again under a name
Triton has loaded. The real gateway and tritonserver are driven end to end by tests/test_gateway_*.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from controlplane.deploy.aliases import Routed, Target, bound_name, private_name
from controlplane.deploy.engine import Deployer, Outcome
from controlplane.deploy.publish import ServingRepository
from controlplane.deploy.routed import rename_top_level
from controlplane.errors import GatewayError, TritonError
from controlplane.snapshot import ContentStore
from controlplane.store import migrate
from controlplane.store.records import DeploymentRecord
from controlplane.store.registry import AuditQuery, Registry
from controlplane.validation.modelconfig import validate_model_dir
from controlplane.vocab import Cause, ModelState, Result
from tests.harness import write_gen_model
from tests.unit.standin_triton import StandinTriton

pytestmark = pytest.mark.unit

CONTENT_FAILURE = TritonError("failed to load: initialize() raised: boom", "INTERNAL")


class StandinRoutes:
    """The gateway's control channel as the daemon sees it: a route table, updated atomically, and the
    requests in flight per private name (set by the test)."""

    def __init__(self) -> None:
        self.table: dict[str, dict[str, Any]] = {}
        self.updates: list[tuple[dict[str, Any], list[str]]] = []
        self.in_flight: dict[str, int] = {}
        self.down = False

    def update(self, set: Mapping[str, Any], delete: Iterable[str] = ()) -> int:  # noqa: A002
        if self.down:
            raise GatewayError("gateway control socket: connection refused")
        self.updates.append((dict(set), list(delete)))
        self.table.update(set)
        for model in delete:
            self.table.pop(model, None)
        return len(self.updates)

    def routes(self) -> Mapping[str, Any]:
        return dict(self.table)

    def inflight(self, names: Iterable[str]) -> Mapping[str, int]:
        return {n: self.in_flight.get(n, 0) for n in names}

    def routed(self, model: str) -> tuple[str, str] | None:
        route = self.table.get(model)
        if route is None:
            return None
        target = route["targets"][0]
        return target["name"], target["digest"]


class Bench:
    def __init__(self, tmp: Path, drain_s: float = 0.05) -> None:
        self.repo = tmp / "repo"
        self.registry = Registry(f"sqlite:///{tmp / 'registry.db'}")
        migrate.upgrade(self.registry)
        self.store = ContentStore(tmp / "store", fsync=False)
        self.serving = ServingRepository(tmp / "serving", tmp / "published")
        self.triton = StandinTriton(self.serving)
        self.routes = StandinRoutes()
        self.ensembles: dict[str, list[str]] = {}
        self.outcomes: list[Outcome] = []
        self.deployer = Deployer(self.registry, self.store, self.serving, self.triton, load_timeout_s=5.0,
                                 on_outcome=self.outcomes.append, aliases=Routed(self.routes),
                                 drain_s=lambda: drain_s, ensembles=lambda: dict(self.ensembles))
        assert self.deployer.drainer is not None
        self.deployer.drainer.start()

    def record(self, gen: int, *, model: str = "m", smoke_gen: int | None = None) -> str:
        write_gen_model(self.repo, model, gen, smoke_gen=smoke_gen)
        snap = self.store.capture(self.repo / model, model)
        result = validate_model_dir(self.store.tree_path(snap.digest), name=model)
        record, _ = self.registry.record_snapshot(
            model, snap.digest, snap.manifest_json(), config=result.config, versions=result.versions,
            served_versions=result.served_versions, valid=result.ok, problems=[], total_bytes=snap.total_bytes)
        return record.digest

    def loads(self) -> list[str]:
        return [name for call, name, _ in self.triton.calls if call == "load"]

    def audit(self, model: str = "m") -> list[tuple[str, str]]:
        return [(e.action, e.outcome) for e in self.registry.query_audit(AuditQuery(model=model, limit=50))]


@pytest.fixture
def bench(tmp_path: Path) -> Iterator[Bench]:
    b = Bench(tmp_path)
    yield b
    assert b.deployer.drainer is not None
    b.deployer.drainer.stop()
    b.registry.close()


def wait_for(predicate: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_deploy_loads_a_private_name_and_switches_the_route(bench: Bench) -> None:
    first = bench.record(1)
    outcome = bench.deployer.deploy("m", first, "alice")
    assert outcome.outcome == Result.OK, outcome.message
    assert bench.routes.routed("m") == (private_name("m", first), first)
    assert bench.triton.served_digest(private_name("m", first)) == first
    assert "m" not in bench.triton.models  # the public name is never loaded in Triton
    second = bench.record(2)
    assert bench.deployer.deploy("m", second, "alice").outcome == Result.OK
    assert bench.routes.routed("m") == (private_name("m", second), second)
    # each name was loaded once: no load into a loaded name, ever
    assert bench.loads() == [private_name("m", first), private_name("m", second)]
    # the old name drains, then goes
    wait_for(lambda: private_name("m", first) not in bench.triton.models)
    assert bench.serving.current(private_name("m", first)) is None
    assert bench.registry.get_model("m").active_digest == second


def test_the_old_name_stays_while_requests_run_on_it(bench: Bench) -> None:
    first = bench.record(1)
    bench.deployer.deploy("m", first, "alice")
    bench.routes.in_flight[private_name("m", first)] = 2
    bench.deployer.deploy("m", bench.record(2), "alice")
    time.sleep(0.4)
    assert private_name("m", first) in bench.triton.models  # drained only when nothing runs on it
    bench.routes.in_flight.clear()
    wait_for(lambda: private_name("m", first) not in bench.triton.models)


def test_a_failed_load_changes_no_route_and_quarantines_the_content(bench: Bench) -> None:
    first = bench.record(1)
    bench.deployer.deploy("m", first, "alice")
    updates = len(bench.routes.updates)
    bad = bench.record(2)
    bench.triton.load_script = [CONTENT_FAILURE]
    outcome = bench.deployer.deploy("m", bad, "alice")
    assert (outcome.outcome, outcome.cause) == (Result.ROLLED_BACK, Cause.CONTENT)
    assert len(bench.routes.updates) == updates  # clients never saw it
    assert bench.routes.routed("m") == (private_name("m", first), first)
    assert bench.registry.get_snapshot("m", bad).quarantined
    assert bench.registry.get_model("m").active_digest == first
    assert private_name("m", bad) not in bench.triton.models and bench.serving.current(private_name("m", bad)) is None
    assert bench.loads().count(private_name("m", first)) == 1  # no reload of what served: it never stopped


def test_a_smoke_failure_runs_on_the_private_name_only(bench: Bench) -> None:
    first = bench.record(1)
    bench.deployer.deploy("m", first, "alice")
    bad = bench.record(2, smoke_gen=7)  # its smoke.json expects generation 7: it answers 2
    outcome = bench.deployer.deploy("m", bad, "alice")
    assert outcome.outcome == Result.ROLLED_BACK and "smoke" in outcome.message
    assert bench.routes.routed("m") == (private_name("m", first), first)


def test_a_gateway_that_does_not_take_the_switch_is_an_environment_fault(bench: Bench) -> None:
    first = bench.record(1)
    bench.deployer.deploy("m", first, "alice")
    bench.routes.down = True
    second = bench.record(2)
    outcome = bench.deployer.deploy("m", second, "alice")
    assert (outcome.outcome, outcome.cause) == (Result.FAILED, Cause.ENVIRONMENT)
    assert not bench.registry.get_snapshot("m", second).quarantined
    assert private_name("m", second) not in bench.triton.models
    assert bench.registry.get_model("m").active_digest == first


def test_a_bake_rollback_switches_back_to_the_name_still_loaded(bench: Bench) -> None:
    first = bench.record(1)
    bench.deployer.deploy("m", first, "alice")
    assert bench.deployer.drainer is not None
    bench.deployer.drainer.hold(private_name("m", first))  # the bake keeps it
    second = bench.record(2)
    bench.deployer.deploy("m", second, "alice")
    time.sleep(0.2)
    loads = len(bench.loads())
    outcome = bench.deployer.roll_back_analysis("m", second, first, "tritonctl:bake", "failure ratio 0.3")
    assert outcome is not None and (outcome.outcome, outcome.cause) == (Result.ROLLED_BACK, Cause.ANALYSIS)
    assert bench.routes.routed("m") == (private_name("m", first), first)
    assert len(bench.loads()) == loads  # a switch, no load
    wait_for(lambda: private_name("m", second) not in bench.triton.models)


def test_a_rollback_to_an_unloaded_digest_loads_a_fresh_tree_then_switches(bench: Bench) -> None:
    first = bench.record(1)
    bench.deployer.deploy("m", first, "alice")
    second = bench.record(2)
    bench.deployer.deploy("m", second, "alice")
    wait_for(lambda: private_name("m", first) not in bench.triton.models)
    outcome = bench.deployer.rollback("m", "alice")
    assert outcome.outcome == Result.OK
    assert bench.routes.routed("m") == (private_name("m", first), first)
    assert bench.loads().count(private_name("m", first)) == 2  # loaded again only after it was unloaded


def test_unload_takes_the_route_first_then_every_private_name(bench: Bench) -> None:
    bench.deployer.deploy("m", bench.record(1), "alice")
    outcome = bench.deployer.unload("m", "alice")
    assert outcome.outcome == Result.OK
    assert bench.routes.routed("m") is None and bench.routes.updates[-1] == ({}, ["m"])
    assert not [n for n in bench.triton.models if n.startswith("m__")]
    assert bench.registry.get_model("m").state == ModelState.UNLOADED


def test_restore_brings_the_active_digest_up_under_its_name(bench: Bench) -> None:
    digest = bench.record(1)
    bench.deployer.deploy("m", digest, "alice")
    bench.triton.models.clear()  # tritonserver restarted: it serves nothing
    outcome = bench.deployer.restore("m", digest, "reconcile")
    assert outcome is not None and outcome.outcome == Result.OK
    assert bench.triton.served_digest(private_name("m", digest)) == digest
    assert bench.routes.routed("m") == (private_name("m", digest), digest)


def _open(bench: Bench, digest: str, previous: str | None) -> DeploymentRecord:
    bench.registry.ensure_model("m")
    return bench.registry.begin_deployment("m", "deploy", digest, previous, "alice")


def test_recovery_rolls_forward_when_the_switch_happened(bench: Bench) -> None:
    first = bench.record(1)
    bench.deployer.deploy("m", first, "alice")
    second = bench.record(2)
    deployment = _open(bench, second, first)
    # the crashed daemon had published, loaded and switched, not committed
    b = bench.deployer.routed.bring_up_of("m", second, bench.registry.get_snapshot("m", second),  # type: ignore[union-attr]
                                          private_name("m", second), None, reload=False)
    bench.deployer.steps.bring_up(b)
    bench.routes.update({"m": {"targets": [{"name": private_name("m", second), "digest": second, "weight": 100}]}})
    bench.deployer.aliases.adopt()  # type: ignore[attr-defined]
    outcome = bench.deployer.recover(deployment)
    assert outcome is not None and outcome.outcome == Result.OK and "rolled forward" in outcome.message
    assert bench.registry.get_model("m").active_digest == second


def test_recovery_rolls_back_when_the_switch_did_not_happen(bench: Bench) -> None:
    first = bench.record(1)
    bench.deployer.deploy("m", first, "alice")
    second = bench.record(2)
    deployment = _open(bench, second, first)
    b = bench.deployer.routed.bring_up_of("m", second, bench.registry.get_snapshot("m", second),  # type: ignore[union-attr]
                                          private_name("m", second), None, reload=False)
    bench.deployer.steps.bring_up(b)  # loaded, never switched
    outcome = bench.deployer.recover(deployment)
    assert outcome is not None and outcome.outcome == Result.ROLLED_BACK
    assert bench.routes.routed("m") == (private_name("m", first), first)
    bench.deployer.sweep([])  # the orphan goes (the routed sweep runs every round: it says False)
    wait_for(lambda: private_name("m", second) not in bench.triton.models)


def test_an_ensemble_is_rebound_and_switched_with_its_step(bench: Bench, tmp_path: Path) -> None:
    step = bench.record(1, model="s")
    bench.deployer.deploy("s", step, "alice")
    ens_digest = _record_ensemble(bench, "e", "s")
    outcome = bench.deployer.deploy("e", ens_digest, "alice")
    assert outcome.outcome == Result.OK, outcome.message
    bound = bound_name("e", ens_digest, {"s": private_name("s", step)})
    assert bench.routes.routed("e") == (bound, ens_digest)
    assert f'model_name: "{private_name("s", step)}"' in (bench.serving.current(bound) / "config.pbtxt").read_text()
    bench.ensembles = {"e": ["s"]}
    step2 = bench.record(2, model="s")
    updates = len(bench.routes.updates)
    assert bench.deployer.deploy("s", step2, "alice").outcome == Result.OK
    rebound = bound_name("e", ens_digest, {"s": private_name("s", step2)})
    assert len(bench.routes.updates) == updates + 1  # the step and the ensemble over it: one switch
    assert bench.routes.updates[-1][0].keys() == {"s", "e"}
    assert bench.routes.routed("e") == (rebound, ens_digest)
    wait_for(lambda: bound not in bench.triton.models and private_name("s", step) not in bench.triton.models)


def _record_ensemble(bench: Bench, name: str, step: str) -> str:
    root = bench.repo / name
    (root / "1").mkdir(parents=True, exist_ok=True)
    (root / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: 8\n'
        'input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "gen" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        f'ensemble_scheduling {{ step [ {{ model_name: "{step}" model_version: -1 '
        'input_map { key: "x" value: "x" } output_map { key: "gen" value: "gen" } } ] }\n')
    snap = bench.store.capture(root, name)
    result = validate_model_dir(bench.store.tree_path(snap.digest), name=name)
    record, _ = bench.registry.record_snapshot(name, snap.digest, snap.manifest_json(), config=result.config,
                                               versions=result.versions, served_versions=result.served_versions,
                                               valid=True, problems=[], total_bytes=snap.total_bytes)
    return record.digest


def test_the_top_level_name_is_renamed_without_touching_nested_names() -> None:
    text = 'name: "m"\ninput [\n  {\n    name: "x"\n  }\n]\nparameters { key: "name" value { string_value: "n" } }\n'
    renamed = rename_top_level(text, "m__0123abcd")
    assert renamed.startswith('name: "m__0123abcd"\n') and 'name: "x"' in renamed
    assert rename_top_level('backend: "python"\n', "m__1") == 'name: "m__1"\nbackend: "python"\n'
    assert rename_top_level('input [ { name: "x" } ]\n  name:"old"\n', "p") .endswith('  name:"p"\n')


def test_concurrent_deploys_of_two_models_switch_independently(bench: Bench) -> None:
    a, b = bench.record(1, model="a"), bench.record(1, model="b")
    results: list[Outcome] = []
    threads = [threading.Thread(target=lambda m=m, d=d: results.append(bench.deployer.deploy(m, d, "alice")))
               for m, d in (("a", a), ("b", b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r.outcome == Result.OK for r in results)
    assert bench.routes.routed("a") == (private_name("a", a), a)
    assert bench.routes.routed("b") == (private_name("b", b), b)
    assert Target(private_name("a", a), a) == bench.deployer.aliases.target("a")


def test_a_model_another_calls_by_bls_is_served_under_its_own_name(bench: Bench) -> None:
    """A BLS call goes inside Triton by name, past the gateway: the callee answers to its own name there."""
    callee = bench.record(1, model="callee")
    bench.deployer.deploy("callee", callee, "alice")
    assert bench.routes.routed("callee") == (private_name("callee", callee), callee)
    write_gen_model(bench.repo, "caller", 1)
    source = bench.repo / "caller" / "1" / "model.py"
    source.write_text(source.read_text() + '\n\ndef forward(x):\n'
                      '    return pb_utils.InferenceRequest(model_name="callee", requested_output_names=["gen"],'
                      ' inputs=[x])\n')
    snap = bench.store.capture(bench.repo / "caller", "caller")
    result = validate_model_dir(bench.store.tree_path(snap.digest), name="caller")
    record, _ = bench.registry.record_snapshot("caller", snap.digest, snap.manifest_json(), config=result.config,
                                               versions=result.versions, served_versions=result.served_versions,
                                               valid=True, problems=[], total_bytes=snap.total_bytes)
    outcome = bench.deployer.deploy("caller", record.digest, "alice")
    assert outcome.outcome == Result.OK, outcome.message
    assert bench.routes.routed("callee") == ("callee", callee)  # switched with the caller, same content
    assert bench.triton.served_digest("callee") == callee
    wait_for(lambda: private_name("callee", callee) not in bench.triton.models)
    # its next version loads under its own name too (in place: Triton routes the BLS calls)
    second = bench.record(2, model="callee")
    assert bench.deployer.deploy("callee", second, "alice").outcome == Result.OK
    assert bench.routes.routed("callee") == ("callee", second)


def test_bls_calls_are_read_from_the_source() -> None:
    from controlplane.validation.bls import calls_in

    source = ('import triton_python_backend_utils as pb_utils\n'
              'r = pb_utils.InferenceRequest(model_name="add_sub", inputs=[], requested_output_names=[])\n'
              'q = InferenceRequest("pytorch", [], [])\n'
              'dynamic = pb_utils.InferenceRequest(model_name=name, inputs=[])\n')
    assert calls_in(source) == {"add_sub", "pytorch", "*"}  # *: a name computed at run time
    assert calls_in("def broken(:\n") == set()


def test_a_bls_call_by_a_name_computed_at_run_time_serves_every_model_under_its_own_name(bench: Bench) -> None:
    """Undeclared: any model may be its callee, so none may answer only to a private name."""
    other = bench.record(1, model="other")
    bench.deployer.deploy("other", other, "alice")
    write_gen_model(bench.repo, "router", 1)
    source = bench.repo / "router" / "1" / "model.py"
    source.write_text(source.read_text() + '\n\ndef forward(name, x):\n'
                      '    return pb_utils.InferenceRequest(model_name=name, requested_output_names=["gen"],'
                      ' inputs=[x])\n')
    snap = bench.store.capture(bench.repo / "router", "router")
    result = validate_model_dir(bench.store.tree_path(snap.digest), name="router")
    record, _ = bench.registry.record_snapshot("router", snap.digest, snap.manifest_json(), config=result.config,
                                               versions=result.versions, served_versions=result.served_versions,
                                               valid=True, problems=[], total_bytes=snap.total_bytes)
    assert bench.deployer.deploy("router", record.digest, "alice").outcome == Result.OK
    assert bench.routes.routed("other") == ("other", other)
