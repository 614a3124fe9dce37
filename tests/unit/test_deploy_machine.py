"""Every branch of the deploy / rollback / unload / restore / recover state machine, against a
stand-in Triton (tests/unit/standin_triton.py): what the registry records, what serves, whose fault
a failure is, and what the operator is told. The real-server tests (test_daemon_e2e, test_crash,
test_faults) cover the same paths end to end; these make each branch cheap to reach."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select

from controlplane.deploy.engine import Deployer, Outcome, Progress
from controlplane.deploy.publish import ServingRepository
from controlplane.errors import (
    BudgetError,
    EnvironmentFault,
    ModelConfigError,
    NotFoundError,
    TritonError,
    TritonTimeoutError,
    TritonUnavailableError,
)
from controlplane.snapshot import ContentStore
from controlplane.store import migrate, schema
from controlplane.store.records import DeploymentRecord
from controlplane.store.registry import AuditEntry, AuditQuery, Registry
from controlplane.validation.modelconfig import validate_model_dir
from controlplane.vocab import Cause, ModelState, Result
from tests.harness import write_gen_model
from tests.unit.standin_triton import StandinTriton

pytestmark = pytest.mark.unit

CONTENT_FAILURE = TritonError("failed to load 'm': initialize() raised: boom", "INTERNAL")
ENVIRONMENT_FAILURE = TritonError("failed to load 'm': unable to find backend library for 'onnx'", "INTERNAL")


class Bench:
    """A deployer over a temporary registry, content store and serving repository, and a stand-in Triton."""

    def __init__(self, tmp: Path) -> None:
        self.repo = tmp / "repo"
        self.registry = Registry(f"sqlite:///{tmp / 'registry.db'}")
        migrate.upgrade(self.registry)
        self.store = ContentStore(tmp / "store", fsync=False)
        self.serving = ServingRepository(tmp / "serving", tmp / "published")
        self.triton = StandinTriton(self.serving)
        self.outcomes: list[Outcome] = []
        self.deployer = Deployer(self.registry, self.store, self.serving, self.triton, load_timeout_s=5.0,
                                 on_outcome=self.outcomes.append)

    def record(self, gen: int, *, smoke_gen: int | None = None, model: str = "m") -> str:
        write_gen_model(self.repo, model, gen, smoke_gen=smoke_gen)
        snap = self.store.capture(self.repo / model, model)
        result = validate_model_dir(self.store.tree_path(snap.digest), name=model)
        record, _ = self.registry.record_snapshot(
            model, snap.digest, snap.manifest_json(), config=result.config, versions=result.versions,
            served_versions=result.served_versions, valid=result.ok, problems=[], total_bytes=snap.total_bytes)
        return record.digest

    def serving_now(self, gen: int) -> str:
        """Deploy generation `gen` successfully; returns its digest."""
        digest = self.record(gen)
        assert self.deployer.deploy("m", digest, "alice").outcome == Result.OK
        return digest

    def audit(self) -> list[tuple[str, str]]:
        return [(e.action, e.outcome) for e in self.registry.query_audit(AuditQuery(model="m", limit=50))]


@pytest.fixture
def bench(tmp_path: Path) -> Iterator[Bench]:
    b = Bench(tmp_path)
    yield b
    b.registry.close()


def served(bench: Bench) -> str | None:
    return bench.triton.served_digest("m")


# -- deploy: refused before Triton ---------------------------------------------------------------


def test_invalid_content_is_not_sent_to_triton(bench: Bench) -> None:
    write_gen_model(bench.repo, "m", 1)
    (bench.repo / "m" / "config.pbtxt").write_text('name: "m"\nbackend: "python"\nmax_batch_size: -3\n')
    snap = bench.store.capture(bench.repo / "m", "m")
    result = validate_model_dir(bench.store.tree_path(snap.digest), name="m")
    record, _ = bench.registry.record_snapshot(
        "m", snap.digest, snap.manifest_json(), config=result.config, versions=result.versions,
        served_versions=result.served_versions, valid=False, problems=[
            {"file": "m/config.pbtxt", "field": "max_batch_size", "message": "negative", "severity": "error"}],
        total_bytes=snap.total_bytes)
    outcome = bench.deployer.deploy("m", record.digest, "alice")
    assert (outcome.outcome, outcome.cause) == (Result.FAILED, Cause.NONE)
    assert "invalid, not sent to Triton" in outcome.message
    assert bench.triton.calls == [] and bench.audit() == [("deploy", "failed")]
    assert [(s.step, s.state) for s in outcome.steps] == [("validate", "start"), ("validate", "failed")]
    assert bench.outcomes == [outcome]


def test_a_quarantined_digest_needs_force_and_force_clears_the_quarantine(bench: Bench) -> None:
    digest = bench.record(1)
    bench.registry.set_quarantine("m", digest, "it failed before")
    refused = bench.deployer.deploy("m", digest, "alice")
    assert refused.outcome == Result.FAILED and "quarantined (it failed before)" in refused.message
    assert bench.triton.calls == []
    forced = bench.deployer.deploy("m", digest, "alice", force=True)
    assert forced.outcome == Result.OK and served(bench) == digest
    assert not bench.registry.get_snapshot("m", digest).quarantined


def test_an_ensemble_whose_steps_are_not_served_is_the_environments_fault(bench: Bench) -> None:
    digest = bench.record(1)
    config = bench.registry.get_snapshot("m", digest).config or {}
    bench.registry.record_snapshot(
        "ens", digest, "{}", config={"name": "ens", "platform": "ensemble", "ensemble_scheduling": {"step": [
            {"model_name": "absent", "model_version": -1, "input_map": {}, "output_map": {}}]}} | {
            k: v for k, v in config.items() if k in ("input", "output")},
        versions=[1], served_versions=[1], valid=True, problems=[], total_bytes=1)
    outcome = bench.deployer.deploy("ens", digest, "alice")
    assert (outcome.outcome, outcome.cause) == (Result.FAILED, Cause.ENVIRONMENT)
    assert outcome.retried and bench.triton.calls == []


def test_an_ensemble_that_does_not_fit_its_steps_is_the_contents_fault(bench: Bench,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    def misfit(registry: Registry, snap: object, overrides: object = None) -> None:
        raise ModelConfigError("ens/config.pbtxt: step 0: input 'x' has no such tensor")

    monkeypatch.setattr("controlplane.deploy.engine.require_members", misfit)
    outcome = bench.deployer.deploy("m", bench.record(1), "alice")
    assert (outcome.outcome, outcome.cause) == (Result.FAILED, Cause.CONTENT) and not outcome.retried


def test_a_digest_already_served_is_a_noop_unless_forced(bench: Bench) -> None:
    digest = bench.serving_now(1)
    loads = len(bench.triton.calls)
    again = bench.deployer.deploy("m", digest, "alice")
    assert again.outcome == Result.NOOP and again.succeeded and len(bench.triton.calls) == loads
    assert [(s.step, s.state) for s in again.steps][-1] == ("deploy", "skipped")
    assert bench.deployer.deploy("m", digest, "alice", force=True).outcome == Result.OK
    assert len(bench.triton.calls) == loads + 1


# -- deploy: the happy path ----------------------------------------------------------------------


def test_a_deploy_publishes_loads_verifies_smokes_and_commits(bench: Bench) -> None:
    seen: list[Progress] = []
    digest = bench.record(1, smoke_gen=1)
    outcome = bench.deployer.deploy("m", digest, "alice", progress=seen.append)
    assert (outcome.outcome, outcome.active_digest, outcome.cause) == (Result.OK, digest, Cause.NONE)
    assert [(s.step, s.state) for s in seen] == [
        ("validate", "start"), ("validate", "ok"), ("publish", "start"), ("publish", "ok"), ("load", "start"),
        ("load", "ok"), ("verify", "start"), ("verify", "ok"), ("smoke", "start"), ("smoke", "ok"),
        ("commit", "start"), ("commit", "ok")]
    model = bench.registry.get_model("m")
    assert (model.state, model.active_digest) == (ModelState.SERVING, digest)
    assert bench.registry.open_deployments() == []
    assert bench.registry.last_deployment("m").outcome == "ok"  # type: ignore[union-attr]
    assert served(bench) == digest and bench.audit() == [("deploy", "ok")]


# -- deploy: failures and rollback ---------------------------------------------------------------


def test_content_refused_by_triton_is_quarantined_and_the_previous_digest_restored(bench: Bench) -> None:
    good = bench.serving_now(1)
    bad = bench.record(2)
    bench.triton.load_script = [CONTENT_FAILURE]
    outcome = bench.deployer.deploy("m", bad, "alice")
    assert (outcome.outcome, outcome.cause, outcome.active_digest) == (Result.ROLLED_BACK, Cause.CONTENT, good)
    assert outcome.message.startswith(f"rolled back to {good[:12]}")
    assert bench.registry.get_snapshot("m", bad).quarantined
    assert served(bench) == good and bench.registry.get_model("m").state == ModelState.SERVING
    assert ("rollback", "ok") in [(s.step, s.state) for s in outcome.steps]


def test_a_load_triton_ignores_fails_verification(bench: Bench) -> None:
    good = bench.serving_now(1)
    bad = bench.record(2)
    bench.triton.load_script = ["ignore"]
    outcome = bench.deployer.deploy("m", bad, "alice")
    assert outcome.outcome == Result.ROLLED_BACK and "load ignored" in outcome.message
    assert served(bench) == good


def test_a_version_that_never_becomes_ready_fails_verification(bench: Bench) -> None:
    good = bench.serving_now(1)
    bench.triton.unready = {"1"}
    outcome = bench.deployer.deploy("m", bench.record(2), "alice")
    assert outcome.outcome == Result.FAILED and "not READY after load" in outcome.message
    assert "rollback to" in outcome.message  # the previous one cannot become READY either
    assert bench.registry.get_model("m").state == ModelState.DEGRADED
    assert bench.registry.get_model("m").active_digest == good


def test_a_failing_smoke_request_rolls_back(bench: Bench) -> None:
    good = bench.serving_now(1)
    bad = bench.record(2, smoke_gen=3)  # the content answers 2, its smoke file expects 3
    outcome = bench.deployer.deploy("m", bad, "alice")
    assert (outcome.outcome, outcome.cause) == (Result.ROLLED_BACK, Cause.SMOKE)  # its own: held, not "invalid"
    assert outcome.message.split(": ", 1)[1].startswith("smoke test failed: m request 0: output 'gen'")
    assert served(bench) == good and bench.registry.get_snapshot("m", bad).quarantined


def test_an_environment_fault_rolls_back_without_quarantine_and_is_retried(bench: Bench) -> None:
    good = bench.serving_now(1)
    bad = bench.record(2)
    bench.triton.load_script = [ENVIRONMENT_FAILURE]
    outcome = bench.deployer.deploy("m", bad, "alice")
    assert (outcome.outcome, outcome.cause, outcome.active_digest) == (Result.FAILED, Cause.ENVIRONMENT, good)
    assert outcome.retried and "a backend is missing on this tritonserver" in outcome.message
    assert not bench.registry.get_snapshot("m", bad).quarantined and served(bench) == good


def test_an_unreachable_triton_fails_without_quarantine_and_puts_serving_back(bench: Bench) -> None:
    good = bench.serving_now(1)
    bad = bench.record(2)
    bench.triton.load_script = [TritonUnavailableError("connection refused", "UNAVAILABLE")]
    outcome = bench.deployer.deploy("m", bad, "alice")
    assert (outcome.outcome, outcome.cause) == (Result.FAILED, Cause.TRITON_UNREACHABLE)
    assert outcome.message.startswith("tritonserver unreachable")
    assert not bench.registry.get_snapshot("m", bad).quarantined
    model = bench.registry.get_model("m")
    assert (model.state, model.active_digest) == (ModelState.SERVING, good)
    tree = bench.serving.current("m")
    assert tree is not None and good in (tree / "config.pbtxt").read_text()  # serving/ points at good again


def test_an_unreachable_triton_on_a_first_deploy_leaves_the_model_failed(bench: Bench) -> None:
    bench.triton.load_script = [TritonUnavailableError("connection refused", "UNAVAILABLE")]
    outcome = bench.deployer.deploy("m", bench.record(1), "alice")
    assert (outcome.outcome, outcome.cause) == (Result.FAILED, Cause.TRITON_UNREACHABLE)
    assert bench.registry.get_model("m").state == ModelState.FAILED


def test_after_a_load_timeout_the_rollback_load_gets_the_grace_on_top(bench: Bench) -> None:
    from controlplane.deploy.engine import ROLLBACK_GRACE_S

    bench.serving_now(1)
    bench.triton.load_script = [TritonTimeoutError("load 'm': deadline exceeded", "DEADLINE_EXCEEDED")]
    outcome = bench.deployer.deploy("m", bench.record(2), "alice")
    assert outcome.outcome == Result.ROLLED_BACK
    assert bench.triton.calls[-1] == ("load", "m", 5.0 + ROLLBACK_GRACE_S)


def test_content_failure_with_nothing_to_roll_back_to_takes_the_model_out(bench: Bench) -> None:
    bench.triton.load_script = [CONTENT_FAILURE]
    outcome = bench.deployer.deploy("m", bench.record(1), "alice")
    assert (outcome.outcome, outcome.cause, outcome.active_digest) == (Result.FAILED, Cause.CONTENT, None)
    assert outcome.message.startswith("failed, nothing to roll back to")
    assert bench.registry.get_model("m").state == ModelState.FAILED
    assert bench.serving.current("m") is None and ("unload", "m", None) in bench.triton.calls


def test_a_rollback_that_fails_too_leaves_the_model_degraded(bench: Bench) -> None:
    good = bench.serving_now(1)
    bench.triton.load_script = [CONTENT_FAILURE, TritonError("failed to load 'm': out of memory", "INTERNAL")]
    outcome = bench.deployer.deploy("m", bench.record(2), "alice")
    assert outcome.outcome == Result.FAILED and f"rollback to {good[:12]} failed" in outcome.message
    model = bench.registry.get_model("m")
    assert (model.state, model.active_digest) == (ModelState.DEGRADED, good)
    assert ("rollback", "failed") in [(s.step, s.state) for s in outcome.steps]


def test_a_host_capability_check_fails_before_anything_is_published(bench: Bench) -> None:
    class NoBackend:
        def check(self, config: object, tree: Path) -> None:
            raise EnvironmentFault("backend 'python' is not installed on this tritonserver")

        def load(self, model: str, load: object) -> None:  # pragma: no cover - never reached
            raise AssertionError

    deployer = Deployer(bench.registry, bench.store, bench.serving, bench.triton,
                        host=NoBackend())  # type: ignore[arg-type]
    outcome = deployer.deploy("m", bench.record(1), "alice")
    assert (outcome.outcome, outcome.cause) == (Result.FAILED, Cause.ENVIRONMENT)
    assert bench.triton.calls == [("unload", "m", None)]  # nothing to roll back to: taken out


# -- unload, rollback, restore -------------------------------------------------------------------


def test_unload_takes_the_model_out_and_records_it(bench: Bench) -> None:
    bench.serving_now(1)
    outcome = bench.deployer.unload("m", "alice")
    assert outcome.outcome == Result.OK and served(bench) is None and bench.serving.current("m") is None
    model = bench.registry.get_model("m")
    assert (model.state, model.active_digest) == (ModelState.UNLOADED, None)


def test_unload_failures_keep_the_model_and_say_why(bench: Bench) -> None:
    good = bench.serving_now(1)
    bench.triton.unload_error = TritonUnavailableError("connection refused", "UNAVAILABLE")
    outcome = bench.deployer.unload("m", "alice")
    assert (outcome.outcome, outcome.cause) == (Result.FAILED, Cause.TRITON_UNREACHABLE)
    bench.triton.unload_error = TritonError("unload refused", "INTERNAL")
    outcome = bench.deployer.unload("m", "alice")
    assert (outcome.outcome, outcome.cause) == (Result.FAILED, Cause.NONE)
    assert bench.registry.get_model("m").active_digest == good


def test_rollback_goes_to_the_previous_good_digest_or_a_named_one(bench: Bench) -> None:
    with pytest.raises(NotFoundError):
        bench.deployer.rollback("m", "alice") if bench.registry.find_model("m") else bench.deployer.previous_good("x")
    first = bench.serving_now(1)
    with pytest.raises(NotFoundError, match="no previous good version"):
        bench.deployer.rollback("m", "alice")
    second = bench.serving_now(2)
    outcome = bench.deployer.rollback("m", "alice")
    assert (outcome.action, outcome.outcome, outcome.active_digest) == ("rollback", Result.OK, first)
    bench.registry.set_quarantine("m", second, "bad")
    named = bench.deployer.rollback("m", "alice", to=second)  # a named digest is forced
    assert named.outcome == Result.OK and served(bench) == second


def test_restore_loads_the_active_digest_again_and_clears_degraded(bench: Bench) -> None:
    digest = bench.serving_now(1)
    bench.registry.update_model("m", state="degraded")
    bench.triton.models.clear()  # Triton restarted and serves nothing
    outcome = bench.deployer.restore("m", digest, "reconcile")
    assert outcome.outcome == Result.OK and served(bench) == digest
    assert bench.registry.get_model("m").state == ModelState.SERVING


def test_a_failed_restore_is_recorded_as_the_models_last_error(bench: Bench) -> None:
    digest = bench.serving_now(1)
    bench.triton.load_script = [CONTENT_FAILURE]
    outcome = bench.deployer.restore("m", digest, "reconcile")
    assert outcome.outcome == Result.FAILED
    assert "restore of" in (bench.registry.get_model("m").last_error or "")
    assert bench.audit()[0] == ("restore", "failed")


def test_a_restore_of_a_model_evicted_since_the_reconcile_read_it_loads_nothing(bench: Bench) -> None:
    """Reconcile reads what should serve, finds it not in Triton and restores it; an eviction that ran in
    between (the memory budget, the idle sweep) unloaded it on purpose. Measured in bench/ondemand.py
    before this was fixed: the restore loaded the evicted model back while the registry still said
    `unloaded`, so the budget did not count it and 9 models' stubs ran where 7 fit."""
    digest = bench.serving_now(1)
    assert bench.deployer.evict("m", "tritonctl:budget", "memory budget: room for n")
    assert served(bench) is None
    calls = len(bench.triton.calls)
    assert bench.deployer.restore("m", digest, "reconcile") is None
    assert served(bench) is None and bench.triton.calls[calls:] == []
    assert bench.registry.get_model("m").state == ModelState.UNLOADED
    assert [a for a, _ in bench.audit()].count("restore") == 0


