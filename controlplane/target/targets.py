"""Where the operators' changes go, chosen once when the control plane is built: this host alone
(`HostTarget`: its Deployer, its change sets, its on-demand book) or the fleet (`FleetTarget`: a rollout
over every host, or with `host` one host, which the fleet then holds).

The verbs (controlplane/control_plane.py) check their arguments, resolve what to deploy, and hand the
change to their target; no verb asks which target it has. Each target is also the tags' `TagTarget`
(controlplane/ports.py): where tags live and how a tracked tag's digest is deployed depend on the target
alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from controlplane.deploy.causes import RetryBook
from controlplane.deploy.engine import Deployer
from controlplane.deploy.steps import ProgressFn
from controlplane.documents.results import HoldResult, LeaseResult, Outcome, PinResult, PolicyResult, Progress
from controlplane.errors import ConflictError, NotFoundError, UsageError
from controlplane.intake import tags
from controlplane.intake.changeset import ChangeSets
from controlplane.intake.decision import refuse_pinned
from controlplane.intake.flow import FollowTag, IntakePlan
from controlplane.memory.ondemand import OnDemand
from controlplane.store.records import ModelRecord, SnapshotRecord, iso
from controlplane.store.registry import AuditEntry, AuditQuery, Registry
from controlplane.validation.ensemblemembers import step_models
from controlplane.vocab import SERVING_STATES, Cause

MEMBER_DEPTH = 8  # an ensemble's members loaded first, at most this deep


def recorded_digest(registry: Registry, model: str, digest: str) -> str:
    """The full digest of `model`'s recorded content `digest` (a prefix), refused when gc collected it."""
    snap = registry.get_snapshot(model, digest)
    if snap.collected:
        raise ConflictError(f"snapshot {snap.digest[:12]} of '{model}' was collected by gc"
                            f"{_collected_when(registry, snap)}; load the source again with `tritonctl load {model}`")
    return snap.digest


def _collected_when(registry: Registry, snap: SnapshotRecord) -> str:
    for event in registry.query_audit(AuditQuery(action="gc", since=snap.last_seen, limit=1000))[::-1]:
        return f" at {iso(event.time)}"
    return ""


class Target(Protocol):
    """What the verbs hand a decided change to (HostTarget or FleetTarget). `host`: one host of a fleet
    ("" for all; a single host has no other). `fleet`: the fleet strategy, None on a single host."""

    @property
    def fleet(self) -> FleetStrategy | None: ...

    def run(self, planned: IntakePlan, actor: str) -> Outcome | None:
        """What the intake planned (controlplane/intake/flow.py); None when a tracked tag moved, or not."""
        ...

    def load(self, model: str, digest: str, actor: str, force: bool, progress: ProgressFn | None,
             host: str) -> Outcome: ...

    def load_set(self, models: list[str], actor: str, force: bool, progress: ProgressFn | None) -> Outcome: ...

    def unload(self, model: str, actor: str, dependents: bool, progress: ProgressFn | None, force: bool,
               host: str) -> Outcome: ...

    def rollback(self, model: str, actor: str, to: str | None, progress: ProgressFn | None, force: bool,
                 host: str) -> Outcome: ...

    def set_track(self, model: str, policy: str, actor: str, host: str) -> PolicyResult: ...

    def set_policy(self, model: str, policy: str, actor: str, host: str) -> PolicyResult: ...

    def set_pin(self, model: str, pinned: bool, actor: str, host: str) -> PinResult | HoldResult: ...

    def ensure(self, model: str, for_s: float, actor: str, progress: ProgressFn | None) -> LeaseResult: ...

    def renew_lease(self, model: str, lease: str, for_s: float) -> LeaseResult: ...

    def release_lease(self, model: str, lease: str) -> LeaseResult: ...

    # ports.TagTarget
    def tag_registry(self) -> Registry: ...

    def deploy_tagged(self, model: str, digest: str, actor: str, progress: ProgressFn | None) -> Outcome: ...

    def forget_retry(self, model: str) -> None: ...


