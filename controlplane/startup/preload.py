"""What a freshly launched tritonserver loads during its own start-up.

Triton's model-repository API loads one model per request, and its cost per request grows with the
models it already holds (docs/benchmarks.md, issue 26): restoring 1,000 models into a fresh server one
`load_model` each took 151 s, where `--load-model` at launch loads the same repository in one pass of
its load threads in about a second. So a server the daemon launches fresh (a start after a reboot, a
relaunch after it died) is started with `--load-model` for every model the registry serves whose
published tree is in place (with a gateway: under the private names its routes file kept, the names the
gateway sends requests to); the reconcile then finds them READY with the digest it expects and
restores only what did not load (it verifies every one, as for any server).

Not preloaded: without a gateway, a model whose deployment was interrupted (crash recovery decides what
it serves; with one, the route decides and its names are loaded), one not published, every model under a
memory budget (each load is admitted and measured: the budget's count must hold), and in a fleet (the
host converges to the fleet's target).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from controlplane.deploy.publish import ServingRepository
from controlplane.errors import LauncherError
from controlplane.gateway.routes import Route
from controlplane.settings.config import Settings
from controlplane.store.registry import Registry


def models_to_preload(settings: Settings, registry: Registry, serving: ServingRepository,
                      routes: Mapping[str, Route] | None = None) -> dict[str, list[str]]:
    """The models a fresh tritonserver should load in its own start-up, each with the names Triton loads it
    under ({} when none may). Without a gateway (`routes` None) a model loads under its own name. With one,
    Triton knows only the private names of the gateway's routes (`routes`: the table its file kept): a model
    is preloaded when its route's active target (the first) carries the registry's active digest, under every
    name of the route (a canary's previous digest too: the gateway sends it requests) whose tree is published;
    a deployment left open (this start's staged deploy, or one a crash interrupted) does not keep it out: a
    private name holds one digest only, and the route is what clients reach until that deploy switches it."""
    if (not settings.launch_loads_serving or settings.fleet
            or settings.memory_budget_mb is not None or settings.gpu_memory_budget_mb is not None):
        return {}
    interrupted = {d.model for d in registry.open_deployments()}
    published = set(serving.models())
    out: dict[str, list[str]] = {}
    for m in registry.serving_models():
        if not m.active_digest or (routes is None and m.name in interrupted):
            continue  # in place, an interrupted deploy may have published its content under the model's name
        if routes is None:
            if m.name in published:
                out[m.name] = [m.name]
            continue
        route = routes.get(m.name)
        if route is None or not route.targets or route.targets[0].digest != m.active_digest:
            continue  # not routed to what the registry serves: the reconcile restores it
        names = [t.name for t in route.targets if t.name in published]
        if names and names[0] == route.targets[0].name:
            out[m.name] = names
    return dict(sorted(out.items()))


def preload_timeout_s(settings: Settings, count: int) -> float:
    """How long a launch with `count` preloads may take to go live: Triton's own start, then the loads
    in waves of its load threads, each bounded by one model's load timeout. A load that hangs is found
    sooner, by `LoadProgress` (no load finished for `load_timeout_s`)."""
    waves = -(-count // max(1, settings.triton_load_threads))
    return 60.0 + waves * settings.load_timeout_s


# Triton's own line for each model its start-up finished loading: `... model_lifecycle.cc:839]
# "successfully loaded 'good'"`, or `"failed to load 'bad'"` (measured on tritonserver 2.51)
_FINISHED = re.compile(rb"""\] "(?:successfully loaded|failed to load) '[^']+'"\s*$""", re.M)


class LoadProgress:
    """A launching tritonserver's start-up loads, read from its log as they finish: `check()` counts
    them and raises LauncherError when none finished for `stall_s` (a load that hangs: the daemon then
    launches the server without preloads, and restores each model with its own load timeout)."""

    def __init__(self, log_path: Path, total: int, stall_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.log_path = Path(log_path)
        self.total = total
        self.stall_s = stall_s
        self.clock = clock
        self.finished = 0
        try:
            self.offset = self.log_path.stat().st_size  # the server appends to the log of earlier runs
        except OSError:
            self.offset = 0
        self._partial = b""
        self._progress_at = clock()

    def poll(self) -> int:
        """Read what the log gained; return how many loads finished so far."""
        try:
            with open(self.log_path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except OSError:
            return self.finished
        self.offset += len(data)
        text = self._partial + data
        complete, _, self._partial = text.rpartition(b"\n")
        found = len(_FINISHED.findall(complete))
        if found:
            self.finished += found
            self._progress_at = self.clock()
        return self.finished

    def check(self) -> None:
        self.poll()
        idle = self.clock() - self._progress_at
        if idle > self.stall_s:
            raise LauncherError(f"tritonserver's start-up loads: {self.finished} of {self.total} finished, "
                                f"none in the last {idle:.0f} s (load_timeout_s {self.stall_s:.0f})")
