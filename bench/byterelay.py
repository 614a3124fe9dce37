"""A TCP relay that only copies bytes (uvloop, no HTTP/2, no renaming): the floor under any userspace hop.

bench/gateway.py runs it beside the gateway, with clients sending the private name straight through, so
the cost of moving the bytes through one more process on this machine is measured in the same run as
the gateway's: what the gateway spends above it is its own work (HTTP/2, routing, renaming, figures).

    python bench/byterelay.py LISTEN_PORT TARGET_HOST:TARGET_PORT
"""

from __future__ import annotations

import asyncio
import socket
import sys
from typing import Any


def _nodelay(transport: Any) -> None:
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class Upstream(asyncio.Protocol):
    def __init__(self, down: Downstream) -> None:
        self.down = down
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        _nodelay(transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.down.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.down.transport.close()


class Downstream(asyncio.Protocol):
    target: tuple[str, int] = ("127.0.0.1", 0)

    def connection_made(self, transport: Any) -> None:
        _nodelay(transport)
        self.transport = transport
        self.early: list[bytes] = []
        self.up: Upstream | None = None
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        _, up = await asyncio.get_running_loop().create_connection(lambda: Upstream(self), *self.target)
        self.up = up  # type: ignore[assignment]
        for data in self.early:
            up.transport.write(data)  # type: ignore[attr-defined]

    def data_received(self, data: bytes) -> None:
        if self.up is None:
            self.early.append(data)
        else:
            self.up.transport.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.up is not None and self.up.transport is not None:
            self.up.transport.close()


async def serve(port: int, target: tuple[str, int]) -> None:
    Downstream.target = target
    server = await asyncio.get_running_loop().create_server(Downstream, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main() -> int:
    import uvloop

    host, _, port = sys.argv[2].rpartition(":")
    uvloop.run(serve(int(sys.argv[1]), (host, int(port))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
