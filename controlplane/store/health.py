"""Whether a registry answers: one object per registry that every caller reports to, and the one voice
that speaks about an outage.

The registry's own transactions report here (`Registry._session`: a connection that fails is an
outage, a transaction that commits ends it; a write, when the registry could read but not write),
and so do the fleet's own connections (the election's,
controlplane/fleet/election.py). The log gets one WARNING when the registry becomes unreachable, at
most one line a minute while it stays so, and one INFO when it answers again, with how long it was
gone; the callers whose round failed stay quiet while `quiet(exc)` says the outage is already told.

`regained_at` (monotonic) is when it last answered again: the fleet's liveness gives every host a
grace from then before it judges one dead (controlplane/fleet/rollouts.py). `on_return` callbacks
run, outside the lock, on the thread that saw the registry answer again (the journal's replay),
before the outage is declared over: one that raises StoreError keeps it on.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime

from controlplane.errors import StoreError
from controlplane.store.records import utcnow

log = logging.getLogger("tritonctl.store")

REPEAT_S = 60.0  # at most one line a minute while the registry stays unreachable


class RegistryHealth:
    """Reachable or not, since when, and why (thread-safe)."""

    def __init__(self, name: str, clock: Callable[[], float] = time.monotonic, repeat_s: float = REPEAT_S) -> None:
        self.name = name  # the registry's URL, password hidden
        self.clock = clock
        self.repeat_s = repeat_s
        self._lock = threading.Lock()
        self._down_at: float | None = None  # monotonic, while unreachable
        self._since: datetime | None = None  # UTC, while unreachable
        self._reason = ""
        self._reads_end_it = True  # False: the registry reads but cannot be written (a full disk)
        self._last_line = 0.0
        self.regained_at: float | None = None  # monotonic: the last time it answered again
        self.outages = 0
        self.last_outage_s = 0.0  # how long the last outage lasted
        self.on_return: list[Callable[[float], str]] = []  # called with the outage's length; says what it did
        self._returning = False  # the on_return callbacks run now
        # a full disk's outage ends only once this says there is room again (a SQLite registry's own
        # filesystem: controlplane/store/journaled.py); a full disk takes a small write now and then
        self.room: Callable[[], bool] | None = None

    @property
    def reachable(self) -> bool:
        return self._down_at is None

    @property
    def since(self) -> datetime | None:
        """When the current outage began (naive UTC), None while reachable."""
        return self._since

    @property
    def reason(self) -> str:
        return self._reason

    def failed(self, reason: str, reads_end_it: bool = True) -> None:
        """A connection to the registry failed: the first failure starts an outage (one WARNING); later
        ones say so again at most once a minute. `reads_end_it` False: it reads but cannot be written
        (a full disk), so only a write that commits ends this outage."""
        now = self.clock()
        with self._lock:
            self._reads_end_it = reads_end_it
            first = self._down_at is None
            if first:
                self._down_at, self._since, self.outages = now, utcnow(), self.outages + 1
            self._reason = reason
            if not first and now - self._last_line < self.repeat_s:
                return
            self._last_line = now
            down_for = now - (self._down_at or now)
        if first:
            log.warning("registry %s unreachable: %s; serving is unchanged, what is done meanwhile waits in "
                        "the journal", self.name, reason)
        else:
            log.warning("registry %s still unreachable after %.0f s: %s", self.name, down_for, reason)

    def answered(self, wrote: bool = True) -> None:
        """A transaction on the registry committed (`wrote`: one that wrote): an outage, if one was on,
        is over (one INFO) once the `on_return` callbacks ran; one that raises StoreError (the journal's
        writes failed again: a full disk takes a small write now and then) keeps it on, untold."""
        if self._down_at is None or not (wrote or self._reads_end_it):  # the common case, without the lock
            return
        if not self._reads_end_it and self.room is not None and not self.room():
            return
        now = self.clock()
        with self._lock:
            if self._down_at is None or self._returning:  # a callback's own writes answer too: not again
                return
            self._returning = True
            length = now - self._down_at
        try:
            done = [said for said in (callback(length) for callback in list(self.on_return)) if said]
        except StoreError:
            return  # still away (the failure under the callback was told as this outage's)
        finally:
            with self._lock:
                self._returning = False
        with self._lock:
            if self._down_at is None:
                return
            self._down_at, self._since, self._reason, self.regained_at = None, None, "", now
            self.last_outage_s = length
        log.info("registry %s reachable again after %.1f s%s", self.name, length,
                 f"; {'; '.join(done)}" if done else "")

    def quiet(self) -> bool:
        """True while an outage is on: its own lines tell it, the caller whose round failed says nothing."""
        return self._down_at is not None

    def told(self, exc: BaseException) -> bool:
        """`exc` is the registry failing during an outage this object already tells: log nothing more."""
        return isinstance(exc, StoreError) and self.quiet()

    def in_grace(self, grace_s: float) -> bool:
        """Within `grace_s` of the registry answering again (or still unreachable)."""
        if self._down_at is not None:
            return True
        return self.regained_at is not None and self.clock() - self.regained_at < grace_s
