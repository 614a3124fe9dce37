"""The daemon's lifecycle: start-up (migrate, Triton, reconcile, control API, watcher, READY=1) →
main loop (settled models, periodic reconcile, Triton supervision, watchdog) → shutdown.

Signal handlers only set flags; the loop acts on them. SIGHUP re-reads the settings that can change
without a restart (policy, settle window, log level, reconcile interval); SIGTERM/SIGINT stop taking
new work, let in-flight deploys finish within `shutdown_timeout_s`, leave models loaded in an
external tritonserver and stop a launched one (unless `keep_triton`); a second SIGINT exits at once.
A launched tritonserver is the data plane and never dies with the daemon: a SIGKILLed daemon leaves
it serving, and the next start adopts it (controlplane/triton/launcher.py), whatever its ports, and
reconciles. One daemon per state directory (`daemon.lock`): a second would adopt the first one's server.
"""

from __future__ import annotations

import functools
import logging
import os
import queue
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

from controlplane.base import systemd
from controlplane.control_plane import ControlPlane
from controlplane.deploy.publish import ServingRepository
from controlplane.errors import TritonctlError
from controlplane.memory.onrequest import RequestLoads
from controlplane.outcomes.bus import Outcomes
from controlplane.outcomes.log import OutcomeLog
from controlplane.parts import build_parts
from controlplane.runtime.inflight import InFlight
from controlplane.runtime.reload import reloaded
from controlplane.runtime.waker import Waker, loop_sleep_s, sets
from controlplane.settings.config import Settings
from controlplane.snapshot import CONFIG_FILE, ContentStore
from controlplane.source.protocol import NoSource, Source
from controlplane.startup import bulk, launch, preflight
from controlplane.startup.dataplane import DataPlane
from controlplane.startup.record import Wave, deploy_alone, record_wave
from controlplane.startup.registries import open_registries
from controlplane.startup.scan import plan_start
from controlplane.startup.sources import configured_source
from controlplane.startup.statedir import StateDir
from controlplane.store.journaled import JournaledRegistry
from controlplane.store.records import SnapshotRecord
from controlplane.store.registry import AuditEntry, Registry
from controlplane.target.targets import FleetTarget
from controlplane.triton.client import Timeouts, TritonClient
from controlplane.triton.host import host_for
from controlplane.triton.launcher import TritonServer
from controlplane.validation.modelconfig import is_ensemble_text
from controlplane.vocab import SERVING_STATES

if TYPE_CHECKING:
    from controlplane.api.server import ApiServer
    from controlplane.fleet.member import FleetMember
    from controlplane.fleet.settings import FleetSettings
    from controlplane.outcomes.metrics import Metrics
    from controlplane.outcomes.webhooks import Webhooks

log = logging.getLogger("tritonctl.daemon")

TICK_S = 0.1
# Between reconciles, this often: is tritonserver alive (a dead or restarted one is reconciled at once), is a
# retry due (an environment fault's, a restore's: sent).
SUPERVISE_INTERVAL_S = 1.0
RECONCILE_CPU_BUDGET = 0.004  # the periodic reconcile's share of a core at most (a costly one: the next waits)


