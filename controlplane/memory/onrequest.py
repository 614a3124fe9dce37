"""Requests load models: the daemon's side of the gateway's waiting requests (controlplane/gateway/parking.py).

Why: a client should not have to manage what is loaded (ModelMesh loads a model when a request for it arrives
and evicts by LRU). With a gateway in front of tritonserver, a request for a model that is registered but not
loaded waits in the gateway while this module loads it (docs/ondemand.md "Requests load models"):

- **Which models a request loads** (`loads_on_request`): a registered model that does not serve now and was
  evicted (by the memory budget, or unloaded for idleness), or whose policy is `ondemand` — unless its last
  operation is an operator's `unload`, which stays (the operator said so; `load` or `ensure` serves it
  again). `sync` keeps the gateway's route of each such model `loadable` (and deletes the `loadable` route
  of a model that no longer is one: an operator's unload, a model removed from the source, a policy
  changed), each under the model's deploy lock, whenever the registry was written since the last sync. An
  eviction routes its model `loadable` itself (controlplane/deploy/routed.py `take_out_model`).
- **One load per model**: a thread long-polls the gateway's `wanted`; each wanted model is loaded once,
  however many requests wait (one load in flight per model here, and `ensure`'s per-model lock), as an
  `ensure` by `tritonctl:gateway` (audited `ondemand` like every on-demand load, the memory budget making
  room first) whose lease is released as soon as it answered. Its switch makes the route `serving`, which
  lets the waiting requests go on. A load the budget can never make room for by itself (pinned and protected
  models alone hold it) is refused at once, the holders named; one that waits for room (leased, busy or
  loading models hold it) says so in a `note`, which a request that times out gets; any failure is sent
  with `refuse`, and every waiting request gets it (503 / UNAVAILABLE).
- **Last use**: `last_requests` is each model's last inference request through the gateway; the memory
  budget's LRU and the idle sweep read it instead of Triton's last-inference stamps (controlplane/parts.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from datetime import datetime
from typing import Any, Protocol

from controlplane.deploy.aliases import LOADABLE, Aliases, Route
from controlplane.deploy.engine import Deployer
from controlplane.documents.results import LeaseResult
from controlplane.errors import NotFoundError, TritonctlError
from controlplane.memory.budget import MemoryGuard
from controlplane.memory.ondemand import OnDemand
from controlplane.store.records import DeploymentRecord, ModelRecord
from controlplane.store.registry import Registry
from controlplane.vocab import SERVING_STATES, ModelState, Policy

log = logging.getLogger("tritonctl.ondemand")

GATEWAY_ACTOR = "tritonctl:gateway"
POLL_S = 2.0  # one `wanted` poll waits at most this long (a sync runs between two)
LEASE_S = 5.0  # the ensure's own lease, released once it answered: the waiting requests are the use
MARGIN_S = 0.5  # the load's wait for room ends this much before the requests' own wait
WORKERS = 4  # models loaded at once on request
NOT_SERVING = (ModelState.NEW.value, ModelState.UNLOADED.value, ModelState.FAILED.value)
MANY = 500  # more candidates than this: every model's last deployment is read in one query instead
FLEET_SYNC_S = 10.0  # on a fleet, the routes are synced this often too (the fleet's models change elsewhere)
_NO_POLICY = ModelRecord("", None, False, None, "", None, None, datetime(1970, 1, 1), None)  # the default policy's


class RequestPort(Protocol):
    """What this module asks of the gateway's control channel (controlplane/startup/gateway.py GatewayPort)."""

    def wanted(self, after: int, wait_s: float, load_wait_s: float | None = None) -> tuple[int, dict[str, Any]]: ...

    def note(self, model: str, text: str) -> bool: ...

    def refuse(self, model: str, reason: str) -> int: ...

    def last(self) -> dict[str, float]: ...


class FleetPort(Protocol):
    """On a fleet, its member (controlplane/fleet/member.py): loads through the fleet's placement."""

    def ensure_for_request(self, model: str, for_s: float, actor: str) -> LeaseResult: ...

    def release_lease(self, model: str, lease: str) -> LeaseResult: ...

    def ondemand_models(self) -> set[str]: ...

    @property
    def registry(self) -> Registry: ...  # the fleet's shared registry, whose outage it tells itself


def loads_on_request(record: ModelRecord, policy: str, last: DeploymentRecord | None) -> bool:
    """Whether a request for `record` loads it (see the module docstring): not serving, not removed, not last
    unloaded by an operator; and evicted (or loaded on demand since), or under policy ondemand."""
    if record.removed_at is not None or record.state in SERVING_STATES:
        return False
    kind = last.kind if last is not None else None
    if kind == "unload":
        return False
    return kind in ("evict", "ondemand") or policy == Policy.ONDEMAND


