"""Where an on-demand model goes in a fleet: the placement decision, a pure function of the hosts.

Why: on a fleet an `ondemand` model is not rolled out to every host (that would load it everywhere, the
opposite of loading on demand); an `ensure` through any host places it on ONE host, and every later
ensure of it, through any host, is served there. Which host: the model's footprint against each live
host's budget and what the host holds (its reported footprints, and the loads placed on it that have
not reported yet):

1. a host that already has it (placed, loading or loaded, or serving it on its own) — never a second load;
2. else a host with free room (budget − held ≥ footprint, in host memory and per GPU; a host without a
   budget has unlimited room), the one with the most room left afterwards, then by name;
3. else a host that can make room by evicting idle models (not pinned, protected or leased: reported as
   `evictable`), the one that has to evict the least, then by name; its own budget guard
   (controlplane/memory budget) evicts, least recently used first;
4. else none: `BudgetError` naming every host's budget, the footprint and what holds each host's memory.

The decision is made one at a time (controlplane/store/placements.py takes a PostgreSQL transaction
lock around reading the rooms, deciding and recording), by whichever host the ensure came through.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from controlplane.errors import BudgetError
from controlplane.vocab import GPU, MEMORY

BUDGET_NAMES = {MEMORY: "memory_budget_mb", GPU: "gpu_memory_budget_mb"}


@dataclass(frozen=True)
class Holding:
    """One model a host holds: its footprint (MB; host memory and per GPU) and whether it may be evicted."""

    model: str
    memory_mb: float = 0.0
    gpu_memory_mb: float = 0.0
    evictable: bool = False

    def of(self, key: str) -> float:
        return self.memory_mb if key == MEMORY else self.gpu_memory_mb


@dataclass(frozen=True)
class HostRoom:
    """A live host: its budgets (None: unlimited) and what it holds."""

    host: str
    memory_budget_mb: float | None = None
    gpu_memory_budget_mb: float | None = None
    holdings: Sequence[Holding] = field(default_factory=tuple)

    def budget(self, key: str) -> float | None:
        return self.memory_budget_mb if key == MEMORY else self.gpu_memory_budget_mb

    def held(self, key: str, evictable_too: bool = True) -> float:
        return sum(h.of(key) for h in self.holdings if evictable_too or not h.evictable)

    def room(self, key: str, evictable_too: bool = True) -> float:
        """What is free under the budget (infinite without one); `evictable_too=False`: after evicting."""
        budget = self.budget(key)
        return math.inf if budget is None else budget - self.held(key, evictable_too)


@dataclass(frozen=True)
class Choice:
    """The host an ensure is served by, and why (audited as `place`)."""

    host: str
    reason: str  # "placed" | "has it" | "evicts"
    message: str


def _fmt(value: float) -> str:
    return "unlimited" if math.isinf(value) else f"{value:.0f} MB"


def _fits(room: HostRoom, need: Mapping[str, float], evictable_too: bool) -> bool:
    return all(room.room(key, evictable_too) >= need.get(key, 0.0) for key in (MEMORY, GPU))


def _left(room: HostRoom, need: Mapping[str, float], evictable_too: bool) -> float:
    return room.room(MEMORY, evictable_too) - need.get(MEMORY, 0.0)


def place(model: str, need: Mapping[str, float], rooms: Sequence[HostRoom], has_it: Sequence[str] = (),
          prefer: str | None = None) -> Choice:
    """The host `model` (footprint `need`: memory_mb, gpu_memory_mb) is served by; `has_it`: live hosts
    that have it placed or serving already; `prefer`: the host a request for it arrived at (its gateway:
    controlplane/memory/onrequest.py), chosen when it has or can make room. Raises BudgetError when no host
    has or can make room."""
    live = {r.host: r for r in rooms}
    for host in has_it:
        if host in live:
            return Choice(host, "has it", f"{model} is on {host} already")
    if not rooms:
        raise BudgetError(f"{model}: no live host in the fleet to load it on")
    size = f"{_fmt(need.get(MEMORY, 0.0))}" + (f", {_fmt(need[GPU])} per GPU" if need.get(GPU) else "")
    here = live.get(prefer) if prefer is not None else None
    if here is not None and _fits(here, need, False):
        evicts = not _fits(here, need, True)
        return Choice(here.host, "evicts" if evicts else "placed",
                      f"{model} ({size}) placed on {here.host}, where a request for it arrived"
                      + (": it evicts idle models for room" if evicts else ""))
    free = sorted((r for r in rooms if _fits(r, need, True)), key=lambda r: (-_left(r, need, True), r.host))
    if free:
        best = free[0]
        return Choice(best.host, "placed", f"{model} ({size}) placed on {best.host}: "
                                           f"{_fmt(best.room(MEMORY))} free of {_fmt(_budget(best, MEMORY))}")
    evicting = sorted((r for r in rooms if _fits(r, need, False)),
                      key=lambda r: (-_left(r, need, True), r.host))
    if evicting:
        best = evicting[0]
        return Choice(best.host, "evicts", f"{model} ({size}) placed on {best.host}: it evicts idle models "
                                           f"for room ({_fmt(best.room(MEMORY))} free of "
                                           f"{_fmt(_budget(best, MEMORY))})")
    raise BudgetError(no_room(model, need, rooms))


def _budget(room: HostRoom, key: str) -> float:
    budget = room.budget(key)
    return math.inf if budget is None else budget


def no_room(model: str, need: Mapping[str, float], rooms: Sequence[HostRoom]) -> str:
    """Why no host can load `model`: each host's budget, what it holds and what of that cannot be evicted."""
    parts = []
    for room in sorted(rooms, key=lambda r: r.host):
        key = next((k for k in (MEMORY, GPU) if room.room(k, False) < need.get(k, 0.0)), MEMORY)
        fixed = sorted((h for h in room.holdings if not h.evictable and h.of(key) > 0), key=lambda h: -h.of(key))
        listing = ", ".join(f"{h.model} {_fmt(h.of(key))}" for h in fixed[:5]) or "nothing"
        more = f" and {len(fixed) - 5} more" if len(fixed) > 5 else ""
        parts.append(f"{room.host}: {BUDGET_NAMES[key]} = {_fmt(_budget(room, key))}, "
                     f"{_fmt(room.held(key, False))} held by {listing}{more} (pinned, protected, leased or busy)")
    what = _fmt(need.get(MEMORY, 0.0)) + (f" and {_fmt(need[GPU])} per GPU" if need.get(GPU) else "")
    return f"{model} needs {what} but no host has room: " + "; ".join(parts)
