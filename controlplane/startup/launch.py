"""A launched tritonserver (`--launch-triton`): built from the settings, adopted when the daemon's own
server still runs (a crash, `keep_triton`), else started fresh with what the registry serves loading in
its own start-up (controlplane/startup/preload.py); and whether other local users could read its key.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import Sequence
from concurrent.futures import Executor
from typing import Any, Protocol

from controlplane.base import systemd
from controlplane.deploy.publish import ServingRepository
from controlplane.errors import ConfigError, LauncherError, TritonctlError
from controlplane.gateway.launcher import ROUTES_FILE
from controlplane.gateway.routes import Route, read_table
from controlplane.ports import WavePlane
from controlplane.settings.config import Settings
from controlplane.startup import bulk
from controlplane.startup.gateway import GATEWAY_DIR
from controlplane.startup.preload import LoadProgress, models_to_preload, preload_timeout_s
from controlplane.store.registry import Registry
from controlplane.triton.client import TritonClient
from controlplane.triton.exposure import key_exposure
from controlplane.triton.launcher import RECORD_FILE, WAIT_CALLBACK_S, TritonServer
from controlplane.triton.ports import launch_ports, unlike_requested
from controlplane.triton.serverlog import LogCursor

log = logging.getLogger("tritonctl.daemon")


def key_exposed(settings: Settings) -> bool:
    """Before a tritonserver is launched (or adopted): can other local users read its command line,
    and with it its key? One WARNING line, or with `launch_triton_exposed_key = "refuse"` no start."""
    if not settings.launch_triton:
        return False
    exposure = key_exposure()
    if not exposure.exposed:
        log.info("tritonserver's key: %s", exposure.reason)
    elif settings.launch_triton_exposed_key == "refuse":
        raise ConfigError(f"launch_triton_exposed_key = \"refuse\": {exposure.reason}; not launching tritonserver")
    else:
        log.warning("tritonserver's key is exposed: %s", exposure.reason)
    return exposure.exposed


def new_server(settings: Settings) -> TritonServer:
    """The daemon's tritonserver, not started: its key known only to this daemon (nobody else can load
    code), outliving a crash of the control plane (the data plane keeps serving). Refused for a state
    directory whose path holds whitespace: tritonserver 2.51's python backend never finishes starting
    a model instance under such a path (measured: `tests/test_launcher.py`), so every python model
    would hang in its load."""
    if any(ch.isspace() for ch in str(settings.state_dir.resolve())):
        raise ConfigError(f"state_dir: {settings.state_dir}: a launched tritonserver cannot start python models "
                          "under a path with whitespace; choose a state directory (--state-dir) without any")
    workdir = settings.state_dir / "triton"
    return TritonServer(
        model_repository=settings.state_dir / "serving",
        workdir=workdir,
        tritonserver=str(settings.tritonserver) if settings.tritonserver else None,
        restricted_key=secrets.token_hex(16),
        die_with_parent=False,
        record_path=workdir / RECORD_FILE,
        disable_auto_complete=not settings.triton_auto_complete,
        extra_args=[f"--model-load-thread-count={settings.triton_load_threads}"],
    )


def adopt_or_launch(settings: Settings, registry: Registry, server: TritonServer, serving: ServingRepository,
                    *, defer: bool = False) -> list[str] | None:
    """The record before any port: the ports a crash (or keep_triton) left our own tritonserver serving
    on are adopted with it, whatever they are; only another holder is a conflict. Returns the models a
    fresh server loaded in its start-up ([] when adopted); None when `defer`: the ports are chosen and the
    launch waits for the first start's deploys (controlplane/startup/bulk.py), which load in it too."""
    if server.adopt():
        log.info("adopted the running tritonserver pid %s on %s", server.pid, server.grpc_url)
        changed = unlike_requested(settings, (server.grpc_port, server.http_port, server.metrics_port))
        if changed:
            log.warning("the adopted tritonserver keeps its ports, not the requested %s, until the daemon "
                        "stops it (SIGTERM without keep_triton); the next start then uses them", ", ".join(changed))
        return []
    server.grpc_port, server.http_port, server.metrics_port = launch_ports(settings)
    if defer:
        return None
    preloaded, _ = launch(settings, registry, server, serving)
    log.info("launched tritonserver pid %s on %s", server.pid, server.grpc_url)
    return preloaded


