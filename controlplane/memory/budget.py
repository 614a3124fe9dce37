"""A host's memory budget: room for a deploy is made by unloading idle models, least recently used first.

Why: without a budget every model of the repository is loaded, so a host serves only what fits in its
memory and a growing repository fails at load time in Triton's words (out of memory). With
`memory_budget_mb` (host memory) or `gpu_memory_budget_mb` (per GPU) set, the Deployer asks this guard
before every load (`admit`) and after it (`settle`):

- `admit` estimates what the load adds (the digest's recorded footprint, else the model's last one,
  else its declared one, else the median of every recorded footprint, else 0; a reload adds the
  difference to what it replaces), adds what loaded models hold (their recorded footprints) and the
  loads admitted but not settled, and when that exceeds the budget it evicts loaded models, least
  recently used first (last inference from Triton's statistics, then last lease), never the model
  itself, a pinned one, one whose serving digest carries a protected tag (`protected_tags`, `stable`
  by default), one with a lease or one an operation holds. When that cannot make room it raises
  `BudgetError` (an EnvironmentFault: the deploy ends `failed`, naming the budget, the footprint and
  what holds the memory, and is retried with backoff until room appears).
  An evicted model's memory is free only once its stub processes exited (Triton's unload returns
  about 1 s before): a second eviction waits until the first one's stubs exited, at most EXIT_WAIT_S;
  stubs that outlive that wait count as held (their model's footprint) until they exit, so the next
  admission makes room for them too.
- `settle` measures the load (controlplane/memory/footprint.py), records the footprint per digest, and, when
  the measurement turned out bigger than the estimate, evicts again until the budget holds: the
  budget is overshot by at most the one load's misestimate, during that eviction.

Every model's footprint is measured and recorded whether or not a budget is set. The GPU budget is the
same arithmetic over `gpu_memory_mb`; measured only where NVML and GPUs exist (tests drive it with
declared footprints as a stand-in).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timezone
from pathlib import Path
from typing import Any

from controlplane.errors import BudgetError
from controlplane.memory.footprint import DECLARED, Baseline, Meter, declared, estimate, stub_pids
from controlplane.store.records import FootprintRecord, ModelRecord
from controlplane.store.registry import Registry
from controlplane.vocab import GPU, MEMORY, SERVING_STATES

log = logging.getLogger("tritonctl.budget")

EXIT_WAIT_S = 10.0  # how long a load waits for an evicted model's stub processes to exit


@dataclass
class Ticket:
    """One admitted load: what it was estimated to add, and what ran before it. `name`: what Triton loads
    it under when not the model's own name (a change set's private step name, which holds memory beside
    the public model's)."""

    model: str
    digest: str
    config: Mapping[str, Any] | None
    baseline: Baseline
    reserved: dict[str, float]
    name: str = ""

    @property
    def loads(self) -> str:
        return self.name or self.model


@dataclass
class Exiting:
    """A model evicted for room: the stub processes its unload left running, and what they hold."""

    model: str
    pids: set[int]
    footprint: dict[str, float]


def running(pids: set[int]) -> bool:
    """Whether any of `pids` still runs."""
    return any(Path(f"/proc/{pid}").exists() for pid in pids)


@dataclass(frozen=True)
class Hooks:
    """What the guard asks of the rest of the plane: last use per model (seconds since the epoch, from
    Triton's statistics and the leases), whether a model is held (a lease, an operation), and eviction
    (an audited unload through the Deployer; False when it could not)."""

    last_used: Callable[[], dict[str, float]]
    held: Callable[[str], bool]
    evict: Callable[[str, str], bool]


def runs_processes(config: Mapping[str, Any] | None) -> bool:
    """Whether a load of `config` may start processes of its own to measure. An ensemble starts none (its
    steps are loaded and measured apart), so its load is not measured: two scans of /proc per ensemble
    were 12 % of a 1,000-ensemble start-up's deploy time (issue 26), and found nothing."""
    return config is None or config.get("platform") != "ensemble"


def _fmt(value: float) -> str:
    return f"{value:.0f} MB"


