"""Models loaded on demand: `ensure` with a lease, and the sweep that unloads idle ones.

Why: a host serves more models than fit when only the ones in use are loaded. A model under policy
`ondemand` is recorded and validated like any other (intake/decision.py keeps it out of Triton: only `auto`
deploys on its own); `tritonctl ensure MODEL` / `POST /v1/models/{model}/lease` loads it (or finds it
loaded), holds it with a lease (controlplane/memory/leases.py) and answers once it is READY, with the digest
that serves; the lease runs from that answer. Concurrent ensures of one model wait on one lock, so they
cause one load; the later ones find it loaded. An ensure waits (up to `load_timeout_s`) while leased,
pinned or protected models hold the memory budget, since a released lease frees room; then it loads or
fails. What an ensure loads: the model's pinned digest when pinned, else the source's newest valid
content, else what it served last; an ensemble's steps are ensured first, under leases that the
ensemble's lease renews and releases. Loads go through the Deployer like every load (the memory budget
makes room first: controlplane/memory/budget.py), audited as action `ondemand`.

The sweep (a thread of the daemon, every `SWEEP_S`) expires leases (audited `lease_expired`) and unloads
a loaded `ondemand` model after `idle_unload_s` with no inference (the gateway's last inference request when
it carries the traffic, else Triton's statistics: `last_inferences`) and no lease
(audited `evict`), unless it is pinned or its serving digest carries a protected tag (as the budget
spares it). Counts for the metrics: on-demand loads, evictions (budget, idle), lease expiries.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from functools import partial
from typing import Any

from controlplane.base.periodic import Periodic
from controlplane.deploy.engine import Deployer, Outcome, ProgressFn, admission
from controlplane.documents.results import LeaseResult
from controlplane.errors import ConflictError, DeployError, NotFoundError, TritonctlError
from controlplane.memory.leases import MAX_LEASE_S, Lease, LeaseBook, check_duration
from controlplane.names import validate_model_name
from controlplane.store.records import ModelRecord, iso
from controlplane.store.registry import AuditEntry, Registry
from controlplane.triton.client import TritonClient
from controlplane.validation.ensemblemembers import step_models
from controlplane.vocab import SERVING_STATES, Cause, Policy, Result

log = logging.getLogger("tritonctl.ondemand")

SWEEP_S = 1.0
# a model with no policy of its own: `policy_of` of it is the configured default policy
_NO_POLICY = ModelRecord("", None, False, None, "", None, None, datetime(1970, 1, 1), None)
ROOM_POLL_S = 0.05  # an ensure waiting for room looks again this often
ONDEMAND_ACTOR = "tritonctl:ondemand"


@dataclass(frozen=True)
class Standing:
    """`status`'s on-demand column of one model: standby, loading, or loaded with its leases."""

    state: str  # standby | loading | loaded
    leases: int
    until: float | None

    def to_json(self) -> dict[str, object]:
        return {"state": self.state, "leases": self.leases, "until": iso(_utc(self.until)) if self.until else None}


