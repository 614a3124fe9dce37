"""The deploy engine's plans: a change set (an ensemble and the steps that change with it) deployed as
one unit, the old pipeline answering until the new one answers; and its crash recovery.

Why: Triton swaps one model at a time. When a step's outputs are renamed together with the
ensemble's mapping, no order of per-model reloads serves a consistent pipeline at every moment
(shared/TRITON_NOTES.md, "Ensembles whose steps change together"), and a step's config.pbtxt is
shared by all its versions. tritonctl owns the serving tree, so a plan stages under private names:

1. each changed step is published and loaded under `<step>__<8 hex of its digest>` (config `name`
   rewritten; names.py reserves the pattern), verified READY with its digest and smoke-tested;
2. each serving ensemble over those steps is reloaded pointed at the private names (stamped with an
   interim digest `<digest>+changeset-<id>`); the old ensemble answers until the new one is READY;
3. the public steps are deployed as any model (`Deployer.deploy`);
4. each ensemble is reloaded pointed back at the public names, verified and smoke-tested;
5. the private names are unloaded and unpublished.

Every load goes through the same `TritonSteps` as a model deployed alone (the host's capability
check, its load wrapper, verify, smoke), and every member's deployment row and audit event is a
`DeployOperation`'s, so a model deployed in a set is recorded as it would be alone. A failure before
step 3 puts every ensemble back; only content that failed by its own fault is quarantined. A failure
from step 3 on is undone in reverse. What forms a set and in what order is controlplane.intake.changeset.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import AbstractContextManager, ExitStack
from dataclasses import dataclass, field
from typing import Any, Protocol

from google.protobuf import text_format

from controlplane.deploy.aliases import private_name
from controlplane.deploy.causes import environment_cause
from controlplane.deploy.publish import ServingRepository
from controlplane.deploy.steps import BringUp, DeployOperation, LoadGuard, ProgressFn, TritonSteps, ms_since
from controlplane.documents.results import Outcome, Progress
from controlplane.errors import TritonctlError
from controlplane.names import is_private_name
from controlplane.snapshot import CONFIG_FILE
from controlplane.store.records import DeploymentRecord, ServingRecord
from controlplane.store.registry import AuditEntry, Registry
from controlplane.triton.client import DIGEST_PARAMETER
from controlplane.validation.ensemblemembers import require_members, step_models
from controlplane.validation.modelconfig import parse_config_text, stamp_parameter
from controlplane.vocab import SERVING_STATES, Cause, ModelState, Result

log = logging.getLogger("tritonctl.changeset")

ACTION = "changeset"


def audit_set(registry: Registry, actor: str, set_id: str, members: Sequence[Member], outcome: str, message: str,
              started: float) -> None:
    """A change set's own audit event: its id, members and how it ended (beside each member's)."""
    detail = {"id": set_id, "members": [m.to_json() for m in members], "message": message}
    registry.audit(AuditEntry(actor, ACTION, None, None, outcome, json.dumps(detail), ms_since(started)))


def rename_config(text: str, name: str) -> str:
    """config.pbtxt text with its `name` set to `name` (canonical protobuf text)."""
    config = parse_config_text(text, CONFIG_FILE)
    config.name = name
    return str(text_format.MessageToString(config))


def point_steps(text: str, names: dict[str, str]) -> str:
    """An ensemble's config.pbtxt text with each step's model_name mapped through `names`."""
    config = parse_config_text(text, CONFIG_FILE)
    for step in config.ensemble_scheduling.step:
        if step.model_name in names:
            step.model_name = names[step.model_name]
    return str(text_format.MessageToString(config))


@dataclass
class Member:
    """One model of a plan: what it deploys and what served before."""

    model: str
    digest: str
    previous: str | None
    ensemble: bool
    steps: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return self.digest != self.previous

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "digest": self.digest, "previous_digest": self.previous,
                "ensemble": self.ensemble, "changed": self.changed}


def serving_digest(registry: Registry, model: str) -> str | None:
    """The digest `model` serves now by the registry (None: it serves nothing)."""
    current = registry.find_model(model)
    if current is None or current.state not in SERVING_STATES or not current.active_digest:
        return None
    return current.active_digest


def serving_member(registry: Registry, model: str, digest: str, config: dict[str, Any] | None) -> Member:
    """`model` to deploy `digest` (recorded with `config`), against what it serves now."""
    steps = step_models(config)
    return Member(model, digest, serving_digest(registry, model),
                  bool(steps) or (config or {}).get("platform") == "ensemble", steps)


def order(members: Sequence[Member]) -> list[Member]:
    """Steps before the ensembles over them (nested ensembles after their inner ones)."""
    left = list(members)
    out: list[Member] = []
    while left:
        waiting = {m.model for m in left}
        ready = [m for m in left if not m.ensemble or not any(s in waiting and s != m.model for s in m.steps)]
        if not ready:  # a cycle: Triton refuses it at load; keep a stable order
            ready = left[:1]
        taken = {id(m) for m in ready}
        out.extend(ready)
        left = [m for m in left if id(m) not in taken]
    return out


@dataclass(frozen=True)
class Plan:
    """What `Deployer.run` deploys: one model, or an ordered change set (steps before ensembles)."""

    members: tuple[Member, ...]
    force: bool = False
    kind: str = "deploy"
    analysis: str = ""  # a bake's set rollback (controlplane/bake/baker.py): the figures that failed it


    @classmethod
    def of(cls, members: Iterable[Member], *, force: bool = False) -> Plan:
        return cls(tuple(order(list(members))), force=force)

    @property
    def label(self) -> str:
        return ",".join(m.model for m in self.members)


class SetFailed(TritonctlError):
    """A step of a change set failed; `model` is the member at fault, `own_fault` whether its content is."""

    def __init__(self, message: str, model: str, own_fault: bool) -> None:
        super().__init__(message)
        self.model = model
        self.own_fault = own_fault


class ModelDeploys(Protocol):
    """What a plan asks of the Deployer (controlplane.deploy.engine): its parts and its one-model deploy."""

    registry: Registry
    serving: ServingRepository
    steps: TritonSteps
    guard: LoadGuard

    def lock(self, model: str) -> AbstractContextManager[Any]: ...

    def deploy(self, model: str, digest: str, actor: str, *, force: bool = ..., kind: str = ...,
               progress: ProgressFn | None = ...) -> Outcome: ...

    def roll_back_analysis(self, model: str, digest: str, previous: str, actor: str,
                           reason: str) -> Outcome | None: ...

    def report(self, outcome: Outcome) -> None: ...


class Admissions:
    """The memory budget's tickets for one change set's loads (the Deployer's guard, as for a model
    deployed alone). A step staged under its private name is admitted before its load, beside the
    public model's content, and settled (measured) just before the private name is dropped: it counts
    against the budget for as long as it is loaded. An ensemble is admitted before its interim switch
    and settled after its switch back (or its put-back). The public steps' deploys admit themselves."""

    def __init__(self, guard: LoadGuard) -> None:
        self.guard = guard
        self._tickets: dict[str, Any] = {}
        self._lock = threading.Lock()

    def admit(self, key: str, model: str, digest: str, config: Any, previous: str | None,
              name: str | None = None) -> None:
        """Raises the guard's EnvironmentFault (BudgetError) when the load does not fit."""
        ticket = self.guard.admit(model, digest, config, previous, name)
        with self._lock:
            self._tickets[key] = ticket

    def settle(self, key: str, loaded: bool) -> None:
        with self._lock:
            if key not in self._tickets:
                return
            ticket = self._tickets.pop(key)
        self.guard.settle(ticket, loaded)

    def settle_rest(self) -> None:
        """Whatever is still admitted when the set ends (a failure path): released, nothing measured."""
        with self._lock:
            keys = list(self._tickets)
        for key in keys:
            self.settle(key, False)


