"""On-demand models in a fleet: an `ensure` through any host is served by ONE host that has or can load
the model; its lease is renewed and released through any host.

Why: rolling an `ondemand` model out to every host would load it everywhere. Instead the leader's
rollouts only record its content (the shared store and registry), and:

- a request at a host's gateway for an on-demand model that is not loaded (FleetOnDemand.ensure_for_request,
  controlplane/memory/onrequest.py) places it like an ensure, on that host when it has or can make room;
  placed (or found) on another host, the requests are answered UNAVAILABLE naming that host.
- `ensure MODEL` on any host (FleetOnDemand.ensure) places it, one decision at a time
  (controlplane/store/placements.py: a PostgreSQL transaction lock around reading every live host's
  budget and holdings, deciding by controlplane/fleet/placement.py and recording the placement with the
  caller's lease). The host that ensure came through makes the decision; the lock makes it the only one
  at that moment, which is what "the leader places" needs without a round trip to the leader.
- the placed host's agent (PlacedModels.serve, every agent tick and on each notification) imports the
  content from the shared store, loads it with the single host's ensure (its own budget evicts idle
  models for room, refuses with BudgetError when it cannot) and marks the placement `loaded`, or
  `failed` with the reason; it holds a local lease for as long as any fleet lease of the model is active.
- the ensuring host waits for `loaded` and answers the host, its tritonserver's gRPC and HTTP URLs and the
  serving digest. A placed model with no active lease left becomes `idle` (still loaded; the host's idle
  sweep unloads it after `idle_unload_s`, which frees the placement: audited `unplace`); an ensure of an
  idle model asks its host again (found loaded, or loaded again).
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from controlplane.deploy.engine import admission
from controlplane.documents.results import LeaseResult
from controlplane.errors import BudgetError, ConflictError, DeployError, NotFoundError, TritonctlError, UsageError
from controlplane.fleet.hostplane import HostPlane
from controlplane.fleet.placement import Holding, HostRoom, place
from controlplane.fleet.settings import FleetSettings
from controlplane.memory.footprint import declared, estimate
from controlplane.memory.leases import MAX_LEASE_S, check_duration
from controlplane.names import validate_model_name
from controlplane.settings.config import Settings
from controlplane.store.fleet import FleetStore
from controlplane.store.placements import PlacementRow, PlacementStore, Room
from controlplane.store.records import ModelRecord
from controlplane.store.registry import AuditEntry, Registry, utcnow
from controlplane.validation.ensemblemembers import step_models
from controlplane.vocab import SERVING_STATES, Cause, Policy, Result

log = logging.getLogger("tritonctl.fleet")

PLACE_ACTOR = "fleet:placement"
POLL_S = 0.05  # an ensure waiting for its host's load looks again this often
FOUND = "found "  # a placed host's `loaded` message when the model was loaded there already
LOCAL_SLACK_S = 30.0  # the placed host's local lease outlasts the fleet's by this (its agent renews it)


def host_rooms(rooms: list[Room]) -> list[HostRoom]:
    """The fleet tables' rooms as the placement rule's HostRoom values."""
    return [HostRoom(r.host, r.memory_budget_mb, r.gpu_memory_budget_mb,
                     tuple(Holding(m, mem, gpu, evictable) for m, mem, gpu, evictable in r.holdings)) for r in rooms]


class FleetOnDemand:
    """`ensure`, `lease renew`, `lease release` through this host, for the fleet's on-demand models."""

    def __init__(self, host: str, plane: HostPlane, registry: Registry, settings: Callable[[], Settings],
                 fleet: Callable[[], FleetSettings]) -> None:
        self.host = host
        self.plane = plane
        self.registry = registry  # the shared registry
        self.settings = settings
        self.fleet = fleet
        self.store = PlacementStore(registry)
        self.fleet_store = FleetStore(registry)

    def placed(self, model: str) -> ModelRecord | None:
        """The fleet's record of `model` when the fleet places it (policy ondemand), else None."""
        record = self.registry.find_model(model)
        if record is None:
            raise NotFoundError(f"model '{model}' is unknown to the fleet; `tritonctl status --fleet` lists the models")
        return record if (record.policy or self.settings().policy) == Policy.ONDEMAND else None

    def target(self, record: ModelRecord) -> str:
        """The pinned digest when pinned, else the newest valid content the leader recorded."""
        if record.pinned and record.active_digest:
            return record.active_digest
        for snap in self.registry.list_snapshots(record.name):  # newest first
            if admission(snap, force=False, where="the fleet") is None and not snap.collected:
                return snap.digest
        raise ConflictError(f"model '{record.name}' has no valid content to load")

    def estimate(self, model: str, digest: str) -> dict[str, float]:
        """What a load of `digest` will hold: a host's measurement of it, else of the model, else its declared
        footprint, else the median of every reported footprint, else 0 (as a host's budget estimates)."""
        reported = self.store.reported_footprints()
        mine = [r for r in reported if r.model == model]
        best = next((r for r in mine if r.digest == digest), mine[0] if mine else None)
        return estimate([best, declared(self.registry.get_snapshot(model, digest).config)], reported)

    def models(self) -> set[str]:
        """The fleet's on-demand models (placed on request): a request at any host's gateway loads one."""
        default = self.settings().policy
        return {m.name for m in self.registry.list_models() if m.removed_at is None
                and (m.policy or default) == Policy.ONDEMAND}

    def ensure_for_request(self, model: str, for_s: float, actor: str) -> LeaseResult:
        """An ensure for the requests waiting at this host's gateway (controlplane/memory/onrequest.py): placed
        here when the placement allows it; placed on (or found on) another host, refused naming that host and
        its addresses (the fleet serves an on-demand model on one host; the client sends there)."""
        result = self.ensure(model, for_s, actor, prefer=self.host)
        if result.host is None or result.host == self.host:
            return result
        try:
            self.release(model, result.lease)
        except TritonctlError:
            pass
        where = ", ".join(f"{kind} {url}" for kind, url in (("gRPC", result.grpc_url), ("HTTP", result.http_url))
                          if url)
        raise ConflictError(f"the fleet serves it on host {result.host}" + (f" ({where})" if where else "")
                            + f", not on {self.host}: send its requests there")

    def ensure(self, model: str, for_s: float, actor: str, prefer: str | None = None) -> LeaseResult:
        validate_model_name(model)
        check_duration(for_s)
        record = self.placed(model)
        if record is None:  # rolled out to every host: this host's own ensure
            return self.plane.ensure_here(model, for_s, actor)
        started = time.monotonic()
        digest = self.target(record)
        if step_models(self.registry.get_snapshot(model, digest).config):
            raise UsageError(f"model '{model}' is an ensemble: on a fleet, ensure places single models "
                             "(ensure each step, or give the ensemble policy auto)")
        need = self.estimate(model, digest)
        wait_s = self.settings().load_timeout_s
        lease_id = secrets.token_hex(8)
        held_until = utcnow() + timedelta(seconds=min(MAX_LEASE_S, 2 * wait_s + for_s))
        live = self.fleet_store.live_hosts(self.fleet().host_timeout_s)

        def decide(rooms: list[Room], has_it: list[str]) -> tuple[str, str]:
            choice = place(model, need, host_rooms(rooms), has_it, prefer)
            return choice.host, choice.message

        try:
            placed, asked = self.store.place(model, digest, need, live, decide, (lease_id, held_until, actor),
                                             self.host)
        except BudgetError as exc:
            self.registry.audit(AuditEntry(actor, "place", model, digest, Result.FAILED.value, str(exc)))
            raise DeployError(str(exc), Result.FAILED.value, Cause.ENVIRONMENT.value) from None
        try:
            row = self._wait(model, placed, digest, started + 2 * wait_s)
        except BaseException:
            self.store.release(model, lease_id)
            raise
        until = utcnow() + timedelta(seconds=for_s)
        self.store.renew(model, lease_id, until)
        grpc_url, http_url = self._urls(row.host)
        loaded = asked and not row.message.startswith(FOUND)  # this ensure's ask made its host load it
        return LeaseResult(model, row.digest, lease_id, until, loaded, int((time.monotonic() - started) * 1000),
                           host=row.host, grpc_url=grpc_url, http_url=http_url)

    def _urls(self, host: str) -> tuple[str | None, str | None]:
        """Where the host's clients send inference (its gateway, else its tritonserver): gRPC and HTTP URLs, as
        its heartbeat records them."""
        return self.store.urls(host)

    def _wait(self, model: str, placed: PlacementRow, digest: str, deadline: float) -> PlacementRow:
        """Until the placed host says `loaded` (or `failed`: DeployError with its reason, exit 1)."""
        while True:
            row = self.store.get(model)
            if row is not None and row.host == placed.host and row.state == "loaded" and row.digest == digest:
                return row
            if row is None or row.host != placed.host or row.state == "failed":
                failed = row is not None and row.state == "failed"
                why = row.message if row is not None and failed else "its placement ended before it loaded"
                if row is not None and failed:
                    self.store.forget(model, row.host, states=("failed",))
                raise DeployError(f"{model} on {placed.host}: {why}", Result.FAILED.value, Cause.ENVIRONMENT.value)
            if time.monotonic() > deadline:
                raise DeployError(f"{model} on {placed.host}: not loaded within {self.settings().load_timeout_s:g} s "
                                  f"(placement {row.state})", Result.FAILED.value, Cause.ENVIRONMENT.value)
            time.sleep(POLL_S)

    def _answer(self, model: str, lease: str, until: datetime, released: bool = False) -> LeaseResult:
        row = self.store.get(model)
        grpc_url, http_url = self._urls(row.host) if row is not None else (None, None)
        return LeaseResult(model, row.digest if row else None, lease, until, False, 0, released=released,
                           host=row.host if row else None, grpc_url=grpc_url, http_url=http_url)

    def renew(self, model: str, lease: str, for_s: float) -> LeaseResult:
        validate_model_name(model)
        until = utcnow() + timedelta(seconds=check_duration(for_s))
        if self.store.renew(model, lease, until):
            return self._answer(model, lease, until)
        return self.plane.renew_here(model, lease, for_s)  # a lease of a model this host serves itself

    def release(self, model: str, lease: str) -> LeaseResult:
        validate_model_name(model)
        until = self.store.release(model, lease)
        if until is not None:
            return self._answer(model, lease, until, released=True)
        return self.plane.release_here(model, lease)