class FleetStrategy(Protocol):
    """Where a decided change goes in a fleet (controlplane.fleet.member.FleetMember): a rollout over
    every host, or with `host` this host alone, which the fleet then holds. Passed to ControlPlane
    as a factory, so the fleet gets the plane it serves and the plane its target at construction."""

    def load(self, model: str, digest: str, actor: str, force: bool, progress: ProgressFn | None) -> Outcome: ...

    def held(self, model: str, host: str, actor: str, action: Callable[[], Outcome]) -> Outcome: ...

    def rollback(self, model: str, actor: str, to: str | None, progress: ProgressFn | None,
                 host: str) -> Outcome: ...

    def unload(self, model: str, actor: str, dependents: bool, progress: ProgressFn | None,
               host: str) -> Outcome: ...

    def set_pin(self, model: str, pinned: bool, actor: str, host: str) -> PinResult | HoldResult: ...

    def set_policy(self, model: str, policy: str, actor: str, host: str) -> PolicyResult: ...

    @property
    def registry(self) -> Registry: ...  # the shared registry (tags live there)

    def rollout(self, model: str, record: SnapshotRecord | None, actor: str, *, force: bool,
                progress: ProgressFn | None, kind: str = ...) -> Outcome: ...

    # on-demand models: placed on one host with room; leases through any host (controlplane/fleet/ondemand.py)
    def ensure(self, model: str, for_s: float, actor: str) -> LeaseResult: ...

    def renew_lease(self, model: str, lease: str, for_s: float) -> LeaseResult: ...

    def release_lease(self, model: str, lease: str) -> LeaseResult: ...


