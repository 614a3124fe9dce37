"""A first start's deploys staged and ended many at a time (controlplane/startup/bulk.py).

A staged deploy goes through the steps around the launching tritonserver's own start-up: validated,
its intent recorded, its tree published (and `PUBLISHED` recorded) before the launch; `LOADED`
recorded, then verified, `VERIFIED` recorded, smoke-tested and committed after it. One at a time
(the `Deployer.stage` this module replaced), each of those records was a transaction of its own and each publish
an fsync of the serving root: at 2,000 models, staging took 22 s and ending the deploys 28 s where
Triton's start-up loaded them all in one (bench/results/first_start_phases.json: the registry 38 % and
61 % of them, the publishes' fsyncs a third of staging). Here the same steps run for a whole wave of
deploys, each step's records written for all of them in one transaction (controlplane/store/batches.py)
and the serving root made durable once, before the launch and before `PUBLISHED` is recorded. Each
deploy still has its own deployment row, steps, audit event, outcome and lock; one that fails a step
leaves the batch there and fails as any deploy does (`_recover_from_failure`: rolled back where a
previous digest exists, quarantined when its content is at fault).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from functools import partial

from controlplane.deploy.aliases import Target
from controlplane.deploy.engine import Deployer
from controlplane.deploy.steps import FAULT_POINTS, BringUp, Staged, fault_point
from controlplane.documents.results import Outcome
from controlplane.errors import TritonctlError
from controlplane.store.batches import DeploymentIntent
from controlplane.store.records import SnapshotRecord
from controlplane.validation.ensemblemembers import step_models
from controlplane.vocab import SERVING_STATES, Cause, DeployStep, ModelState, RecordedStep, Result, StepState


def stage_many(deployer: Deployer, items: Sequence[tuple[str, str]], actor: str, pool: Executor,
               overrides: Mapping[str, SnapshotRecord] | None = None) -> list[Staged | Outcome]:
    """Stage each (model, full digest), in order: the snapshots and models read at once,
    the intents recorded in one transaction, the trees published in `pool`, the serving root made durable
    once, `PUBLISHED` recorded in one transaction. Each Staged holds its model's lock until it ends."""
    if not items:
        return []
    registry = deployer.registry
    held: list[threading.Lock | None] = [deployer.lock(model) for model, _ in items]
    for lock in held:
        assert lock is not None
        lock.acquire()
    out: list[Staged | Outcome | None] = [None] * len(items)
    pending: list[tuple[int, Staged]] = []
    # the private names staged so far in this start (an ensemble binds to them): the steps staged before
    planned: dict[str, str] = {}
    if deployer.routed is not None:
        for staged_model, staged_snap in (overrides or {}).items():
            if not step_models(staged_snap.config):
                planned.setdefault(staged_model, deployer.routed.name_for(staged_model, staged_snap.digest, None)[0])
    try:
        started = time.monotonic()
        snaps = registry.snapshots(items)
        current = registry.ensure_models([model for model, _ in items])
        if deployer.routed is not None:  # what these models call by BLS is staged under its own name
            deployer.routed.mark_callees([(m, (snaps.get((m, d)) or registry.get_snapshot(m, d))) for m, d in items])
        for i, (model, digest) in enumerate(items):
            snap = snaps.get((model, digest)) or registry.get_snapshot(model, digest)
            record = current[model]
            previous = record.active_digest if record.state in SERVING_STATES else None
            op = deployer._operation(model, snap.digest, previous, actor, "deploy", None, started)
            op.emit(DeployStep.VALIDATE, StepState.START)
            refusal = deployer._refusal(snap, force=False, overrides=overrides)
            if refusal is not None:
                _release(held, i)
                out[i] = op.refuse(*refusal)
                continue
            op.emit(DeployStep.VALIDATE, StepState.OK)
            if deployer.routed is not None:  # under its private name; switched once loaded (finish_many)
                try:  # an ensemble binds to its steps' names: staged in this start, or routed now
                    name, binding = deployer.routed.name_for(model, snap.digest, snap.config, planned)
                except TritonctlError as exc:
                    _release(held, i)
                    out[i] = op.refuse(str(exc), Cause.ENVIRONMENT)
                    continue
                planned[model] = name
                ticket = deployer.guard.admit(model, snap.digest, snap.config, None, name)
                b = deployer.routed.bring_up_of(model, snap.digest, snap, name, binding, reload=False)
                b.sync = False
            else:
                ticket = deployer.guard.admit(model, snap.digest, snap.config, previous)
                b = BringUp(model, snap.digest, snap.config, snap.served_versions, sync=False)
            pending.append((i, Staged(op, snap, b, deployer.lock(model), ticket)))
        staged = [s for _, s in pending]
        begun = registry.begin_deployments([DeploymentIntent(s.op.model, s.op.kind, s.op.digest, s.op.previous,
                                                             s.op.actor) for s in staged])
        for s, deployment in zip(staged, begun, strict=True):
            s.op.deployment = deployment
        if staged:
            fault_point("after_intent")

        def publish(s: Staged) -> None:  # the host's capability check needs the server: its load's reason says it,
            # but whether it completes configs is known before it runs (a model it would load incomplete)
            deployer.steps.check_completion(s.bring_up.config, s.bring_up.digest)
            deployer._bring_up(s.op, s.bring_up, record=False, start="publish", stop="load")

        failed = _each(pool, publish, staged)
        deployer.serving.sync()
        _advance(deployer, [s for s in staged if s.model not in failed], RecordedStep.PUBLISHED)
        for i, s in pending:
            held[i] = None
            out[i] = s if s.model not in failed else _failed(deployer, s, failed[s.model])
    except BaseException:
        for i, s in pending:
            if held[i] is not None:
                deployer.guard.settle(s.ticket, False)
        for i in range(len(held)):
            _release(held, i)
        raise
    return [o for o in out if o is not None]


