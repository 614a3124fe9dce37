"""The daemon main loop's sleep: woken by another thread or by a signal handler, else until its next duty.

The loop used to wake every 0.1 s only to notice a stop or reload signal (a handler may not set a
`threading.Event`: the main thread it interrupts can hold that event's lock, in `clear` or `wait`,
and the handler would wait on it forever). Those wake-ups were 0.13 % of a core in an idle daemon
(issue 39, item 3). A pipe has no such lock: `set` writes a byte (from a thread or a handler, never
blocking), `wait` is one `poll` of its read end until the deadline the loop computes from its
duties, and `clear` drains it.
"""

from __future__ import annotations

import os
import select
from collections.abc import Callable
from typing import Protocol


class Waker:
    """A wake-up that a signal handler may set. Holds two file descriptors until `close()`."""

    def __init__(self) -> None:
        self._r, self._w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._poll = select.poll()  # not select(): a daemon may hold more than 1,024 descriptors
        self._poll.register(self._r, select.POLLIN)

    def set(self) -> None:
        if self._w < 0:
            return  # closed: nobody waits, and the number may name another file by now
        try:
            os.write(self._w, b"!")
        except OSError:  # full: a wake-up is pending anyway; closed: nobody waits
            pass

    def clear(self) -> None:
        if self._r < 0:
            return
        try:
            while os.read(self._r, 512):
                pass
        except OSError:  # empty now
            pass

    def wait(self, timeout_s: float) -> bool:
        """Until `set` (True: set since the last `clear`, which this leaves to the caller) or `timeout_s`."""
        if self._r < 0:
            return False
        return bool(self._poll.poll(max(0, round(timeout_s * 1000))))

    def close(self) -> None:
        fds, self._r, self._w = (self._r, self._w), -1, -1
        for fd in fds:
            if fd >= 0:
                os.close(fd)


def loop_sleep_s(now: float, *due: float | None, floor_s: float, ceiling_s: float = 1.0) -> float:
    """How long the main loop may sleep: until the earliest of its `due` times (monotonic; None: no such
    duty), at least `floor_s` (a duty due but still running is looked at again a tick later) and at
    most `ceiling_s`."""
    soonest = min((d for d in due if d is not None), default=now + ceiling_s)
    return min(max(soonest - now, floor_s), ceiling_s)


class _Settable(Protocol):
    def set(self) -> None: ...


def sets(*flags: _Settable) -> Callable[..., None]:
    """A signal handler that sets each of `flags` (a `Waker` last, so the loop wakes to see the others)."""
    def handler(*_: object) -> None:
        for flag in flags:
            flag.set()

    return handler