class Guard:
    """A stand-in for the memory budget (controlplane/memory/budget.py's MemoryGuard, tested over a real registry
    in tests/unit/test_budget.py): admits or refuses, and records what it was told."""

    def __init__(self, refuse: str | None = None) -> None:
        self.refuse = refuse
        self.admitted: list[str] = []
        self.settled: list[bool] = []

    def admit(self, model: str, digest: str, config: object, previous: str | None, name: str | None = None) -> str:
        if self.refuse:
            raise BudgetError(self.refuse)
        self.admitted.append(model)
        return model

    def settle(self, ticket: object, loaded: bool) -> None:
        self.settled.append(loaded)


def test_a_restore_loads_within_the_memory_budget_like_a_deploy(bench: Bench) -> None:
    """After Triton restarted, reconcile restores what served: with a budget, through it (room made,
    the footprint measured), and with no room, not loaded at all — the reason kept as the last error."""
    digest = bench.serving_now(1)
    bench.triton.models.clear()
    bench.deployer.guard = guard = Guard(refuse="memory_budget_mb = 100 MB and m needs 150 MB")
    outcome = bench.deployer.restore("m", digest, "reconcile")
    assert outcome.outcome == Result.FAILED and served(bench) is None
    assert "memory_budget_mb = 100 MB" in (bench.registry.get_model("m").last_error or "")
    guard.refuse = None
    assert bench.deployer.restore("m", digest, "reconcile").outcome == Result.OK and served(bench) == digest
    assert guard.admitted == ["m"] and guard.settled == [True]