class SetRunner:
    """Runs change-set plans for the Deployer, and recovers one a crash interrupted."""

    def __init__(self, deployer: ModelDeploys) -> None:
        self.d = deployer
        self.analysis = ""  # the plan running now is a bake's set rollback, failed by these figures

    def operation(self, member: Member, actor: str, progress: ProgressFn | None) -> DeployOperation:
        return DeployOperation(self.d.registry, self.d.report, member.model, member.digest, member.previous, actor,
                               "rollback" if self.analysis else "deploy", progress=progress)

    def _deploy(self, member: Member, actor: str, force: bool, progress: ProgressFn | None) -> Outcome | None:
        """A member's own deploy; in a bake's set rollback, its rollback to `member.digest` (the Deployer's
        `roll_back_analysis`: outcome `rolled_back`, cause `analysis`; None: the baked digest no longer serves)."""
        if not self.analysis:
            return self.d.deploy(member.model, member.digest, actor, force=force, progress=progress)
        assert member.previous is not None, "a set rollback member without the digest it leaves"
        return self.d.roll_back_analysis(member.model, member.previous, member.digest, actor, self.analysis)

    def _done(self, result: Outcome | None) -> bool:
        """Whether a member's `_deploy` did what the plan asked."""
        if result is not None and self.analysis:
            return result.outcome == Result.ROLLED_BACK and result.cause == Cause.ANALYSIS
        return result is not None and result.succeeded

    def _commit(self, op: DeployOperation, member: Member, versions: list[str], message: str) -> None:
        """A staged ensemble's deployment ends: committed, or in a bake's set rollback, rolled back (analysis)."""
        if not self.analysis:
            op.commit(versions, message)
            return
        serving = ServingRecord(member.model, member.digest, [int(v) for v in versions if v.isdigit()])
        op.end(Result.ROLLED_BACK, f"rolled back to {member.digest[:12]} with its change set: {self.analysis}",
               error=self.analysis, state=ModelState.SERVING, active=member.digest, serving=serving,
               cause=Cause.ANALYSIS)

    def run(self, plan: Plan, actor: str, progress: ProgressFn | None) -> Outcome:
        self.analysis = plan.analysis
        try:
            return self._run(plan, actor, progress)
        finally:
            self.analysis = ""

    def _run(self, plan: Plan, actor: str, progress: ProgressFn | None) -> Outcome:
        started = time.monotonic()
        set_id = secrets.token_hex(4)
        steps: list[Progress] = []
        members, force = list(plan.members), plan.force

        def emit(p: Progress) -> None:
            steps.append(p)
            log.log(logging.WARNING if p.state == "failed" else logging.DEBUG,
                    "changeset %s: %s %s %s %s", set_id, p.model, p.step, p.state, p.message)
            if progress:
                progress(p)

        changed = [m for m in members if m.changed or force]
        if not changed:
            return Outcome(plan.label, ACTION, "noop", None, None, "every member already serves its source content")
        snaps = [self.d.registry.get_snapshot(m.model, m.digest) for m in changed]
        bad = next((s for s in snaps if not s.valid or (s.quarantined and not force)), None)
        if bad is not None:
            why = f"invalid: {bad.first_error}" if not bad.valid else "quarantined; use --force to retry"
            message = f"{bad.model} {bad.digest[:12]} is {why}"
            self._audit(actor, set_id, members, "failed", message, started)
            return Outcome(plan.label, ACTION, Result.FAILED, None, None, message, ms_since(started), steps,
                           Cause.CONTENT)
        changed_steps = [m for m in changed if not m.ensemble]
        staged = [m for m in members if m.ensemble and m.previous and set(m.steps) & {s.model for s in changed_steps}]
        if staged and (len(changed) > 1 or any(m.ensemble for m in changed)):
            outcome, message = self._staged(set_id, members, changed_steps, staged, actor, emit, force)
        else:
            outcome, message = self._in_order(changed, actor, progress, force)
        if self.analysis and outcome == "deployed":  # a bake's set rollback went through
            outcome, message = Result.ROLLED_BACK.value, f"rolled back as a set ({message}): {self.analysis}"
            self._audit(actor, set_id, members, outcome, message, started)
            return Outcome(plan.label, ACTION, Result.ROLLED_BACK, None, None, f"change set {set_id}: {message}",
                           ms_since(started), steps, Cause.ANALYSIS)
        self._audit(actor, set_id, members, outcome, message, started)
        result = "ok" if outcome == "deployed" else outcome
        return Outcome(plan.label, ACTION, result, None, None, f"change set {set_id}: {message}", ms_since(started),
                       steps, Cause.NONE if result == "ok" else Cause.CONTENT)

    def _audit(self, actor: str, set_id: str, members: list[Member], outcome: str, message: str,
               started: float) -> None:
        audit_set(self.d.registry, actor, set_id, members, outcome, message, started)

    def _in_order(self, changed: list[Member], actor: str, progress: ProgressFn | None,
                  force: bool) -> tuple[str, str]:
        """No serving pipeline to keep answering: steps first, then ensembles, each as any model."""
        done: list[str] = []
        for member in changed:
            result = self._deploy(member, actor, force, progress)
            if not self._done(result):
                said = result.message if result is not None else f"no longer serves {(member.previous or '')[:12]}"
                return ("rolled_back" if result is not None and result.outcome == "rolled_back" else "failed",
                        f"{member.model}: {said}" + (f" (deployed before it: {', '.join(done)})" if done else ""))
            done.append(member.model)
        return "deployed", f"deployed {', '.join(done)}"

    # -- the staged switch -------------------------------------------------------------------------

    def _staged(self, set_id: str, members: list[Member], changed_steps: list[Member], staged: list[Member],
                actor: str, emit: ProgressFn, force: bool) -> tuple[str, str]:
        admissions = Admissions(self.d.guard)
        try:
            return self._staged_admitted(set_id, members, changed_steps, staged, actor, emit, force, admissions)
        finally:
            admissions.settle_rest()

    def _staged_admitted(self, set_id: str, members: list[Member], changed_steps: list[Member],
                         staged: list[Member], actor: str, emit: ProgressFn, force: bool,
                         admissions: Admissions) -> tuple[str, str]:
        privates = {step.model: private_name(step.model, step.digest) for step in changed_steps}
        interim: list[Member] = []
        ops: dict[str, DeployOperation] = {}
        stamp = f"+changeset-{set_id}"
        with ExitStack() as stack:
            for member in sorted(staged, key=lambda m: m.model):
                stack.enter_context(self.d.lock(member.model))  # reconcile leaves them alone meanwhile
            try:
                _each(changed_steps, lambda step: self._load_private(step, privates[step.model], emit, admissions))
                for ensemble in staged:
                    if ensemble.changed:
                        ops[ensemble.model] = self.operation(ensemble, actor, None)
                        ops[ensemble.model].begin()
                    config = self.d.registry.get_snapshot(ensemble.model, ensemble.digest).config
                    admissions.admit(ensemble.model, ensemble.model, ensemble.digest, config, ensemble.previous)
                    interim.append(ensemble)
                    self._switch(ensemble, privates, f"{ensemble.digest}{stamp}", "interim", emit)
            except TritonctlError as exc:
                message = self._fail_before_switch(exc, changed_steps, interim, ops, actor, emit)
                self._drop_privates(privates, admissions)
                return "rolled_back", message
            # The new pipeline answers through the private names: the public steps may change now.
            results = _each(changed_steps, lambda step: self._deploy(step, actor, force, emit), raise_first=False)
            public_done = [step for step, result in zip(changed_steps, results, strict=True) if self._done(result)]
            failure = next((f"{step.model}: {result.message if result is not None else 'deploy raised'}"
                            for step, result in zip(changed_steps, results, strict=True)
                            if not self._done(result)), None)
            ready: dict[str, list[str]] = {}
            if failure is None:
                switched: list[Member] = []
                try:
                    for ensemble in staged:
                        ready[ensemble.model] = self._switch(ensemble, {}, ensemble.digest, "switch", emit,
                                                             ops.get(ensemble.model))
                        switched.append(ensemble)
                except TritonctlError as exc:
                    failure = f"{ensemble.model}: {exc}"
                    if ensemble.changed and _environment(exc) is None:
                        self.d.registry.set_quarantine(ensemble.model, ensemble.digest, str(exc))
                    for back in [*switched, ensemble]:  # the interim pipeline answers again
                        _quietly(self._switch, back.model, back, privates, f"{back.digest}{stamp}", "interim", emit)
            if failure is not None:
                self._undo_after_switch(public_done, staged, ops, failure, actor, emit)
                self._drop_privates(privates, admissions)
                return "rolled_back", f"rolled back: {failure}"
            for ensemble in staged:
                versions = ready[ensemble.model]
                if ensemble.model in ops:
                    self._commit(ops[ensemble.model], ensemble, versions,
                                 f"serving {ensemble.digest[:12]} (versions {', '.join(versions)})")
                self.d.serving.prune(ensemble.model)
                admissions.settle(ensemble.model, True)
        self._drop_privates(privates, admissions)
        # changed ensembles that did not need staging (new, or over unchanged steps): as any deploy
        rest = [m for m in members if m.ensemble and m.changed and m not in staged]
        for member in rest:
            result = self._deploy(member, actor, force, emit)
            if not self._done(result):
                return "failed", f"{member.model}: {result.message if result is not None else 'no longer serves'}"
        names = ", ".join(m.model for m in [*changed_steps, *staged, *rest])
        return "deployed", f"deployed {names} with the old pipeline answering until the new one did"

    def _load_private(self, step: Member, name: str, emit: ProgressFn, admissions: Admissions) -> None:
        """Stage `step` under `name`: admitted by the memory budget beside the public model (which keeps
        serving), then brought up as any load (checked, published, loaded, verified, smoke-tested)."""
        emit(Progress(step.model, "stage", "start", f"as {name}", step.digest))
        try:
            snap = self.d.registry.get_snapshot(step.model, step.digest)
            admissions.admit(name, step.model, step.digest, snap.config, None, name=name)
            try:
                self.d.steps.bring_up(BringUp(
                    step.model, step.digest, snap.config, snap.served_versions, name=name,
                    rewrite=lambda text: stamp_parameter(rename_config(text, name), DIGEST_PARAMETER, step.digest)))
            except TritonctlError:
                admissions.settle(name, False)
                raise
        except TritonctlError as exc:
            emit(Progress(step.model, "stage", "failed", str(exc), step.digest))
            raise SetFailed(f"{step.model} (staged as {name}): {exc}", step.model, True) from exc
        emit(Progress(step.model, "stage", "ok", f"{name} READY", step.digest))

    def _switch(self, ensemble: Member, names: dict[str, str], stamp: str, what: str, emit: ProgressFn,
                op: DeployOperation | None = None) -> list[str]:
        """Bring the ensemble's content up with its steps mapped through `names`, stamped `stamp`. `op`: the
        ensemble's deployment, advanced like a deploy of it alone."""
        emit(Progress(ensemble.model, what, "start", digest=ensemble.digest))
        try:
            snap = self.d.registry.get_snapshot(ensemble.model, ensemble.digest)
            ready = self.d.steps.bring_up(BringUp(
                ensemble.model, ensemble.digest, snap.config, snap.served_versions, stamp=stamp,
                rewrite=lambda text: stamp_parameter(point_steps(text, names), DIGEST_PARAMETER, stamp)),
                reached=op.advance if op is not None else None).ready
        except TritonctlError as exc:
            emit(Progress(ensemble.model, what, "failed", str(exc), ensemble.digest))
            raise SetFailed(f"{ensemble.model}: {exc}", ensemble.model, ensemble.changed) from exc
        emit(Progress(ensemble.model, what, "ok", ", ".join(f"{k} -> {v}" for k, v in names.items()),
                      ensemble.digest))
        return ready

    # -- failure paths ---------------------------------------------------------------------------

    def _fail_before_switch(self, exc: TritonctlError, changed_steps: list[Member], interim: list[Member],
                            ops: dict[str, DeployOperation], actor: str, emit: ProgressFn) -> str:
        """Nothing public changed but the ensembles' interim content: put them back; quarantine the
        member whose own content failed; record each changed member's deployment as rolled back."""
        at_fault = exc.model if isinstance(exc, SetFailed) and exc.own_fault else None
        environment = _environment(exc)
        cause = Cause.ENVIRONMENT if environment else Cause.NONE
        for ensemble in reversed(interim):
            self._put_back(ensemble, emit)
        message = f"rolled back, the old pipeline kept answering: {exc}"
        if environment:
            message = f"{environment}: {message}"
        quarantined = ""
        for member in [*changed_steps, *interim]:
            if member.model == at_fault and environment is None:
                self.d.registry.set_quarantine(member.model, member.digest, str(exc))
                quarantined = member.model
        for member in changed_steps:
            if member.model == at_fault:
                op = self.operation(member, actor, None)
                op.begin()
                _end_back(op, Result.FAILED if environment else Result.ROLLED_BACK, message, cause)
        for model, op in ops.items():
            _end_back(op, Result.FAILED if environment or model != at_fault else Result.ROLLED_BACK, message, cause)
        if quarantined:
            message += f" ({quarantined} quarantined)"
        return message

    def _put_back(self, ensemble: Member, emit: ProgressFn) -> None:
        """An ensemble back on its previous content (its public steps), its interim trees pruned."""
        target = ensemble.previous or ensemble.digest
        _quietly(self._switch, ensemble.model, Member(ensemble.model, target, ensemble.previous, True, ensemble.steps),
                 {}, target, "restore", emit)
        self.d.serving.prune(ensemble.model)

    def _undo_after_switch(self, public_done: list[Member], staged: list[Member], ops: dict[str, DeployOperation],
                           failure: str, actor: str, emit: ProgressFn) -> None:
        """The public steps changed and a later step failed: the interim pipeline answers; put the public
        steps back, then the ensembles (which then drop the private names)."""
        for step in reversed(public_done):
            if step.previous:
                self.d.deploy(step.model, step.previous, actor, force=True, kind="rollback", progress=emit)
        for ensemble in reversed(staged):
            self._put_back(ensemble, emit)
            if ensemble.model in ops:
                _end_back(ops[ensemble.model], Result.ROLLED_BACK, f"rolled back: {failure}")

    def _drop_privates(self, privates: dict[str, str], admissions: Admissions | None = None) -> None:
        """Unload and unpublish the private names; each staged load is settled (measured) first, while
        it still runs, and stops counting against the budget as it goes."""
        for name in privates.values():
            try:
                if admissions is not None:
                    admissions.settle(name, True)
            finally:
                self.d.steps.take_out(name)

    # -- after a crash ---------------------------------------------------------------------------

    def recover(self, deployment: DeploymentRecord) -> Outcome | None:
        """A daemon stopped mid change set, with the ensemble of `deployment` serving its interim content
        (steps pointed at private names): when the public steps serve (or can be deployed with) content
        the new ensemble fits, point it at them and finish the deployment (rolled forward). None: not
        such a case, or it did not work; the Deployer's one-model recovery decides."""
        model, digest = deployment.model, deployment.digest
        if not digest or deployment.kind != "deploy":
            return None
        registry, triton = self.d.registry, self.d.steps.triton
        try:
            served = triton.served_digest(model) or ""
            if not served.startswith(f"{digest}+changeset-"):
                return None
            snap = registry.get_snapshot(model, digest)
            for name in _steps_of(triton.served_config(model)):
                if not is_private_name(name):
                    continue
                public, prefix = name.rsplit("__", 1)
                target = registry.get_snapshot(public, prefix).digest
                current = registry.find_model(public)
                if current is None or current.active_digest != target:  # the set's public step, forward too
                    if not self.d.deploy(public, target, "tritonctl", kind="deploy").succeeded:
                        return None
            require_members(registry, snap)
        except TritonctlError:
            return None  # the steps do not fit the new ensemble: the deployer puts the previous content back
        member = Member(model, digest, deployment.previous_digest, True, step_models(snap.config))
        op = DeployOperation.resume(registry, self.d.report, deployment)
        with self.d.lock(model):
            if not registry.deployment_open(deployment.id):
                return None  # its own operation finished it meanwhile
            try:
                ready = self._switch(member, {}, digest, "recover", lambda p: None)
            except TritonctlError as exc:
                log.warning("%s: rolling the interrupted change set forward failed: %s", model, exc)
                return None
            outcome = op.commit(ready, f"rolled forward: serving {digest[:12]}; interrupted change set finished "
                                       "after restart")
        self.d.serving.prune(model)
        log.warning("%s: rolled an interrupted change set forward to %s", model, digest[:12])
        return outcome

    def sweep(self, ensembles: Iterable[str]) -> tuple[list[str], bool]:
        """Unload and unpublish private step names a stopped daemon left behind, except those a loaded
        ensemble of `ensembles` still uses (unloading a step unloads its ensemble). (removed, all gone)."""
        names = [n for n in self.d.serving.models() if is_private_name(n)]
        if not names:  # the usual start: nothing to sweep, and no ensemble's config to read (N calls at N models)
            return [], True
        used: set[str] = set()
        for ensemble in ensembles:
            try:
                used |= set(_steps_of(self.d.steps.triton.served_config(ensemble)))
            except TritonctlError:
                continue
        drop = [n for n in names if n not in used]
        if drop:
            log.warning("removing private step names left by an interrupted change set: %s", ", ".join(drop))
            self._drop_privates({n: n for n in drop})
        return drop, len(drop) == len(names)


