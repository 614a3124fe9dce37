"""A host's duties in the fleet (every daemon, the leader included): run this host's rollout steps and
converge to the fleet's target.

A step is claimed (pending → running, by this host only), its snapshot imported from the shared
store (every object verified) into this host's store and registry, and deployed with the single-host
state machine (controlplane.deploy.engine, which already rolls itself back on a failure); the outcome is
reported to the fleet tables. Converge: a model whose fleet target differs from what this host
serves, with no rollout open, is deployed (a host that was down during a rollout catches up this
way). A host an operator acted on alone (`--host`, its local pin) is *held*: left alone.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field

from controlplane.deploy.engine import Outcome
from controlplane.errors import StoreError, TritonctlError
from controlplane.fleet import sets
from controlplane.fleet.bake import BAKE, HostBakes, first_weight
from controlplane.fleet.hostplane import HostPlane
from controlplane.fleet.journal import Journal
from controlplane.fleet.ondemand import PlacedModels
from controlplane.fleet.rollouts import FLEET_ACTOR
from controlplane.fleet.settings import FleetSettings
from controlplane.fleet.sharedcontent import SharedContent
from controlplane.intake import recording as intake
from controlplane.intake.decision import decide, held
from controlplane.settings.modelparams import bake_parameters
from controlplane.store.fleet import FleetStore, Step, audit_event
from controlplane.store.registry import Registry, utcnow
from controlplane.vocab import ModelState, Policy, Result

log = logging.getLogger("tritonctl.fleet")

CONVERGE_ACTOR = "fleet-converge"
REPORT_EVERY_S = 5.0
GATHER_S = 3.0  # how long a host waits for the rest of a change set's steps to become its to claim
GATHER_MIN_S = 0.3  # the leader opens a set's later waves rollout by rollout, within milliseconds


@dataclass
class HostAgent:
    """This host's side of every rollout; `tick` runs one round (the member's agent thread calls it)."""

    host: str
    plane: HostPlane
    registry: Registry  # the shared registry
    store: FleetStore
    shared: SharedContent
    fleet: FleetSettings
    stopping: threading.Event
    journal: Journal | None = None  # this host's records while the registry is away (controlplane/fleet/journal.py)
    _again: list[Step] = field(default_factory=list)  # steps the registry's outage cut short: run again
    _last_converge: float = 0.0
    _last_report: float = 0.0
    placed: PlacedModels = field(init=False)  # on-demand models placed on this host (controlplane/fleet/ondemand.py)
    bakes: HostBakes = field(init=False)  # this host's bake steps (controlplane/fleet/bake.py)

    def __post_init__(self) -> None:
        self.placed = PlacedModels(self.host, self.plane, self.registry, self._import, self.report)
        self.bakes = HostBakes(self.plane, self.store)

    def _claim(self) -> list[Step]:
        """This host's pending steps, claimed; its bake steps go to `bakes` (they run beside the others)."""
        claimed = self.store.claim(self.host)
        self.bakes.take([s for s in claimed if s.action == BAKE])
        return [s for s in claimed if s.action != BAKE]

    def tick(self) -> None:
        try:
            self.placed.serve()
        except TritonctlError as exc:
            if not self.registry.health.told(exc):
                log.error("placed models: %s", exc)
        # claimed steps stay this host's until each is finished: a round an outage cuts short (a failed
        # read, an import) leaves them running on the fleet's tables, and the next round runs them again
        claimed = self._again = self._again + self._claim()
        try:
            if claimed:
                claimed = self._gather(claimed)
                self._converge_steps_of(claimed)
            for batch in sets.batches(claimed, self.registry):  # a change set as one unit, steps first
                if len(batch) > 1:
                    self.run_set(batch)
                else:
                    self.run_step(batch[0])
        except StoreError:
            if not self.registry.health.quiet():
                self._again = []
            raise
        except BaseException:
            self._again = []
            raise
        self.bakes.tick()
        now = time.monotonic()
        if now - self._last_converge >= self.fleet.converge_s:
            self._last_converge = now
            self.converge()
        if now - self._last_report >= REPORT_EVERY_S:
            self._last_report = now
            self.report()

    def _import(self, model: str, digest: str) -> None:
        """Bring a snapshot from the shared store into this host's store and registry (verified)."""
        self.shared.import_into(self.plane.store, model, digest)
        shared = self.registry.get_snapshot(model, digest)
        self.plane.registry.record_content(model, digest, intake.revalidate(self.plane.store, model, digest, shared))

    def _deploy(self, model: str, digest: str | None, kind: str, actor: str) -> Outcome:
        if digest is None:
            return self.plane.unload_here(model, actor)
        self._import(model, digest)
        return self.plane.deploy_here(model, digest, actor, force=kind == "rollback", kind=kind)

    def _finish(self, step: Step, state: str, message: str, result: str, serving: str | None,
                started: float | None = None, actor: str = FLEET_ACTOR, action: str = "") -> None:
        """A step's end on the fleet's tables and its audit event (one transaction: FleetStore.finish_step)."""
        prefix = f"rollout {step.rollout_id}: " if step.rollout_id else "converge: "
        audit = audit_event(actor, action or step.action, step.model, step.digest, result, prefix + message,
                            int((time.monotonic() - started) * 1000) if started is not None else None)
        at = utcnow()
        self._again = [s for s in self._again if not step.id or s.id != step.id]
        try:
            self.store.finish_step(step, state, message, host=self.host, serving=serving, audit=audit)
        except StoreError:
            if self.journal is None or not self.registry.health.quiet():
                raise
            # done here, whatever the database does: kept, and written once when the registry answers
            self.journal.append(step, state, message, self.host, serving, audit, at)

    def run_step(self, step: Step) -> None:
        started = time.monotonic()
        local = self.plane.registry.find_model(step.model)
        if local is not None and held(local) is not None:  # held by an operator's --host action: left alone
            message = f"host {self.host} held (pinned here); `tritonctl unpin {step.model} --host {self.host}`"
            self._finish(step, "skipped", message, Result.SKIPPED.value, local.active_digest)
            self.report()
            return
        log.info("%s: rollout %s step %s: %s %s", step.model, step.rollout_id, step.id, step.action,
                 (step.digest or "-")[:12])
        try:
            self._canary_first(step)
            outcome = self._deploy(step.model, step.digest or None, step.action, FLEET_ACTOR)
            state = "ok" if outcome.succeeded else "failed"
            message, result, serving = outcome.message, str(outcome.outcome), outcome.active_digest
        except StoreError:
            if not self.registry.health.quiet():
                raise
            # not the step's failure: the shared registry went away under its import; it runs again when
            # the registry answers (still running on the fleet's tables, this host's to finish: _again)
            return
        except TritonctlError as exc:
            state, message, result = "failed", str(exc), Result.FAILED.value
            found = self.plane.registry.find_model(step.model)
            serving = found.active_digest if found else None
        self._finish(step, state, message, result, serving, started)

    def _canary_first(self, step: Step) -> None:
        """A rollout's deploy of a wave that bakes through canary steps: this host's switch gives the new digest
        the wave's first weight (controlplane/fleet/bake.py), the leader sets the next ones."""
        if step.action != "deploy" or not step.digest or not step.rollout_id:
            return
        try:
            config = self.registry.get_snapshot(step.model, step.digest).config or {}
            parameters = bake_parameters(config.get("parameters") or {})
        except (TritonctlError, ValueError):
            parameters = {}
        weight = first_weight(self.fleet.bake, parameters, step.wave)
        if weight < 100:
            self.plane.canary_first(step.model, step.digest, weight)

    def _gather(self, claimed: list[Step]) -> list[Step]:
        """The leader starts a change set's rollouts together (one transaction), but opens their later
        waves and adds their rollback steps rollout by rollout, and a member may queue behind an earlier
        rollout of its model: for up to GATHER_S, claim this host's steps of open rollouts connected
        through ensembles to what was claimed, so the set runs as one."""
        started = time.monotonic()
        while not self.stopping.is_set():
            mine = sets.members(self.registry, [(s.model, s.digest or "") for s in claimed])
            taken = {s.id for s in claimed}
            others = [(r.model, r.digest) for r in self.store.rollouts() if r.state in ("queued", "running")
                      and any(s.host == self.host and s.id not in taken and s.state in ("waiting", "pending")
                              for s in r.steps)]
            waited = time.monotonic() - started
            if waited >= GATHER_S:
                return claimed
            if waited >= GATHER_MIN_S and (not others or not sets.related(self.registry, mine, others)):
                return claimed
            time.sleep(0.1)
            more = self._claim()
            claimed, self._again = claimed + more, self._again + more
        return claimed

    def run_set(self, steps: list[Step]) -> None:
        """This host's steps of one change set, deployed as one (controlplane/intake/changeset.py: staged under
        private names, the old pipeline answering until the new one does; rolled back as a unit). Each
        step reports the set's outcome: a set that fails here fails every member's rollout, so the whole
        set rolls back on the fleet (never a new step beside an old ensemble)."""
        started = time.monotonic()
        pinned = [s for s in steps if held(self.plane.registry.find_model(s.model)) is not None]
        if pinned or any(not s.digest for s in steps):  # a pinned member, or an unload: one by one
            for step in steps:
                self.run_step(step)
            return
        log.info("rollout steps %s: change set %s", ", ".join(str(s.id) for s in steps),
                 ", ".join(f"{s.model} {(s.digest or '-')[:12]}" for s in steps))
        try:
            records = {}
            for step in steps:
                self._import(step.model, step.digest or "")
                self._canary_first(step)
                records[step.model] = self.plane.registry.get_snapshot(step.model, step.digest or "")
            outcome = self.plane.deploy_set(
                records, FLEET_ACTOR, force=any(s.action == "rollback" for s in steps))
            message, result = outcome.message, str(outcome.outcome)
            succeeded = outcome.succeeded
        except StoreError as exc:
            if self.registry.health.quiet():
                return  # the registry went away under the set's imports: run again when it answers (_again)
            message, result, succeeded = str(exc), Result.FAILED.value, False
        except TritonctlError as exc:
            message, result, succeeded = str(exc), Result.FAILED.value, False
        for step in steps:
            found = self.plane.registry.find_model(step.model)
            serving = found.active_digest if found else None
            ok = succeeded and serving == step.digest
            self._finish(step, "ok" if ok else "failed", message,
                         result if ok or not succeeded else Result.FAILED.value, serving, started)

    def _converge_steps_of(self, claimed: list[Step]) -> None:
        """A host that joined the fleet after an ensemble's steps rolled out has not taken them yet (its
        converge round would, later): before it deploys the ensemble, it converges the steps the
        ensemble names that this claim does not bring, so the ensemble never meets a missing step."""
        names = {s.model for s in claimed}
        needed = {step for member in sets.members(self.registry, [(s.model, s.digest or "") for s in claimed])
                  for step in member.steps if step not in names}
        if needed:
            self.converge(only=needed)

    def converge(self, only: set[str] | None = None) -> None:
        # The open rollouts first, then the targets: a rollout that completes in between is still busy
        # here (skipped this round), never a model whose target was read before it moved (a converge
        # that put a step back on the fleet's previous digest under its new ensemble).
        busy = {r.model for r in self.store.rollouts()}
        targets = self.store.targets()
        if only is not None:
            targets = {m: d for m, d in targets.items() if m in only}
        if not targets:
            return
        ordered = sets.steps_first(self.registry, sorted(targets.items()))  # steps before ensembles
        for model, target in ((m, targets[m]) for m in ordered):
            if model in busy or self.stopping.is_set():
                continue
            local = self.plane.registry.find_model(model)
            if held(local) is not None:
                continue
            try:  # serving it, or quarantined: failed here before (`tritonctl load --force` retries it)
                mine = self.plane.registry.get_snapshot(model, target)
                if local is not None and not decide(local, mine, policy=Policy.AUTO, chosen=True).deploys:
                    continue
            except TritonctlError:
                pass  # not imported yet: the deploy imports it
            log.info("%s: converging to the fleet's %s", model, target[:12])
            started = time.monotonic()
            try:
                outcome = self._deploy(model, target, "deploy", CONVERGE_ACTOR)
            except TritonctlError as exc:
                if not self.registry.health.told(exc):
                    log.error("%s: converge: %s", model, exc)
                continue
            self._finish(Step(0, 0, self.host, 0, "deploy", target, "", "", model),
                         "ok" if outcome.succeeded else "failed", outcome.message, str(outcome.outcome),
                         outcome.active_digest, started, CONVERGE_ACTOR, outcome.action)

    def report(self) -> None:
        try:
            models = self.plane.registry.list_models()
        except StoreError:
            return
        # A host an operator acted on alone (--host) is pinned here: the fleet shows it `held`. A model it
        # unloaded on its own (evicted, idle) is reported unloaded; with what each holds (placement weighs it).
        try:
            holdings = self.plane.holdings_here()
        except TritonctlError:
            holdings = {}
        self.store.report(self.host, {m.name: (m.active_digest, "held" if m.pinned else m.state)
                                      for m in models if m.active_digest or m.pinned or m.state == ModelState.UNLOADED},
                          {m.name: holdings.get(m.name, (None, None, False)) for m in models})
