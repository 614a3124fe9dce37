"""The gateway process: its listeners, its route table, its figures, and a clean stop.

One process, one thread, one uvloop event loop: every connection is an asyncio Protocol whose
callbacks run to completion, so the hot path takes no lock and the route table is swapped by one
attribute assignment (`Gateway.install`). SIGTERM stops accepting, sends GOAWAY to every client,
lets the calls in flight finish within `drain_s`, and exits 0.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controlplane.gateway import grpcmeta
from controlplane.gateway.figures import Figures
from controlplane.gateway.grpcfront import FrontConnection
from controlplane.gateway.h2 import Limits
from controlplane.gateway.httpfront import HttpFront
from controlplane.gateway.httpup import HttpPool
from controlplane.gateway.routes import RouteTable, read_table
from controlplane.gateway.table import LiveTable
from controlplane.gateway.upstream import UpstreamPool

log = logging.getLogger("tritonctl.gateway")
DEFAULT_MAX_MESSAGE = 256 << 20


@dataclass
class GatewayOptions:
    grpc_address: tuple[str, int] | None
    http_address: tuple[str, int] | None
    triton_grpc: tuple[str, int]
    triton_http: tuple[str, int] | None = None
    triton_metrics: tuple[str, int] | None = None
    metrics_address: tuple[str, int] | None = None
    control_socket: Path | None = None
    routes_file: Path | None = None
    upstream_connections: int = 4
    max_message: int = DEFAULT_MAX_MESSAGE
    drain_s: float = 30.0
    triton_key: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


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
        self.http_pool = HttpPool(http_host, http_port)
        self.routes = RouteTable()
        self.table = LiveTable(self.routes, self.figures)
        self.connections: set[Any] = set()
        self.calls = 0
        self.inflight = 0
        self.draining = False
        self.servers: list[asyncio.AbstractServer] = []
        self.meta = grpcmeta.Meta(self)

    # -- routes ---------------------------------------------------------------------------------------

    def install(self, routes: RouteTable) -> None:
        """Swap the route table in one assignment: calls already started keep the table they read."""
        self.routes = routes
        self.table = LiveTable(routes, self.figures)

    def load_routes_file(self) -> None:
        if self.options.routes_file is not None:
            self.install(read_table(self.options.routes_file))

    # -- calls --------------------------------------------------------------------------------------

    def call_ended(self, call: Any) -> None:
        self.calls -= 1

    def local(self, call: Any, body: bytes) -> None:
        self.meta.local(call, body)

    def meta_answer(self, call: Any, body: bytes) -> bytes:
        return self.meta.answer(call, body)

    # -- lifecycle ----------------------------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        if self.options.grpc_address is not None:
            host, port = self.options.grpc_address
            server = await loop.create_server(lambda: FrontConnection(self), host, port, reuse_address=True,
                                              backlog=1024)
            self.servers.append(server)
        if self.options.http_address is not None:
            host, port = self.options.http_address
            server = await loop.create_server(lambda: HttpFront(self), host, port, reuse_address=True, backlog=1024)
            self.servers.append(server)

    def bound_ports(self) -> list[int]:
        return [int(s.sockets[0].getsockname()[1]) for s in self.servers if s.sockets]

    async def stop(self) -> None:
        """Stop accepting, GOAWAY every client, wait for the calls in flight (at most drain_s)."""
        self.draining = True
        for server in self.servers:
            server.close()
        for conn in list(self.connections):
            if isinstance(conn, FrontConnection):
                conn.send_goaway()
                conn.flush()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.options.drain_s
        while self.calls > 0 and loop.time() < deadline:
            await asyncio.sleep(0.02)
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.close()
        self.pool.close()
        self.http_pool.close()


async def serve(options: GatewayOptions, ready: Any = None) -> int:
    gateway = Gateway(options)
    gateway.load_routes_file()
    await gateway.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if ready is not None:
        ready(gateway)
    await stop.wait()
    await gateway.stop()
    return 0