# -- recover: a deployment a crash interrupted ---------------------------------------------------


def interrupted(bench: Bench, kind: str, digest: str | None, previous: str | None,
                step: str = "loaded") -> DeploymentRecord:
    """A deployment a crash left open at `step`, as reconcile finds it."""
    begun = bench.registry.begin_deployment("m", kind, digest, previous, "alice")
    bench.registry.advance(begun.id, step)
    [deployment] = bench.registry.open_deployments()
    return deployment


def recovered(bench: Bench, deployment: DeploymentRecord) -> Outcome:
    outcome = bench.deployer.recover(deployment)
    assert outcome is not None, "recovery waited"
    return outcome


def test_recover_rolls_forward_what_triton_serves_as_recorded(bench: Bench) -> None:
    old = bench.serving_now(1)
    new = bench.record(2)
    bench.deployer.steps.publish("m", new)
    bench.triton.load("m")  # the crash came after the load
    deployment = interrupted(bench, "deploy", new, old)
    outcome = recovered(bench, deployment)
    assert outcome.outcome == Result.OK and outcome.message.startswith("rolled forward")
    assert bench.registry.get_model("m").active_digest == new


def test_recover_rolls_back_to_the_previous_digest_reloading_it_when_needed(bench: Bench) -> None:
    old = bench.serving_now(1)
    new = bench.record(2)
    bench.deployer.steps.publish("m", new)  # published, never loaded: Triton still serves old
    deployment = interrupted(bench, "deploy", new, old, step="published")
    bench.triton.load_script = ["ignore"]  # drain's load of the interrupted tree: Triton keeps old
    loads = len(bench.triton.calls)
    outcome = recovered(bench, deployment)
    assert outcome.outcome == Result.ROLLED_BACK
    assert served(bench) == old and bench.registry.get_model("m").active_digest == old
    assert len([c for c in bench.triton.calls[loads:] if c[0] == "load"]) == 2  # drain's, then old's again
    tree = bench.serving.current("m")
    assert tree is not None and old in (tree / "config.pbtxt").read_text()


