"""The operator's verbs in a fleet: `rollback`, `unload`, `pin`, `unpin` and `policy` act on the fleet.

Through any host's control API, without `--host`: rollback and unload change the fleet's target and
run as a rollout (canary, waves, fleet rollback on a failure; each host's step streamed as it ends);
pin, unpin and policy (`track:NAME` too: fleet-wide only) change the shared registry's model, which the
leader honours before it starts any rollout. Every change is audited in the shared registry with the
actor and the host it came through.

With `--host H` (H must be the daemon the command reached) the single-host action runs on H alone
and H is *held* for the model (its local pin): the fleet skips H's rollout steps and converge leaves
it alone, `status --fleet` shows it `held`, until `tritonctl unpin MODEL --host H` releases it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, TypeVar

from controlplane.deploy.engine import Outcome, ProgressFn
from controlplane.documents.results import HoldResult, PinResult, PolicyResult
from controlplane.errors import NotFoundError, TritonctlError, UsageError
from controlplane.fleet.hostplane import HostPlane
from controlplane.intake import tags
from controlplane.settings.config import Settings
from controlplane.store.records import SnapshotRecord
from controlplane.store.registry import AuditEntry, Registry
from controlplane.vocab import Policy, Result

T = TypeVar("T")


class VerbsMember(Protocol):
    """What the verbs use of this daemon's fleet membership (controlplane.fleet.member.FleetMember)."""

    host: str
    settings: Settings
    plane: HostPlane
    registry: Registry  # the shared registry

    def rollout(self, model: str, record: SnapshotRecord | None, actor: str, *, force: bool,
                progress: ProgressFn | None, kind: str = ...) -> Outcome: ...

    def report_now(self) -> None: ...

    def look_again(self, model: str) -> None: ...


class FleetVerbs:
    def __init__(self, member: VerbsMember) -> None:
        self.member = member

    # -- --host H: this host only, held ---------------------------------------------------------

    def check_host(self, host: str) -> None:
        if host != self.member.host:
            raise UsageError(f"--host {host}: this daemon is host '{self.member.host}'; "
                             f"send the command to {host}'s daemon")

    def held(self, model: str, host: str, actor: str, action: Callable[[], T]) -> T:
        """Run a single-host action on this host, then hold the host for `model`."""
        self.check_host(host)
        result = action()
        self._hold(model, actor, True)
        return result

    def _hold(self, model: str, actor: str, held: bool) -> None:
        local = self.member.plane.registry
        local.ensure_model(model)
        local.update_model(model, pinned=held)
        message = (f"host {self.member.host} held by {actor}: the fleet leaves it alone until unpin --host"
                   if held else f"host {self.member.host} released: it converges to the fleet's target")
        self.member.registry.audit(AuditEntry(actor, "hold" if held else "release", model, None, Result.OK, message))
        self.member.report_now()

    # -- the fleet --------------------------------------------------------------------------------

    def previous_target(self, model: str) -> str:
        """The last digest the fleet served before its target (valid, not quarantined, not collected)."""
        shared = self.member.registry
        current = shared.find_model(model)
        if current is None:
            raise NotFoundError(f"model '{model}' is unknown to the fleet")
        for entry in shared.serving_history(model, limit=500):
            if entry.digest is None or entry.digest == current.active_digest:
                continue
            try:
                snap = shared.get_snapshot(model, entry.digest)
            except TritonctlError:
                continue
            if snap.valid and not snap.quarantined and not snap.collected:
                return snap.digest
        raise NotFoundError(f"model '{model}' has no previous good version in the fleet to roll back to")

    def rollback(self, model: str, actor: str, to: str | None, progress: ProgressFn | None, host: str) -> Outcome:
        if host:
            plane = self.member.plane
            return self.held(model, host, actor, lambda: plane.rollback_here(model, actor, to, progress))
        target = self.member.registry.get_snapshot(model, to).digest if to else self.previous_target(model)
        return self.member.rollout(model, self.member.registry.get_snapshot(model, target), actor,
                                   force=to is not None, progress=progress, kind="rollback")

    def unload(self, model: str, actor: str, dependents: bool, progress: ProgressFn | None, host: str) -> Outcome:
        if host:
            return self.held(model, host, actor,
                             lambda: self.member.plane.unload_here(model, actor, dependents, progress))
        return self.member.rollout(model, None, actor, force=False, progress=progress, kind="unload")

    def set_pin(self, model: str, pinned: bool, actor: str, host: str) -> PinResult | HoldResult:
        if host:
            self.check_host(host)
            local = self.member.plane.registry.find_model(model)
            if local is None:
                raise NotFoundError(f"model '{model}' is unknown on host {host}")
            self._hold(model, actor, pinned)
            return HoldResult(model, host, pinned, local.active_digest)
        shared = self.member.registry
        existing = shared.find_model(model)
        if existing is None:
            raise NotFoundError(f"model '{model}' is unknown to the fleet")
        if pinned and not existing.active_digest:
            raise UsageError(f"model '{model}' serves nothing in the fleet to pin")
        record = shared.update_model(model, pinned=pinned)
        action = "pin" if pinned else "unpin"
        shared.audit(AuditEntry(actor, action, model, record.active_digest, Result.OK,
                                f"{action}ned on the fleet (through {self.member.host})"))
        if not pinned:  # the source's newest content goes out by the usual rules
            self.member.look_again(model)
        return PinResult(model, pinned, record.active_digest, fleet=True)

    def set_policy(self, model: str, policy: str, actor: str, host: str) -> PolicyResult:
        if policy.startswith(tags.TRACK_PREFIX):  # fleet-wide only: tags live in the shared registry
            tags.refuse_host(policy, host)
            return tags.set_track(self.member.plane, model, policy, actor, through=self.member.host)
        value = None if policy == Policy.INHERIT else policy
        if host:
            self.check_host(host)
            record = self.member.plane.registry.update_model(model, policy=value)
            self.member.plane.registry.audit(AuditEntry(actor, "policy", model, record.active_digest, Result.OK,
                                                        f"policy {policy} on host {host}"))
            self._hold(model, actor, True)
            return PolicyResult(model, value or self.member.settings.policy, inherited=value is None, host=host)
        shared = self.member.registry
        record = shared.update_model(model, policy=value)
        shared.audit(AuditEntry(actor, "policy", model, record.active_digest, Result.OK,
                                f"policy {policy} on the fleet (through {self.member.host})"))
        if (record.policy or self.member.settings.policy) == Policy.AUTO:
            self.member.look_again(model)
        return PolicyResult(model, record.policy or self.member.settings.policy, inherited=record.policy is None,
                            fleet=True)