class HostTarget:
    """This host alone: its Deployer deploys, its change sets switch together, its on-demand book leases.

    `capture`: the content a model's source holds now, recorded (an ensemble's members that serve nothing
    are loaded first from their sources); `converge`: look at a model's source again (the watcher's path,
    so the usual rules decide); `policy_of`: a model's effective policy (the daemon's may change on
    SIGHUP)."""

    def __init__(self, registry: Registry, deployer: Deployer, changesets: ChangeSets, ondemand: OnDemand,
                 retries: RetryBook, *, capture: Callable[[str, str], str], converge: Callable[[str], None],
                 policy_of: Callable[[ModelRecord], str]) -> None:
        self.fleet: FleetStrategy | None = None
        self.registry = registry
        self.deployer = deployer
        self.changesets = changesets
        self.ondemand = ondemand
        self.retries = retries
        self.capture = capture
        self.converge = converge
        self.policy_of = policy_of

    def load(self, model: str, digest: str, actor: str, force: bool, progress: ProgressFn | None,
             host: str) -> Outcome:
        refused = refuse_pinned(self.registry.find_model(model), digest, force=force)
        if refused is not None:
            raise ConflictError(refused)
        failed = self._load_members(model, digest, actor, progress, (model,))
        if failed is not None:
            return failed
        return self.deployer.deploy(model, digest, actor, force=force, progress=progress)

    def _load_members(self, model: str, digest: str, actor: str, progress: ProgressFn | None,
                      chain: tuple[str, ...]) -> Outcome | None:
        """An ensemble's members that do not serve are loaded first, in step order (recursively), each
        from what its source holds now. Returns the failed outcome of a member that could not be loaded
        (the ensemble is then not tried)."""
        for member in step_models(self.registry.get_snapshot(model, digest).config):
            if member in chain:
                continue  # a cycle: Triton refuses it at load, with its own message
            record = self.registry.find_model(member)
            if record is not None and record.state in SERVING_STATES and record.active_digest:
                continue
            if progress:
                progress(Progress(member, "member", "start", f"needed by ensemble {model}"))
            outcome = (self.load(member, self.capture(member, actor), actor, False, progress, "")
                       if len(chain) < MEMBER_DEPTH else None)
            if outcome is None or not outcome.succeeded:
                message = f"member {member} could not be loaded: {outcome.message if outcome else 'too deep'}"
                self.registry.audit(AuditEntry(actor, "deploy", model, digest, "failed", message))
                return Outcome(model, "deploy", "failed", digest, None, message,
                               cause=Cause(outcome.cause) if outcome else Cause.NONE)
        return None

    def run(self, planned: IntakePlan, actor: str) -> Outcome | None:
        if isinstance(planned, FollowTag):
            tags.follow(self, planned.model, actor)
            return None
        return self.deployer.run(planned, actor)

    def load_set(self, models: list[str], actor: str, force: bool, progress: ProgressFn | None) -> Outcome:
        with self.changesets.one_at_a_time:
            return self.deployer.run(self.changesets.load(models, actor, force), actor, progress)

    def _serving_ensembles(self) -> dict[str, list[str]]:
        """Each serving ensemble and the members its active config names."""
        out: dict[str, list[str]] = {}
        for record in self.registry.list_models(states=SERVING_STATES):
            if record.active_digest:
                names = step_models(self.registry.get_snapshot(record.name, record.active_digest).config)
                if names:
                    out[record.name] = names
        return out

    def unload(self, model: str, actor: str, dependents: bool, progress: ProgressFn | None, force: bool,
               host: str) -> Outcome:
        ensembles = self._serving_ensembles()
        needed_by = sorted(e for e, names in ensembles.items() if model in names and e != model)
        if needed_by and not force:
            raise ConflictError(f"'{model}' is a member of serving ensemble(s) {', '.join(needed_by)}: unload "
                             f"{needed_by[0]} first (--dependents unloads its members too) or use --force")
        outcome = self.deployer.unload(model, actor, dependents, progress)
        if not dependents or not outcome.succeeded or model not in ensembles:
            return outcome
        others = {name for e, names in ensembles.items() if e != model for name in names}
        for member in ensembles[model]:
            record = self.registry.find_model(member)
            if member in others or record is None or record.state not in SERVING_STATES:
                continue
            result = self.deployer.unload(member, actor, False, None)
            text = f"member of {model}: {result.message}"
            if progress:
                progress(Progress(member, "unload", "ok" if result.succeeded else "failed", text))
        return outcome

    def rollback(self, model: str, actor: str, to: str | None, progress: ProgressFn | None, force: bool,
                 host: str) -> Outcome:
        current = self.registry.find_model(model)
        if current is None:
            raise NotFoundError(f"model '{model}' is unknown to the registry; `tritonctl status` lists the models")
        refused = refuse_pinned(current, None, force=force)
        if refused is not None:
            raise ConflictError(refused)
        return self.deployer.rollback(model, actor, to, progress)

    def set_track(self, model: str, policy: str, actor: str, host: str) -> PolicyResult:
        return tags.set_track(self, model, policy, actor)

    def set_policy(self, model: str, policy: str, actor: str, host: str) -> PolicyResult:
        record = self.registry.update_model(model, policy=None if policy == "inherit" else policy)
        self.registry.audit(AuditEntry(actor, "policy", model, record.active_digest, "ok", f"policy {policy}"))
        if self.policy_of(record) == "auto":
            self.converge(model)
        return PolicyResult(model, self.policy_of(record), inherited=record.policy is None)

    def set_pin(self, model: str, pinned: bool, actor: str, host: str) -> PinResult | HoldResult:
        existing = self.registry.find_model(model)
        if existing is None:
            raise NotFoundError(f"model '{model}' is unknown to the registry")
        if pinned and not existing.active_digest:
            raise ConflictError(f"model '{model}' serves nothing to pin")
        record = self.registry.update_model(model, pinned=pinned)
        action = "pin" if pinned else "unpin"
        self.registry.audit(AuditEntry(actor, action, model, record.active_digest, "ok", f"{action}ned"))
        if not pinned:
            self.converge(model)
        return PinResult(model, pinned, record.active_digest)

    def ensure(self, model: str, for_s: float, actor: str, progress: ProgressFn | None) -> LeaseResult:
        return self.ondemand.ensure(model, for_s, actor, progress)

    def renew_lease(self, model: str, lease: str, for_s: float) -> LeaseResult:
        return self.ondemand.renew(model, lease, for_s)

    def release_lease(self, model: str, lease: str) -> LeaseResult:
        return self.ondemand.release(model, lease)

    def tag_registry(self) -> Registry:
        return self.registry

    def deploy_tagged(self, model: str, digest: str, actor: str, progress: ProgressFn | None) -> Outcome:
        """A tracked tag's digest, deployed the usual way (`tritonctl load MODEL --digest`)."""
        return self.load(model, recorded_digest(self.registry, model, digest), actor, False, progress, "")

    def forget_retry(self, model: str) -> None:
        self.retries.clear(model)


