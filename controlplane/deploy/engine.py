"""The per-model deploy / rollback / unload state machine.

One operation at a time per model (different models deploy concurrently). Every step is recorded in
the registry before it is taken, so a crash leaves a deployment that `recover` can finish or roll
back. A deploy is: publish a fresh tree → load → verify every served version READY and the served
config carrying the new digest → smoke requests → commit. On any failure the last good snapshot is
published as a fresh tree and loaded again (Triton ignores a re-point to an old tree; see
shared/TRITON_NOTES.md). When the content is at fault (controlplane.deploy.causes) the failing digest is
quarantined and the outcome is `rolled_back`; an environment fault ends `failed`, unquarantined, and
the control plane retries it later.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace

from controlplane.deploy import routedsets
from controlplane.deploy.aliases import Aliases, InPlace, Routed, Target
from controlplane.deploy.causes import classify
from controlplane.deploy.drain import Drainer
from controlplane.deploy.plans import Plan, SetRunner, serving_digest
from controlplane.deploy.publish import ServingRepository
from controlplane.deploy.routed import RoutedDeploys
from controlplane.deploy.steps import (
    FAULT_POINTS,
    BringUp,
    DeployOperation,
    LoadGuard,
    NoBudget,
    ProgressFn,
    Staged,
    TritonPort,
    TritonSteps,
    VerifyError,
    admission,
    fault_point,
)
from controlplane.documents.results import Outcome, Progress  # the operation's result: one definition, in results
from controlplane.errors import (
    EnvironmentFault,
    ModelConfigError,
    NotFoundError,
    SnapshotError,
    TritonctlError,
    TritonError,
    TritonTimeoutError,
    TritonUnavailableError,
)
from controlplane.snapshot import CONFIG_FILE, ContentStore
from controlplane.store.records import DeploymentRecord, ServingRecord, SnapshotRecord
from controlplane.store.registry import Registry
from controlplane.triton.host import TritonHost
from controlplane.validation.ensemblemembers import require_members
from controlplane.vocab import (
    SERVING_STATES,
    Cause,
    DeployStep,
    ModelState,
    RecordedStep,
    Result,
    StepState,
)

__all__ = ["Deployer", "DeployOperation", "Staged", "LoadGuard", "NoBudget", "Outcome", "Progress", "ProgressFn",
           "TritonPort", "VerifyError", "admission"]

log = logging.getLogger("tritonctl.deploy")

# After a load outlived its deadline, the rollback's load queues behind it in Triton: give it this long
# on top of the usual deadline before calling the rollback failed (reconcile retries it later anyway).
ROLLBACK_GRACE_S = 60.0


class Deployer:
    """Drives one Triton through deploys, rollbacks and unloads, recording each step."""

    def __init__(
        self,
        registry: Registry,
        content: ContentStore,
        serving: ServingRepository,
        triton: TritonPort,
        *,
        load_timeout_s: float = 120.0,
        on_outcome: Callable[[Outcome], None] | None = None,
        host: TritonHost | None = None,
        guard: LoadGuard | None = None,
        aliases: Aliases | None = None,
        drain_s: Callable[[], float] = lambda: 5.0,
        ensembles: Callable[[], dict[str, list[str]]] = dict,
    ) -> None:
        self.registry = registry
        self.guard: LoadGuard = guard or NoBudget()  # footprints and the memory budget
        self.store = content
        self.serving = serving
        self.triton = triton
        self.load_timeout_s = load_timeout_s
        self.on_outcome = on_outcome
        self.on_set: Callable[[Plan, Outcome], None] | None = None  # a change set ended (its bake: bake/baker.py)
        self.host = host  # capability checks and Triton's real reasons (None: a plain client)
        self.steps = TritonSteps(content, serving, triton, host, load_timeout_s, registry)
        self._plans = SetRunner(self)
        self._sets = threading.Lock()
        self._set_thread = threading.local()
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()
        # with a gateway (controlplane/deploy/aliases.py), every digest under its own name and one switch:
        # controlplane/deploy/routed.py; without one (InPlace) Triton reloads the model's own name
        self.aliases: Aliases = aliases if aliases is not None else InPlace()
        self.routed: RoutedDeploys | None = None
        self.drainer: Drainer | None = None
        if isinstance(self.aliases, Routed):
            routed = self.aliases
            self.drainer = Drainer(lambda model, name: bool(self.routed and self.routed.retire_now(model, name)),
                                   routed.in_use, routed.inflight, drain_s)
            self.routed = RoutedDeploys(self, routed, self.drainer, ensembles)

    # -- plans: one model, or a change set (controlplane/deploy/plans.py) -------------------------------

    def run(self, plan: Plan, actor: str, progress: ProgressFn | None = None) -> Outcome:
        """Deploy a plan: a single model (a set of one) as `deploy`, a change set with its staged switch."""
        if len(plan.members) == 1:
            member = plan.members[0]
            return self.deploy(member.model, member.digest, actor, force=plan.force, kind=plan.kind,
                               progress=progress)
        with self._sets:  # one change set at a time
            # what each member serves is read now: a set that ran since the plan was made changed it
            members = tuple(replace(m, previous=serving_digest(self.registry, m.model)) for m in plan.members)
            run = replace(plan, members=members)
            self._set_thread.active = True  # its members' outcomes are reported in this thread
            try:
                outcome = (self._plans.run(run, actor, progress) if self.routed is None
                           else routedsets.roll_back_set(self.routed, run, actor, progress) if run.analysis
                           else routedsets.run_set(self.routed, run, actor, progress))
            finally:
                self._set_thread.active = False
        if self.on_set is not None:
            self.on_set(run, outcome)
        return outcome

    def in_change_set(self) -> bool:
        """Whether the calling thread runs a change set now (an outcome subscriber tells a set's member from a
        deploy of its own: a bake does not bake a set's members one by one)."""
        return bool(getattr(self._set_thread, "active", False))

    def sweep(self, ensembles: Iterable[str]) -> bool:
        """Private step names a stopped daemon left behind, removed unless a set runs now or a loaded
        ensemble of `ensembles` still uses them. True when none is left."""
        if not self._sets.acquire(blocking=False):
            return False
        try:
            if self.routed is not None:  # names nothing routes, drains or holds: drained at once, every round
                self.routed.sweep()  # (a step an ensemble used when its drain came is found here later)
                return False
            return self._plans.sweep(ensembles)[1]
        finally:
            self._sets.release()

    def report(self, outcome: Outcome) -> None:
        self._report(outcome)

    def lock(self, model: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(model, threading.Lock())

    def busy_models(self) -> list[str]:
        """Models with an operation in progress in this process."""
        with self._locks_guard:
            return sorted(model for model, lock in self._locks.items() if lock.locked())

    # -- the bring-up (controlplane/deploy/steps.py BRING_UP: the one sequence every path runs) ----------

    def _bring_up(self, op: DeployOperation, b: BringUp, *, record: bool = True, quiet: bool = False,
                  start: str | None = None, stop: str | None = None) -> BringUp:
        """Bring `b` up for the operation `op` (its own digest, or the one a rollback restores). `record`:
        advance the operation's deployment at each recorded step (and its kill point); `quiet`: stream no
        progress."""

        def emit(step: DeployStep, state: StepState, message: str) -> None:
            op.emit(step, state, message, b.digest)

        def reached(step: RecordedStep) -> None:
            op.advance(step)
            fault_point(FAULT_POINTS[step])

        return self.steps.bring_up(b, reached=reached if record else None, emit=None if quiet else emit,
                                   start=start, stop=stop)

    def _bring_up_recorded(self, op: DeployOperation, model: str, digest: str, *, reload: bool,
                           timeout_s: float | None = None, record: bool = True, quiet: bool = False) -> BringUp:
        """`digest` of `model` as the registry recorded it (its config and served versions), brought up."""
        snap = self.registry.get_snapshot(model, digest)
        return self._bring_up(op, BringUp(model, digest, snap.config, snap.served_versions, reload=reload,
                                          timeout_s=timeout_s), record=record, quiet=quiet)

    # -- operations -----------------------------------------------------------------------------

    def deploy(
        self,
        model: str,
        digest: str,
        actor: str,
        *,
        force: bool = False,
        kind: str = "deploy",
        progress: ProgressFn | None = None,
    ) -> Outcome:
        """Deploy a recorded snapshot; roll back to the last good one on any failure."""
        with self.lock(model):
            return self._deploy_locked(model, digest, actor, force=force, kind=kind, progress=progress)

    def _operation(self, model: str, digest: str | None, previous: str | None, actor: str, kind: str,
                   progress: ProgressFn | None = None, started: float | None = None) -> DeployOperation:
        return DeployOperation(self.registry, self._report, model, digest, previous, actor, kind, progress=progress,
                               started=time.monotonic() if started is None else started)

    def _deploy_locked(
        self, model: str, digest: str, actor: str, *, force: bool, kind: str, progress: ProgressFn | None
    ) -> Outcome:
        started = time.monotonic()
        snap = self.registry.get_snapshot(model, digest)
        current = self.registry.ensure_model(model)
        previous = current.active_digest if current.state in SERVING_STATES else None
        digest = snap.digest
        op = self._operation(model, digest, previous, actor, kind, progress, started)
        op.emit(DeployStep.VALIDATE, StepState.START)
        refusal = self._refusal(snap, force)
        if refusal is not None:
            return op.refuse(*refusal)
        op.emit(DeployStep.VALIDATE, StepState.OK)
        if previous == digest and not force and self._serves(model, digest):
            return op.skip(f"already serving {digest[:12]}")
        if self.routed is not None:  # admitted beside what serves, under its own name (deploy/routed.py)
            return self.routed.deploy_admitted(op, snap, None)
        try:
            ticket = self.guard.admit(model, digest, snap.config, previous)
        except EnvironmentFault as exc:  # no room within the memory budget: nothing was touched
            return op.refuse(str(exc), Cause.ENVIRONMENT)
        outcome: Outcome | None = None
        try:
            outcome = self._deploy_admitted(op, snap)
        finally:
            self.guard.settle(ticket, outcome is not None and outcome.outcome == Result.OK)
        return outcome

    def _deploy_admitted(self, op: DeployOperation, snap: SnapshotRecord) -> Outcome:
        model, digest = op.model, snap.digest
        op.begin()
        try:
            ready = self._bring_up(op, BringUp(model, digest, snap.config, snap.served_versions)).ready
        except (TritonError, VerifyError, SnapshotError, TritonctlError) as exc:
            return self._recover_from_failure(op, exc)
        return self._committed(op, snap, ready)

    def _committed(self, op: DeployOperation, snap: SnapshotRecord, ready: list[str]) -> Outcome:
        model, digest = op.model, snap.digest
        fault_point("before_commit")
        message = f"serving {digest[:12]} (versions {', '.join(ready)})"
        op.emit(DeployStep.COMMIT, StepState.START, message)
        outcome = op.commit(ready, message)
        if snap.quarantined:
            self.registry.set_quarantine(model, digest, None)
        self.serving.prune(model)
        op.emit(DeployStep.COMMIT, StepState.OK, message)
        return outcome

    # -- a first start's loads in the launching tritonserver's own start-up (controlplane/startup/bulk.py) --
    # staged and, once that start-up loaded them, ended many at a time: controlplane/deploy/staged.py

    def finish_staged(self, staged: Staged, *, failure: TritonctlError | None = None) -> Outcome:
        """End a staged deploy (controlplane/deploy/staged.py `stage_many`) one by one: `failure`, it failed
        in tritonserver's start-up (rolled back like any failed deploy); else the server was launched
        without it and it is loaded by its own request now."""
        op, b = staged.op, staged.bring_up
        outcome: Outcome | None = None
        try:
            try:
                if failure is not None:
                    raise failure
                self._bring_up(op, b, start="load")
                if self.routed is not None:
                    self.aliases.switch({op.model: Target(b.served_as, b.digest)})
            except (TritonError, VerifyError, SnapshotError, TritonctlError) as exc:
                outcome = self._recover_from_failure(op, exc, b.served_as)
                return outcome
            outcome = self._committed(op, staged.snap, b.ready)
            return outcome
        finally:
            self.guard.settle(staged.ticket, outcome is not None and outcome.outcome == Result.OK)
            staged.lock.release()

    def _refusal(self, snap: SnapshotRecord, force: bool,
                 overrides: Mapping[str, SnapshotRecord] | None = None) -> tuple[str, Cause] | None:
        """Why a recorded snapshot is not sent to Triton (message, whose fault), or None."""
        refused = admission(snap, force=force, where="Triton")
        if refused is not None:
            return refused, Cause.NONE
        try:
            require_members(self.registry, snap, overrides)
        except EnvironmentFault as exc:  # an ensemble whose steps this daemon lacks yet: retried
            return str(exc), Cause.ENVIRONMENT
        except ModelConfigError as exc:  # an ensemble that does not fit the steps this daemon serves
            return str(exc), Cause.CONTENT
        return None

    def _serves(self, model: str, digest: str) -> bool:
        if self.routed is not None:
            return self.routed.routed_serves(model, digest)
        try:
            return self.triton.served_digest(model) == digest and bool(self.triton.ready_versions(model))
        except TritonctlError:
            return False

    def _recover_from_failure(self, op: DeployOperation, exc: Exception, name: str | None = None) -> Outcome:
        if self.routed is not None:  # nothing was switched: the new name goes, what served still serves
            return self.routed.failed(op, exc, name or op.model)
        model, digest, previous = op.model, op.require_digest(), op.previous
        error = str(exc)
        op.emit(DeployStep.DEPLOY, StepState.FAILED, error)
        op.advance(RecordedStep.ROLLING_BACK)
        fault_point("mid_rollback")
        fault = classify(exc)
        if fault.cause is Cause.TRITON_UNREACHABLE:
            # Not the content's fault: no quarantine. Put the serving repository back to what the
            # registry says serves; reconcile loads it when Triton is back.
            if previous:
                self.steps.publish(model, previous)
            message = f"tritonserver unreachable: {error}"
            return op.end(Result.FAILED, message, error=message,
                          state=ModelState.SERVING if previous else ModelState.FAILED, active=previous,
                          cause=fault.cause)
        if fault.cause.quarantines:
            self.registry.set_quarantine(model, digest, error)
            log.warning("%s %s quarantined: %s", model, digest[:12], error)
        else:
            # Not the content's fault (docs/operations.md "Failed deploys"): never quarantined, retried.
            error = f"{fault.reason}: {error}"
        if previous:
            # Triton cannot cancel a load that outlived our deadline; it finishes it before it
            # takes ours, so the rollback's load gets room for both.
            timeout = self.load_timeout_s + ROLLBACK_GRACE_S if isinstance(exc, TritonTimeoutError) else None
            return self._back_to(op, previous, error, fault.cause, timeout_s=timeout,
                                 result=Result.FAILED if fault.cause.retried else Result.ROLLED_BACK)
        self._take_out(model)
        return op.end(Result.FAILED, f"failed, nothing to roll back to: {error}", error=error,
                      state=ModelState.FAILED, active=None, serving=ServingRecord(model, None, []), cause=fault.cause)

    def _back_to(self, op: DeployOperation, previous: str, error: str, cause: Cause, *, result: Result,
                 timeout_s: float | None = None, committed: bool = False) -> Outcome:
        """Bring `previous` up again after `error` and end `op` with `result` (or `failed`, degraded, when it
        does not come up). `committed`: the digest left had been committed (a bake's rollback), so the
        operation is recorded step by step and `previous` serves again in the serving history."""
        model = op.model
        op.emit(DeployStep.ROLLBACK, StepState.START, f"restoring {previous[:12]}", previous)
        try:
            ready = self._bring_up_recorded(op, model, previous, reload=True, timeout_s=timeout_s,
                                            record=committed).ready
        except TritonctlError as rollback_exc:
            message = f"{error}; rollback to {previous[:12]} failed: {rollback_exc}"
            op.emit(DeployStep.ROLLBACK, StepState.FAILED, str(rollback_exc), previous)
            return op.end(Result.FAILED, message, error=message, state=ModelState.DEGRADED, active=previous,
                          cause=cause)
        message = f"rolled back to {previous[:12]}: {error}"
        self.serving.prune(model)
        op.emit(DeployStep.ROLLBACK, StepState.OK, message, previous)
        serving = ServingRecord(model, previous, [int(v) for v in ready if v.isdigit()]) if committed else None
        return op.end(result, message, error=error, state=ModelState.SERVING, active=previous, serving=serving,
                      cause=cause)

    def _take_out(self, model: str) -> None:
        """Nothing good to return to: take the broken model out of Triton and the serving repository."""
        self.steps.take_out(model)

    def unload(self, model: str, actor: str, dependents: bool = False, progress: ProgressFn | None = None) -> Outcome:
        with self.lock(model):
            current = self.registry.get_model(model)
            op = self._operation(model, None, current.active_digest, actor, "unload")
            op.begin()
            try:
                if self.routed is not None:  # the route first: the gateway answers with a clear error
                    self.routed.take_out_model(model)
                else:
                    self.triton.unload(model, dependents)
            except TritonctlError as exc:
                cause = Cause.TRITON_UNREACHABLE if isinstance(exc, TritonUnavailableError) else Cause.NONE
                return op.end(Result.FAILED, str(exc), error=str(exc), state=current.state,
                              active=current.active_digest, cause=cause)
            if self.routed is None:
                self.serving.unpublish(model)
            if progress:
                progress(Progress(model, DeployStep.UNLOAD, StepState.OK, "unloaded"))
            return op.end(Result.OK, "unloaded", state=ModelState.UNLOADED, active=None,
                          serving=ServingRecord(model, None, []))

    def evict(self, model: str, actor: str, reason: str, unless: Callable[[], bool] | None = None) -> bool:
        """Unload an idle model to make room (the memory budget, an on-demand model's idle time): audited as
        `evict`; False when an operation holds the model now (it is not waited for), when `unless()` says
        so under the model's lock (a lease taken meanwhile), or the unload failed."""
        lock = self.lock(model)
        if not lock.acquire(blocking=False):
            return False
        try:
            current = self.registry.get_model(model)
            if current.state not in SERVING_STATES or (unless is not None and unless()):
                return False
            op = self._operation(model, None, current.active_digest, actor, "evict")
            op.begin()
            try:
                if self.routed is not None:  # its requests wait while a request loads it again
                    self.routed.take_out_model(model, loadable=True)
                else:
                    self.triton.unload(model)
            except TritonctlError as exc:
                op.end(Result.FAILED, f"evict failed ({reason}): {exc}", error=str(exc), state=current.state,
                       active=current.active_digest)
                return False
            if self.routed is None:
                self.serving.unpublish(model)
            op.end(Result.OK, f"evicted ({reason})", state=ModelState.UNLOADED, active=None,
                   serving=ServingRecord(model, None, []))
            return True
        finally:
            lock.release()

    def previous_good(self, model: str) -> str:
        """The last digest that served before the active one (valid, not quarantined, not collected)."""
        current = self.registry.get_model(model)
        for entry in self.registry.serving_history(model, limit=200):
            if entry.digest is None or entry.digest == current.active_digest:
                continue
            snap = self.registry.get_snapshot(model, entry.digest)
            if snap.valid and not snap.quarantined and not snap.collected:
                return snap.digest
        raise NotFoundError(f"model '{model}' has no previous good version to roll back to")

    def rollback(self, model: str, actor: str, to: str | None = None, progress: ProgressFn | None = None) -> Outcome:
        target = self.registry.get_snapshot(model, to).digest if to else self.previous_good(model)
        return self.deploy(model, target, actor, force=to is not None, kind="rollback", progress=progress)

    def roll_back_analysis(self, model: str, digest: str, previous: str, actor: str, reason: str) -> Outcome | None:
        """Live traffic failed `digest`'s bake (controlplane/bake/baker.py): bring `previous` up again as a
        rollback does (recorded, verified, smoke-tested), ended `rolled_back` with cause `analysis` and
        `reason` (the figures). `digest` is not quarantined: `load --digest` may try it again. None when
        `digest` no longer serves (another operation came first)."""
        with self.lock(model):
            current = self.registry.get_model(model)
            if current.state not in SERVING_STATES or current.active_digest != digest:
                return None
            op = self._operation(model, previous, digest, actor, "rollback")
            op.begin()
            if self.routed is not None:  # a switch back: the bake kept `previous` loaded
                return self.routed.back_to(op, previous, reason, Cause.ANALYSIS, result=Result.ROLLED_BACK,
                                           committed=True)
            return self._back_to(op, previous, reason, Cause.ANALYSIS, result=Result.ROLLED_BACK, committed=True)

    def restore(self, model: str, digest: str, reason: str) -> Outcome | None:
        """Make Triton serve the registry's active digest again (reconcile, crash recovery). None: nothing to
        do, because the model stopped meaning to serve `digest` since the caller read the registry (an
        eviction or another deploy took the lock first; measured: a reconcile reloaded a model the memory
        budget had just evicted, and held memory nobody asked for)."""
        with self.lock(model):
            current = self.registry.get_model(model)
            if current.state not in SERVING_STATES or current.active_digest != digest:
                return None
            op = self._operation(model, digest, digest, "tritonctl", "restore")
            try:
                if self.routed is not None:
                    self.routed.restore(op, model, digest)
                else:
                    self._reload_admitted(op, model, digest)
            except TritonctlError as exc:
                message = f"restore of {digest[:12]} failed ({reason}): {exc}"
                self.registry.update_model(model, last_error=message)
                return op.audited(Result.FAILED, message, active=digest)
            message = f"restored {digest[:12]} ({reason})"
            if self.registry.get_model(model).state == ModelState.DEGRADED:
                self.registry.update_model(model, state=ModelState.SERVING.value)
            self.serving.prune(model)
            return op.audited(Result.OK, message, active=digest)

    def _reload_admitted(self, op: DeployOperation, model: str, digest: str) -> None:
        """Load recorded content again (a restore, a recovery's previous content) as a deploy loads:
        admitted by the memory budget first (room made, or BudgetError), its footprint measured after."""
        snap = self.registry.get_snapshot(model, digest)
        ticket = self.guard.admit(model, digest, snap.config, None)
        loaded = False
        try:
            self._bring_up(op, BringUp(model, digest, snap.config, snap.served_versions, reload=True),
                           record=False, quiet=True)
            loaded = True
        finally:
            self.guard.settle(ticket, loaded)

    def drain(self, model: str, bound_s: float | None = None) -> bool:
        """Wait until Triton runs no load or unload of `model` (one a killed daemon may have left).

        A first load or an unload shows as LOADING / UNLOADING in the repository index. A reload of
        a READY model shows READY throughout (measured), so the index cannot tell it; but Triton runs
        one load of a model at a time, so a load of the tree `serving/` already points at queues
        behind it, then loads nothing (the tree is unchanged and pre-compiled) — or finishes the
        interrupted publish → load, which is what the interrupted deploy wanted. Nothing is re-pointed
        here. The bound is the rollback's after a load deadline: the load deadline plus
        ROLLBACK_GRACE_S. Returns False when a load was still running at the bound.
        """
        bound = bound_s if bound_s is not None else self.load_timeout_s + ROLLBACK_GRACE_S
        deadline = time.monotonic() + bound
        while any(e.name == model and e.state in ("LOADING", "UNLOADING") for e in self.triton.index()):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
        if self.serving.current(model) is None:
            return True
        try:
            self.triton.load(model, max(1.0, deadline - time.monotonic()))
        except TritonTimeoutError:
            return False
        except TritonUnavailableError:
            raise
        except TritonctlError as exc:  # the interrupted content does not load: decided from what serves
            log.warning("%s: load of the interrupted tree after restart: %s", model, exc)
        return True

    def _serves_verified(self, op: DeployOperation, digest: str, smoke: bool) -> list[str] | None:
        """READY versions when Triton serves `digest` as recorded (and, with `smoke`, it passes the fresh
        content's steps from "verify" on), else None."""
        model = op.model
        try:
            snap = self.registry.get_snapshot(model, digest)
            tree = self.serving.current(model)
            if tree is None or digest not in (tree / CONFIG_FILE).read_text(errors="replace"):
                return None  # Triton serves it, but serving/ points elsewhere: publish it again
            b = BringUp(model, digest, snap.config, snap.served_versions, reload=not smoke, tree=tree)
            return self._bring_up(op, b, record=False, quiet=True, start="verify").ready
        except OSError:
            return None
        except TritonctlError as exc:
            log.info("%s: %s does not serve as recorded: %s", model, digest[:12], exc)
            return None

    def recover(self, deployment: DeploymentRecord) -> Outcome | None:
        """Finish, roll forward or roll back a deployment a crash interrupted.

        First `drain` (never re-point `serving/` under a load Triton may still run: its python stub
        would import one tree's code under the other's config); then decide from what Triton serves:
        the interrupted digest READY, verified and smoke-tested is committed (rolled forward); else
        the previous one is restored (without a reload when it already serves). None: Triton still
        ran a load at the bound; the deployment stays open and the next reconcile tries again. Also None
        when the deployment finished meanwhile: the list it came from was read while its own operation
        still ran (recovering it then would end it twice and could undo a later deploy).
        """
        if not self.registry.deployment_open(deployment.id):
            return None
        rolled = self._plans.recover(deployment) if self.routed is None else None  # a set's interim ensemble
        if rolled is not None:
            return rolled
        with self.lock(deployment.model):
            if not self.registry.deployment_open(deployment.id):
                return None
            op = DeployOperation.resume(self.registry, self._report, deployment)
            if self.routed is not None:  # the gateway's route says whether the switch happened
                return self.routed.recover(op, deployment)
            model, previous, digest = deployment.model, deployment.previous_digest, deployment.digest
            reason = f"interrupted at step '{deployment.step}' by a daemon stop"
            if not self.drain(model):
                log.warning("%s: Triton still loads it after the bound; recovery waits for the next round", model)
                return None
            if deployment.kind in ("unload", "evict"):
                self._take_out(model)
                return op.end(Result.OK, f"finished after restart; {reason}", state=ModelState.UNLOADED,
                              active=None, serving=ServingRecord(model, None, []))
            if digest and deployment.step != RecordedStep.ROLLING_BACK:
                ready = self._serves_verified(op, digest, smoke=True)
                if ready is not None:
                    message = f"rolled forward: serving {digest[:12]} (versions {', '.join(ready)}); {reason}"
                    outcome = op.commit(ready, message)
                    self.serving.prune(model)
                    return outcome
            if previous:
                if self._serves_verified(op, previous, smoke=False) is None:
                    try:
                        self._reload_admitted(op, model, previous)
                    except TritonctlError as exc:
                        message = f"{reason}; restoring {previous[:12]} failed: {exc}"
                        return op.end(Result.FAILED, message, error=message, state=ModelState.DEGRADED,
                                      active=previous)
                self.serving.prune(model)
                return op.end(Result.ROLLED_BACK, f"rolled back to {previous[:12]}: {reason}", error=reason,
                              state=ModelState.SERVING, active=previous)
            self._take_out(model)
            return op.end(Result.FAILED, f"failed: {reason} (no previous version)", error=reason,
                          state=ModelState.FAILED, active=None, serving=ServingRecord(model, None, []))

    def _report(self, outcome: Outcome) -> None:
        if self.on_outcome:
            self.on_outcome(outcome)
