"""One daemon's part in a fleet: heartbeat, leader duties when elected, and host duties always.

Leader duties (only while this daemon holds the advisory lock): record what the source repository
holds in the shared registry, export the content to the shared store, start rollouts (canary set,
then waves) and drive them: the next wave starts once every host of the current one reports ok; a
failure anywhere stops the waves, quarantines the digest and rolls back every host that took it.

Host duties (every daemon, the leader included): claim this host's pending steps (woken by
LISTEN/NOTIFY, with a poll as fallback), import the snapshot from the shared store verifying every
object, deploy it with the single-host state machine (which already rolls itself back on a failure)
and report the outcome; and converge: a model whose fleet target differs from what this host serves,
with no rollout open, is deployed (a host that was down during a rollout catches up this way).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from controlplane.config import Settings
from controlplane.deploy import Outcome, Progress, ProgressFn
from controlplane.errors import ObjectStoreError, SnapshotError, StoreError, TritonctlError
from controlplane.fleet.election import LeaderElection, connect
from controlplane.fleet.settings import FleetSettings
from controlplane.fleet.sharedstore import open_shared_store
from controlplane.fleet.store import CHANNEL, FleetStore, Step, audit_event
from controlplane.fleet.verbs import FleetVerbs
from controlplane.modelconfig import is_ensemble_dir, validate_model_dir
from controlplane.snapshot import is_ignored_name
from controlplane.store.records import SnapshotRecord
from controlplane.store.registry import AuditEntry, Registry, utcnow

log = logging.getLogger("tritonctl.fleet")

FLEET_ACTOR = "fleet"
REPORT_EVERY_S = 5.0


def plan_waves(hosts: list[str], canary_hosts: tuple[str, ...], canary_count: int, wave_size: int) -> list[list[str]]:
    """Canaries first (the named ones that are alive, else the first N by name), then waves of the rest."""
    ordered = sorted(hosts)
    canaries = [h for h in canary_hosts if h in ordered] or ordered[:canary_count]
    rest = [h for h in ordered if h not in canaries]
    return [canaries] + [rest[i:i + wave_size] for i in range(0, len(rest), wave_size)] if canaries else []


class FleetMember:
    def __init__(self, settings: Settings, fleet: FleetSettings, plane: Any, shared_registry: Registry) -> None:
        self.settings = settings
        self.fleet = fleet
        self.plane = plane  # the host's own ControlPlane (local registry, store, deployer, Triton)
        self.host = settings.host
        self.registry = shared_registry
        self.store = FleetStore(shared_registry)
        self.shared = open_shared_store(fleet.shared_store)
        self.started_at = utcnow()
        self._stop = threading.Event()
        self._wake_agent = threading.Event()
        self._wake_leader = threading.Event()
        self._scan_requested = threading.Event()
        self._settled: list[str] = []
        self._settled_lock = threading.Lock()
        self.election = LeaderElection(settings.db_url or "", self.host, self._on_leadership,
                                       interval_s=fleet.heartbeat_s)
        self._threads = [threading.Thread(target=self._guard, args=(fn, period), name=f"fleet-{name}", daemon=True)
                         for name, fn, period in (("heartbeat", self._heartbeat, fleet.heartbeat_s),
                                                  ("agent", self._agent_tick, None),
                                                  ("leader", self._leader_tick, None))]
        self._threads.append(threading.Thread(target=self._listen, name="fleet-listen", daemon=True))
        self._last_converge = 0.0
        self._last_report = 0.0
        self.verbs = FleetVerbs(self)

    # -- lifecycle ------------------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self.election.is_leader

    def start(self) -> None:
        self._heartbeat()  # registered before anyone plans a wave
        requeued = self.store.requeue_running(self.host)  # steps a crash of this daemon interrupted
        if requeued:
            log.warning("fleet: %d interrupted rollout step(s) of this host run again", requeued)
        for thread in self._threads:
            thread.start()
        self.election.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake_agent.set()
        self._wake_leader.set()
        self.election.stop()
        for thread in self._threads:
            thread.join(10)

    def _on_leadership(self, leader: bool) -> None:
        if leader:
            self._scan_requested.set()  # the source may have changed while nobody led
            self._wake_leader.set()
            try:
                self.registry.audit(AuditEntry(FLEET_ACTOR, "leader", None, None, "ok", f"{self.host} leads the fleet"))
            except TritonctlError as exc:
                log.error("audit: %s", exc)

    def _guard(self, fn: Any, period: float | None) -> None:
        while not self._stop.is_set():
            try:
                fn()
            except TritonctlError as exc:
                log.error("fleet %s: %s", fn.__name__.strip("_"), exc)
            except Exception:  # noqa: BLE001 - one bad tick must not stop the fleet duties
                log.exception("fleet %s failed", fn.__name__.strip("_"))
            if period is not None:
                self._stop.wait(period)

    def _listen(self) -> None:
        """LISTEN on the fleet channel and wake the agent and the leader loop on every notification."""
        while not self._stop.is_set():
            try:
                conn = connect(self.settings.db_url or "", f"tritonctl-listen:{self.host}")
            except Exception as exc:  # noqa: BLE001 - fall back to polling until the database is back
                log.debug("listen: %s", exc)
                self._stop.wait(self.fleet.poll_s)
                continue
            try:
                conn.execute(f"LISTEN {CHANNEL}")
                while not self._stop.is_set():
                    for _ in conn.notifies(timeout=self.fleet.poll_s, stop_after=1):
                        self._wake_agent.set()
                        self._wake_leader.set()
            except TypeError:  # psycopg < 3.2: no timeout on notifies(); the periodic poll does the work
                log.info("fleet: psycopg without notifies(timeout=...); polling every %.1fs", self.fleet.poll_s)
                return
            except Exception as exc:  # noqa: BLE001 - reconnect after a pause
                log.debug("listen: %s", exc)
                self._stop.wait(self.fleet.poll_s)
            finally:
                try:
                    conn.close()
                except Exception:  # noqa: BLE001
                    pass

    def _heartbeat(self) -> None:
        self.store.heartbeat(self.host, self.plane.triton.url, _version(), self.started_at)

    # -- the source repository (leader only) ------------------------------------------------------

    def handle_settled(self, model: str) -> None:
        """The watcher saw a model settle. Every host watches; only the leader acts."""
        if not self.is_leader:
            return
        with self._settled_lock:
            if model not in self._settled:
                self._settled.append(model)
        self._wake_leader.set()

    def initial_scan(self) -> None:
        self._scan_requested.set()
        self._wake_leader.set()

    def _scan(self) -> None:
        repo = self.settings.repository
        if self.plane.source is not None:  # an s3:// source (docs/object-storage.md)
            names = self.plane.source.initial_scan()
        elif repo is None or not repo.is_dir():
            return
        else:
            names = sorted(p.name for p in repo.iterdir() if p.is_dir() and not is_ignored_name(p.name))
            names.sort(key=lambda n: is_ensemble_dir(repo / n))  # ensembles after their members (stable)
        with self._settled_lock:
            self._settled.extend(n for n in names if n not in self._settled)

    def record(self, model: str) -> SnapshotRecord | None:
        """Capture locally, export to the shared store, record in the shared registry (once per content)."""
        if not self.plane.source_has(model):
            return None
        try:
            local = self.plane.capture(model)
        except SnapshotError as exc:
            text = str(exc)
            retry = isinstance(exc, ObjectStoreError) or exc.retryable
            if retry and self.plane.reschedule:
                self.plane.reschedule(model, self.settings.settle_s)
            else:
                self.registry.audit(AuditEntry("watcher", "snapshot", model, None, "failed", text))
            return None
        record, new = self.publish(model, local.digest)
        if new:
            message = "recorded" if record.valid else f"invalid: {record.first_error}"
            self.registry.audit(AuditEntry("watcher", "snapshot", model, record.digest,
                                           "ok" if record.valid else "invalid", message))
        return record

    def propose(self, model: str, record: SnapshotRecord, actor: str = "watcher") -> int | None:
        """Start a rollout of `record` if policy allows and the fleet does not already serve it."""
        current = self.registry.ensure_model(model)
        policy = current.policy or self.settings.policy
        if policy != "auto" or current.pinned or not record.valid or record.quarantined:
            return None
        if record.digest == current.active_digest:
            return None
        for rollout in self.store.rollouts():
            if rollout["model"] == model and rollout["digest"] == record.digest:
                return None  # already on its way
        hosts = self.store.live_hosts(self.fleet.host_timeout_s)
        waves = plan_waves(hosts, self.fleet.canary_hosts, self.fleet.canary_count, self.fleet.wave_size)
        if not waves:
            return None
        rollout_id = self.store.create_rollout(model, record.digest, current.active_digest, actor, waves)
        self.registry.audit(AuditEntry(actor, "rollout", model, record.digest, "ok",
                                       f"rollout {rollout_id} started: canary {', '.join(waves[0])}; "
                                       f"then {len(waves) - 1} wave(s)"))
        log.info("%s: rollout %s of %s: waves %s", model, rollout_id, record.digest[:12], waves)
        return rollout_id

    def publish(self, model: str, digest: str) -> tuple[SnapshotRecord, bool]:
        """A snapshot this host holds, made available to the fleet: content into the shared store first,
        then the record into the shared registry. Returns (shared record, newly recorded)."""
        local = self.plane.registry.get_snapshot(model, digest)
        self.shared.export(self.plane.store, model, digest)
        try:
            return self.registry.record_snapshot(
                model, digest, local.manifest, config=local.config, versions=local.versions,
                served_versions=local.served_versions, valid=local.valid, problems=local.problems,
                total_bytes=local.total_bytes)
        except StoreError as exc:
            from sqlalchemy.exc import IntegrityError

            if isinstance(exc.__cause__, IntegrityError):  # another host recorded it at the same moment
                return self.registry.get_snapshot(model, digest), False
            raise

    def load(self, model: str, digest: str, actor: str, force: bool, progress: ProgressFn | None) -> Outcome:
        """`tritonctl load` on any host of a fleet: roll `digest` out to every host, streaming each step."""
        record, _ = self.publish(model, digest)
        return self.rollout(model, record, actor, force=force, progress=progress)

    def rollout(self, model: str, record: SnapshotRecord | None, actor: str, *, force: bool,
                progress: ProgressFn | None, kind: str = "rollout") -> Outcome:
        """Change the fleet's target to `record` (None: unload everywhere) as a rollout: canary, waves,
        fleet rollback on a failure; each host's step is streamed as it ends. Held hosts are skipped."""
        started = time.monotonic()
        digest = record.digest if record is not None else ""
        what = digest[:12] if digest else "nothing (unload)"

        def end(outcome: str, message: str, active: str | None) -> Outcome:
            return Outcome(model, kind, outcome, digest or None, active, message,
                           int((time.monotonic() - started) * 1000))

        current = self.registry.ensure_model(model)
        if kind == "rollout" and current.pinned and digest != current.active_digest and not force:
            return end("failed", f"model '{model}' is pinned on the fleet to {str(current.active_digest)[:12]}; "
                                 "unpin it or use --force", current.active_digest)
        if record is not None and not record.valid:
            return end("failed", f"invalid, not sent to the fleet: {record.first_error}", current.active_digest)
        if record is not None and record.quarantined:
            if not force:
                return end("failed", f"digest {digest[:12]} is quarantined ({record.quarantine_reason}); "
                                     "use --force to retry", current.active_digest)
            self.registry.set_quarantine(model, digest, None)
        if (digest or None) == current.active_digest and not force:
            return end("noop", f"the fleet already serves {what}", current.active_digest)
        waves = plan_waves(self.store.live_hosts(self.fleet.host_timeout_s), self.fleet.canary_hosts,
                           self.fleet.canary_count, self.fleet.wave_size)
        if not waves:
            return end("failed", "no live hosts in the fleet", current.active_digest)
        rid = self.store.create_rollout(model, digest, current.active_digest, actor, waves)
        self.registry.audit(AuditEntry(actor, kind, model, digest or None, "ok",
                                       f"rollout {rid} of {what} started by {actor} through {self.host}: "
                                       f"canary {', '.join(waves[0])}"))
        shown: dict[int, str] = {}
        deadline = time.monotonic() + self.settings.load_timeout_s * (len(waves) + 2)
        while True:
            rollout = self.store.rollout(rid)
            for step in rollout["steps"]:
                if shown.get(step.id) == step.state or step.state in ("waiting", "pending"):
                    continue
                shown[step.id] = step.state
                if progress is not None:
                    label = "canary" if step.wave == 0 and step.action == "deploy" else f"wave {step.wave}"
                    if step.action == "rollback":
                        label = "rollback"
                    progress(Progress(model, f"{label} {step.host}", step.state, step.message, step.digest or ""))
            if rollout["state"] in ("done", "rolled_back"):
                break
            if time.monotonic() > deadline or self._stop.is_set():
                return end("failed", f"rollout {rid} still {rollout['state']}; follow it with "
                                     "`tritonctl rollouts --watch`", current.active_digest)
            time.sleep(0.2)
        target = self.store.targets().get(model)
        if rollout["state"] == "done":
            return end("ok", f"rollout {rid}: serving {what} on every host", target)
        return end("rolled_back", f"rollout {rid} rolled back: {rollout['error']}", target)

    # -- rollouts (leader only) -------------------------------------------------------------------

    def _leader_tick(self) -> None:
        self._wake_leader.wait(self.fleet.poll_s)
        self._wake_leader.clear()
        if self._stop.is_set() or not self.is_leader:
            return
        if self._scan_requested.is_set():
            self._scan_requested.clear()
            self._scan()
        while self.is_leader:
            with self._settled_lock:
                if not self._settled:
                    break
                model = self._settled.pop(0)
            try:
                record = self.record(model)
                if record is not None:
                    self.propose(model, record)
            except TritonctlError as exc:
                log.error("%s: %s", model, exc)
        for rollout in self.store.rollouts():
            if self.is_leader:
                self._drive(rollout)

    def _drive(self, rollout: dict[str, Any]) -> None:
        rid, model, digest = rollout["id"], rollout["model"], rollout["digest"]
        steps: list[Step] = rollout["steps"]
        if rollout["state"] == "queued":
            if self.store.open_rollout(model) == rid:  # the oldest open one of its model
                self.store.set_rollout(rid, "running")
                self.store.set_steps(rid, ("waiting",), "pending", wave=0)
            return
        self._skip_silent_hosts(rid, steps)
        steps = self.store.rollout(rid)["steps"]
        deploys = [s for s in steps if s.action == "deploy"]
        if rollout["state"] == "running":
            failed = [s for s in deploys if s.state == "failed"]
            if failed:
                self.store.set_steps(rid, ("waiting", "pending"), "skipped", message="not started: a host failed")
                if any(s.state == "running" for s in self.store.rollout(rid)["steps"]):
                    return  # let the hosts already deploying finish, then undo them too
                reason = f"failed on {failed[0].host}: {failed[0].message}"
                try:
                    self.registry.set_quarantine(model, digest, reason)
                except TritonctlError as exc:
                    log.error("quarantine: %s", exc)
                if not self.store.transition(rid, "running", "rolling_back", reason):
                    return
                took = [s.host for s in self.store.rollout(rid)["steps"] if s.action == "deploy" and s.state == "ok"]
                self.store.add_rollback_steps(rid, took, rollout["previous_digest"],
                                              wave=max(s.wave for s in steps) + 1)
                log.warning("%s: rollout %s %s; rolling back %s", model, rid, reason, took or "nothing")
                return
            open_waves = sorted({s.wave for s in deploys if s.state in ("waiting", "pending", "running")})
            if not open_waves:
                served = [s.host for s in deploys if s.state == "ok"]
                self.store.set_rollout(rid, "done", target=(model, digest), audit=self._audit(
                    "rollout", model, digest, "ok", f"rollout {rid} done: serving on {', '.join(served)}"))
                self._start_queued(model)
                return
            wave = open_waves[0]
            if all(s.state == "waiting" for s in deploys if s.wave == wave):
                self.store.set_steps(rid, ("waiting",), "pending", wave=wave)
            return
        if rollout["state"] == "rolling_back":
            if all(s.state in ("ok", "failed", "skipped") for s in steps):
                self.store.set_rollout(rid, "rolled_back", audit=self._audit(
                    "rollout", model, digest, "rolled_back", f"rollout {rid} rolled back: {rollout['error']}"))
                self._start_queued(model)

    def _start_queued(self, model: str) -> None:
        queued = [r for r in self.store.rollouts(("queued",)) if r["model"] == model]
        if queued:
            first = min(queued, key=lambda r: r["id"])
            self.store.set_rollout(first["id"], "running")
            self.store.set_steps(first["id"], ("waiting",), "pending", wave=0)

    def _skip_silent_hosts(self, rid: int, steps: list[Step]) -> None:
        """A dead host does not hold the fleet: its steps not yet done (waiting ones too) are skipped
        as soon as its daemon's session is gone or its heartbeat ages past the liveness window; the
        host converges to the fleet's target when it is back."""
        live = set(self.store.live_hosts(self.fleet.host_timeout_s))
        for step in steps:
            if step.state in ("waiting", "pending", "running") and step.host not in live:
                log.warning("rollout %s: host %s is dead; it converges when it is back", rid, step.host)
                self.store.skip_step(step.id, f"host {step.host} dead (no session or silent); it converges when back")

    def _audit(self, action: str, model: str, digest: str | None, outcome: str, message: str) -> Any:
        event = audit_event(FLEET_ACTOR, action, model, digest, outcome, message)
        event.host = self.host
        return event

    # -- host duties (every host) ------------------------------------------------------------------

    def _agent_tick(self) -> None:
        self._wake_agent.wait(self.fleet.poll_s)
        self._wake_agent.clear()
        if self._stop.is_set():
            return
        for step in self.store.claim(self.host):
            self._run_step(step)
        now = time.monotonic()
        if now - self._last_converge >= self.fleet.converge_s:
            self._last_converge = now
            self._converge()
        if now - self._last_report >= REPORT_EVERY_S:
            self._last_report = now
            self._report()

    def _import(self, model: str, digest: str) -> None:
        """Bring a snapshot from the shared store into this host's store and registry (verified)."""
        self.shared.import_into(self.plane.store, model, digest)
        tree = self.plane.store.tree_path(digest)
        shared = self.registry.get_snapshot(model, digest)
        result = validate_model_dir(tree, name=model)
        self.plane.registry.record_snapshot(
            model, digest, shared.manifest, config=result.config, versions=result.versions,
            served_versions=result.served_versions, valid=result.ok, problems=shared.problems,
            total_bytes=shared.total_bytes)

    def _deploy(self, model: str, digest: str | None, kind: str, actor: str) -> Outcome:
        if digest is None:
            return self.plane.deployer.unload(model, actor)
        self._import(model, digest)
        return self.plane.deployer.deploy(model, digest, actor, force=kind == "rollback", kind=kind)

    def _run_step(self, step: Step) -> None:
        started = time.monotonic()
        local = self.plane.registry.find_model(step.model)
        if local is not None and local.pinned:  # held by an operator's --host action: left alone
            message = f"host {self.host} held (pinned here); `tritonctl unpin {step.model} --host {self.host}`"
            self.store.finish_step(step, "skipped", message, host=self.host, serving=local.active_digest,
                                   audit=audit_event(FLEET_ACTOR, step.action, step.model, step.digest, "skipped",
                                                     f"rollout {step.rollout_id}: {message}"))
            self.report_now()
            return
        log.info("%s: rollout %s step %s: %s %s", step.model, step.rollout_id, step.id, step.action,
                 (step.digest or "-")[:12])
        try:
            outcome = self._deploy(step.model, step.digest or None, step.action, FLEET_ACTOR)
            state = "ok" if outcome.succeeded else "failed"
            message, result, serving = outcome.message, outcome.outcome, outcome.active_digest
        except TritonctlError as exc:
            state, message, result = "failed", str(exc), "failed"
            found = self.plane.registry.find_model(step.model)
            serving = found.active_digest if found else None
        self.store.finish_step(step, state, message, host=self.host, serving=serving, audit=audit_event(
            FLEET_ACTOR, step.action, step.model, step.digest, result, f"rollout {step.rollout_id}: {message}",
            int((time.monotonic() - started) * 1000)))

    def _converge(self) -> None:
        targets = self.store.targets()
        if not targets:
            return
        busy = {r["model"] for r in self.store.rollouts()}
        for model, target in sorted(targets.items()):
            if model in busy or self._stop.is_set():
                continue
            local = self.plane.registry.find_model(model)
            if local is not None and local.active_digest == target and local.state == "serving":
                continue
            if local is not None and local.pinned:
                continue
            try:
                mine = self.plane.registry.get_snapshot(model, target)
                if mine.quarantined:
                    continue  # failed here before; an operator retries with `tritonctl load --force`
            except TritonctlError:
                pass
            log.info("%s: converging to the fleet's %s", model, target[:12])
            started = time.monotonic()
            try:
                outcome = self._deploy(model, target, "deploy", "fleet-converge")
            except TritonctlError as exc:
                log.error("%s: converge: %s", model, exc)
                continue
            self.store.finish_step(
                Step(0, 0, self.host, 0, "deploy", target, "", "", model), "ok" if outcome.succeeded else "failed",
                outcome.message, host=self.host, serving=outcome.active_digest,
                audit=audit_event("fleet-converge", outcome.action, model, target, outcome.outcome,
                                  f"converge: {outcome.message}", int((time.monotonic() - started) * 1000)))

    def report_now(self) -> None:
        self._report()

    def _report(self) -> None:
        try:
            models = self.plane.registry.list_models()
        except StoreError:
            return
        # A host an operator acted on alone (--host) is pinned here: the fleet shows it `held`.
        self.store.report(self.host, {m.name: (m.active_digest, "held" if m.pinned else m.state)
                                      for m in models if m.active_digest or m.pinned})


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tritonctl")
    except PackageNotFoundError:
        return "dev"


MIGRATION_LOCK = 0x7472_6975


def upgrade_shared(registry: Registry) -> None:
    """Upgrade the shared registry's schema; daemons starting together take turns (an advisory lock)."""
    from controlplane.store import migrate

    if registry.engine.dialect.name != "postgresql":
        migrate.upgrade(registry)
        return
    from sqlalchemy import text

    with registry.engine.connect() as conn:
        conn.execute(text("SELECT pg_advisory_lock(:key)"), {"key": MIGRATION_LOCK})
        conn.commit()
        try:
            before, after = migrate.upgrade(registry)
            if before != after:
                log.info("shared registry schema upgraded %s -> %s", before or "empty", after)
        finally:
            conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": MIGRATION_LOCK})
            conn.commit()
