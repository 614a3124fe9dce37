"""What the daemon counts about itself: the last action and Triton's reachability (systemd's STATUS=,
the `tritonctl_triton_reachable` gauge), the drift the last reconcile found, and how often the source
pipeline ran (Prometheus counters, controlplane/outcomes/metrics.py)."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from controlplane.deploy.reconcile import Drift


@dataclass
class Counters:
    """What the daemon tells systemd and metrics about itself."""

    last_action: str = "starting"
    triton_reachable: bool = False
    drift: tuple[Drift, ...] = ()


class PipelineCounts:
    """How often the source pipeline ran since the daemon started: captures, validations and records
    (Prometheus counters, controlplane/outcomes/metrics.py), and what the start-up scan found unchanged by
    signature (so no file of it was read) or handed to capture (controlplane/startup/scan.py), and the
    deploys a launching tritonserver's start-up loaded (controlplane/startup/bulk.py)."""

    NAMES = ("captures", "validations", "records", "start_unchanged", "start_changed", "startup_loads")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(self.NAMES, 0)

    def add(self, name: str, amount: int = 1) -> None:
        with self._lock:
            self._counts[name] += amount

    def get(self, name: str) -> int:
        with self._lock:
            return self._counts[name]
