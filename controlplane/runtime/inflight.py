"""Work the daemon has in flight (watcher deploys, reconciles, retries, scans): remembered so that a
stop can wait for it within its bound (Daemon.shutdown), from the main loop and workers alike."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any


class InFlight:
    """The futures submitted and not done yet (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # also guards what the daemon counts beside them (its scans reporting)
        self._futures: set[Future[Any]] = set()

    def track(self, future: Future[Any]) -> None:
        with self.lock:
            self._futures.add(future)

    def prune(self) -> None:
        """Forget the finished ones (the main loop, each turn)."""
        with self.lock:
            self._futures = {f for f in self._futures if not f.done()}

    def wait(self, deadline: float, busy: Callable[[], list[str]], tick_s: float) -> list[str]:
        """Wait until every tracked future is done and `busy` (operations started elsewhere, e.g. by the
        control API in its own threads) is empty, or `deadline` (monotonic) passes. Returns what was still
        running then: the busy models, or ["reconcile"] for a future that did not finish; [] when all ended."""
        with self.lock:
            futures = list(self._futures)
        for future in futures:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                future.result(timeout=remaining)
            except Exception:  # noqa: BLE001 - its own handler logged it (or it was cancelled); we only wait
                pass
        running = busy()
        while running and time.monotonic() < deadline:
            time.sleep(tick_s)
            running = busy()
        if not running and any(not f.done() for f in futures):
            return ["reconcile"]
        return running