def launch(settings: Settings, registry: Registry, server: TritonServer, serving: ServingRepository,
           staged: list[str] | None = None) -> tuple[list[str], bool]:
    """Start a fresh tritonserver (the daemon's start, a relaunch after it died) with the models the
    registry serves loading in its own start-up (controlplane/startup/preload.py): one pass of its
    load threads instead of a load request each. If those loads stall or the server does not come
    up with them, it is launched without them and the reconcile restores each model, as before.
    `staged`: a first start's deploys, published, to load there too (controlplane/startup/bulk.py).
    Returns the registry's models it loaded in its start-up (the next reconcile verifies and audits
    them), and whether it was launched with its loads."""
    preloads = models_to_preload(settings, registry, serving, gateway_routes(settings))
    served = list(preloads)
    preload = sorted({*(name for names in preloads.values() for name in names), *(staged or [])})
    if preload:
        log.info("launching tritonserver with the %d models the registry serves loading in its start-up%s",
                 len(served), f", and the {len(staged)} deploys of this start" if staged else "")
        progress = LoadProgress(server.log_path, len(preload), stall_s=settings.load_timeout_s)

        def waiting() -> None:
            progress.check()  # raises when no load finished for load_timeout_s
            # loads are finishing: systemd's start timeout and watchdog wait for them
            systemd.notify(f"STATUS=tritonserver start-up: {progress.finished} of {len(preload)} models "
                           "loaded", f"EXTEND_TIMEOUT_USEC={int(6 * WAIT_CALLBACK_S * 1e6)}")
            systemd.watchdog_ping()

        started = time.monotonic()
        try:
            server.start(live_timeout_s=preload_timeout_s(settings, len(preload)), load=preload, on_wait=waiting)
        except LauncherError as exc:
            log.error("%s; launching tritonserver without them: the reconcile restores each model", exc)
        else:
            log.info("tritonserver live %.1f s after launch, its start-up loads done (%d of %d finished; "
                     "the reconcile verifies each)", time.monotonic() - started, progress.poll(), len(preload))
            return served, True
    server.start()
    return [], False


def gateway_routes(settings: Settings) -> dict[str, Route] | None:
    """The routes the gateway's file kept (the names Triton serves each model under), read before the gateway
    is adopted or started; None without a gateway. A file that cannot be read preloads nothing (the reconcile
    restores each model, and the gateway's own start says what is wrong with it)."""
    if not settings.routes_traffic:
        return None
    try:
        return dict(read_table(settings.state_dir / GATEWAY_DIR / ROUTES_FILE).routes)
    except TritonctlError as exc:
        log.warning("the gateway's routes file: %s; nothing preloaded", exc)
        return {}


class StagedPlane(WavePlane, Protocol):
    """What the deferred launch uses of the plane beyond the start-up scan's records: its counters (Triton
    reachable), its Triton client (reconnected once the server listens), the preloads to verify, and the
    reconcile a start runs first."""

    @property
    def counters(self) -> Any: ...

    @property
    def triton(self) -> TritonClient: ...

    def preloaded(self, models: Sequence[str]) -> None: ...

    def reconcile(self) -> Any: ...


def launch_staged(settings: Settings, registry: Registry, server: TritonServer, serving: ServingRepository,
                  plane: StagedPlane, bulks: Sequence[bulk.Bulk], pool: Executor) -> tuple[list[str], list[str]]:
    """The deferred launch of a fresh tritonserver (controlplane/startup/bulk.py): the staged deploys
    (`bulks`: the step models', then the ensembles') and the registry's models in its start-up, the staged
    deploys verified and ended in that order, then the reconcile that a start runs first. Returns (the
    registry's models it preloaded, the staged models)."""
    names = [name for b in bulks for name in b.names]
    cursor = LogCursor(server.log_path)
    try:
        preloaded, loaded = launch(settings, registry, server, serving, names)
    except TritonctlError as exc:
        for s in (s for b in bulks for s in b.staged):
            plane.deployer.finish_staged(s, failure=exc)
        raise
    log.info("launched tritonserver pid %s on %s", server.pid, server.grpc_url)
    plane.counters.triton_reachable = True  # live: the reconcile below keeps it up to date
    plane.triton.reconnect()  # its channel was made before the server listened
    plane.preloaded(preloaded)
    lines = bulk.log_lines(cursor) if loaded else []
    for b in bulks:
        bulk.finish_all(plane, b, loaded=loaded, lines=lines, index=plane.triton.index, url=plane.triton.url,
                        pool=pool)
    plane.reconcile()  # interrupted deployments, and the registry's preloads verified and audited
    return preloaded, names
