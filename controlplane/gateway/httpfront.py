"""The gateway's HTTP/REST listener (KServe v2): one keep-alive connection per client, one exchange per request.

httptools parses each request; `Exchange` (httpexchange.py) routes it, sends it to tritonserver on a
pooled keep-alive connection with the model's private name in the path, and relays the answer with
public names. Pipelined requests are answered in order. `Expect: 100-continue` is answered by the
gateway; chunked request bodies pass on chunked. A request the parser refuses, a URL or header list
over the limits, answers 400 / 414 / 431 and closes that connection only.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import Any

import httptools

from controlplane.gateway.httpexchange import Exchange, simple_response
from controlplane.gateway.upstream import nodelay

log = logging.getLogger("tritonctl.gateway")
MAX_URL = 8 << 10
MAX_HEADERS = 64 << 10
MAX_QUEUED = 16  # pipelined requests held before the gateway stops reading the connection


class HttpFront(asyncio.Protocol):
    def __init__(self, gw: Any) -> None:
        self.gw = gw
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.queue: deque[Exchange] = deque()
        self.cur: Exchange | None = None
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.header_bytes = 0
        self.closed = False
        self.paused = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        nodelay(transport)
        self.transport = transport  # type: ignore[assignment]
        self.gw.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.gw.connections.discard(self)
        for ex in list(self.queue):
            ex.client_gone()
        self.queue.clear()

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._refuse(400, "the gateway does not upgrade HTTP connections")
        except httptools.HttpParserError as exc:
            cause = exc.__context__
            if self.closed:
                return
            if isinstance(cause, _TooLarge):
                self._refuse(cause.status, str(cause))
            elif isinstance(exc, httptools.HttpParserCallbackError) and cause is not None:
                log.error("gateway: internal error on an HTTP request", exc_info=cause)
                self._refuse(500, "internal error in the gateway")
            else:
                self._refuse(400, f"malformed HTTP request: {exc}")

    def _refuse(self, status: int, message: str) -> None:
        """Answer a request the connection cannot go on from, then close it (after earlier answers)."""
        if self.queue:
            self.queue[-1].abandon()
        self.write(simple_response(status, message, keep_alive=False))
        self.close()

    # -- httptools callbacks ----------------------------------------------------------------------

    def on_message_begin(self) -> None:
        self.url = b""
        self.headers = []
        self.header_bytes = 0

    def on_url(self, url: bytes) -> None:
        self.url += url
        if len(self.url) > MAX_URL:
            raise _TooLarge(414, f"URL longer than {MAX_URL} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_bytes += len(name) + len(value)
        if self.header_bytes > MAX_HEADERS:
            raise _TooLarge(431, f"request headers over {MAX_HEADERS} bytes")
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        parser = self.parser
        ex = Exchange(self, self.url, self.headers, parser.get_method(), parser.should_keep_alive(),
                      parser.get_http_version())
        self.cur = ex
        self.queue.append(ex)
        if len(self.queue) == 1:
            ex.start()
        elif len(self.queue) > MAX_QUEUED:
            self.pause_reading()

    def on_body(self, body: bytes) -> None:
        if self.cur is not None:
            self.cur.client_body(body)

    def on_message_complete(self) -> None:
        ex, self.cur = self.cur, None
        if ex is not None:
            ex.client_end()

    # -- toward the client -----------------------------------------------------------------------

    def write(self, data: Any) -> None:
        if self.transport is not None and not self.closed:
            self.transport.write(data)

    def exchange_done(self, ex: Exchange) -> None:
        """`ex` has answered: start the next pipelined one, or close after a last answer."""
        if self.queue and self.queue[0] is ex:
            self.queue.popleft()
        if not ex.keep_alive or self.gw.draining:
            self.close()
            return
        if self.queue:
            self.queue[0].start()
        if self.paused and len(self.queue) <= MAX_QUEUED:
            self.resume_reading()

    def pause_reading(self) -> None:
        if self.transport is not None and not self.closed and not self.paused:
            self.paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.closed and self.paused:
            self.paused = False
            self.transport.resume_reading()

    def pause_writing(self) -> None:
        if self.queue:
            self.queue[0].pause_upstream()

    def resume_writing(self) -> None:
        if self.queue:
            self.queue[0].resume_upstream()

    def close(self) -> None:
        if not self.closed and self.transport is not None:
            self.transport.close()
        self.closed = True


class _TooLarge(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
