"""Requests for a model that is not loaded, held while tritonctl loads it (docs/ondemand.md "Requests load models").

A route in state `loadable` has no target: the model is registered but not loaded (policy ondemand, evicted by
the memory budget, unloaded for idleness). A request that needs the model (an inference, a stream, metadata,
config) is parked here instead of refused. The first request of a model makes it *wanted*; the daemon learns
it through the control channel (`wanted`, a long poll that answers as soon as a model becomes wanted) and
answers with ONE load, however many requests wait (a model wanted since the last answer is reported once
even when its requests went already: past a wait of 0, or a client that gave up). Then:

- the route becomes `serving` (the load's switch reaches `Gateway.install`): every parked request goes on from
  where it stopped, against the new table, in the order it arrived;
- the route is deleted or `unavailable`: they get that route's answer, as a new request would;
- the daemon reports the load refused (`refuse`: the memory budget cannot hold it, it has no content): they get
  503 / UNAVAILABLE with its reason, the holders of the budget named;
- still parked `load_wait_s` after it arrived (`gateway_load_wait_s`): 503 / UNAVAILABLE naming the wait, and
  what the load was doing (`note`), or that no daemon is connected to load it.

Bounded: at most `per_model` requests wait per model and they hold at most `max_bytes` in all (a parked HTTP
request's body is held as it arrives; a parked gRPC request holds what its flow-control windows let the client
send). A request past a bound is refused at once (RESOURCE_EXHAUSTED / 503) naming the bound. A waiter is any
object with `resume()` and `give_up(message)` (httpexchange.Exchange, grpccall.GrpcCall); one thread, no locks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

from controlplane.gateway.h2state import flush_dirty

log = logging.getLogger("tritonctl.gateway")

PER_MODEL = 10_000  # requests that may wait for one model's load
MAX_BYTES = 256 << 20  # request bytes all parked requests may hold together
DEFAULT_LOAD_WAIT_S = 60.0  # gateway_load_wait_s until the daemon says otherwise (its `wanted` polls)
CONNECTED_S = 10.0  # a daemon that polled `wanted` this recently (or polls now) is connected
MAX_NOTE = 500  # characters of a daemon's note kept


class Parking:
    def __init__(self, load_wait_s: float = DEFAULT_LOAD_WAIT_S, per_model: int = PER_MODEL,
                 max_bytes: int = MAX_BYTES) -> None:
        self.load_wait_s = load_wait_s
        self.per_model = per_model
        self.max_bytes = max_bytes
        self.waiting: dict[str, dict[Any, asyncio.TimerHandle]] = {}  # model -> waiter -> its deadline
        self.held: dict[Any, int] = {}  # waiter -> request bytes it holds
        self.bytes = 0
        self.since: dict[str, float] = {}  # model -> time.time() its first waiting request arrived
        self.notes: dict[str, str] = {}  # model -> what the daemon's load is doing (for a timeout's message)
        self.generation = 0  # counts models becoming wanted: a `wanted` poll answers once it passes `after`
        self.asked: dict[str, float] = {}  # models wanted since the last `wanted` answer, waiters or not
        self.parked = 0  # requests ever parked (the metrics)
        self.polls = 0  # `wanted` polls waiting now
        self.polled = 0.0  # time.monotonic() of the last poll's end
        self._wake: asyncio.Event | None = None

    # -- a request ----------------------------------------------------------------------------------

    def park(self, model: str, waiter: Any, size: int = 0) -> str | None:
        """Hold `waiter` until `model`'s route changes; a refusal (one line naming the bound) when it cannot be."""
        queue = self.waiting.get(model)
        if queue is not None and len(queue) >= self.per_model:
            return (f"model '{model}' is not loaded yet and {self.per_model} requests already wait for it "
                    "(the gateway's bound); try again shortly")
        if self.bytes + size > self.max_bytes:
            return self.over_bytes()
        if queue is None:
            queue = self.waiting[model] = {}
            self.since[model] = self.asked[model] = time.time()
            self.generation += 1
            if self._wake is not None:
                self._wake.set()
        loop = asyncio.get_running_loop()
        queue[waiter] = loop.call_later(self.load_wait_s, self._expire, model, waiter)
        self.held[waiter] = size
        self.bytes += size
        self.parked += 1
        return None

    def hold(self, waiter: Any, n: int) -> bool:
        """`waiter` holds `n` bytes more (its body came on); False when that would pass `max_bytes`."""
        if waiter not in self.held:
            return True
        if self.bytes + n > self.max_bytes:
            return False
        self.held[waiter] += n
        self.bytes += n
        return True

    def over_bytes(self) -> str:
        return (f"requests waiting for models to load already hold {self.bytes >> 20} MiB (the gateway's bound is "
                f"{self.max_bytes >> 20} MiB); try again shortly")

    def leave(self, model: str, waiter: Any) -> None:
        """`waiter` stops waiting without an answer from here (its client went, or it answered itself)."""
        queue = self.waiting.get(model)
        timer = queue.pop(waiter, None) if queue is not None else None
        if timer is not None:
            timer.cancel()
        self.bytes -= self.held.pop(waiter, 0)
        if queue is not None and not queue:
            self._forget(model)

    def _forget(self, model: str) -> None:
        self.waiting.pop(model, None)
        self.since.pop(model, None)
        self.notes.pop(model, None)

    def _take(self, model: str) -> list[Any]:
        """Every waiter of `model`, in arrival order, no longer parked."""
        queue = self.waiting.get(model) or {}
        waiters = list(queue)
        for waiter in waiters:
            queue[waiter].cancel()
            self.bytes -= self.held.pop(waiter, 0)
        self._forget(model)
        return waiters

    def _expire(self, model: str, waiter: Any) -> None:
        queue = self.waiting.get(model)
        if queue is None or waiter not in queue:
            return
        message = self.timeout_message(model)
        self.leave(model, waiter)
        waiter.give_up(message)
        flush_dirty()

    def timeout_message(self, model: str) -> str:
        why = self.notes.get(model)
        if not self.connected():
            why = "no tritonctl daemon is connected to the gateway to load it"
        return (f"model '{model}' is not loaded: it did not load within gateway_load_wait_s = {self.load_wait_s:g} s"
                + (f" ({why})" if why else ""))

    def connected(self) -> bool:
        return self.polls > 0 or time.monotonic() - self.polled < CONNECTED_S

    # -- the route table and the daemon -------------------------------------------------------------

    def resume(self, routes: Mapping[bytes, Any]) -> int:
        """The table changed (Gateway.install): the waiters of every model whose route is no longer `loadable`
        go on against it. Returns how many went on."""
        moved = 0
        for model in list(self.waiting):
            route = routes.get(model.encode())
            if route is not None and route.state == "loadable":
                continue
            for waiter in self._take(model):
                moved += 1
                waiter.resume()
        if moved:
            flush_dirty()
        return moved

    def refuse(self, model: str, reason: str) -> int:
        """The daemon could not load `model`: every waiter gets 503 / UNAVAILABLE with `reason`."""
        waiters = self._take(model)
        message = f"model '{model}' could not be loaded: {reason}"
        for waiter in waiters:
            waiter.give_up(message)
        if waiters:
            flush_dirty()
        return len(waiters)

    def note(self, model: str, text: str) -> bool:
        """What the daemon's load of `model` is doing, named by a timeout; False when nothing waits for it."""
        if model not in self.waiting:
            return False
        self.notes[model] = text[:MAX_NOTE]
        return True

    def close(self, reason: str) -> None:
        """The gateway stops: every waiter is answered."""
        for model in list(self.waiting):
            for waiter in self._take(model):
                waiter.give_up(f"model '{model}' is not loaded: {reason}")
        flush_dirty()

    def wanted_now(self) -> dict[str, Any]:
        """Every model requests wait for, and those wanted since the last answer whose requests went already
        (past a wait of 0, a client that gave up): their load goes on for the next request."""
        now = time.time()
        wanted = {model: {"since": since, "waiting": 0, "waited_s": round(now - since, 3)}
                  for model, since in self.asked.items()}
        self.asked = {}
        wanted.update({model: {"since": self.since[model], "waiting": len(queue),
                               "waited_s": round(now - self.since[model], 3)}
                       for model, queue in self.waiting.items()})
        return {"generation": self.generation, "wanted": wanted}

    async def wanted(self, after: int, wait_s: float) -> dict[str, Any]:
        """The models requests wait for, once one became wanted after generation `after` (at most `wait_s`)."""
        self.polls += 1
        try:
            if self.generation <= after and wait_s > 0:
                if self._wake is None:
                    self._wake = asyncio.Event()
                self._wake.clear()
                try:
                    await asyncio.wait_for(self._wake.wait(), wait_s)
                except asyncio.TimeoutError:
                    pass
        finally:
            self.polls -= 1
            self.polled = time.monotonic()
        return self.wanted_now()
