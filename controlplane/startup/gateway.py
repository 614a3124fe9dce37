"""The gateway in front of tritonserver (docs/gateway.md): where it listens, started or adopted at the daemon's
start, started again when it dies, and the route port the deploy engine switches through.

With `--launch-triton` (and `gateway` on, the default) the gateway takes the ports clients use today
(`triton_grpc_port`, `triton_http_port`, `triton_metrics_port`: 8001, 8000, 8002) and the launched
tritonserver moves to loopback ports of its own (controlplane/triton/ports.py `requested_ports`). With an
external tritonserver it runs when `gateway_grpc_address` or `gateway_http_address` is set. Like the launched
tritonserver it is the data plane and outlives the daemon: its own session, `<state>/gateway/gateway.json`
(controlplane/gateway/launcher.py), adopted by the next start if it is the same process and answers; it
keeps serving its last routes (its routes file) while no daemon runs. A gateway whose upstream is not the
tritonserver this start drives (a tritonserver launched afresh on other ports) is started again; one started
again keeps the ports it had. Where something else runs the gateway (`gateway_control_socket`: its own container
in deploy/kubernetes, so that it outlives the tritonctl container's restarts) the daemon only talks to it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controlplane.errors import ConfigError, GatewayError, UsageError
from controlplane.gateway.launcher import GatewayProcess
from controlplane.gateway.routes import route_from_json, route_to_json
from controlplane.settings.config import Settings
from controlplane.triton.launcher import TritonServer
from controlplane.triton.ports import PORT_FLAGS

log = logging.getLogger("tritonctl.daemon")

GATEWAY_DIR = "gateway"  # under the state directory
START_WAIT_S = 60.0  # how long a start waits for a gateway something else runs (gateway_control_socket) to answer


class GatewayPort:
    """The deploy engine's route port (controlplane/deploy/aliases.py `RoutePort`) over the gateway's control
    channel: routes travel as the JSON `route_json` writes, checked here into the gateway's `Route`s."""

    def __init__(self, process: GatewayProcess) -> None:
        self.process = process

    def update(self, set: Mapping[str, Any], delete: Iterable[str] = ()) -> int:  # noqa: A002
        try:
            routes = {model: route_from_json(model, route) for model, route in set.items()}
        except UsageError as exc:  # a route the daemon built wrong: nothing is sent, nothing switches
            raise GatewayError(f"route not sent to the gateway: {exc}") from None
        return self.process.control().update(set=routes, delete=list(delete))

    def routes(self) -> dict[str, Any]:
        return {model: route_to_json(route) for model, route in self.process.control().routes().routes.items()}

    def inflight(self, names: Iterable[str]) -> dict[str, int]:
        return self.process.control().inflight(names)

    def figures(self) -> dict[str, Any]:
        return self.process.control().figures()

    # requests that load models (controlplane/memory/onrequest.py `RequestPort`)

    def wanted(self, after: int, wait_s: float, load_wait_s: float | None = None) -> tuple[int, dict[str, Any]]:
        return self.process.control(wait_s + 5.0).wanted(after, wait_s, load_wait_s)

    def note(self, model: str, text: str) -> bool:
        return self.process.control().note(model, text)

    def refuse(self, model: str, reason: str) -> int:
        return self.process.control().refuse(model, reason)

    def last(self) -> dict[str, float]:
        return self.process.control().last()


@dataclass
class ExternalGateway(GatewayProcess):
    """A gateway something else runs and restarts (its own container, docs/kubernetes.md; its own unit), reached
    on `socket_path` (`gateway_control_socket`): the daemon switches through it and never starts, restarts or
    stops it. Running means answering `hello`."""

    socket_path: Path = Path()
    wait_s: float = START_WAIT_S

    @property
    def control_socket(self) -> Path:
        return self.socket_path

    def is_running(self) -> bool:
        return self.adopt(1.0)

    def adopt(self, timeout_s: float = 5.0) -> bool:
        try:
            hello = self.control(timeout_s).hello()
        except GatewayError:
            return False
        self.pid = hello.get("pid") if isinstance(hello.get("pid"), int) else None
        self.ports = {str(k): int(v) for k, v in (hello.get("ports") or {}).items()}
        return True

    def start(self, timeout_s: float | None = None) -> ExternalGateway:
        """Wait for it to answer (it may be starting, or restarting under its supervisor)."""
        deadline = time.monotonic() + (self.wait_s if timeout_s is None else timeout_s)
        while not self.adopt(1.0):
            if time.monotonic() >= deadline:
                raise GatewayError(f"gateway_control_socket: no gateway answers on {self.socket_path} (it is run "
                                   "by its own container or unit, not by this daemon: start it first)")
            time.sleep(0.2)
        return self

    def stop(self, timeout_s: float | None = None) -> int | None:
        return None  # not ours: its supervisor stops it

    def kill(self) -> None:
        return None


