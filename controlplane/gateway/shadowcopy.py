"""A shadow's copy of a request, sent to the shadow's private name; its answer comes back here and nowhere else.

A gRPC copy is one more stream on the gateway's shared HTTP/2 connections to tritonserver (upstream.py),
with the client's header block and the request message renamed to the shadow (shadow.py `Pair.renamed`),
sent whole. An HTTP copy is one exchange on the keep-alive pool (httpup.py): the client's method, the
path with the shadow's private name, the client's headers and its body (de-chunked, with a
Content-Length). Either way the answer is read whole (bounded: shadow.ANSWER_MAX_BYTES), tritonserver is
credited for it at once (a copy never waits for a client), and the pair gets its status and bytes. A copy
that does not reach tritonserver (the connection lost, GOAWAY, tritonserver unreachable) ends with status
UNREACHED: its pair is not compared (counted `unavailable`), as the bake does not count an unreachable
tritonserver against a version. An HTTP copy sent on a kept-alive connection tritonserver had closed is sent
again once, as a client's request is (httpexchange.py).
"""

from __future__ import annotations

import time
from typing import Any

from controlplane.gateway import grpcwire as g

_perf = time.perf_counter
ANSWER_LIMIT = 4 << 20  # bytes of a copy's answer kept (shadow.ANSWER_MAX_BYTES); a larger one is not compared
UNREACHED = -1  # the copy's status when it never reached tritonserver
_DROP = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer", b"transfer-encoding",
                   b"upgrade", b"expect", b"host", b"content-length"})


def grpc_copy(pair: Any, message: bytes) -> None:
    ShadowGrpcCall(pair, message).send()


def http_copy(pair: Any, head: tuple[bytes, bytes, list[tuple[bytes, bytes]]], body: bytes) -> None:
    method, path, headers = head
    parts = [method, b" ", path, b" HTTP/1.1\r\nHost: ", pair.gw.http_authority, b"\r\n"]
    for name, value in headers:
        if name not in _DROP:
            parts += [name, b": ", value, b"\r\n"]
    parts.append(b"Content-Length: %d\r\n\r\n" % len(body))
    ShadowHttpExchange(pair, b"".join(parts) + body).send()


class _Body:
    """An answer read whole, up to ANSWER_LIMIT bytes (past it only its size is counted)."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.size = 0

    def add(self, data: Any) -> None:
        self.size += len(data)
        if self.size <= ANSWER_LIMIT:
            self.parts.append(bytes(data))

    def whole(self) -> bytes | None:
        """The answer's bytes; None when it was over ANSWER_LIMIT."""
        return b"".join(self.parts) if self.size <= ANSWER_LIMIT else None


class ShadowGrpcCall:
    """The upstream side of a gRPC copy: the callbacks upstream.py calls on a stream's owner."""

    def __init__(self, pair: Any, message: bytes) -> None:
        self.pair, self.gw = pair, pair.gw
        self.message = message
        self.up: Any = None
        self.ust: Any = None
        self.done = False
        self.body = _Body()
        self.t0 = _perf()

    def send(self) -> None:
        conn = self.gw.pool.pick()
        if conn is None:
            self.gw.pool.wait(self)
        else:
            self.upstream_ready(conn)

    def upstream_ready(self, conn: Any) -> None:
        if self.done:
            return
        self.up = conn
        message, self.message = self.message, b""
        self.ust, _ = conn.start(self, self.pair.block, message, True)

    def up_headers(self, head: Any, end: bool) -> None:
        if end:
            status = head.status if head.status is not None else g.UNKNOWN
            self._finish(status, head.message.decode("utf-8", "replace"))

    def up_data(self, payload: Any, end: bool) -> None:
        if self.done:
            return
        self.body.add(payload)
        self.up.consumed(self.ust, len(payload))
        if end:
            self._finish(g.INTERNAL, "tritonserver ended the call without a status")

    def up_reset(self, code: int) -> None:
        self._finish(g.INTERNAL, f"tritonserver reset the call (HTTP/2 error {code})")

    def up_refused(self) -> None:
        self.ust = None
        self._finish(UNREACHED, "tritonserver refused the stream (GOAWAY)")

    def up_lost(self, reason: str) -> None:
        self.ust = None
        self._finish(UNREACHED, reason)

    def up_window(self) -> None:
        """The copy's message left (it is sent whole): nothing waits on it."""

    def _finish(self, status: int, text: str) -> None:
        if self.done:
            return
        self.done = True
        if self.ust is not None:
            self.up.release(self.ust)
            self.ust = None
        self.pair.shadow_done(status, text, _perf() - self.t0, self.body.whole(), None)


class _NoClient:
    """An HTTP copy has no client to pause when tritonserver reads slowly."""

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


_NO_CLIENT = _NoClient()


class ShadowHttpExchange:
    """The upstream side of an HTTP copy: the callbacks httpup.py calls on an exchange."""

    front = _NO_CLIENT

    def __init__(self, pair: Any, data: bytes) -> None:
        self.pair, self.gw = pair, pair.gw
        self.data = data
        self.retried = False
        self.done = False
        self.status = 0
        self.json_len: int | None = None
        self.body = _Body()
        self.t0 = _perf()

    def send(self) -> None:
        conn = self.gw.http_pool.acquire(self)
        if conn is not None:
            self.up_ready(conn)

    def up_ready(self, conn: Any) -> None:
        if self.done:
            self.gw.http_pool.release(conn)
            return
        conn.send(self, self.data)

    def up_head(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.status = status
        for name, value in headers:
            if name == b"inference-header-content-length" and value.isdigit():
                self.json_len = int(value)

    def up_body(self, body: bytes) -> None:
        self.body.add(body)

    def up_end(self) -> None:
        self._finish(self.status, "")

    def up_failed(self, reason: str, reused: bool) -> None:
        if reused and not self.status and not self.retried and not self.done:
            self.retried = True  # a kept-alive connection tritonserver had closed: once more on another
            self.send()
            return
        self._finish(UNREACHED, reason)

    def _finish(self, status: int, text: str) -> None:
        if self.done:
            return
        self.done = True
        self.data = b""
        self.pair.shadow_done(status, text, _perf() - self.t0, self.body.whole(), self.json_len)
