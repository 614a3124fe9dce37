"""Private names the gateway no longer routes to, unloaded once the requests that started on them finished.

After a switch (controlplane/deploy/aliases.py) the old digest's private name still answers the requests a
client sent before the flip. It is unloaded `gateway_drain_s` after the flip, and not before the gateway
counts no request in flight on it (waiting at most `MAX_WAIT_S` more, then unloaded anyway: a request
that outlives that holds a model nobody routes to). A name that is routed again meanwhile (a rollback
flipped back to it), or held (a bake keeps the previous digest loaded so that its rollback is a flip), is
not unloaded. Names a stopped daemon left loaded and unrouted are found by the reconcile, which hands them
here too (`retire` with no wait).
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping

log = logging.getLogger("tritonctl.deploy")

MAX_WAIT_S = 60.0  # past the drain, how long requests still in flight keep an unrouted name loaded
POLL_S = 0.2  # how often a name with requests in flight is looked at again


class Drainer:
    """The names waiting to be unloaded (see the module docstring). `unload(model, name)` takes a name out
    of Triton under the model's lock and says whether it did (not when it is routed again); `in_use()`
    names what a request can reach now; `inflight(names)` asks the gateway; `drain_s()` is read at each
    retirement (SIGHUP may change it)."""

    def __init__(self, unload: Callable[[str, str], bool], in_use: Callable[[], set[str]],
                 inflight: Callable[[Iterable[str]], Mapping[str, int]], drain_s: Callable[[], float]) -> None:
        self._unload = unload
        self._in_use = in_use
        self._inflight = inflight
        self._drain_s = drain_s
        self._due: list[tuple[float, float, str, str]] = []  # (due, give up at, model, name)
        self._held: dict[str, int] = {}
        self._cond = threading.Condition()
        self._stopped = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="drain", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def retire(self, model: str, name: str, after_s: float | None = None) -> None:
        """Unload `name` (a private name of `model`) once drained: `after_s` from now (default the drain)."""
        wait = self._drain_s() if after_s is None else after_s
        now = time.monotonic()
        with self._cond:
            heapq.heappush(self._due, (now + wait, now + wait + MAX_WAIT_S, model, name))
            self._cond.notify_all()

    def hold(self, name: str) -> None:
        """Keep `name` loaded while unrouted (a bake's previous digest) until `release`."""
        with self._cond:
            self._held[name] = self._held.get(name, 0) + 1

    def release(self, model: str, name: str) -> None:
        with self._cond:
            left = self._held.get(name, 0) - 1
            if left > 0:
                self._held[name] = left
                return
            self._held.pop(name, None)
        self.retire(model, name)

    def pending(self) -> list[str]:
        """The names waiting (for `status` and tests)."""
        with self._cond:
            return sorted(name for _, _, _, name in self._due)

    def held(self) -> set[str]:
        with self._cond:
            return set(self._held)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopped and (not self._due or self._due[0][0] > time.monotonic()):
                    timeout = self._due[0][0] - time.monotonic() if self._due else None
                    self._cond.wait(timeout=timeout if timeout is None else max(0.0, timeout))
                if self._stopped:
                    return
                due, give_up, model, name = heapq.heappop(self._due)
                held = name in self._held
            try:
                self._one(due, give_up, model, name, held)
            except Exception:  # a retirement never stops the drainer
                log.exception("%s: unloading the drained name %s failed", model, name)

    def _one(self, due: float, give_up: float, model: str, name: str, held: bool) -> None:
        if held or name in self._in_use():
            return  # routed again, or held: a later retire or release brings it back
        try:
            busy = int(self._inflight([name]).get(name, 0))
        except Exception as exc:  # the gateway is away: what it counted is unknown, wait for it
            log.info("%s: requests in flight on %s unknown (%s); looked at again", model, name, exc)
            busy = 1
        now = time.monotonic()
        if busy > 0 and now < give_up:
            with self._cond:
                heapq.heappush(self._due, (now + POLL_S, give_up, model, name))
            return
        if busy > 0:
            log.warning("%s: %s still had %d request(s) in flight %.0f s after its drain; unloaded", model, name,
                        busy, MAX_WAIT_S)
        if self._unload(model, name):
            log.info("%s: %s drained and unloaded", model, name)
