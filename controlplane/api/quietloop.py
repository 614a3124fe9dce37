"""A uvicorn server whose housekeeping wakes once a second instead of ten times (issue 39, item 3).

uvicorn's `Server.main_loop` sleeps 0.1 s between ticks, only to refresh its `date` header once a
second and to notice `should_exit`: an idle daemon's listener thread spent 0.18 % of a core on those
wake-ups (measured per thread at 2,000 models, bench/idle_windows.py), as much as its reconcile. Here
the loop waits up to `TICK_S` on an event that `stop()` sets from any thread, so the header still
changes every second and a stop is seen at once. Requests are served by the event loop as before; this
loop only keeps house: it also runs `housekeeping` once a tick (the listener's connection sweep,
controlplane/api/connections.py), and the loop's exception handler is set before it serves (`exception_handler`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import uvicorn

TICK_S = 1.0
TICKS_PER_WAIT = 10  # uvicorn's on_tick counts 0.1 s ticks: its header refresh runs when counter % 10 == 0


class QuietServer(uvicorn.Server):
    """`uvicorn.Server` with a once-a-second housekeeping loop; `stop()` ends it from another thread."""

    _wake: asyncio.Event | None = None
    _loop: asyncio.AbstractEventLoop | None = None
    housekeeping: Callable[[], None] | None = None  # run once a tick
    exception_handler: Any = None  # the event loop's, set before the server serves

    async def startup(self, sockets: Any = None) -> None:
        if self.exception_handler is not None:
            asyncio.get_running_loop().set_exception_handler(self.exception_handler)
        await super().startup(sockets=sockets)

    async def main_loop(self) -> None:
        self._loop, self._wake = asyncio.get_running_loop(), asyncio.Event()
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            try:
                await asyncio.wait_for(self._wake.wait(), TICK_S)
            except asyncio.TimeoutError:  # TimeoutError itself from Python 3.11 on
                pass
            counter = (counter + TICKS_PER_WAIT) % 864000
            if self.housekeeping is not None:
                self.housekeeping()
            should_exit = await self.on_tick(counter)

    def stop(self) -> None:
        """Ask the server to exit and wake its loop (thread-safe; before the loop runs, its first tick
        sees `should_exit`)."""
        self.should_exit = True
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            try:
                loop.call_soon_threadsafe(wake.set)
            except RuntimeError:  # the loop has closed already
                pass
