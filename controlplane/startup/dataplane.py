"""The data plane a daemon drives: its tritonserver (launched or adopted, or the external one of --triton-url)
and, in front of it, the gateway that answers inference (controlplane/startup/gateway.py, docs/gateway.md).

Both outlive the control plane: a SIGKILLed daemon leaves them serving and the next start adopts them. This
module starts or adopts them in order (tritonserver first: the gateway's upstream is its ports), says where
clients send inference, restarts a gateway that died (supervision) and stops both at a clean shutdown unless
`keep_triton` leaves them serving for the next start.
"""

from __future__ import annotations

import logging
from typing import Any

from controlplane.deploy.publish import ServingRepository
from controlplane.errors import TritonctlError
from controlplane.gateway.launcher import GatewayProcess
from controlplane.settings.config import Settings
from controlplane.startup import bulk, gateway, launch
from controlplane.store.registry import Registry
from controlplane.triton.launcher import TritonServer

log = logging.getLogger("tritonctl.daemon")


class DataPlane:
    """This daemon's tritonserver and gateway (see the module docstring)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.triton_server: TritonServer | None = None
        self.gateway: GatewayProcess | None = None
        self.preloaded: list[str] = []  # what the tritonserver launched at start loaded in its start-up
        self.deferred_launch = False  # its launch waits for the first start's deploys (startup/bulk.py)

    def start_triton(self, registry: Registry, serving: ServingRepository) -> tuple[str, str | None]:
        """The gRPC URL and key of the tritonserver this daemon drives: launched or adopted
        (controlplane/startup/launch.py), or the external one of --triton-url."""
        settings = self.settings
        if settings.launch_triton:
            server = self.triton_server = launch.new_server(settings)  # a failed start stops it
            preloaded = launch.adopt_or_launch(settings, registry, server, serving, defer=bulk.eligible(settings))
            self.deferred_launch = preloaded is None  # launched by the initial scan, with its deploys
            self.preloaded = preloaded or []
            return server.grpc_url, server.restricted_key
        if not settings.triton_url:
            raise TritonctlError("no tritonserver: give --triton-url HOST:PORT or --launch-triton")
        return settings.triton_url, settings.triton_key

    def start_gateway(self) -> gateway.GatewayPort | None:
        """The gateway in front of the tritonserver, adopted or started (None without one): the deploy
        engine's route port. Started before a deferred tritonserver is launched: until it answers, the
        gateway answers UNAVAILABLE."""
        process = gateway.gateway_process(self.settings, self.triton_server)
        if process is None:
            return None
        self.gateway = gateway.adopt_or_start(process, gateway.port_flags(self.settings))
        return gateway.GatewayPort(self.gateway)

    def inference_urls(self) -> str:
        """Where clients send inference, for the daemon's ready line."""
        if self.gateway is not None:
            return gateway.inference_urls(self.gateway)
        return self.triton_server.inference_urls() if self.triton_server is not None else ""

    def http_url(self) -> str | None:
        """The HTTP/REST inference URL clients use (`status`), when this daemon knows it."""
        if self.gateway is not None:
            return gateway.http_url(self.gateway)
        return f"http://{self.triton_server.http_url}" if self.triton_server is not None else None

    def gateway_info(self) -> dict[str, Any] | None:
        """`status`'s gateway: where it listens (what clients use) and the tritonserver behind it."""
        process = self.gateway
        if process is None:
            return None
        ports = process.ports
        return {"pid": process.pid, "grpc_url": f"127.0.0.1:{ports['grpc']}" if "grpc" in ports else None,
                "http_url": gateway.http_url(process),
                "metrics_url": f"http://127.0.0.1:{ports['metrics']}/metrics" if "metrics" in ports else None,
                "upstream_grpc_url": process.triton_grpc}

    def supervise_gateway(self) -> bool:
        """A gateway that died is started again; True when it was."""
        return self.gateway is not None and gateway.restarted(self.gateway)

    def stop(self) -> None:
        """A clean shutdown: both stop, unless `keep_triton` leaves them serving (the next start adopts them)."""
        if self.settings.keep_triton:
            if self.triton_server is not None:
                log.info("leaving tritonserver pid %s serving (keep_triton); the next start adopts it",
                         self.triton_server.pid)
                self.triton_server.release()
            if self.gateway is not None:
                log.info("leaving the gateway pid %s serving (keep_triton); the next start adopts it", self.gateway.pid)
            return
        if self.gateway is not None:
            self.gateway.stop()
        if self.triton_server is not None:
            self.triton_server.stop()

    def stop_failed_start(self) -> None:
        """Start-up failed part-way: what this start launched goes; what it adopted served before it and stays."""
        if self.triton_server is not None and not self.triton_server.adopted_pid:
            if self.gateway is not None:
                self.gateway.stop(2.0)
            self.triton_server.stop()