def test_recover_of_a_rollback_in_progress_never_rolls_forward(bench: Bench) -> None:
    old = bench.serving_now(1)
    new = bench.record(2)
    bench.deployer.steps.publish("m", new)
    bench.triton.load("m")
    deployment = interrupted(bench, "deploy", new, old, step="rolling_back")
    outcome = recovered(bench, deployment)
    assert outcome.outcome == Result.ROLLED_BACK and served(bench) == old


def test_recover_that_cannot_restore_the_previous_digest_leaves_it_degraded(bench: Bench) -> None:
    old = bench.serving_now(1)
    new = bench.record(2)
    bench.deployer.steps.publish("m", new)
    bench.triton.models.clear()
    deployment = interrupted(bench, "deploy", new, old, step="published")
    bench.triton.load_script = ["ignore", CONTENT_FAILURE]  # drain's load of the tree, then the restore
    outcome = recovered(bench, deployment)
    assert outcome.outcome == Result.FAILED
    assert bench.registry.get_model("m").state == ModelState.DEGRADED


def test_recover_reloads_the_previous_digest_within_the_memory_budget(bench: Bench) -> None:
    """A recovery that reloads the previous content loads as a restore does: admitted by the budget
    first, and with no room it loads nothing and leaves the model degraded, the budget named."""
    old = bench.serving_now(1)
    new = bench.record(2)
    bench.deployer.steps.publish("m", new)
    bench.triton.models.clear()  # Triton lost it: the previous content must be loaded again
    deployment = interrupted(bench, "deploy", new, old, step="published")
    bench.triton.load_script = ["ignore"]  # drain's load of the interrupted tree
    bench.deployer.guard = guard = Guard(refuse="memory_budget_mb = 100 MB and m needs 150 MB")
    outcome = recovered(bench, deployment)
    assert outcome.outcome == Result.FAILED and "memory_budget_mb = 100 MB" in outcome.message
    assert bench.registry.get_model("m").state == ModelState.DEGRADED and served(bench) is None

    deployment = interrupted(bench, "deploy", new, old, step="published")
    bench.triton.load_script = ["ignore"]
    guard.refuse = None
    assert recovered(bench, deployment).outcome == Result.ROLLED_BACK and served(bench) == old
    assert guard.admitted == ["m"] and guard.settled == [True]


