"""What every finished operation tells the operator: one log line (a rollback and any failure at WARNING)
and systemd's STATUS= line (how many models serve, whether Triton answers, the last action).

A subscriber of controlplane/outcomes/bus.py, wired by daemon.py after the plane's own
(controlplane/outcomes/bookkeeping.py sets the last action it shows). While a start-up scan writes its own
progress to STATUS= (`scan_reporting`), an outcome does not write the serving count over it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from controlplane.base import systemd
from controlplane.documents.results import Outcome
from controlplane.errors import TritonctlError
from controlplane.outcomes.counters import Counters
from controlplane.store.registry import Registry

log = logging.getLogger("tritonctl.daemon")


class OutcomeLog:
    """An `Outcomes` subscriber (see the module docstring)."""

    def __init__(self, registry: Registry, counters: Counters) -> None:
        self.registry = registry
        self.counters = counters
        self._lock = threading.Lock()
        self._scans_reporting = 0  # start-up scans writing their own progress to STATUS=

    def note(self, outcome: Outcome) -> None:
        log.log(  # a rollback (automatic or an operator's) and any failure stand out: WARNING
            logging.INFO if outcome.succeeded and outcome.action != "rollback" else logging.WARNING,
            "%s %s %s digest %s active %s in %d ms: %s", outcome.model, outcome.action, outcome.outcome,
            (outcome.digest or "-")[:12], (outcome.active_digest or "-")[:12], outcome.duration_ms,
            outcome.message,
        )
        with self._lock:
            quiet = self._scans_reporting > 0
        if not quiet:
            systemd.status(self.line())

    def line(self) -> str:
        """STATUS=: models serving (a count, not 10,000 rows, every round), Triton, the last action."""
        try:
            serving = self.registry.count_models("serving")
        except TritonctlError:
            serving = -1
        triton = "reachable" if self.counters.triton_reachable else "unreachable"
        return f"{serving} models serving, triton {triton}; last: {self.counters.last_action}"

    @contextmanager
    def scan_reporting(self) -> Iterator[None]:
        """While a start-up scan deploys, STATUS= is its progress line (a registry count per deploy would
        be 1,000 of them in a first start)."""
        with self._lock:
            self._scans_reporting += 1
        try:
            yield
        finally:
            with self._lock:
                self._scans_reporting -= 1
            systemd.status(self.line())