class MemoryGuard:
    """Measures every load; with a budget, makes room before it and keeps the budget after it."""

    def __init__(self, registry: Registry, meter: Meter, hooks: Hooks, *, memory_budget_mb: float | None = None,
                 gpu_memory_budget_mb: float | None = None, protected_tags: Sequence[str] = ("stable",)) -> None:
        self.registry = registry
        self.meter = meter
        self.hooks = hooks
        self.budgets = {k: v for k, v in ((MEMORY, memory_budget_mb), (GPU, gpu_memory_budget_mb)) if v}
        self.protected_tags = tuple(protected_tags)
        self._lock = threading.Lock()
        self._reserved: dict[int, Ticket] = {}
        self._refused: set[str] = set()  # models whose last admission found no room
        self._exiting: list[Exiting] = []  # evicted models whose stub processes may still run, the last last
        self.evictions = 0

    # -- what is held -----------------------------------------------------------------------------

    def _loaded(self, exclude: str = "") -> list[ModelRecord]:
        return [m for m in self.registry.list_models(states=SERVING_STATES)
                if m.active_digest and m.name != exclude and m.removed_at is None]

    def _estimate(self, model: str, digest: str | None, config: Mapping[str, Any] | None,
                  known: dict[tuple[str, str], FootprintRecord]) -> dict[str, float]:
        record = known.get((model, digest or ""))
        if record is None:  # the model's newest measurement of any content
            mine = sorted((r for (m, _), r in known.items() if m == model), key=lambda r: r.measured_at)
            record = mine[-1] if mine else None
        return estimate([record or declared(config)], known.values())

    def holdings(self, exclude: str = "") -> list[tuple[str, dict[str, float]]]:
        """(model, footprint) of every loaded model but `exclude`, then the admitted loads not settled."""
        known = self.registry.footprints()
        loaded = self._loaded(exclude)
        held = [(m.name, self._estimate(m.name, m.active_digest, None, known)) for m in loaded]
        names = {m.name for m in loaded}  # committed, not settled yet: counted once, as loaded
        held += [(t.loads, t.reserved) for t in self._reserved.values() if t.loads != exclude and t.loads not in names]
        # an evicted model whose stubs outlived the wait for them (all but the one evicted last): still held
        held += [(f"{e.model} (evicted, exiting)", e.footprint) for e in self._exiting[:-1] if running(e.pids)]
        return held

    def _over(self, held: list[tuple[str, dict[str, float]]], need: dict[str, float]) -> list[str]:
        return [key for key, budget in self.budgets.items()
                if sum(f.get(key, 0.0) for _, f in held) + need.get(key, 0.0) > budget]

    # -- the deployer's two calls -----------------------------------------------------------------

    def admit(self, model: str, digest: str, config: Mapping[str, Any] | None, previous: str | None,
              name: str | None = None) -> Ticket:
        """Before a load of `digest`: make room (evictions), or raise BudgetError. `name`: the load is
        staged under that name (controlplane/deploy/plans.py) beside the model's serving content, which
        stays counted and is not evicted; its footprint is the model's, and it stays counted until
        settled."""
        loads = name or model
        baseline = self.meter.before(loads) if runs_processes(config) else Baseline(loads)
        if not self.budgets:
            return Ticket(model, digest, config, baseline, {}, name or "")
        with self._lock:
            known = self.registry.footprints()
            need = self._estimate(model, digest, config, known)
            if previous:
                replaced = self._estimate(model, previous, None, known)
                need = {k: max(0.0, need[k] - replaced[k]) for k in need}
            self._refused.add(model)  # until admitted below
            held = self.holdings(exclude=loads)
            if self._over(held, need):
                victims = set(self.candidates(exclude=model))
                fixed = [(m, f) for m, f in held if m not in victims]
                over = self._over(fixed, need)
                if over:  # not even evicting every idle model would make room: evict none
                    raise BudgetError(self._no_room(loads, digest, need, fixed, over))
                self._make_room(model, need, f"room for {loads} {digest[:12]}", loads)
            over = self._over(self.holdings(exclude=loads), need)
            if over:  # an eviction failed (the model got busy meanwhile): retried later
                raise BudgetError(self._no_room(loads, digest, need, self.holdings(exclude=loads), over))
            ticket = Ticket(model, digest, config, baseline, need, name or "")
            self._reserved[id(ticket)] = ticket
            self._refused.discard(model)
            return ticket

    def refused(self, model: str) -> bool:
        """The last admission of `model` found no room in the budget."""
        with self._lock:
            return model in self._refused

    def fits(self, model: str, digest: str, config: Mapping[str, Any] | None) -> bool:
        """Whether a load of `digest` fits once every evictable model went (what an ensure waits for)."""
        if not self.budgets:
            return True
        with self._lock:
            known = self.registry.footprints()
            need = self._estimate(model, digest, config, known)
            victims = set(self.candidates(exclude=model))
            return not self._over([(m, f) for m, f in self.holdings(exclude=model) if m not in victims], need)

    def blocked(self, model: str, digest: str, config: Mapping[str, Any] | None) -> tuple[str, bool] | None:
        """Why a load of `digest` cannot fit now, once every evictable model went: (the no-room message, which
        names the budget and the holders; whether it never will by itself, the pinned and protected models
        alone leaving no room, where leased, busy and loading ones may free theirs). None: it fits."""
        if not self.budgets:
            return None
        with self._lock:
            known = self.registry.footprints()
            need = self._estimate(model, digest, config, known)
            victims = set(self.candidates(exclude=model))
            held = [(m, f) for m, f in self.holdings(exclude=model) if m not in victims]
            over = self._over(held, need)
            if not over:
                return None
            spared = self.spared()
            fixed = {m.name for m in self._loaded(model) if spared(m)}
            never = bool(self._over([(m, f) for m, f in held if m in fixed], need))
            return self._no_room(model, digest, need, held, over), never

    def settle(self, ticket: Ticket, loaded: bool) -> None:
        """After the load: record its footprint (when it loaded) and keep the budget."""
        with self._lock:
            self._reserved.pop(id(ticket), None)
        if not loaded:
            return
        measured = self.meter.measure(ticket.baseline) if runs_processes(ticket.config) else None
        footprint = measured or declared(ticket.config)
        if footprint is not None:
            stated = declared(ticket.config)
            gpu = footprint.gpu_memory_mb
            if gpu is None and stated is not None:  # no NVML here: the declared GPU footprint stands in
                gpu = stated.gpu_memory_mb
            self.registry.record_footprint(ticket.model, ticket.digest, footprint.memory_mb, gpu,
                                           DECLARED if footprint.source == DECLARED else footprint.source)
        if self.budgets:
            with self._lock:
                self._make_room(ticket.model, {}, f"{ticket.loads} measured bigger than estimated", ticket.loads)

    # -- eviction ---------------------------------------------------------------------------------

    def spared(self) -> Callable[[ModelRecord], bool]:
        """Whether a model is never evicted for room or idleness: pinned, or its serving digest protected."""
        protected = {(t.model, t.digest) for t in self.registry.list_tags() if t.name in self.protected_tags}
        return lambda m: m.pinned or (m.name, m.active_digest) in protected

    def candidates(self, exclude: str) -> list[str]:
        """Loaded models that may be evicted, least recently used first."""
        spared = self.spared()
        try:
            last = self.hooks.last_used()
        except Exception as exc:  # noqa: BLE001 - statistics unreachable: eviction by load time only
            log.warning("inference statistics unavailable: %s", exc)
            last = {}
        loaded = [m for m in self._loaded(exclude) if not spared(m) and not self.hooks.held(m.name)]

        def used(m: ModelRecord) -> float:  # its last inference or lease; never used: when it was loaded
            since = m.active_since.replace(tzinfo=timezone.utc).timestamp() if m.active_since else 0.0
            return max(last.get(m.name, 0.0), since)

        return [m.name for m in sorted(loaded, key=used)]

    def _make_room(self, model: str, need: dict[str, float], why: str, loads: str | None = None) -> None:
        """Evict until `need` fits beside what is held but `loads` (the name loaded; default the model);
        the model itself is never evicted."""
        counted = loads or model
        if not self._over(self.holdings(exclude=counted), need) and not (need == {} and self._over_total()):
            return
        for victim in self.candidates(exclude=model):
            held = dict(self.holdings(exclude=counted))
            if not self._over(list(held.items()), need) and not (need == {} and self._over_total()):
                return
            if self.hooks.evict(victim, f"memory budget: {why}"):
                self.evictions += 1
                self._await_exit(victim, held.get(victim, {}))

    def _await_exit(self, model: str, footprint: dict[str, float]) -> None:
        """Triton's unload returns before the model's stub processes exit (about 1 s later, measured), and
        only then is the memory free. One evicted model may still be exiting while the next load runs (the
        budget's overshoot: one footprint, during an eviction); a second eviction waits for the first to
        exit, at most EXIT_WAIT_S. Stubs still running after that (measured: one for 30 s under a load
        average of 9) stay in `_exiting` and count as held (holdings) until they exit. The evicted
        model's stubs are told by their pids, taken under the lock right after its unload returned (a
        reload of the model cannot start meanwhile), so a reload's new stubs are not waited for."""
        pids = stub_pids(model, self.meter.server_pid())
        started = time.monotonic()
        while True:
            self._exiting = [e for e in self._exiting if running(e.pids)]
            if not self._exiting or time.monotonic() >= started + EXIT_WAIT_S:
                break
            time.sleep(0.05)
        log.debug("evicted %s (stubs %s) after %.2f s waiting for earlier evictions' stubs; still exiting: %s",
                  model, sorted(pids), time.monotonic() - started, [e.model for e in self._exiting])
        self._exiting.append(Exiting(model, pids, footprint))

    def _over_total(self) -> bool:
        return bool(self._over(self.holdings(), {}))

    def _no_room(self, model: str, digest: str, need: dict[str, float], held: list[tuple[str, dict[str, float]]],
                 over: list[str]) -> str:
        key = over[0]
        name = "memory_budget_mb" if key == MEMORY else "gpu_memory_budget_mb"
        holders = sorted(held, key=lambda h: -h[1].get(key, 0.0))
        listing = ", ".join(f"{m} {_fmt(f.get(key, 0.0))}" for m, f in holders[:8] if f.get(key, 0.0) > 0)
        more = f" and {len(holders) - 8} more" if len(holders) > 8 else ""
        total = sum(f.get(key, 0.0) for _, f in held)
        return (f"{model} {digest[:12]} needs {_fmt(need.get(key, 0.0))}{' per GPU' if key == GPU else ''} but "
                f"{name} = {_fmt(self.budgets[key])} and {_fmt(total)} is held by models that cannot be evicted "
                f"(pinned, protected, leased or busy): {listing or 'none'}{more}")