class RequestLoads:
    """The loadable routes, the loads the gateway's waiting requests ask for, and the gateway's last use."""

    def __init__(self, port: RequestPort, registry: Registry, deployer: Deployer, aliases: Aliases,
                 ondemand: OnDemand, guard: MemoryGuard, policy_of: Callable[[ModelRecord], str],
                 load_wait_s: Callable[[], float]) -> None:
        self.port = port
        self.registry = registry
        self.deployer = deployer
        self.aliases = aliases
        self.ondemand = ondemand
        self.guard = guard
        self.policy_of = policy_of
        self.load_wait_s = load_wait_s
        # how a wanted model is loaded and its lease let go: this host's ensure (a fleet's daemon may route it
        # through the fleet's placement instead: controlplane/daemon.py)
        self.ensure: Callable[[str, float, str, float], LeaseResult] = \
            lambda model, for_s, actor, wait_s: ondemand.ensure(model, for_s, actor, wait_s=wait_s)
        self.release: Callable[[str, str], object] = ondemand.release
        # on a fleet, its on-demand models (controlplane/fleet/ondemand.py): loadable here whether this host
        # knows them yet or not, and loaded through the fleet's placement (`ensure` above)
        self.fleet_models: Callable[[], set[str]] | None = None
        self._registries = [registry]  # the registries a round reads (the fleet's too): their outages' voices
        self._synced_at = 0.0
        self.counts = {"loads": 0, "refused": 0}
        self._busy: set[str] = set()
        self._guard = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="request-load")
        self._synced: tuple[int, str] | None = None  # (registry writes, default policy) of the last sync

    # -- last use -----------------------------------------------------------------------------------

    def last_requests(self) -> dict[str, float] | None:
        """Each model's last inference request through the gateway (None: the gateway did not answer)."""
        try:
            return self.port.last()
        except TritonctlError as exc:
            log.debug("the gateway's last requests: %s", exc)
            return None

    # -- the loadable routes ------------------------------------------------------------------------

    def _default_policy(self) -> str:
        return self.policy_of(_NO_POLICY)

    def sync(self, force: bool = False) -> dict[str, Route]:
        """Route `loadable` every model a request loads that has no route, delete the `loadable` routes of
        models that no longer are; only when the registry was written or the default policy changed since
        the last sync (or `force`). Returns the routes changed."""
        key = (self.registry.writes, self._default_policy())
        fleet = self.fleet_models is not None and time.monotonic() - self._synced_at >= FLEET_SYNC_S
        if not force and key == self._synced and not fleet:
            return {}
        self._synced, self._synced_at = key, time.monotonic()
        candidates = self.registry.list_models(states=NOT_SERVING)
        names = [r.name for r in candidates]
        last = self.registry.last_deployments(names if len(names) <= MANY else None) if names else {}
        want = {r.name for r in candidates if loads_on_request(r, self.policy_of(r), last.get(r.name))}
        placed = self.fleet_models() if self.fleet_models is not None else set()
        if placed:  # the fleet's on-demand models: loadable here unless this host serves one or unloaded it
            local = {r.name: r for r in self.registry.list_models(names=sorted(placed))}
            lasts = self.registry.last_deployments(sorted(placed) if len(placed) <= MANY else None)
            want |= {m for m in placed if m not in local
                     or loads_on_request(local[m], Policy.ONDEMAND, lasts.get(m))}
        routed, loadable = self.aliases.targets(), self.aliases.loadable()
        moves = sorted({m for m in want if m not in loadable and m not in routed} | (loadable - want))
        changes: dict[str, Route] = {}
        with ExitStack() as stack:
            for model in moves:
                lock = self.deployer.lock(model)
                if not lock.acquire(blocking=False):  # an operation holds it: its end writes, the next sync sees it
                    continue
                stack.callback(lock.release)
                record = self.registry.find_model(model)
                policy = Policy.ONDEMAND if model in placed else self.policy_of(record) if record else ""
                now = (record is None and model in placed) or (record is not None and loads_on_request(
                    record, policy, self.registry.last_deployment(model)))
                if self.aliases.target(model) is not None:
                    continue
                if now and model not in self.aliases.loadable():
                    changes[model] = LOADABLE
                elif not now and model in self.aliases.loadable():
                    changes[model] = None
            self.aliases.switch(changes)
        if changes:
            log.info("gateway routes: %d models load on request, %d no longer",
                     sum(1 for c in changes.values() if c is LOADABLE), sum(1 for c in changes.values() if c is None))
        return changes

    # -- the loads ----------------------------------------------------------------------------------

    def start(self, fleet: FleetPort | None = None) -> None:
        """The thread that polls the gateway; on a fleet, the loads go through its placement (a request at this
        host's gateway places the model here when it can: controlplane/fleet/ondemand.py), and its on-demand
        models are routed loadable here whether this host knows them yet or not."""
        if fleet is not None:
            self.ensure = lambda model, for_s, actor, _wait_s: fleet.ensure_for_request(model, for_s, actor)
            self.release = fleet.release_lease
            self.fleet_models = fleet.ondemand_models
            self._registries.append(fleet.registry)
        self._thread = threading.Thread(target=self._run, name="request-loads", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _run(self) -> None:
        generation = 0
        while not self._stop.is_set():
            try:
                self.sync()
            except TritonctlError as exc:
                if not any(r.health.told(exc) for r in self._registries):  # an outage has one voice (store/health.py)
                    log.warning("gateway routes of the models a request loads: %s", exc)
            except Exception:  # noqa: BLE001 - the thread must outlive any one failure
                log.exception("gateway routes of the models a request loads")
            try:
                generation, wanted = self.port.wanted(generation, POLL_S, self.load_wait_s())
            except TritonctlError as exc:  # the gateway restarts, or is gone: the supervisor starts it again
                log.debug("the gateway's wanted models: %s", exc)
                self._stop.wait(1.0)
                continue
            except Exception:  # noqa: BLE001 - the thread must outlive any one failure
                log.exception("the gateway's wanted models")
                self._stop.wait(1.0)
                continue
            for model, info in wanted.items():
                since = info.get("since") if isinstance(info, dict) else None
                self.want(model, float(since) if isinstance(since, (int, float)) else time.time())

    def want(self, model: str, since: float) -> bool:
        """Load `model` for the requests that wait for it since `since`, unless a load of it runs already."""
        with self._guard:
            if model in self._busy or self._stop.is_set():
                return False
            self._busy.add(model)
        try:
            self._pool.submit(self._load, model, since)
        except RuntimeError:  # stopping
            with self._guard:
                self._busy.discard(model)
            return False
        return True

    def _load(self, model: str, since: float) -> None:
        try:
            self.load(model, since)
        except Exception as exc:  # noqa: BLE001 - the waiting requests get an answer whatever happened
            log.exception("loading %s on request", model)
            self._refuse(model, f"tritonctl failed to load it: {exc}")
        finally:
            with self._guard:
                self._busy.discard(model)

    def load(self, model: str, since: float) -> LeaseResult | None:
        """One load of `model` for the requests waiting since `since`: refused at once when it cannot be, else
        an ensure within what is left of `gateway_load_wait_s`. The ensure's answer, or None when refused."""
        record = self.registry.find_model(model)
        if record is None and self.fleet_models is not None and model in self.fleet_models():
            return self._ensure(model, since, "the fleet is placing it")  # not here yet: placement decides
        if record is None:
            self._refuse(model, "it is unknown to the registry (`tritonctl status` lists the models)")
            return None
        last = self.registry.last_deployment(model)
        if record.state not in SERVING_STATES and not loads_on_request(record, self.policy_of(record), last):
            self._refuse(model, self._not_loadable(record, last))
            return None
        try:
            digest = self.ondemand.target(record)
            blocked = self.guard.blocked(model, digest, self.registry.get_snapshot(model, digest).config)
        except TritonctlError as exc:
            self._refuse(model, str(exc))
            return None
        if blocked is not None and blocked[1]:  # pinned and protected models alone hold the budget
            self._refuse(model, blocked[0])
            return None
        return self._ensure(model, since, f"waiting for room: {blocked[0]}" if blocked
                            else f"tritonctl is loading {digest[:12]}")

    def _ensure(self, model: str, since: float, note: str) -> LeaseResult | None:
        self._note(model, note)
        left = self.load_wait_s() - (time.time() - since) - MARGIN_S
        try:
            result = self.ensure(model, LEASE_S, GATEWAY_ACTOR, max(0.0, left))
        except TritonctlError as exc:
            self._refuse(model, str(exc))
            return None
        try:
            self.release(model, result.lease)
        except NotFoundError:
            pass
        if result.loaded:
            self.counts["loads"] += 1
        log.info("%s %s on request (%d ms)", "loaded" if result.loaded else "found", model, result.duration_ms)
        return result

    @staticmethod
    def _not_loadable(record: ModelRecord, last: DeploymentRecord | None) -> str:
        if last is not None and last.kind == "unload":
            return (f"it was unloaded by {last.actor}, which a request does not undo (`tritonctl load {record.name}` "
                    f"or `tritonctl ensure {record.name}` serves it again)")
        if record.removed_at is not None:
            return "it was removed from the source"
        return f"it is {record.state} under policy {record.policy or 'the default'}, which a request does not load"

    def _note(self, model: str, text: str) -> None:
        try:
            self.port.note(model, text)
        except TritonctlError as exc:
            log.debug("note to the gateway: %s", exc)

    def _refuse(self, model: str, reason: str) -> None:
        self.counts["refused"] += 1
        log.info("request load of %s refused: %s", model, reason)
        try:
            self.port.refuse(model, reason)
        except TritonctlError as exc:
            log.warning("could not tell the gateway why %s was not loaded: %s", model, exc)