class FleetTarget:
    """The fleet: `load` rolls a digest out over every host (canary, waves); with `host`, one host deploys
    it and the fleet holds that host (docs/fleet.md). Tags live in the shared registry."""

    def __init__(self, fleet: FleetStrategy, registry: Registry, deployer: Deployer, retries: RetryBook) -> None:
        """`registry`, `deployer`: this host's own (a `--host` load checks this host's pin and deploys here)."""
        self.strategy = fleet
        self.registry = registry
        self.deployer = deployer
        self.retries = retries

    @property
    def fleet(self) -> FleetStrategy | None:
        return self.strategy

    def load(self, model: str, digest: str, actor: str, force: bool, progress: ProgressFn | None,
             host: str) -> Outcome:
        if not host:  # the fleet's pin is checked by the rollout
            return self.strategy.load(model, digest, actor, force, progress)
        refused = refuse_pinned(self.registry.find_model(model), digest, force=force)
        if refused is not None:
            raise ConflictError(refused)
        return self.strategy.held(model, host, actor, lambda: self.deployer.deploy(
            model, digest, actor, force=force, progress=progress))

    def run(self, planned: IntakePlan, actor: str) -> Outcome | None:
        """The fleet's leader plans its own rollouts (controlplane/fleet/leader.py); a plan handed here
        rolls out like an operator's load."""
        if isinstance(planned, FollowTag):
            tags.follow(self, planned.model, actor)
            return None
        if len(planned.members) > 1:
            return self.load_set([m.model for m in planned.members], actor, planned.force, None)
        member = planned.members[0]
        return self.load(member.model, member.digest, actor, planned.force, None, "")

    def load_set(self, models: list[str], actor: str, force: bool, progress: ProgressFn | None) -> Outcome:
        raise UsageError("loading several models as one change set needs a daemon without --fleet")

    def unload(self, model: str, actor: str, dependents: bool, progress: ProgressFn | None, force: bool,
               host: str) -> Outcome:
        return self.strategy.unload(model, actor, dependents, progress, host)

    def rollback(self, model: str, actor: str, to: str | None, progress: ProgressFn | None, force: bool,
                 host: str) -> Outcome:
        return self.strategy.rollback(model, actor, to, progress, host)

    def set_track(self, model: str, policy: str, actor: str, host: str) -> PolicyResult:
        return self.strategy.set_policy(model, policy, actor, host)  # audited like every fleet policy change

    def set_policy(self, model: str, policy: str, actor: str, host: str) -> PolicyResult:
        return self.strategy.set_policy(model, policy, actor, host)

    def set_pin(self, model: str, pinned: bool, actor: str, host: str) -> PinResult | HoldResult:
        return self.strategy.set_pin(model, pinned, actor, host)

    def ensure(self, model: str, for_s: float, actor: str, progress: ProgressFn | None) -> LeaseResult:
        return self.strategy.ensure(model, for_s, actor)

    def renew_lease(self, model: str, lease: str, for_s: float) -> LeaseResult:
        return self.strategy.renew_lease(model, lease, for_s)

    def release_lease(self, model: str, lease: str) -> LeaseResult:
        return self.strategy.release_lease(model, lease)

    def tag_registry(self) -> Registry:
        return self.strategy.registry

    def deploy_tagged(self, model: str, digest: str, actor: str, progress: ProgressFn | None) -> Outcome:
        """A tracked tag's digest as a rollout (canary, waves)."""
        return self.strategy.rollout(model, self.strategy.registry.get_snapshot(model, digest), actor, force=False,
                                  progress=progress)

    def forget_retry(self, model: str) -> None:
        self.retries.clear(model)
