"""A daemon thread that does one round of work every interval until stopped (the on-demand sweep, the
bakes' judging): an exception in a round is logged and the next round tries again."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any


class Periodic:
    """`work()` every `interval_s` in a thread named `name`, from `start()` until `stop()`."""

    def __init__(self, name: str, interval_s: float, work: Callable[[], Any], log: logging.Logger) -> None:
        self.name = name
        self.interval_s = interval_s
        self.work = work
        self.log = log
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.work()
            except Exception as exc:  # noqa: BLE001 - the registry busy, Triton away: the next round tries again
                self.log.warning("%s: %s", self.name, exc)