def _environment(exc: BaseException) -> str | None:
    """Whose fault: a staged load's failure is judged by what Triton or the host said (SetFailed wraps it)."""
    return environment_cause(exc.__cause__ if isinstance(exc, SetFailed) and exc.__cause__ else exc)


def _steps_of(config: dict[str, Any]) -> list[str]:
    return [str(step.get("model_name")) for step in config.get("ensemble_scheduling", {}).get("step", [])]


def _end_back(op: DeployOperation, result: Result, message: str, cause: Cause = Cause.NONE) -> None:
    """A member's deployment ended without its content serving: what served before serves. `cause`
    ENVIRONMENT: not the content's fault (no room in the memory budget, a host that lacks a backend):
    the control plane deploys it again later, as a model deployed alone."""
    op.end(result, message, error=message, state=ModelState.SERVING if op.previous else ModelState.FAILED,
           active=op.previous, cause=cause)


def _each(members: list[Member], fn: Callable[[Member], Any], raise_first: bool = True) -> list[Any]:
    """`fn` on every member at once (Triton loads different models concurrently); results in order.
    `raise_first`: re-raise the first member's exception after all finished; else None for it."""
    if len(members) <= 1:
        return [fn(m) for m in members] if raise_first else [_or_none(fn, m) for m in members]
    with ThreadPoolExecutor(max_workers=min(4, len(members)), thread_name_prefix="changeset") as pool:
        futures = [pool.submit(fn, m) for m in members]
        wait(futures)
    failed = next((f.exception() for f in futures if f.exception() is not None), None)
    if failed is not None and raise_first:
        raise failed
    return [None if f.exception() is not None else f.result() for f in futures]


def _quietly(fn: Callable[..., Any], model: str, *args: Any) -> None:
    try:
        fn(*args)
    except TritonctlError as exc:
        log.error("%s: putting it back failed: %s", model, exc)


def _or_none(fn: Callable[[Member], Any], member: Member) -> Any:
    try:
        return fn(member)
    except TritonctlError as exc:
        log.error("%s: %s", member.model, exc)
        return None
