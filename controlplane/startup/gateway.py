"""The gateway in front of tritonserver (docs/gateway.md): where it listens, started or adopted at the daemon's
start, started again when it dies, and the route port the deploy engine switches through.

With `--launch-triton` (and `gateway` on, the default) the gateway takes the ports clients use today
(`triton_grpc_port`, `triton_http_port`, `triton_metrics_port`: 8001, 8000, 8002) and the launched
tritonserver moves to loopback ports of its own (controlplane/triton/ports.py `requested_ports`). With an
external tritonserver it runs when `gateway_grpc_address` or `gateway_http_address` is set. Like the launched
tritonserver it is the data plane and outlives the daemon: its own session, `<state>/gateway/gateway.json`
(controlplane/gateway/launcher.py), adopted by the next start if it is the same process and answers; it
keeps serving its last routes (its routes file) while no daemon runs. A gateway whose upstream is not the
tritonserver this start drives (a tritonserver launched afresh on other ports) is started again.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from controlplane.errors import ConfigError, GatewayError, UsageError
from controlplane.gateway.launcher import GatewayProcess
from controlplane.gateway.routes import route_from_json, route_to_json
from controlplane.settings.config import Settings
from controlplane.triton.launcher import TritonServer

log = logging.getLogger("tritonctl.daemon")

GATEWAY_DIR = "gateway"  # under the state directory


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


def gateway_process(settings: Settings, server: TritonServer | None) -> GatewayProcess | None:
    """The gateway the settings ask for, not started: None without one (`gateway = false`, or an external
    tritonserver with no gateway address)."""
    if not settings.routes_traffic:
        return None
    workdir = settings.state_dir / GATEWAY_DIR
    if server is not None:  # launched: the clients' ports are the gateway's now
        return GatewayProcess(workdir, triton_grpc=server.grpc_url, triton_http=server.http_url,
                              triton_metrics=f"{server.host}:{server.metrics_port}" if server.metrics_port else None,
                              grpc_address=f"127.0.0.1:{settings.triton_grpc_port}",
                              http_address=f"127.0.0.1:{settings.triton_http_port}",
                              metrics_address=f"127.0.0.1:{settings.triton_metrics_port}",
                              drain_s=settings.shutdown_timeout_s)
    if not settings.triton_url:
        raise ConfigError("gateway: an external tritonserver needs --triton-url")
    if settings.gateway_http_address and not settings.triton_http_url:
        raise ConfigError("gateway_http_address: the gateway's HTTP side needs the external tritonserver's HTTP "
                          "address too (triton_http_url, HOST:PORT)")
    metrics = settings.triton_metrics_url
    triton_metrics = metrics.split("://", 1)[-1].split("/", 1)[0] if metrics else None
    return GatewayProcess(workdir, triton_grpc=settings.triton_url, triton_http=settings.triton_http_url,
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


def adopt_or_start(process: GatewayProcess) -> GatewayProcess:
    """The gateway of the last daemon if it is still that process, answering, in front of the same
    tritonserver; else a fresh one (which reads the routes file the last one wrote)."""
    wanted = {"--triton-grpc": process.triton_grpc}
    if process.triton_http:
        wanted["--triton-http"] = process.triton_http
    if process.adopt():
        upstream = upstream_of(process)
        if all(upstream.get(flag) == value for flag, value in wanted.items()):
            log.info("adopted the running gateway pid %s on %s", process.pid, _where(process))
            return process
        log.warning("the running gateway pid %s is in front of tritonserver %s, not %s: starting it again",
                    process.pid, upstream.get("--triton-grpc"), process.triton_grpc)
        process.stop(5.0)
    process.start()
    log.info("started the gateway pid %s on %s", process.pid, _where(process))
    return process


def restarted(process: GatewayProcess) -> bool:
    """Supervision: a gateway that died is started again (from its routes file); True when it was."""
    if process.is_running():
        return False
    log.error("the gateway died (pid %s); starting it again with its last routes", process.pid)
    try:
        process.start()
    except GatewayError as exc:
        log.error("starting the gateway again: %s", exc)
        return False
    log.info("started the gateway again pid %s on %s", process.pid, _where(process))
    return True


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
