"""The fleet's rollout state machine, driven by the leader: canary set first, then waves; a failure
anywhere stops the waves, quarantines the digest and rolls back every host that took it.

A rollout (controlplane.store.fleet.Rollout) moves queued → running → done, or running → rolling_back
→ rolled_back; one rollout of a model runs at a time (the next waits queued). Each host's step moves
waiting → pending (its wave started) → running (claimed by its agent) → ok | failed | skipped. A host
whose daemon is gone does not hold the fleet: its open steps are skipped; it converges when back.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from controlplane.errors import TritonctlError
from controlplane.fleet import sets
from controlplane.fleet.bake import WaveBakes
from controlplane.fleet.settings import FleetSettings
from controlplane.store.fleet import FleetStore, Rollout, Step, audit_event
from controlplane.store.registry import AuditEntry, Registry
from controlplane.vocab import Result

log = logging.getLogger("tritonctl.fleet")

FLEET_ACTOR = "fleet"


def plan_waves(hosts: list[str], canary_hosts: tuple[str, ...], canary_count: int, wave_size: int) -> list[list[str]]:
    """Canaries first (the named ones that are alive, else the first N by name), then waves of the rest."""
    ordered = sorted(hosts)
    canaries = [h for h in canary_hosts if h in ordered] or ordered[:canary_count]
    rest = [h for h in ordered if h not in canaries]
    return [canaries] + [rest[i:i + wave_size] for i in range(0, len(rest), wave_size)] if canaries else []


class RolloutMachine:
    """Advances every open rollout one step per call of `drive` (the leader's tick)."""

    def __init__(self, store: FleetStore, registry: Registry, fleet: FleetSettings, host: str) -> None:
        self.store = store
        self.registry = registry  # the shared registry (quarantine)
        self.fleet = fleet
        self.host = host  # the leader's name, on the audit events it writes
        self.bakes = WaveBakes(store, registry, lambda: self.fleet, host)  # a wave bakes before the next one

    def waves(self) -> list[list[str]]:
        """The waves a rollout started now would take, over the hosts alive now. Within `liveness_s` of a
        registry outage, the hosts that heartbeat within `liveness_s` before it began: nobody could
        heartbeat or hold a session during it, and a rollout then leaves no host out for that."""
        f, health = self.fleet, self.registry.health
        grace = health.in_grace(f.host_timeout_s)
        hosts = self.store.live_hosts(f.host_timeout_s + (health.last_outage_s if grace else 0.0), by_session=not grace)
        return plan_waves(hosts, f.canary_hosts, f.canary_count, f.wave_size)

    def drive(self, rollout: Rollout) -> None:
        rid, model, digest = rollout.id, rollout.model, rollout.digest
        steps: list[Step] = rollout.steps
        if rollout.state == "queued":
            if self.store.open_rollout(model) == rid:  # the oldest open one of its model
                self.store.set_rollout(rid, "running")
                self.store.set_steps(rid, ("waiting",), "pending", wave=0)
            return
        self.skip_silent_hosts(rid, steps)
        steps = self.store.rollout(rid).steps
        deploys = [s for s in steps if s.action == "deploy"]
        if rollout.state == "running":
            failed = [s for s in deploys if s.state == "failed"]
            if failed:
                self._stop_and_roll_back(rollout, steps, f"failed on {failed[0].host}: {failed[0].message}")
                return
            open_waves = sorted({s.wave for s in deploys if s.state in ("waiting", "pending", "running")})
            baking, stop = self.bakes.hold(rollout, steps, open_waves)
            if stop is not None:  # not the content's fault: it failed on this traffic, it is not quarantined
                self._stop_and_roll_back(rollout, steps, stop, quarantine=False)
                self._stop_its_set(rollout, stop)
                return
            if baking:
                return
            if not open_waves:
                served = [s.host for s in deploys if s.state == "ok"]
                self.store.set_rollout(rid, "done", target=(model, digest), host=self.host, audit=audit_event(
                    FLEET_ACTOR, "rollout", model, digest, Result.OK.value,
                    f"rollout {rid} done: serving on {', '.join(served)}"))
                self.start_queued(model)
                return
            wave = open_waves[0]
            if all(s.state == "waiting" for s in deploys if s.wave == wave):
                self.store.set_steps(rid, ("waiting",), "pending", wave=wave)
            return
        if rollout.state == "rolling_back":
            if all(s.state in ("ok", "failed", "skipped") for s in steps):
                self.store.set_rollout(rid, "rolled_back", host=self.host, audit=audit_event(
                    FLEET_ACTOR, "rollout", model, digest, Result.ROLLED_BACK.value,
                    f"rollout {rid} rolled back: {rollout.error}"))
                self.start_queued(model)

    def _stop_and_roll_back(self, rollout: Rollout, steps: list[Step], reason: str, quarantine: bool = True) -> None:
        rid, model, digest = rollout.id, rollout.model, rollout.digest
        self.store.set_steps(rid, ("waiting", "pending"), "skipped",
                             message="not started: a host failed" if quarantine else f"not started: {reason}")
        self.store.set_steps(rid, ("running",), "skipped", message=f"stopped: {reason}", action="bake")
        if any(s.state == "running" for s in self.store.rollout(rid).steps):
            return  # let the hosts already deploying finish, then undo them too
        try:
            if quarantine:
                self.registry.set_quarantine(model, digest, reason)
        except TritonctlError as exc:
            log.error("quarantine: %s", exc)
        if not self.store.transition(rid, "running", "rolling_back", reason):
            return
        took = [s.host for s in self.store.rollout(rid).steps if s.action == "deploy" and s.state == "ok"]
        self.store.add_rollback_steps(rid, took, rollout.previous_digest, wave=max(s.wave for s in steps) + 1)
        log.warning("%s: rollout %s %s; rolling back %s", model, rid, reason, took or "nothing")

    def _stop_its_set(self, rollout: Rollout, reason: str) -> None:
        """A change set rolls out as one rollout per member (fleet/sets.py): a member's failed bake stops
        and rolls back the running rollouts connected to it through ensembles too, so no host keeps a new
        step beside an old ensemble (its agent runs their rollback steps as one set)."""
        others = [r for r in self.store.rollouts(("running",)) if r.id != rollout.id]
        if not others:
            return
        mine = sets.members(self.registry, [(rollout.model, rollout.digest)])
        related = set(sets.related(self.registry, mine, [(r.model, r.digest) for r in others]))
        for other in others:
            if other.model in related:
                log.warning("%s: rollout %s stopped with its change set's %s", other.model, other.id, rollout.model)
                self._stop_and_roll_back(other, other.steps, f"{reason} (with its change set: {rollout.model})",
                                         quarantine=False)

    def start_queued(self, model: str) -> None:
        queued = [r for r in self.store.rollouts(("queued",)) if r.model == model]
        if queued:
            first = min(queued, key=lambda r: r.id)
            self.store.set_rollout(first.id, "running")
            self.store.set_steps(first.id, ("waiting",), "pending", wave=0)

    def skip_silent_hosts(self, rid: int, steps: list[Step]) -> None:
        """A dead host does not hold the fleet: its steps not yet done (waiting ones too) are skipped
        as soon as its daemon's session is gone or its heartbeat ages past the liveness window; the
        host converges to the fleet's target when it is back. Nobody is judged dead for a time in which
        the leader itself could not reach the registry (nobody could heartbeat then): from the moment it
        answers the leader again, every host has `liveness_s` to heartbeat before any step is skipped,
        and the rollout resumes in its own order."""
        if self.registry.health.in_grace(self.fleet.host_timeout_s):
            return
        live = set(self.store.live_hosts(self.fleet.host_timeout_s))
        for step in steps:
            if step.state in ("waiting", "pending", "running") and step.host not in live:
                log.warning("rollout %s: host %s is dead; it converges when it is back", rid, step.host)
                self.store.skip_step(step.id, f"host {step.host} dead (no session or silent); it converges when back")

    def start(self, model: str, digest: str, previous: str | None, actor: str, kind: str,
              waves: list[list[str]], message: Callable[[int], str]) -> int:
        """Queue a rollout over `waves` and audit who started it (`message` of the rollout's id)."""
        return self.start_set([(model, digest, previous)], actor, kind, waves, lambda _model, rid: message(rid))[0]

    def start_set(self, rollouts: Sequence[tuple[str, str, str | None]], actor: str, kind: str,
                  waves: list[list[str]], message: Callable[[str, int], str]) -> list[int]:
        """Queue (model, digest, previous) rollouts over `waves` in one transaction (a change set's reach
        every host's claim together) and audit who started each (`message` of its model and id)."""
        ids = self.store.create_rollouts(rollouts, actor, waves)
        for (model, digest, _previous), rid in zip(rollouts, ids, strict=True):
            self.registry.audit(AuditEntry(actor, kind, model, digest or None, Result.OK.value, message(model, rid)))
        return ids
