"""One settable clock for the tests: pass it where the code takes a clock (`Registry(url, clock=...)`).

Naive UTC, like `controlplane.store.records.utcnow`, so "when" questions have exact answers.
"""

from __future__ import annotations

from datetime import datetime, timedelta


class Clock:
    """A stand-in for `utcnow`: returns `now`, which a test sets (`at`) or moves (`advance`)."""

    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def at(self, when: datetime) -> Clock:
        self.now = when
        return self

    def advance(self, **delta: float) -> datetime:
        self.now += timedelta(**delta)
        return self.now