def finish_many(deployer: Deployer, staged: Sequence[Staged], indexed: Mapping[str, list[str]],
                pool: Executor) -> list[Outcome]:
    """End the deploys that tritonserver's start-up loaded (`Deployer.finish_staged` ends the others, one
    by one; `indexed`: each one's READY versions in the repository index taken after it): `LOADED`
    recorded for all, each verified in `pool`, `VERIFIED` recorded for those that passed, each
    smoke-tested, and those that passed committed in one transaction; one that failed a step fails there
    as any deploy does."""
    outcomes: list[Outcome] = []
    live = list(staged)
    try:
        for s in live:
            s.op.emit(DeployStep.LOAD, StepState.OK, "loaded in tritonserver's start-up", s.bring_up.digest)
            s.bring_up.indexed = indexed.get(s.bring_up.served_as)
        _advance(deployer, live, RecordedStep.LOADED)
        for step, recorded in (("verify", RecordedStep.VERIFIED), ("smoke", None)):
            stop = "smoke" if step == "verify" else None

            def take(s: Staged, step: str = step, stop: str | None = stop) -> None:
                deployer._bring_up(s.op, s.bring_up, record=False, start=step, stop=stop)

            failed = _each(pool, take, live)
            failing = [s for s in live if s.model in failed]
            live = [s for s in live if s.model not in failed]
            outcomes += pool.map(partial(_failed_of, deployer, failed), failing)
            if recorded is not None:
                _advance(deployer, live, recorded)
        if live and deployer.routed is not None:  # one switch of the gateway for the whole chunk
            live = _switched(deployer, live, outcomes)
        if live:
            fault_point("before_commit")
        messages = {s.model: f"serving {s.bring_up.digest[:12]} (versions {', '.join(s.bring_up.ready)})"
                    for s in live}
        for s in live:
            s.op.emit(DeployStep.COMMIT, StepState.START, messages[s.model])
        deployer.registry.finish_deployments([s.op.ending(Result.OK, messages[s.model], state=ModelState.SERVING,
                                                          serving=s.op.served(s.bring_up.ready)) for s in live])
        done, live = live, []
        for s in done:
            try:
                outcomes.append(s.op.outcome(Result.OK, messages[s.model], s.op.digest))
                if s.snap.quarantined:
                    deployer.registry.set_quarantine(s.model, s.bring_up.digest, None)
                deployer.serving.prune(s.model)
                s.op.emit(DeployStep.COMMIT, StepState.OK, messages[s.model])
            finally:
                deployer.guard.settle(s.ticket, True)
                s.lock.release()
    finally:
        for s in live:  # a registry write failed: the deploys it left open are recovered at the next start
            deployer.guard.settle(s.ticket, False)
            s.lock.release()
    return outcomes


def _switched(deployer: Deployer, live: list[Staged], outcomes: list[Outcome]) -> list[Staged]:
    """Route every public name of `live` to its staged name in one gateway update; when the gateway does
    not take it, each deploy fails as any deploy whose switch failed (its name taken out, retried)."""
    try:
        deployer.aliases.switch({s.model: Target(s.bring_up.served_as, s.bring_up.digest) for s in live})
    except TritonctlError as exc:
        outcomes += [_failed(deployer, s, exc) for s in live]
        return []
    return live


def _each(pool: Executor, take: Callable[[Staged], None], staged: Sequence[Staged]) -> dict[str, TritonctlError]:
    """`take` of each in `pool`; the ones that failed, with their errors."""
    def one(s: Staged) -> TritonctlError | None:
        try:
            take(s)
        except TritonctlError as exc:  # SnapshotError, TritonError, VerifyError are TritonctlErrors
            return exc
        return None

    return {s.model: exc for s, exc in zip(staged, pool.map(one, staged), strict=True) if exc is not None}


def _advance(deployer: Deployer, staged: Sequence[Staged], step: RecordedStep) -> None:
    """`step` recorded for each deployment in one transaction, then its kill point (tests' TRITONCTL_FAULT)."""
    if not staged:
        return
    deployer.registry.advance_all([s.op.deployment.id for s in staged if s.op.deployment is not None], step.value)
    if step in FAULT_POINTS:
        fault_point(FAULT_POINTS[step])


def _failed(deployer: Deployer, s: Staged, exc: TritonctlError) -> Outcome:
    """A staged deploy that failed a step: failed as any deploy (rolled back, quarantined), its lock released."""
    outcome: Outcome | None = None
    try:
        outcome = deployer._recover_from_failure(s.op, exc, s.bring_up.served_as)
        return outcome
    finally:
        deployer.guard.settle(s.ticket, False)
        s.lock.release()


def _failed_of(deployer: Deployer, failed: Mapping[str, TritonctlError], s: Staged) -> Outcome:
    return _failed(deployer, s, failed[s.model])


def _release(held: list[threading.Lock | None], i: int) -> None:
    lock = held[i]
    held[i] = None
    if lock is not None:
        lock.release()