class PlacedModels:
    """This host's side: load what is placed here, hold it while a fleet lease is active, free it when gone."""

    def __init__(self, host: str, plane: HostPlane, registry: Registry, import_content: Callable[[str, str], None],
                 report: Callable[[], None]) -> None:
        self.host = host
        self.plane = plane
        self.registry = registry
        self.store = PlacementStore(registry)
        self.import_content = import_content  # the agent's verified import from the shared store
        self.report = report
        self._held: dict[str, str] = {}  # model → this host's local lease for its placement
        self._loading: set[str] = set()
        self._guard = threading.Lock()

    def serve(self) -> None:
        mine = self.store.on_host(self.host)
        for lease_id, model, actor in self.store.expire(p.model for p in mine):
            self.registry.audit(AuditEntry(PLACE_ACTOR, "lease_expired", model, None, Result.OK.value,
                                           f"lease {lease_id} of {actor} expired (fleet, served by {self.host})"))
        ends = self.store.lease_ends(p.model for p in mine)
        for p in mine:
            if p.state == "loading":
                self._start_load(p)
            elif p.state in ("loaded", "idle"):
                self._hold(p, ends.get(p.model))
        placed = {p.model for p in mine if p.state != "failed"}
        for model in [m for m in self._held if m not in placed]:
            self._let_go(model)

    def _start_load(self, p: PlacementRow) -> None:
        with self._guard:
            if p.model in self._loading:
                return
            self._loading.add(p.model)
        threading.Thread(target=self._load, args=(p,), name=f"place-{p.model}", daemon=True).start()

    def _load(self, p: PlacementRow) -> None:
        try:
            self.import_content(p.model, p.digest)
            local = self.plane.registry.get_model(p.model)
            if local.policy != Policy.ONDEMAND:  # the host's idle sweep unloads it once no lease holds it
                self.plane.registry.update_model(p.model, policy=Policy.ONDEMAND.value)
            result = self.plane.ensure_here(p.model, LOCAL_SLACK_S + 60.0, PLACE_ACTOR, digest=p.digest)
            previous = self._held.get(p.model)
            self._held[p.model] = result.lease
            if previous and previous != result.lease:
                self._release_local(p.model, previous)
            self.report()  # its footprint reaches the fleet before anyone is told it is loaded
            self.store.mark(p.model, self.host, p.digest, "loaded",
                            f"{'' if result.loaded else FOUND}loaded on {self.host}")
        except TritonctlError as exc:
            log.error("%s: placed on %s: %s", p.model, self.host, exc)
            self.store.mark(p.model, self.host, p.digest, "failed", str(exc))
        except Exception as exc:  # noqa: BLE001 - a load thread must report, whatever failed
            log.exception("%s: placed load failed", p.model)
            self.store.mark(p.model, self.host, p.digest, "failed", f"{type(exc).__name__}: {exc}")
        finally:
            with self._guard:
                self._loading.discard(p.model)

    def _hold(self, p: PlacementRow, end: tuple[int, datetime] | None) -> None:
        local = self.plane.registry.find_model(p.model)
        serving = local is not None and local.state in SERVING_STATES and local.active_digest == p.digest
        lease = self._held.get(p.model)
        if end is not None:  # a fleet lease is active: keep the local one past it
            remaining = (end[1] - utcnow()).total_seconds() + LOCAL_SLACK_S
            if lease is not None:
                try:
                    self.plane.renew_here(p.model, lease, min(MAX_LEASE_S, max(1.0, remaining)))
                    return
                except NotFoundError:
                    self._held.pop(p.model, None)
            self._start_load(p)  # a restarted daemon, or the model went: ensure it here (found loaded, or loaded)
            return
        if p.state == "loaded" and self.store.idle_if_unleased(p.model, self.host):
            log.info("%s: no fleet lease left: idle on %s", p.model, self.host)
            self._let_go(p.model)
        elif p.state == "idle" and not serving and lease is None:
            if self.store.forget(p.model, self.host, AuditEntry(
                    PLACE_ACTOR, "unplace", p.model, p.digest, Result.OK.value,
                    f"{p.model} unloaded from {self.host} (idle): its placement is free")):
                self.report()

    def _let_go(self, model: str) -> None:
        lease = self._held.pop(model, None)
        if lease is not None:
            self._release_local(model, lease)

    def _release_local(self, model: str, lease: str) -> None:
        try:
            self.plane.release_here(model, lease)
        except NotFoundError:
            pass