def test_recover_with_no_previous_digest_takes_the_model_out(bench: Bench) -> None:
    new = bench.record(1)
    deployment = interrupted(bench, "deploy", new, None, step="intent")
    outcome = recovered(bench, deployment)
    assert outcome.outcome == Result.FAILED and "no previous version" in outcome.message
    assert bench.registry.get_model("m").state == ModelState.FAILED


def test_recover_finishes_an_interrupted_unload(bench: Bench) -> None:
    old = bench.serving_now(1)
    deployment = interrupted(bench, "unload", None, old, step="intent")
    outcome = recovered(bench, deployment)
    assert outcome.outcome == Result.OK and served(bench) is None
    assert bench.registry.get_model("m").state == ModelState.UNLOADED


def test_recover_waits_while_triton_still_loads_the_model(bench: Bench) -> None:
    old = bench.serving_now(1)
    bench.triton.models["m"].state = "LOADING"
    deployment = interrupted(bench, "deploy", bench.record(2), old)
    from controlplane.deploy.engine import ROLLBACK_GRACE_S

    bench.deployer.load_timeout_s = 0.2 - ROLLBACK_GRACE_S  # drain's bound (deadline + grace) is then 0.2 s
    assert bench.deployer.recover(deployment) is None
    assert len(bench.registry.open_deployments()) == 1  # the next reconcile tries again