class OnDemand:
    """Ensure, renew, release; the idle sweep; the counts the metrics read."""

    def __init__(self, registry: Registry, deployer: Deployer, triton: TritonClient, leases: LeaseBook,
                 policy_of: Callable[[ModelRecord], str], idle_unload_s: Callable[[], float],
                 spared: Callable[[], Callable[[ModelRecord], bool]] = lambda: lambda _m: False,
                 fits: Callable[[str, str, dict[str, Any] | None], bool] = lambda _m, _d, _c: True,
                 refused: Callable[[str], bool] = lambda _m: False,
                 wait_s: Callable[[], float] = lambda: 120.0) -> None:
        self.registry = registry
        self.deployer = deployer
        self.triton = triton
        self.leases = leases
        self.policy_of = policy_of
        self.idle_unload_s = idle_unload_s
        self.spared = spared  # pinned or protected-tag models are never unloaded for idleness either
        self.fits = fits  # the memory budget has room once the evictable models went (controlplane/memory/budget.py)
        self.wait_s = wait_s  # how long an ensure waits for leases elsewhere to free that room
        self.refused = refused  # the budget refused the model's last admission (another load took the room)
        self.counts = {"loads": 0, "evictions_idle": 0, "lease_expiries": 0}
        # each model's last use: its last inference request through the gateway when one carries the traffic
        # (controlplane/memory/onrequest.py), else Triton's last-inference stamps
        self.last_inferences: Callable[[], dict[str, float]] = lambda: self.triton.last_inferences()
        self._locks: dict[str, threading.Lock] = {}
        self._guard = threading.Lock()
        self._loading: set[str] = set()
        self._steps: dict[str, list[tuple[str, str]]] = {}  # an ensemble's lease → its steps' (model, lease)
        self._sweeper = Periodic("on-demand sweep", SWEEP_S, self.sweep, log)
        # whether a model not in the registry is on its way there (controlplane/intake/flow.py `recording`)
        self.recording: Callable[[str], bool] = lambda _m: False
        # (the registry's serving list, the default policy, its ondemand models): see _ondemand_serving
        self._ondemand: tuple[list[ModelRecord], str, list[ModelRecord]] | None = None

    # -- ensure / renew / release -----------------------------------------------------------------

    def _lock(self, model: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(model, threading.Lock())

    def target(self, record: ModelRecord) -> str:
        """The digest an ensure serves: the pinned one, else the source's newest valid content, else the last."""
        if record.pinned and record.active_digest:
            return record.active_digest
        head = self.registry.source_heads([record.name]).get(record.name)
        if head is not None and head.valid and not head.quarantined and record.removed_at is None:
            return head.digest
        if record.active_digest:
            return record.active_digest
        for snap in self.registry.list_snapshots(record.name):  # newest first
            if admission(snap, force=False, where="Triton") is None and not snap.collected:
                return snap.digest
        raise ConflictError(f"model '{record.name}' has no valid content to load")

    def _serves(self, record: ModelRecord, digest: str) -> bool:
        if record.state not in SERVING_STATES or record.active_digest != digest:
            return False
        try:
            return self.triton.version_ready(record.name)
        except TritonctlError:
            return False

    def _recorded(self, model: str) -> bool:
        """Whether `model` is in the registry, waiting (up to `wait_s`) while it is on its way there: an
        ensure right after the daemon's start, or after the model's directory appeared, finds it."""
        deadline = time.monotonic() + self.wait_s()
        while self.registry.find_model(model) is None:
            if not self.recording(model) or time.monotonic() >= deadline:
                return self.registry.find_model(model) is not None
            time.sleep(0.1)
        return True

    def ensure(self, model: str, for_s: float, actor: str, progress: ProgressFn | None = None,
               digest: str | None = None, wait_s: float | None = None) -> LeaseResult:
        """Load `model` (or find it loaded) and hold it for `for_s` seconds; answers once it is READY.
        `digest`: that content (a fleet's placement), else `target`'s. `wait_s`: how long its load waits for
        room in the memory budget (default `load_timeout_s`; a request's load: what is left of its wait)."""
        validate_model_name(model)
        check_duration(for_s)
        if not self._recorded(model):
            raise NotFoundError(f"model '{model}' is unknown to the registry; `tritonctl status` lists the models")
        started = time.monotonic()
        # held from the start (no eviction between its load and the answer), for as long as the wait and load may take
        lease = self.leases.grant(model, min(MAX_LEASE_S, 2 * self.wait_s() + for_s), actor)
        try:
            with self._lock(model):  # concurrent ensures of one model: one load, the others find it loaded
                record = self.registry.get_model(model)
                digest = digest or self.target(record)
                loaded = False
                steps = step_models(self.registry.get_snapshot(model, digest).config)
                for step in steps:  # an ensemble's steps first, each under a lease tied to this one
                    held = self.ensure(step, min(MAX_LEASE_S, for_s + 2 * self.wait_s()), actor, progress)
                    with self._guard:
                        self._steps.setdefault(lease.id, []).append((step, held.lease))
                with self.deployer.lock(model):  # an eviction decides under this lock, seeing the lease above
                    serves = self._serves(self.registry.get_model(model), digest)
                if not serves:
                    outcome = self._load(model, digest, actor, progress, wait_s)
                    if not outcome.succeeded:
                        raise DeployError(f"{model}: {outcome.message}", outcome.outcome, str(outcome.cause))
                    loaded = outcome.outcome == Result.OK
                    if loaded:
                        self.counts["loads"] += 1
            lease = self.leases.renew(model, lease.id, for_s)  # the lease runs from the answer
            self._each_step(lease.id, lambda step, held: self.leases.renew(step, held, for_s))
        except BaseException:
            self._drop(lease)
            raise
        return LeaseResult(model, digest, lease.id, _utc(lease.until), loaded, int((time.monotonic() - started) * 1000))

    def _load(self, model: str, digest: str, actor: str, progress: ProgressFn | None,
              wait_s: float | None = None) -> Outcome:
        """Deploy `digest`. While leased (or pinned, protected, busy) models hold the budget, wait for one
        to go, up to `wait_s`; a deploy refused because another load took the room meanwhile (the budget
        still full after it) is tried again within that time; then it ends failed, naming the budget."""
        config = self.registry.get_snapshot(model, digest).config
        deadline = time.monotonic() + (self.wait_s() if wait_s is None else wait_s)
        with self._guard:
            self._loading.add(model)
        try:
            while True:
                while not self.fits(model, digest, config) and time.monotonic() < deadline:
                    time.sleep(ROOM_POLL_S)
                outcome = self.deployer.deploy(model, digest, actor, kind="ondemand", progress=progress)
                if (outcome.succeeded or outcome.cause != Cause.ENVIRONMENT or time.monotonic() >= deadline
                        or not self.refused(model)):
                    return outcome
        finally:
            with self._guard:
                self._loading.discard(model)

    def _each_step(self, lease_id: str, act: Callable[[str, str], object], forget: bool = False) -> None:
        """`act(step, step_lease)` on the step leases an ensemble's lease holds (renew, release)."""
        with self._guard:
            steps = self._steps.pop(lease_id, []) if forget else list(self._steps.get(lease_id, []))
        for step, held in steps:
            try:
                act(step, held)
            except NotFoundError:  # expired meanwhile: the ensemble's own lease is what the caller holds
                pass

    def _drop(self, lease: Lease) -> None:
        self._each_step(lease.id, self.leases.release, forget=True)
        try:
            self.leases.release(lease.model, lease.id)
        except NotFoundError:
            pass

    def renew(self, model: str, lease_id: str, for_s: float) -> LeaseResult:
        validate_model_name(model)
        lease = self.leases.renew(model, lease_id, for_s)
        self._each_step(lease.id, lambda step, held: self.leases.renew(step, held, for_s))
        record = self.registry.get_model(model)
        return LeaseResult(model, record.active_digest, lease.id, _utc(lease.until), False, 0)

    def release(self, model: str, lease_id: str) -> LeaseResult:
        validate_model_name(model)
        lease = self.leases.release(model, lease_id)
        self._each_step(lease.id, self.leases.release, forget=True)
        record = self.registry.get_model(model)
        return LeaseResult(model, record.active_digest, lease.id, _utc(lease.until), False, 0, released=True)

    def standing(self, record: ModelRecord) -> Standing | None:
        """`status`'s view of an on-demand model (None for other policies)."""
        if self.policy_of(record) != Policy.ONDEMAND:
            return None
        with self._guard:
            loading = record.name in self._loading
        active = self.leases.active(record.name)
        until = max((lease.until for lease in active), default=None)
        if loading:
            return Standing("loading", len(active), until)
        if record.state in SERVING_STATES:
            return Standing("loaded", len(active), until)
        return Standing("standby", len(active), until)

    # -- the sweep --------------------------------------------------------------------------------

    def on_expiry(self, lease: Lease) -> None:
        self.counts["lease_expiries"] += 1
        with self._guard:
            self._steps.pop(lease.id, None)  # its steps' leases end at the same time, on their own
        self.registry.audit(AuditEntry(ONDEMAND_ACTOR, "lease_expired", lease.model, None, Result.OK.value,
                                       f"lease {lease.id} of {lease.actor} expired"))

    def _ondemand_serving(self) -> list[ModelRecord]:
        """The serving models under policy ondemand, picked out again only when the registry's serving
        list or the default policy (a reload may change it) changed: the sweep runs every SWEEP_S, and
        looking at every serving model each time grows with N (issue 26: idle CPU at 10,000 models)."""
        serving = self.registry.serving_models()
        default = self.policy_of(_NO_POLICY)
        cached = self._ondemand
        if cached is None or cached[0] is not serving or cached[1] != default:
            cached = self._ondemand = (serving, default,
                                       [m for m in serving if self.policy_of(m) == Policy.ONDEMAND])
        return cached[2]

    def sweep(self, now: float | None = None) -> list[str]:
        """Expire leases; unload the idle on-demand models. Returns the models unloaded."""
        self.leases.expire()
        now = time.time() if now is None else now
        idle_s = self.idle_unload_s()
        loaded = [m for m in self._ondemand_serving()
                  if not self.leases.held(m.name) and not self.deployer.lock(m.name).locked()]
        if not loaded:
            return []
        spared = self.spared()
        loaded = [m for m in loaded if not spared(m)]
        used = self.leases.last_used()
        try:
            for model, when in self.last_inferences().items():
                used[model] = max(used.get(model, 0.0), when)
        except TritonctlError as exc:
            log.debug("inference statistics unavailable: %s", exc)
            return []
        unloaded = []
        for record in loaded:
            since = record.active_since.replace(tzinfo=timezone.utc).timestamp() if record.active_since else 0.0
            last = max(used.get(record.name, 0.0), since)
            if now - last < idle_s:
                continue
            with self._lock(record.name):  # not while an ensure of it runs
                if self.leases.held(record.name):
                    continue
                reason = f"policy ondemand: no inference and no lease for {now - last:.0f} s"
                keep = partial(self.leases.held, record.name)
                if self.deployer.evict(record.name, ONDEMAND_ACTOR, reason, unless=keep):
                    self.counts["evictions_idle"] += 1
                    unloaded.append(record.name)
        return unloaded

    def start(self) -> None:
        self._sweeper.start()

    def stop(self) -> None:
        self._sweeper.stop()


def _utc(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, timezone.utc).replace(tzinfo=None)
