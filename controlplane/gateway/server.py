"""The gateway process: its listeners, its route table, its figures, and a clean stop.

One process, one thread, one uvloop event loop: every connection is an asyncio Protocol whose
callbacks run to completion, so the hot path takes no lock and the route table is swapped by one
attribute assignment (`Gateway.install`). It starts with the routes of its routes file, so a gateway
started again after the daemon is gone serves what it served before. Requests for a model whose route is
`loadable` wait in `Gateway.parking` (parking.py) until a route update brings it. SIGTERM stops accepting, sends
GOAWAY to every gRPC client and closes idle HTTP connections, lets the calls in flight finish within
`drain_s`, and exits 0.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controlplane.gateway import grpcmeta
from controlplane.gateway.controlserver import ControlServer
from controlplane.gateway.figures import Figures
from controlplane.gateway.grpcfront import FrontConnection
from controlplane.gateway.h2state import Limits
from controlplane.gateway.httpfront import HttpFront
from controlplane.gateway.httpup import HttpPool
from controlplane.gateway.metrics import MetricsServer
from controlplane.gateway.parking import DEFAULT_LOAD_WAIT_S, MAX_BYTES, PER_MODEL, Parking
from controlplane.gateway.routes import RouteTable, read_table
from controlplane.gateway.shadow import Comparer
from controlplane.gateway.table import LiveTable
from controlplane.gateway.upstream import UpstreamPool

log = logging.getLogger("tritonctl.gateway")
DEFAULT_MAX_MESSAGE = 256 << 20

Address = tuple[str, int]


@dataclass
class GatewayOptions:
    grpc_address: Address | None
    http_address: Address | None
    triton_grpc: Address
    triton_http: Address | None = None
    triton_metrics: Address | None = None
    metrics_address: Address | None = None
    control_socket: Path | None = None
    routes_file: Path | None = None
    upstream_connections: int = 4
    http_connections: int = 64
    max_message: int = DEFAULT_MAX_MESSAGE
    drain_s: float = 30.0
    load_wait_s: float = DEFAULT_LOAD_WAIT_S  # a request for a loadable model waits this long (parking.py)
    waiting_per_model: int = PER_MODEL  # requests that may wait for one model's load
    waiting_bytes: int = MAX_BYTES  # request bytes the waiting requests may hold together


class Gateway:
    def __init__(self, options: GatewayOptions) -> None:
        self.options = options
        self.figures = Figures()
        self.front_limits = Limits()
        self.max_message = options.max_message
        host, port = options.triton_grpc
        self.authority = f"{host}:{port}".encode()
        self.pool = UpstreamPool(host, port, options.upstream_connections, Limits(max_streams=0))
        http_host, http_port = options.triton_http or (host, 0)
        self.http_authority = f"{http_host}:{http_port}".encode()
        self.http_pool = HttpPool(http_host, http_port, options.http_connections)
        self.routes = RouteTable()
        self.table = LiveTable(self.routes, self.figures)
        # requests waiting for their model's load
        self.parking = Parking(options.load_wait_s, options.waiting_per_model, options.waiting_bytes)
        self.connections: set[Any] = set()
        self.calls = 0
        self.draining = False
        self.started = time.time()
        self.servers: dict[str, asyncio.Server] = {}
        self.meta = grpcmeta.Meta(self)
        self.metrics = MetricsServer(self)
        self.control: ControlServer | None = None
        self.comparer = Comparer()  # the thread a shadow's large pairs are compared in (shadow.py)

    # -- routes -------------------------------------------------------------------------------------

    def install(self, routes: RouteTable) -> None:
        """Swap the route table in one assignment: calls already started keep the table they read; requests
        parked for a model whose route is no longer `loadable` go on against the new one."""
        self.routes = routes
        self.table = LiveTable(routes, self.figures)
        if self.parking.waiting:
            self.parking.resume(self.table.routes)

    def load_routes_file(self) -> None:
        if self.options.routes_file is not None:
            self.install(read_table(self.options.routes_file))

    def hello(self) -> dict[str, Any]:
        return {"pid": os.getpid(), "started": self.started, "version": self.routes.version, "ports": self.ports()}

    # -- calls (the hooks grpccall.py uses) ----------------------------------------------------------

    def local(self, call: Any, body: bytes) -> None:
        self.meta.local(call, body)

    def meta_answer(self, call: Any, body: bytes) -> bytes:
        return self.meta.answer(call, body)

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        if self.options.grpc_address is not None:
            host, port = self.options.grpc_address
            self.servers["grpc"] = await loop.create_server(lambda: FrontConnection(self), host, port,
                                                            reuse_address=True, backlog=1024)
        if self.options.http_address is not None:
            host, port = self.options.http_address
            self.servers["http"] = await loop.create_server(lambda: HttpFront(self), host, port,
                                                            reuse_address=True, backlog=1024)
        if self.options.metrics_address is not None:
            await self.metrics.start(*self.options.metrics_address)
        if self.options.control_socket is not None:
            self.control = ControlServer(self, self.options.control_socket)
            await self.control.start()

    def ports(self) -> dict[str, int]:
        out = {name: int(server.sockets[0].getsockname()[1]) for name, server in self.servers.items() if server.sockets}
        metrics = self.metrics.port()
        if metrics is not None:
            out["metrics"] = metrics
        return out

    def busy(self) -> int:
        """Calls and exchanges still in flight on client connections."""
        total = 0
        for conn in self.connections:
            total += len(conn.streams) if isinstance(conn, FrontConnection) else len(conn.queue)
        return total

    async def stop(self) -> None:
        """Stop accepting, GOAWAY every client, wait for the calls in flight (at most drain_s)."""
        self.draining = True
        for server in self.servers.values():
            server.close()
        self.metrics.close()
        self.parking.close("the gateway is stopping")
        for conn in list(self.connections):
            if isinstance(conn, FrontConnection):
                conn.send_goaway()
                conn.flush()
            elif not conn.queue:
                conn.close()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.options.drain_s
        while self.busy() and loop.time() < deadline:
            await asyncio.sleep(0.02)
        left = self.busy()
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.close()
        self.pool.close()
        self.http_pool.close()
        if self.control is not None:
            self.control.close()
        self.comparer.close()
        log.info("gateway: stopped (%d calls still in flight cut)", left)


async def serve(options: GatewayOptions) -> int:
    gateway = Gateway(options)
    gateway.load_routes_file()
    await gateway.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    ports = gateway.ports()
    log.info("gateway: pid %d, gRPC %s, HTTP %s, metrics %s, tritonserver gRPC %s, control %s, routes version %d "
             "(%d models)", os.getpid(), ports.get("grpc", "-"), ports.get("http", "-"), ports.get("metrics", "-"),
             gateway.authority.decode(), options.control_socket or "-", gateway.routes.version,
             len(gateway.routes.routes))
    await stop.wait()
    await gateway.stop()
    return 0
