"""The leader's duties (only while this daemon holds the advisory lock): record what the source holds
in the shared registry, start rollouts of what the shared pipeline lets through, and drive them.

Recording is the single-host pipeline (controlplane.intake.recording, through the host's own plane: capture →
validate → record → audit), then the content is exported to the shared store and recorded in the
shared registry; whether it is proposed is the same `decision.decide` (policy, pin, unloaded, invalid,
quarantined, serving already). An operator's `tritonctl load` on any host becomes a rollout
too (`rollout`), followed until it ends.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from controlplane.deploy.engine import Outcome, Progress, ProgressFn, admission
from controlplane.errors import SnapshotError, StoreError, TritonctlError
from controlplane.fleet import sets
from controlplane.fleet.hostplane import HostPlane
from controlplane.fleet.rollouts import RolloutMachine
from controlplane.fleet.sharedcontent import SharedContent
from controlplane.intake import recording as intake
from controlplane.intake.decision import Verdict, decide, decide_capture, refuse_pinned
from controlplane.settings.config import Settings
from controlplane.snapshot import CONFIG_FILE
from controlplane.store.fleet import FleetStore
from controlplane.store.records import SnapshotRecord
from controlplane.store.registry import AuditEntry, Registry
from controlplane.validation.modelconfig import is_ensemble_text
from controlplane.vocab import Result

log = logging.getLogger("tritonctl.fleet")


@dataclass
class Leader:
    """Records, proposes and drives; `tick` runs one round (the member's leader thread calls it)."""

    settings: Settings
    plane: HostPlane
    registry: Registry  # the shared registry
    store: FleetStore
    shared: SharedContent
    machine: RolloutMachine
    is_leader: Callable[[], bool]
    stopping: threading.Event
    scan_requested: threading.Event = field(default_factory=threading.Event)
    _settled: list[str] = field(default_factory=list)
    _latest: dict[str, SnapshotRecord] = field(default_factory=dict)  # this host's newest record per model
    _unproposed: dict[str, SnapshotRecord] = field(default_factory=dict)  # waiting for their set to settle
    _settled_lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def host(self) -> str:
        return self.machine.host

    # -- the source repository --------------------------------------------------------------------

    def settled(self, model: str) -> None:
        with self._settled_lock:
            if model not in self._settled:
                self._settled.append(model)

    def _scan(self) -> None:
        names = self.plane.source.names()
        names.sort(key=self._is_ensemble)  # ensembles after their members (stable)
        with self._settled_lock:
            self._settled.extend(n for n in names if n not in self._settled)

    def _is_ensemble(self, model: str) -> bool:
        return is_ensemble_text(self.plane.source.read_text(model, CONFIG_FILE) or "")

    def record(self, model: str, members: dict[str, SnapshotRecord] | None = None) -> SnapshotRecord | None:
        """Capture locally, export to the shared store, record in the shared registry (once per content).
        `members`: this host's records of models captured with it (an ensemble is checked against them)."""
        if not self.plane.source_has(model):
            return None
        if self.plane.repository_held():  # `.tritonctl-hold` at the repository root
            self.plane.look_again(model, max(self.settings.settle_s, 0.5))
            return None
        try:
            local = self.plane.capture(model, members=members)
        except (SnapshotError, StoreError) as exc:
            decision = decide_capture(exc, model, self.settings.settle_s)
            if decision.verdict is Verdict.WAIT:
                self.plane.look_again(model, decision.delay_s)
            else:
                self.registry.audit(AuditEntry("watcher", "snapshot", model, None, Result.FAILED.value, str(exc)))
            return None
        return self.publish(model, local.digest, "watcher")

    def publish(self, model: str, digest: str, actor: str) -> SnapshotRecord:
        """A snapshot this host holds, made available to the fleet: content into the shared store first,
        then the record into the shared registry (audited the first time)."""
        local = self.plane.registry.get_snapshot(model, digest)
        self.shared.export(self.plane.store, model, digest)
        return intake.record(self.registry, model, digest, local, actor)

    def propose(self, model: str, record: SnapshotRecord, actor: str = "watcher") -> int | None:
        """Start a rollout of `record` if the pipeline's gate lets it through and none is on its way."""
        return self.propose_set([(model, record)], actor).get(model)

    def propose_set(self, records: list[tuple[str, SnapshotRecord]], actor: str = "watcher") -> dict[str, int]:
        """`propose` for models in order (a change set: steps before ensembles), the rollouts started in
        one transaction: a host never claims a set's first steps without the rest (it would deploy a
        step alone, beside the old ensemble over it). {model: rollout id} of those started."""
        chosen: list[tuple[str, str, str | None]] = []
        on_its_way = {(r.model, r.digest) for r in self.store.rollouts()}
        for model, record in records:
            try:
                current = self.registry.ensure_model(model)
            except TritonctlError as exc:
                if not self.registry.health.told(exc):
                    log.error("%s: %s", model, exc)
                continue
            if not decide(current, record, policy=current.policy or self.settings.policy).deploys:
                continue  # (the fleet keeps no deployments: an operator holds it with a pin)
            if (model, record.digest) not in on_its_way:
                chosen.append((model, record.digest, current.active_digest))
        waves = self.machine.waves() if chosen else []
        if not waves:
            return {}
        ids = self.machine.start_set(chosen, actor, "rollout", waves,
                                     lambda _model, rid: f"rollout {rid} started: canary {', '.join(waves[0])}; "
                                                         f"then {len(waves) - 1} wave(s)")
        for (model, digest, _previous), rid in zip(chosen, ids, strict=True):
            log.info("%s: rollout %s of %s: waves %s", model, rid, digest[:12], waves)
        return dict(zip((m for m, _d, _p in chosen), ids, strict=True))

    # -- an operator's change, as a rollout -------------------------------------------------------

    def rollout(self, model: str, record: SnapshotRecord | None, actor: str, *, force: bool,
                progress: ProgressFn | None, kind: str = "rollout") -> Outcome:
        """Change the fleet's target to `record` (None: unload everywhere) as a rollout: canary, waves,
        fleet rollback on a failure; each host's step is streamed as it ends. Held hosts are skipped."""
        started = time.monotonic()
        digest = record.digest if record is not None else ""
        what = digest[:12] if digest else "nothing (unload)"

        def end(outcome: Result, message: str, active: str | None) -> Outcome:
            return Outcome(model, kind, outcome, digest or None, active, message,
                           int((time.monotonic() - started) * 1000))

        current = self.registry.ensure_model(model)
        refused = refuse_pinned(current, digest, force=force, where=" on the fleet") if kind == "rollout" else None
        if refused is not None:
            return end(Result.FAILED, refused, current.active_digest)
        refused = admission(record, force=force, where="the fleet") if record is not None else None
        if refused is not None:
            return end(Result.FAILED, refused, current.active_digest)
        if record is not None and record.quarantined:  # forced
            self.registry.set_quarantine(model, digest, None)
        if (digest or None) == current.active_digest and not force:
            return end(Result.NOOP, f"the fleet already serves {what}", current.active_digest)
        waves = self.machine.waves()
        if not waves:
            return end(Result.FAILED, "no live hosts in the fleet", current.active_digest)
        rid = self.machine.start(model, digest, current.active_digest, actor, kind, waves,
                                 lambda rid: f"rollout {rid} of {what} started by {actor} through {self.host}: "
                                             f"canary {', '.join(waves[0])}")
        shown: dict[int, str] = {}
        deadline = time.monotonic() + self.settings.load_timeout_s * (len(waves) + 2)
        while True:
            rollout = self.store.rollout(rid)
            for step in rollout.steps:
                if shown.get(step.id) == step.state or step.state in ("waiting", "pending"):
                    continue
                shown[step.id] = step.state
                if progress is not None:
                    label = "canary" if step.wave == 0 and step.action == "deploy" else f"wave {step.wave}"
                    if step.action in ("rollback", "bake"):
                        label = step.action
                    progress(Progress(model, f"{label} {step.host}", step.state, step.message, step.digest or ""))
            if rollout.state in ("done", "rolled_back"):
                break
            if time.monotonic() > deadline or self.stopping.is_set():
                return end(Result.FAILED, f"rollout {rid} still {rollout.state}; follow it with "
                                          "`tritonctl rollouts --watch`", current.active_digest)
            time.sleep(0.2)
        target = self.store.targets().get(model)
        if rollout.state == "done":
            return end(Result.OK, f"rollout {rid}: serving {what} on every host", target)
        return end(Result.ROLLED_BACK, f"rollout {rid} rolled back: {rollout.error}", target)

    # -- one round ----------------------------------------------------------------------------------

    def tick(self) -> None:
        if self.scan_requested.is_set():
            self.scan_requested.clear()
            self._scan()
        while self.is_leader():
            with self._settled_lock:
                if not self._settled:
                    break
                batch, self._settled = self._settled, []
            batch.sort(key=self._is_ensemble)  # ensembles after their steps (stable)
            for model in batch:
                try:
                    # an ensemble is checked against the newest recorded content of its steps
                    record = self.record(model, members=dict(self._latest))
                    if record is not None:
                        self._unproposed[model] = record
                        self._latest[model] = self.plane.registry.get_snapshot(model, record.digest)
                except TritonctlError as exc:
                    if not self.registry.health.told(exc):
                        log.error("%s: %s", model, exc)
        self._propose_settled()
        for rollout in self.store.rollouts():
            if self.is_leader():
                self.machine.drive(rollout)

    def _propose_settled(self) -> None:
        """Propose what was recorded once nothing connected to it through ensembles still settles, all
        of it steps before ensembles: a change set's rollouts (and every host's steps of them) come
        together and in dependency order (controlplane/fleet/sets.py)."""
        if not self._unproposed or not self.is_leader():
            return
        if self.plane.still_settling(sorted(self._unproposed)):
            return
        ready, self._unproposed = self._unproposed, {}
        ordered = sets.steps_first(self.registry, [(m, r.digest) for m, r in ready.items()])
        try:
            self.propose_set([(model, ready[model]) for model in ordered])
        except TritonctlError as exc:
            if isinstance(exc, StoreError):  # the registry is away: proposed again when it answers
                self._unproposed = {**ready, **self._unproposed}
            if not self.registry.health.told(exc):
                log.error("%s: %s", ", ".join(ordered), exc)
