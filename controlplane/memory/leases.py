"""Leases: a client's claim that a model stays loaded until a time, renewed or released by its id.

Why: on a host with a memory budget models come and go (controlplane/memory/budget.py evicts idle ones, policy
`ondemand` unloads them after `idle_unload_s`); a client that ensured a model (`tritonctl ensure`,
`POST /v1/models/{model}/lease`) must not see it unloaded while it uses it, and a client that went
away must not hold it forever. A lease expires unless renewed (as the Triton Management Service's
did); while a model has an active lease it is never evicted or unloaded for idleness.

The book is in the daemon's memory: a daemon restart forgets the leases (its tritonserver keeps serving
what it served, and the idle clock starts again from the restart), which is what a lease's holder sees
as an expiry; it renews or ensures again.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from controlplane.base.bounds import MAX_DURATION_S
from controlplane.errors import NotFoundError, UsageError
from controlplane.text import duration_s

MAX_LEASE_S = MAX_DURATION_S  # a lease is a duration like any other (controlplane/base/bounds.py)
DEFAULT_LEASE = "10m"


@dataclass(frozen=True)
class Lease:
    id: str
    model: str
    until: float  # seconds since the epoch
    actor: str


def parse_duration(text: str, field: str = "--for") -> float:
    """'90', '90s', '10m', '2h', '1d' → seconds (a lease's length, more than 0 and at most a week)."""
    seconds = duration_s(text)
    if seconds is None:
        raise UsageError(f"{field}: '{text}' is not a duration like 30s, 10m, 2h")
    return check_duration(seconds)


def check_duration(for_s: float) -> float:
    """A lease's length: more than 0, at most a week."""
    if not (0 < for_s <= MAX_LEASE_S):  # NaN is refused too
        raise UsageError(f"lease duration {for_s:g} s: expected more than 0 and at most {MAX_LEASE_S:.0f} s")
    return float(for_s)


class LeaseBook:
    """The active leases of this daemon, by id; expired ones are handed to `on_expiry` once."""

    def __init__(self, clock: Callable[[], float] = time.time,
                 on_expiry: Callable[[Lease], None] | None = None) -> None:
        self.clock = clock
        self.on_expiry = on_expiry
        self._leases: dict[str, Lease] = {}
        self._last: dict[str, float] = {}  # model → when its last lease ended or was last renewed
        self._lock = threading.Lock()

    def grant(self, model: str, for_s: float, actor: str) -> Lease:
        lease = Lease(secrets.token_hex(8), model, self.clock() + check_duration(for_s), actor)
        with self._lock:
            self._leases[lease.id] = lease
            self._last[model] = self.clock()
        return lease

    def _get(self, model: str, lease_id: str) -> Lease:
        self.expire()
        lease = self._leases.get(lease_id)
        if lease is None or lease.model != model:
            raise NotFoundError(f"model '{model}' has no active lease {lease_id}")
        return lease

    def renew(self, model: str, lease_id: str, for_s: float) -> Lease:
        lease = self._get(model, lease_id)
        renewed = Lease(lease.id, model, self.clock() + check_duration(for_s), lease.actor)
        with self._lock:
            self._leases[lease.id] = renewed
            self._last[model] = self.clock()
        return renewed

    def release(self, model: str, lease_id: str) -> Lease:
        lease = self._get(model, lease_id)
        with self._lock:
            self._leases.pop(lease.id, None)
            self._last[model] = self.clock()
        return lease

    def expire(self) -> list[Lease]:
        """Drop the leases past their time; each is reported to `on_expiry` once."""
        now = self.clock()
        with self._lock:
            gone = [lease for lease in self._leases.values() if lease.until <= now]
            for lease in gone:
                del self._leases[lease.id]
                self._last[lease.model] = max(self._last.get(lease.model, 0.0), lease.until)
        for lease in gone:
            if self.on_expiry is not None:
                self.on_expiry(lease)
        return gone

    def active(self, model: str) -> list[Lease]:
        now = self.clock()
        with self._lock:
            return sorted((x for x in self._leases.values() if x.model == model and x.until > now),
                          key=lambda x: x.until)

    def held(self, model: str) -> bool:
        return bool(self.active(model))

    def last_used(self) -> dict[str, float]:
        """model → the latest of its leases' grants, renewals, releases and (active) ends so far."""
        now = self.clock()
        with self._lock:
            last = dict(self._last)
            for lease in self._leases.values():
                last[lease.model] = max(last.get(lease.model, 0.0), min(now, lease.until))
        return last