class Daemon:
    """One tritonctl daemon process."""

    def __init__(self, settings: Settings, reload_settings: Callable[[], Settings] | None = None,
                 fleet: FleetSettings | None = None) -> None:
        self.settings = settings
        self.fleet_settings = fleet  # with --fleet (docs/fleet.md); None: a single host
        self.fleet: FleetMember | None = None
        self.shared_registry: Registry | None = None
        self.reload_settings = reload_settings
        self.stop_requested = threading.Event()
        self.loop_turned_at: float | None = None  # the main loop's heartbeat (/v1/live); None: starting
        self.reload_requested = threading.Event()
        self._sigint_count = 0
        self._settled: queue.Queue[tuple[str, bool]] = queue.Queue()  # (model, declared complete)
        self._wake = Waker()  # the main loop's sleep until its next duty, cut short by a hand-on or a signal
        self.inflight = InFlight()  # what a stop waits for (reconcile runs in a worker and may submit work too)
        self._reconciling: Future[Any] | None = None
        self.executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="deploy")
        self.data = DataPlane(settings)  # tritonserver and the gateway in front of it (startup/dataplane.py)
        self.triton_server: TritonServer | None = None
        self.triton_key_exposed = False  # other local users can read the launched tritonserver's key
        self.source: Source = NoSource()  # where models come from (controlplane/source/protocol.py)
        self.api: ApiServer | None = None
        self.metrics: Metrics | None = None
        self.plane: ControlPlane | None = None
        self.registry: JournaledRegistry | None = None
        self.serving: ServingRepository | None = None  # the serving root a launched tritonserver reads
        self._preloaded: list[str] = []  # what the tritonserver launched at start loaded in its start-up
        # a fresh tritonserver whose launch waits for the first start's deploys (controlplane/startup/bulk.py)
        self._deferred_launch = False
        self.outcome_log: OutcomeLog | None = None  # every outcome's log line and STATUS= (outcomes/log.py)
        self.webhooks: Webhooks | None = None
        self.request_loads: RequestLoads | None = None  # with a gateway: requests load the models they ask for
        self.state_dir = StateDir(settings.state_dir)  # its layout, and daemon.lock held while this daemon runs
        self._reconcile_cpu_s = 0.0  # CPU the last reconcile took (RECONCILE_CPU_BUDGET)

    # -- start-up -------------------------------------------------------------------------------

    def _start_triton(self, serving: ServingRepository) -> tuple[str, str | None]:
        """The tritonserver this daemon drives (controlplane/startup/dataplane.py): its gRPC URL and key."""
        assert self.registry is not None
        url, key = self.data.start_triton(self.registry, serving)
        self.triton_server, self._preloaded = self.data.triton_server, self.data.preloaded
        self._deferred_launch = self.data.deferred_launch
        return url, key

    def start(self) -> None:
        settings = self.settings
        preflight.check(settings)  # a bad argument stops the start before anything exists
        self.triton_key_exposed = launch.key_exposed(settings)  # before anything is created or launched
        self.state_dir.prepare()
        self.registry, self.shared_registry = open_registries(settings, fleet=self.fleet_settings is not None)
        store = ContentStore(settings.state_dir / "store", max_model_bytes=settings.max_model_bytes)
        serving = self.serving = ServingRepository(settings.state_dir / "serving", settings.state_dir / "published")
        if swept := serving.sweep_temp_links():
            log.info("removed %d temporary serving links a stop left mid-swap", swept)
        url, key = self._start_triton(serving)
        gateway = self.data.start_gateway()  # in front of it: the clients' ports (docs/gateway.md)
        triton = TritonClient(url, restricted_key=key, timeouts=Timeouts(load_s=settings.load_timeout_s))
        # The source is built (not watched yet) before the plane, which holds it.
        self.source = configured_source(settings, self.registry, shared=self.shared_registry,  # MLflow's write-back
                                        leads=lambda: self.fleet is not None and self.fleet.is_leader)
        from controlplane.outcomes.webhooks import for_registry

        # in a fleet the shared registry's events, sent by the leader only (the member is built with the
        # plane, after this: asked at each round)
        self.webhooks = for_registry(settings, self.shared_registry or self.registry,
                                     fleet=self.shared_registry is not None,
                                     active=lambda: self.fleet is not None and self.fleet.is_leader)
        self.outcomes = Outcomes()  # every finished operation, to the subscribers wired by build_parts and here
        parts = build_parts(  # this host's parts (controlplane/parts.py), then the verbs over them
            settings, self.registry, store, serving, triton, outcomes=self.outcomes, webhooks=self.webhooks,
            host=host_for(triton, self.triton_server, metrics_url=settings.triton_metrics_url,
                          log_path=settings.triton_log_path),
            source=self.source, http_url=self.data.http_url(), gateway=gateway)
        parts.gateway = self.data.gateway_info  # status: where clients send inference, and the server behind it
        self.plane = ControlPlane(parts, target=self._fleet_target if self.fleet_settings is not None else None)
        self.outcome_log = OutcomeLog(self.registry, parts.counters)
        self.outcomes.subscribe(self.outcome_log.note)  # after the parts' own bookkeeping (its last action)
        server = self.triton_server  # a bake's p99s come from Triton's metrics (controlplane/triton/summaries.py)
        parts.baker.metrics_url = lambda: server.metrics_url if server is not None else settings.triton_metrics_url
        self.plane.preloaded(self._preloaded)
        self.plane.triton_key_exposed = self.triton_key_exposed  # status's triton_key_exposed
        if self.triton_server is not None and self.triton_server.adopted_pid:
            # only this daemon can load into the server it launched: it serves what the registry says,
            # but for interrupted deployments, which the first reconcile recovers from Triton itself
            open_models = {d.model for d in self.registry.open_deployments()}
            self.plane.served_view.assume({m.name: m.active_digest for m in self.registry.list_models(
                states=SERVING_STATES) if m.name not in open_models})
        if settings.metrics_port:
            from controlplane.outcomes.metrics import Metrics

            self.metrics = Metrics(self.plane, settings.metrics_port, backlog=self.source.backlog)
            self.metrics.start()
            self.outcomes.subscribe(self.metrics.observe)
        # READY before the deploys: a restart's restores (a fresh tritonserver serves nothing) also go
        # on behind READY, before the initial scan (bench/scale.py --serve-all: restart time)
        behind_ready = not settings.ready_waits_for_deploys and self.fleet_settings is None
        if not behind_ready and not self._deferred_launch:  # else: once the initial scan launched it
            self.plane.reconcile()
        from controlplane.api.server import ApiServer

        self.api = ApiServer(self.plane, self.executor, settings, loop_age_s=self.loop_age_s)
        self.api.start()
        self.webhooks.start()
        self.plane.ondemand.start()  # lease expiries and idle on-demand models (controlplane/memory/ondemand.py)
        self.request_loads = parts.request_loads  # requests load models (memory/onrequest.py; a fleet's placement)
        if self.request_loads is not None:
            self.request_loads.start(fleet=self.fleet)
        self.plane.baker.start()  # bakes of new digests on Triton's figures (controlplane/bake/baker.py)
        if self.plane.deployer.drainer is not None:  # names a switch left, unloaded once drained (deploy/drain.py)
            self.plane.deployer.drainer.start()
        self.source.watch(self._hand_on)
        if self.fleet is not None:
            self.fleet.start()  # the leader scans the source; every host converges to the fleet
        elif settings.ready_waits_for_deploys:
            self._initial_scan()
        else:  # READY now; the deploys go on behind it (`status` shows them pending)
            self.inflight.track(self.executor.submit(self._guarded, lambda _: self._reconcile_then_scan(),
                                                     "initial scan"))
        self.registry.audit(AuditEntry("tritonctl", "daemon_start", None, None, "ok", f"triton {url}"))
        systemd.ready(self.status_line())
        log.info("ready: control socket %s, triton %s%s", settings.socket_path, url, self.data.inference_urls())
        # The inotify watches (20,000 at 10,000 models: a third of a restart's CPU) are added behind
        # READY, in a thread of their own; a change made before its directory is watched is handed on by
        # the rescan that follows them (controlplane/source/inotify.py, start_events).
        self.source.start_events()

    def _fleet_target(self, plane: ControlPlane) -> FleetTarget:
        """Where the plane's verbs send changes with --fleet: this daemon's part in the fleet (a rollout over
        every host, or one host the fleet holds)."""
        from controlplane.fleet.member import FleetMember

        assert self.fleet_settings is not None and self.shared_registry is not None
        self.fleet = FleetMember(self.settings, self.fleet_settings, plane, self.shared_registry)
        return FleetTarget(self.fleet, plane.registry, plane.deployer, plane.retries)

    def _reconcile_then_scan(self) -> None:
        assert self.plane is not None
        if not self._deferred_launch:  # else: once the initial scan launched tritonserver
            self.plane.reconcile()  # finish interrupted deployments and restore first, as before READY
        self._initial_scan()

    def _initial_scan(self) -> None:
        """Record (and, under auto policy, deploy) what changed in the source since the last start: the
        models whose signature differs from the recorded one, or that auto policy owes a deploy
        (controlplane/startup/scan.py); the others cost nothing. Step models first, `startup_parallelism`
        at once, then the ensembles over them. Progress goes to systemd's STATUS= and `status`."""
        assert self.plane is not None and self.registry is not None
        plane = self.plane
        names = self.source.names()
        plan = plan_start(names, self.source.signatures(), plane.source_graph.entries(), self.registry,
                          plane.effective_policy)
        plane.counts.add("start_unchanged", len(plan.unchanged))
        plane.counts.add("start_changed", len(plan.changed) + len(plan.redeploy))
        log.info("initial scan: %d models, %d unchanged since recorded, %d changed or new, %d owed a deploy",
                 len(names), len(plan.unchanged), len(plan.changed), len(plan.redeploy))
        todo = [*plan.changed, *plan.redeploy]
        redeploy = set(plan.redeploy)
        ensembles = sorted(n for n in todo if (plane.source_graph.steps(n) is not None if n in redeploy
                                               else self._is_ensemble(n)))
        members = sorted(set(todo) - set(ensembles))
        total, done = len(todo), 0
        plane.in_hand.starting(set(todo))  # `status`: sync pending ("start-up scan") until handled
        reporting = self.outcome_log.scan_reporting() if self.outcome_log is not None else nullcontext()
        with reporting, ThreadPoolExecutor(max_workers=self._startup_parallelism(),
                                                        thread_name_prefix="startup") as pool:
            deferred = self._deferred_launch  # a fresh tritonserver loads the deploys in its start-up
            staged: dict[str, SnapshotRecord] = {}  # those deploys (controlplane/startup/bulk.py)
            waves: list[tuple[list[str], Wave]] = []
            bulks: list[bulk.Bulk] = []
            for group in (members, ensembles):  # an ensemble loads only once its steps serve (or are staged)
                # the changed ones recorded in batches (controlplane/startup/record.py); what needs more
                # than a record, or a deploy alone, goes on model by model
                wave = record_wave(plane, [n for n in group if n not in redeploy], pool, staged=staged)
                for name in wave.recorded:
                    plane.in_hand.started(name)
                done += len(wave.recorded)
                if deferred:
                    bulks.append(bulk.stage_all(plane, wave.deploy, pool, staged))
                    wave.settle += bulks[-1].handed_back
                    wave.deploy = []
                waves.append((group, wave))
                if not deferred:
                    done = self._run_wave(group, wave, redeploy, pool, done, total, len(plan.unchanged))
            if deferred:
                for name in self._launch_with(bulks, pool):
                    plane.in_hand.started(name)
                    done += 1
                self._scan_status(done, total, len(plan.unchanged))
                for group, wave in waves:
                    done = self._run_wave(group, wave, redeploy, pool, done, total, len(plan.unchanged))
        plane.in_hand.starting(set())
        plane.serving_ensembles.warm()  # the first edit after a start does not pay for reading them

    def _run_wave(self, group: list[str], wave: Wave, redeploy: set[str], pool: ThreadPoolExecutor, done: int,
                  total: int, unchanged: int) -> int:
        """A start-up wave's models that go on model by model; returns how many are done now."""
        futures = [pool.submit(self._startup_one, name) for name in group if name in redeploy]
        futures += [pool.submit(self._startup_one, name) for name in wave.settle]
        futures += [pool.submit(self._startup_deploy, name, digest) for name, digest in wave.deploy]
        for future in futures:
            future.result()
            done += 1
            if done % 50 == 0 or done == total:
                self._scan_status(done, total, unchanged)
        return done

    @staticmethod
    def _scan_status(done: int, total: int, unchanged: int) -> None:
        systemd.status(f"initial scan: {done}/{total} changed models recorded or deployed ({unchanged} unchanged)")

    def _launch_with(self, bulks: list[bulk.Bulk], pool: ThreadPoolExecutor) -> list[str]:
        """The deferred launch with the first start's deploys (controlplane/startup/launch.py
        `launch_staged`); returns the staged models."""
        assert self.plane is not None and self.triton_server is not None and self.serving is not None
        assert self.registry is not None
        try:
            self._preloaded, names = launch.launch_staged(self.settings, self.registry, self.triton_server,
                                                          self.serving, self.plane, bulks, pool)
        finally:
            self._deferred_launch = False  # supervision watches it from now on
        return names

    def _startup_parallelism(self) -> int:
        """How many start-up models go to Triton at once: `startup_parallelism`, or (0) Triton's own
        model-load thread count (`--model-load-thread-count` of a launched server; an external server's
        `triton_load_threads`)."""
        return self.plane.load_parallelism() if self.plane is not None else 1

    def _is_ensemble(self, name: str) -> bool:
        return is_ensemble_text(self.source.read_text(name, CONFIG_FILE) or "")

    def _startup_deploy(self, name: str, digest: str) -> None:
        """A model the start-up scan recorded and may deploy alone (controlplane/startup/record.py); the
        watcher's path when its source changed meanwhile."""
        assert self.plane is not None
        if self.stop_requested.is_set():
            return
        try:
            if deploy_alone(self.plane, name, digest):
                self.plane.in_hand.started(name)
                return
        except TritonctlError as exc:
            log.error("%s: %s", name, exc)
        except Exception:  # noqa: BLE001 - one model's bug must not stop the others' start-up
            log.exception("unexpected error deploying %s at start-up", name)
        else:
            self._startup_one(name)
            return
        self.plane.in_hand.started(name)

    def _startup_one(self, name: str) -> None:
        assert self.plane is not None
        if self.stop_requested.is_set():
            return  # SIGTERM during start-up: the rest waits for the next start
        try:
            self.plane.handle_settled(name)
        except TritonctlError as exc:
            log.error("%s: %s", name, exc)
        except Exception:  # noqa: BLE001 - one model's bug must not stop the others' start-up
            log.exception("unexpected error handling %s at start-up", name)
        finally:
            self.plane.in_hand.started(name)

    # -- main loop ------------------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self._on_stop_signal)
        signal.signal(signal.SIGINT, self._on_stop_signal)
        signal.signal(signal.SIGHUP, sets(self.reload_requested, self._wake))

    def _on_stop_signal(self, signum: int, _frame: Any) -> None:
        if signum == signal.SIGINT:
            self._sigint_count += 1
            if self._sigint_count > 1:
                for pid in (p.pid for p in (self.triton_server, self.data.gateway) if p is not None):
                    if pid is not None and not self.settings.keep_triton:
                        try:  # do not leave a launched tritonserver or gateway (their own sessions) behind
                            os.killpg(pid, signal.SIGKILL)
                        except OSError:
                            pass
                os._exit(130)  # the operator insists
        self.stop_requested.set()
        self._wake.set()  # the loop sees it at once

    def run(self) -> int:
        """Start, loop until asked to stop, shut down. Returns the exit code."""
        try:
            self.start()
        except BaseException:
            self._cleanup_failed_start()
            raise
        assert self.plane is not None
        interval = systemd.watchdog_interval_s()
        next_ping = time.monotonic()
        next_reconcile = time.monotonic() + self.settings.reconcile_interval_s
        next_supervise = time.monotonic() + SUPERVISE_INTERVAL_S
        hang_fault = os.environ.get("TRITONCTL_FAULT") == "hang_loop"  # test-only (tests/test_systemd.py)
        while not self.stop_requested.is_set():
            now = time.monotonic()
            if hang_fault and (self.settings.state_dir / "hang-loop").exists():
                log.error("fault injection: the main loop blocks until a stop signal")
                self.stop_requested.wait()  # the API threads keep answering; the watchdog pings stop
                continue
            self.loop_turned_at = now  # the heartbeat /v1/live reads, stamped where the watchdog is pinged
            if interval is not None and now >= next_ping:
                systemd.watchdog_ping()  # from the loop that does the work: a hung loop stops pinging
                next_ping = now + interval
            if self.reload_requested.is_set():
                self.reload_requested.clear()
                self._reload()
            self._wake.clear()  # before dispatching: a hand-on from now on wakes the next wait
            self._dispatch_settled()
            if now >= next_reconcile and (self._reconciling is None or self._reconciling.done()):
                # In a worker: a restore or a restart can outlast the watchdog; the loop keeps pinging.
                self._reconciling = self.executor.submit(self._guarded, self._supervise_and_reconcile)
                self.inflight.track(self._reconciling)
                next_reconcile = time.monotonic() + max(self.settings.reconcile_interval_s,
                                                        self._reconcile_cpu_s / RECONCILE_CPU_BUDGET)
            elif now >= next_supervise and (self._reconciling is None or self._reconciling.done()):
                self._reconciling = self.executor.submit(self._guarded, self._supervise)
                self.inflight.track(self._reconciling)
                next_supervise = time.monotonic() + SUPERVISE_INTERVAL_S
            self.inflight.prune()
            # until the next duty (a reconcile still running: a tick); a hand-on or a signal wakes it at once
            self._wake.wait(loop_sleep_s(time.monotonic(), next_reconcile, next_supervise,
                                         next_ping if interval is not None else None, floor_s=TICK_S))
        abandoned = self.shutdown()
        if abandoned:
            # Worker threads would hold the exit; the next start recovers the interrupted deployments.
            logging.shutdown()
            os._exit(0)
        return 0

    def loop_age_s(self) -> float | None:
        """Seconds since the main loop last turned (/v1/live); None while starting (systemd's start timeout, or
        a Kubernetes startupProbe on /v1/ready, covers a start-up that hangs)."""
        turned = self.loop_turned_at
        return None if turned is None else time.monotonic() - turned

    def _dispatch_settled(self) -> None:
        assert self.plane is not None
        while True:
            try:
                model, complete = self._settled.get_nowait()
            except queue.Empty:
                return
            handler: Callable[[str], Any] = (
                self.fleet.handle_settled if self.fleet is not None
                else functools.partial(self.plane.handle_settled, complete=True) if complete
                else self.plane.handle_settled
            )
            self.inflight.track(self.executor.submit(self._guarded, self._handle_handed, model, handler))

    def _hand_on(self, model: str, complete: bool = False) -> None:
        """The source's callback (its own thread): queue `model` for capture; until its handler
        returns, `status` shows it `sync: pending` ("capturing"). `complete`: its writer declared it
        whole (renamed in, symlink flip, commit marker): captured at once, without the quiet check."""
        if self.plane is not None:
            self.plane.in_hand.handed_on(model)
        self._settled.put((model, complete))
        self._wake.set()

    def _handle_handed(self, model: str, handler: Callable[[str], Any]) -> Any:
        try:
            return handler(model)
        finally:
            if self.plane is not None:
                self.plane.in_hand.handled(model)

    def _guarded(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except TritonctlError as exc:
            if self.registry is None or not self.registry.health.told(exc):
                log.error("%s: %s", args[0] if args else fn.__name__, exc)
        except Exception:  # noqa: BLE001 - a bug in one model's pipeline must not stop the daemon
            log.exception("unexpected error handling %s", args)
        return None

    def _supervise(self) -> None:
        """The quick check between reconciles: reconcile now if tritonserver died, went away or came back."""
        assert self.plane is not None
        server = self.triton_server
        if self._deferred_launch:
            return  # the initial scan launches it
        self.data.supervise_gateway()  # a gateway that died: started again with its last routes
        if server is not None:
            changed = not server.is_running()
        else:
            live = self.plane.triton.server_live()
            changed = live != self.plane.counters.triton_reachable
            if changed:
                log.warning("tritonserver at %s %s; reconciling now", self.plane.triton.url,
                            "answers again (restarted?)" if live else "stopped answering")
            elif live and self.plane.restart_suspected():
                changed = True
                log.warning("tritonserver at %s no longer serves %s (restarted?); reconciling now",
                            self.plane.triton.url, self.plane.sentinel)
        reachable = self.plane.counters.triton_reachable and not self.stop_requested.is_set()
        if changed and not self.stop_requested.is_set() or reachable and self.plane.restores.due():
            self._supervise_and_reconcile()  # a restore's retry due: the reconcile restores it on time
        elif reachable:
            self._retry_due(self.plane)

    def _retry_due(self, plane: ControlPlane) -> None:
        """Each supervision round: "retry in 5 s" fires at 5 s, not at the next reconcile (issue 57: 9.4 s)."""
        for model in plane.due_retries():  # their backoffs are over (controlplane/deploy/causes.py)
            self.inflight.track(self.executor.submit(self._guarded, plane.retry, model))

    def _supervise_and_reconcile(self) -> None:
        assert self.plane is not None
        server = self.triton_server
        if self._deferred_launch:
            return  # the initial scan launches it
        if server is not None and not server.is_running() and not self.stop_requested.is_set():
            log.error("launched tritonserver died (code %s); restarting", server.process and server.process.returncode)
            self.plane.counters.triton_reachable = False  # a fresh server: re-check the source below
            try:
                server.stop()
                assert self.serving is not None and self.registry is not None
                self.plane.preloaded(launch.launch(self.settings, self.registry, server, self.serving)[0])
            except TritonctlError as exc:
                log.error("restarting tritonserver: %s", exc)
                return
        was_reachable = self.plane.counters.triton_reachable
        cpu_started = time.thread_time()
        try:
            self.plane.reconcile()
        except TritonctlError as exc:
            if not self.plane.registry.health.told(exc):  # an outage is told once (controlplane/store/health.py)
                log.error("reconcile: %s", exc)
        self._reconcile_cpu_s = time.thread_time() - cpu_started
        if self.plane.counters.triton_reachable and not self.stop_requested.is_set():
            self._retry_due(self.plane)  # environment faults, with backoff
        if self.fleet is not None and self.plane.counters.triton_reachable and not was_reachable:
            self.fleet.initial_scan()
        elif self.plane.counters.triton_reachable and not was_reachable:
            # Triton is back: changes recorded while it was away deploy now (auto policy).
            log.info("tritonserver reachable again; re-checking the source repository")
            self.inflight.track(self.executor.submit(self._guarded, lambda _: self._initial_scan(), "rescan"))
        systemd.status(self.status_line())

    def _reload(self) -> None:
        systemd.reloading()
        if self.reload_settings is not None:
            try:
                read = self.reload_settings()
            except TritonctlError as exc:
                log.error("reload refused, keeping the running settings: %s", exc)
            else:
                self.settings = reloaded(self.settings, read, self.plane, self.source, self.fleet, self.webhooks)
        systemd.ready(self.status_line())

    def status_line(self) -> str:
        return self.outcome_log.line() if self.outcome_log is not None else "starting"

    # -- shutdown -------------------------------------------------------------------------------

    def shutdown(self) -> bool:
        """Stop taking work, let in-flight work finish within the bound, release everything.

        Returns whether work was still running when the bound passed (the caller exits regardless).
        """
        systemd.stopping()
        log.info("stopping: no new work; waiting up to %.0fs for deploys in flight", self.settings.shutdown_timeout_s)
        deadline = time.monotonic() + self.settings.shutdown_timeout_s
        self.source.stop()
        if self.fleet is not None:
            self.fleet.stop()
        if self.api is not None:
            self.api.stop(grace_s=1.0)
        if self.webhooks is not None:
            self.webhooks.stop()
        if self.request_loads is not None:
            self.request_loads.stop()
        if self.plane is not None:
            self.plane.ondemand.stop()
            self.plane.baker.stop()
            if self.plane.deployer.drainer is not None:
                self.plane.deployer.drainer.stop()
        self.executor.shutdown(wait=False, cancel_futures=True)  # queued work is dropped, running work ends
        # also operations the control API started in its own threads
        running = self.inflight.wait(deadline, self.plane.deployer.busy_models if self.plane else list, TICK_S)
        abandoned = bool(running)
        if abandoned:
            log.warning("shutdown bound of %.0fs passed with work in flight (%s); the next start recovers it",
                        self.settings.shutdown_timeout_s, ", ".join(running))
        if self.metrics is not None:
            self.metrics.stop()
        if self.registry is not None:
            try:
                self.registry.audit(AuditEntry("tritonctl", "daemon_stop", None, None, "ok", "clean shutdown"))
            except TritonctlError as exc:
                log.error("audit at shutdown: %s", exc)
        self.data.stop()  # tritonserver and the gateway, unless keep_triton leaves them serving
        if self.plane is not None:
            self.plane.triton.close()
        if self.registry is not None:
            self.registry.close()
        if self.shared_registry is not None:
            self.shared_registry.close()
        self.state_dir.unlock()
        log.info("stopped")
        return abandoned

    def _cleanup_failed_start(self) -> None:
        """Start-up failed part-way: release what was started (above all a launched tritonserver)."""
        for stop in (
            self.source.stop,
            lambda: self.fleet.stop() if self.fleet else None,
            lambda: self.api.stop(grace_s=0.5) if self.api else None,
            lambda: self.webhooks.stop() if self.webhooks else None,
            lambda: self.metrics.stop() if self.metrics else None,
            self.data.stop_failed_start,  # what this start launched; an adopted server was serving before it
            lambda: self.registry.close() if self.registry else None,
            lambda: self.shared_registry.close() if self.shared_registry else None,
            self.state_dir.unlock,
        ):
            try:
                stop()
            except Exception:  # noqa: BLE001 - the start-up error is the one to report
                log.debug("cleanup after failed start", exc_info=True)
        self.executor.shutdown(wait=False, cancel_futures=True)