def test_recover_leaves_a_deployment_that_finished_since_the_list_was_read(bench: Bench) -> None:
    """Reconcile reads the open deployments, then recovers each whose model is not locked. A deploy that
    was in flight when the list was read and finished before the lock was looked at is not interrupted:
    recovering it would end it a second time (its end moved past a later deploy's start, seen as
    overlapping deployments under 8 concurrent clients) and could put back what that later deploy replaced."""
    old = bench.serving_now(1)
    deployment = interrupted(bench, "deploy", bench.record(2), old)  # listed while in flight
    finished = bench.registry.finish_deployment(
        deployment.id, outcome="ok", error=None, serving=None, model_state=ModelState.SERVING.value,
        audit=AuditEntry("alice", "deploy", "m", deployment.digest, "ok", "serving", 1))
    latest = bench.serving_now(3)  # a later deploy
    assert bench.deployer.recover(deployment) is None
    assert served(bench) == latest and bench.registry.get_model("m").active_digest == latest
    with bench.registry.engine.connect() as conn:
        end = conn.execute(select(schema.Deployment.finished_at)
                           .where(schema.Deployment.id == deployment.id)).scalar_one()
    assert end == finished.finished_at


def test_a_retry_due_is_taken_once_until_its_outcome_says_when_next() -> None:
    """The daemon asks every supervision round (a second) for the retries due, so "retry 1 in 5 s" fires at about
    5 s (issue 57: it waited for the next reconcile, 9.4 s); a retry still running is not due again, and its
    failure books the next one from then."""
    from controlplane.deploy.causes import RetryBook

    book = RetryBook(base_s=5.0, cap_s=300.0)
    first = book.failed("m", "d" * 64, "backend missing")
    assert book.take_due(first.due_at - 0.5) == []
    assert [r.model for r in book.take_due(first.due_at + 0.1)] == ["m"]
    assert book.take_due(first.due_at + 1.0) == []  # taken: the deploy runs, nothing sends it twice
    assert book.get("m") is not None  # still owed: status says so, the deploy reads it
    second = book.failed("m", "d" * 64, "backend missing")
    assert second.attempt == 2 and 9.5 < second.seconds_left() <= 10
    book.clear("m")
    assert book.take_due(second.due_at + 400) == []
