"""The gateway's keep-alive HTTP/1.1 connections to tritonserver's HTTP port.

One exchange at a time per connection (no pipelining); an idle connection is reused (the most recent
first), a new one is opened while fewer than `size` exist, and beyond that an exchange waits for one
to come free. An answer is parsed with httptools and handed to its exchange (httpfront.py) piece by
piece. A reused connection that tritonserver had closed while idle fails before any answer byte: the
exchange sends its request again once on a fresh connection when it still holds all of it.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

import httptools

from controlplane.gateway.upstream import nodelay


class HttpUpstream(asyncio.Protocol):
    def __init__(self, pool: HttpPool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.ex: Any = None
        self.headers: list[tuple[bytes, bytes]] = []
        self.closed = False
        self.used = 0  # exchanges this connection carried
        self.counted = True  # still counted in the pool's size

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        nodelay(transport)
        self.transport = transport  # type: ignore[assignment]

    def send(self, ex: Any, data: bytes) -> None:
        self.ex = ex
        self.used += 1
        self.headers = []
        assert self.transport is not None
        self.transport.write(data)

    def write(self, data: Any) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            self._fail("tritonserver sent an HTTP answer the gateway cannot parse")
            self.close()

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        if self.ex is not None:
            self.ex.up_head(self.parser.get_status_code(), self.headers)

    def on_body(self, body: bytes) -> None:
        if self.ex is not None:
            self.ex.up_body(body)

    def on_message_complete(self) -> None:
        ex, self.ex = self.ex, None
        keep = self.parser.should_keep_alive()
        self.parser = httptools.HttpResponseParser(self)
        if ex is not None:
            ex.up_end()
        if keep and not self.closed:
            self.pool.release(self)
        else:
            self.close()

    def pause_writing(self) -> None:
        if self.ex is not None:
            self.ex.front.pause_reading()

    def resume_writing(self) -> None:
        if self.ex is not None:
            self.ex.front.resume_reading()

    def pause_reading(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def _fail(self, reason: str) -> None:
        ex, self.ex = self.ex, None
        if ex is not None:
            ex.up_failed(reason, self.used > 1)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.discard(self)
        self._fail("the connection to tritonserver was lost")

    def close(self) -> None:
        self.closed = True
        self.pool.discard(self)
        if self.transport is not None:
            self.transport.close()


class HttpPool:
    def __init__(self, host: str, port: int, size: int = 64) -> None:
        self.host, self.port, self.size = host, port, size
        self.address = f"{host}:{port}"
        self.idle: list[HttpUpstream] = []
        self.count = 0
        self.waiting: deque[Any] = deque()
        self._tasks: set[asyncio.Task[None]] = set()

    def acquire(self, ex: Any) -> HttpUpstream | None:
        """An idle connection now, or None: `ex.up_ready(conn)` is called when one is there."""
        while self.idle:
            conn = self.idle.pop()
            if not conn.closed:
                return conn
        self.waiting.append(ex)
        if self.count < self.size:
            self._dial()
        return None

    def cancel(self, ex: Any) -> None:
        try:
            self.waiting.remove(ex)
        except ValueError:
            pass

    def release(self, conn: HttpUpstream) -> None:
        while self.waiting:
            ex = self.waiting.popleft()
            if not ex.done:
                ex.up_ready(conn)
                return
        self.idle.append(conn)

    def discard(self, conn: HttpUpstream) -> None:
        if conn in self.idle:
            self.idle.remove(conn)
        if conn.counted:
            conn.counted = False
            self.count -= 1
        if self.waiting and self.count < self.size:
            self._dial()

    def _dial(self) -> None:
        self.count += 1
        task = asyncio.get_running_loop().create_task(self._connect())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await loop.create_connection(lambda: HttpUpstream(self), self.host, self.port)
        except OSError as exc:
            self.count -= 1
            reason = f"tritonserver at {self.address} is unreachable: {exc.strerror or exc}"
            waiting, self.waiting = self.waiting, deque()
            for ex in waiting:
                ex.up_failed(reason, False)
            return
        self.release(conn)

    def close(self) -> None:
        for conn in list(self.idle):
            conn.close()
