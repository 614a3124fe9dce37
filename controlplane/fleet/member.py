"""One daemon's part in a fleet: its threads (heartbeat, LISTEN, agent, leader), its election, and the
plane's fleet strategy (targets.FleetStrategy: load, rollback, unload, pin, policy act on the fleet).

The duties themselves live in their own rooms: the leader's (controlplane.fleet.leader: record what
the source holds through the shared pipeline, start rollouts), the rollout state machine
(controlplane.fleet.rollouts: canary, waves, fleet rollback), the host agent's
(controlplane.fleet.agent: run this host's steps, converge) and the operator's verbs
(controlplane.fleet.verbs). All SQL is in controlplane.store.fleet.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from controlplane.deploy.engine import Outcome, ProgressFn
from controlplane.documents.results import HoldResult, LeaseResult, PinResult, PolicyResult
from controlplane.errors import TritonctlError
from controlplane.fleet.agent import HostAgent
from controlplane.fleet.election import LeaderElection, connect
from controlplane.fleet.hostplane import HostPlane
from controlplane.fleet.journal import JOURNAL_NAME, Journal
from controlplane.fleet.leader import Leader
from controlplane.fleet.ondemand import FleetOnDemand
from controlplane.fleet.rollouts import FLEET_ACTOR, RolloutMachine, plan_waves
from controlplane.fleet.settings import FleetSettings
from controlplane.fleet.sharedcontent import open_shared_store
from controlplane.fleet.verbs import FleetVerbs
from controlplane.settings.config import Settings
from controlplane.store.fleet import LOOK_PREFIX, FleetStore, Rollout, listen
from controlplane.store.records import SnapshotRecord
from controlplane.store.registry import AuditEntry, Registry, utcnow

log = logging.getLogger("tritonctl.fleet")

__all__ = ["FleetMember", "plan_waves"]  # plan_waves: imported from here by tests and bench


class FleetMember:
    def __init__(self, settings: Settings, fleet: FleetSettings, plane: HostPlane, shared_registry: Registry) -> None:
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
        self.election = LeaderElection(settings.db_url or "", self.host, self._on_leadership,
                                       interval_s=fleet.heartbeat_s, health=shared_registry.health)
        self.machine = RolloutMachine(self.store, shared_registry, fleet, self.host)
        self.leader = Leader(settings, plane, shared_registry, self.store, self.shared, self.machine,
                             lambda: self.is_leader, self._stop)
        self.journal = Journal(settings.state_dir / JOURNAL_NAME)
        self.agent = HostAgent(self.host, plane, shared_registry, self.store, self.shared, fleet, self._stop,
                               self.journal)
        shared_registry.health.on_return.append(self._replay_journal)
        self._threads = [threading.Thread(target=self._guard, args=(fn, period), name=f"fleet-{name}", daemon=True)
                         for name, fn, period in (("heartbeat", self._heartbeat, fleet.heartbeat_s),
                                                  ("agent", self._agent_tick, None),
                                                  ("leader", self._leader_tick, None))]
        self._threads.append(threading.Thread(target=self._listen, name="fleet-listen", daemon=True))
        self.verbs = FleetVerbs(self)
        self.ondemand = FleetOnDemand(self.host, plane, shared_registry, lambda: self.settings, lambda: self.fleet)

    def reconfigure(self, fleet: FleetSettings) -> None:
        """SIGHUP: canaries, wave size, liveness window and converge period apply from their next use."""
        self.fleet = self.machine.fleet = self.agent.fleet = fleet

    # -- lifecycle ------------------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return self.election.is_leader

    def start(self) -> None:
        self._heartbeat()  # registered before anyone plans a wave
        written = self.journal.replay(self.store)  # what a stop during an outage left unwritten
        if written:
            log.info("fleet: wrote %d journal entr%s left from an outage", written, "y" if written == 1 else "ies")
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

    def _replay_journal(self, _outage_s: float) -> str:
        """The registry answers again: what this host did meanwhile is written, once (the INFO says so)."""
        written = self.journal.replay(self.store)
        return f"{written} journal entr{'y' if written == 1 else 'ies'} written"

    def _on_leadership(self, leader: bool) -> None:
        if leader:
            self.leader.scan_requested.set()  # the source may have changed while nobody led
            self._wake_leader.set()
            try:
                self.registry.audit(AuditEntry(FLEET_ACTOR, "leader", None, None, "ok", f"{self.host} leads the fleet"))
            except TritonctlError as exc:
                if not self.registry.health.told(exc):
                    log.error("audit: %s", exc)

    def _guard(self, fn: Callable[[], None], period: float | None) -> None:
        while not self._stop.is_set():
            try:
                fn()
            except TritonctlError as exc:
                if not self.registry.health.told(exc):  # an outage is told once, by the registry's health
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
                listen(conn)
                while not self._stop.is_set():
                    for note in conn.notifies(timeout=self.fleet.poll_s, stop_after=1):
                        if note.payload.startswith(LOOK_PREFIX):  # an operator lifted a pin or a policy
                            self.handle_settled(note.payload.removeprefix(LOOK_PREFIX))
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
        """Alive, with the addresses this host's clients send inference to (its gateway's when one carries the
        traffic: `hosts`' triton_url, where `ensure` sends a placed model's clients) and its budgets."""
        grpc_url, http_url = self.plane.inference_urls()
        self.store.heartbeat(self.host, grpc_url, _version(), self.started_at, http_url=http_url or "",
                             budgets=(self.settings.memory_budget_mb, self.settings.gpu_memory_budget_mb))

    def _leader_tick(self) -> None:
        self._wake_leader.wait(self.fleet.poll_s)
        self._wake_leader.clear()
        if self._stop.is_set() or not self.is_leader:
            return
        self.leader.tick()

    def _agent_tick(self) -> None:
        self._wake_agent.wait(self.fleet.poll_s)
        self._wake_agent.clear()
        if self._stop.is_set():
            return
        self.agent.tick()

    # -- the source repository (leader only) ------------------------------------------------------

    def handle_settled(self, model: str) -> None:
        """The watcher saw a model settle. Every host watches; only the leader acts."""
        if not self.is_leader:
            return
        self.leader.settled(model)
        self._wake_leader.set()

    def look_again(self, model: str) -> None:
        """Nothing holds `model` on the fleet any more (unpin, policy auto): the leader, wherever it
        runs, looks at its source again and proposes what the usual rules let through, as a single
        host's `converge` does."""
        if self.is_leader:
            self.handle_settled(model)
        else:
            self.store.ask_leader_to_look(model)

    def initial_scan(self) -> None:
        self.leader.scan_requested.set()
        self._wake_leader.set()

    def propose(self, model: str, record: SnapshotRecord, actor: str = "watcher") -> int | None:
        return self.leader.propose(model, record, actor)

    def _drive(self, rollout: Rollout) -> None:
        self.machine.drive(rollout)

    def report_now(self) -> None:
        self.agent.report()

    # -- the fleet as the plane's strategy (targets.FleetStrategy) --------------------------------

    def load(self, model: str, digest: str, actor: str, force: bool, progress: ProgressFn | None) -> Outcome:
        """`tritonctl load` on any host of a fleet: roll `digest` out to every host, streaming each step."""
        record = self.leader.publish(model, digest, actor)
        return self.leader.rollout(model, record, actor, force=force, progress=progress)

    def rollout(self, model: str, record: SnapshotRecord | None, actor: str, *, force: bool,
                progress: ProgressFn | None, kind: str = "rollout") -> Outcome:
        return self.leader.rollout(model, record, actor, force=force, progress=progress, kind=kind)

    def held(self, model: str, host: str, actor: str, action: Callable[[], Outcome]) -> Outcome:
        return self.verbs.held(model, host, actor, action)

    def rollback(self, model: str, actor: str, to: str | None, progress: ProgressFn | None, host: str) -> Outcome:
        return self.verbs.rollback(model, actor, to, progress, host)

    def unload(self, model: str, actor: str, dependents: bool, progress: ProgressFn | None, host: str) -> Outcome:
        return self.verbs.unload(model, actor, dependents, progress, host)

    def set_pin(self, model: str, pinned: bool, actor: str, host: str) -> PinResult | HoldResult:
        return self.verbs.set_pin(model, pinned, actor, host)

    def set_policy(self, model: str, policy: str, actor: str, host: str) -> PolicyResult:
        return self.verbs.set_policy(model, policy, actor, host)

    def ensure(self, model: str, for_s: float, actor: str) -> LeaseResult:
        return self.ondemand.ensure(model, for_s, actor)

    def ensure_for_request(self, model: str, for_s: float, actor: str) -> LeaseResult:
        """A load for requests waiting at this host's gateway: placed here if the fleet's placement allows."""
        return self.ondemand.ensure_for_request(model, for_s, actor)

    def ondemand_models(self) -> set[str]:
        return self.ondemand.models()

    def renew_lease(self, model: str, lease: str, for_s: float) -> LeaseResult:
        return self.ondemand.renew(model, lease, for_s)

    def release_lease(self, model: str, lease: str) -> LeaseResult:
        return self.ondemand.release(model, lease)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tritonctl")
    except PackageNotFoundError:
        return "dev"