def check_settings(settings: Settings) -> None:
    """The gateway settings that do not go together, refused in one line (preflight: before anything starts)."""
    if not settings.routes_traffic:
        return
    if settings.gateway_control_socket is not None and (
            settings.launch_triton or settings.gateway_http_address or settings.gateway_grpc_address):
        raise ConfigError("gateway_control_socket: a gateway run by its own container or unit goes with an external "
                          "tritonserver, without launch_triton, gateway_http_address or gateway_grpc_address "
                          "(those make the daemon run its own gateway)")
    if settings.launch_triton:
        return
    if not settings.triton_url:
        raise ConfigError("gateway: an external tritonserver needs --triton-url")
    if settings.gateway_http_address and not settings.triton_http_url:
        raise ConfigError("gateway_http_address: the gateway's HTTP side needs the external tritonserver's HTTP "
                          "address too (triton_http_url, HOST:PORT)")


def gateway_process(settings: Settings, server: TritonServer | None) -> GatewayProcess | None:
    """The gateway the settings ask for, not started: None without one (`gateway = false`, or an external
    tritonserver with no gateway address); an `ExternalGateway` where something else runs it."""
    if not settings.routes_traffic:
        return None
    check_settings(settings)
    workdir = settings.state_dir / GATEWAY_DIR
    external = settings.triton_url or ""  # check_settings: given wherever no tritonserver is launched
    if settings.gateway_control_socket is not None:
        return ExternalGateway(workdir, triton_grpc=external, triton_http=settings.triton_http_url,
                               socket_path=settings.gateway_control_socket)
    if server is not None:  # launched: the clients' ports are the gateway's now
        return GatewayProcess(workdir, triton_grpc=server.grpc_url, triton_http=server.http_url,
                              triton_metrics=f"{server.host}:{server.metrics_port}" if server.metrics_port else None,
                              grpc_address=f"127.0.0.1:{settings.triton_grpc_port}",
                              http_address=f"127.0.0.1:{settings.triton_http_port}",
                              metrics_address=f"127.0.0.1:{settings.triton_metrics_port}",
                              drain_s=settings.shutdown_timeout_s)
    metrics = settings.triton_metrics_url
    triton_metrics = metrics.split("://", 1)[-1].split("/", 1)[0] if metrics else None
    return GatewayProcess(workdir, triton_grpc=external, triton_http=settings.triton_http_url,
                          triton_metrics=triton_metrics, grpc_address=settings.gateway_grpc_address,
                          http_address=settings.gateway_http_address, drain_s=settings.shutdown_timeout_s)


def upstream_of(process: GatewayProcess) -> dict[str, str]:
    """The tritonserver addresses a running gateway was started with (from its record's command line)."""
    record = process.read_record() or {}
    command = [str(a) for a in record.get("command") or []]
    out: dict[str, str] = {}
    for flag in ("--triton-grpc", "--triton-http", "--triton-metrics"):
        if flag in command[:-1]:
            out[flag] = command[command.index(flag) + 1]
    return out


def port_flags(settings: Settings) -> dict[str, str]:
    """Which flag asks for each of the gateway's ports (its listener kind → the flag), for the warnings."""
    if settings.launch_triton:
        return dict(zip(("grpc", "http", "metrics"), PORT_FLAGS, strict=True))
    return {"grpc": "--gateway-grpc-address", "http": "--gateway-http-address"}


def adopt_or_start(process: GatewayProcess, flags: Mapping[str, str] | None = None) -> GatewayProcess:
    """The gateway of the last daemon if it is still that process, answering, in front of the same
    tritonserver; else a fresh one (which reads the routes file the last one wrote) on the ports the last
    one had where the settings leave the port to it (0). An adopted gateway keeps its ports, as an adopted
    tritonserver does (inference must not stop for a port change): a requested port it does not use is
    named in one warning (`flags`: the flag that asks for each, port_flags)."""
    if isinstance(process, ExternalGateway):
        process.start()
        log.info("using the gateway pid %s on %s (gateway_control_socket %s: run by its own container or unit)",
                 process.pid, _where(process), process.socket_path)
        return process
    wanted = {"--triton-grpc": process.triton_grpc}
    if process.triton_http:
        wanted["--triton-http"] = process.triton_http
    recorded = (process.read_record() or {}).get("ports")
    if process.adopt():
        upstream = upstream_of(process)
        if all(upstream.get(flag) == value for flag, value in wanted.items()):
            log.info("adopted the running gateway pid %s on %s", process.pid, _where(process))
            changed = _unlike_requested(process, flags or {})
            if changed:
                log.warning("the adopted gateway keeps its ports, not the requested %s, until the daemon stops it "
                            "(SIGTERM without keep_triton); the next start then uses them", ", ".join(changed))
            return process
        log.warning("the running gateway pid %s is in front of tritonserver %s, not %s: starting it again",
                    process.pid, upstream.get("--triton-grpc"), process.triton_grpc)
        process.stop(5.0)
    _start_on(process, recorded if isinstance(recorded, dict) else {})
    log.info("started the gateway pid %s on %s", process.pid, _where(process))
    return process


def restarted(process: GatewayProcess) -> bool:
    """Supervision: a gateway that died is started again (from its routes file) on the ports it had, the
    ones clients know; True when it was."""
    if process.is_running():
        return False
    if isinstance(process, ExternalGateway):  # its supervisor restarts it; the next update waits for it
        log.error("the gateway on %s does not answer (run by its own container or unit: its supervisor starts it "
                  "again)", process.socket_path)
        return False
    log.error("the gateway died (pid %s); starting it again with its last routes", process.pid)
    try:
        _start_on(process, dict(process.ports))
    except GatewayError as exc:
        log.error("starting the gateway again: %s", exc)
        return False
    log.info("started the gateway again pid %s on %s", process.pid, _where(process))
    return True


ADDRESSES = (("grpc_address", "grpc"), ("http_address", "http"), ("metrics_address", "metrics"))


def _unlike_requested(process: GatewayProcess, flags: Mapping[str, str]) -> list[str]:
    """The requested ports (not 0) an adopted gateway does not listen on, as `FLAG N (serves on M)`."""
    out = []
    for attr, kind in ADDRESSES:
        address, have = getattr(process, attr), process.ports.get(kind)
        want = address.rsplit(":", 1)[-1] if address else "0"
        if kind in flags and want.isdigit() and int(want) != 0 and have is not None and int(want) != have:
            out.append(f"{flags[kind]} {want} (serves on {have})")
    return out


def _start_on(process: GatewayProcess, ports: dict[str, Any]) -> None:
    """Start `process` on `ports` (kind → port: the ones an earlier gateway bound) where its address asks for
    any free port (0): a gateway started again keeps the ports its clients use. Were one taken since, it
    starts on free ports instead (status and the log say which)."""
    wanted = {attr: getattr(process, attr) for attr, _ in ADDRESSES}
    pinned = False
    for attr, kind in ADDRESSES:
        address, port = wanted[attr], ports.get(kind)
        if address and address.rsplit(":", 1)[-1] == "0" and isinstance(port, int) and port > 0:
            setattr(process, attr, f"{address.rsplit(':', 1)[0]}:{port}")
            pinned = True
    try:
        process.start()
    except GatewayError as exc:
        if not pinned:
            raise
        log.warning("the gateway could not take its earlier ports again (%s); starting it on free ports", exc)
    else:
        return
    finally:
        for attr, address in wanted.items():
            setattr(process, attr, address)
    process.start()


def _where(process: GatewayProcess) -> str:
    ports = process.ports
    parts = [f"{kind} {port}" for kind, port in sorted(ports.items())]
    return ", ".join(parts) or "its addresses"


def inference_urls(process: GatewayProcess) -> str:
    """"; inference: gRPC HOST:PORT, HTTP http://HOST:PORT" through the gateway (the daemon's ready line)."""
    ports = process.ports
    parts = []
    if "grpc" in ports:
        parts.append(f"gRPC 127.0.0.1:{ports['grpc']}")
    if "http" in ports:
        parts.append(f"HTTP http://127.0.0.1:{ports['http']}")
    return f"; inference (gateway): {', '.join(parts)}" if parts else ""


def http_url(process: GatewayProcess) -> str | None:
    port = process.ports.get("http")
    return f"http://127.0.0.1:{port}" if port else None
