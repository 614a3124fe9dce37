"""One HTTP request relayed: routed by the model in its path, sent on with the private name, answered publicly.

The request's body passes untouched (JSON, or the binary tensor extension), chunked when the client
sent it chunked. The answer's JSON part is rewritten (httpnames.py): a whole JSON answer is held and
sent with its new Content-Length; a binary answer holds only its `Inference-Header-Content-Length`
bytes of JSON, fixes that header and Content-Length, and streams the tensors; generate_stream's events
are renamed line by line as they come; anything else streams as it arrives. Requests the gateway
answers itself: the repository index, load/unload (403), unknown or private model names (Triton's
status and wording, with the client's name), a model that is not serving (503). A request that needs a
model whose route is `loadable` (not loaded; a request loads it) waits in the gateway's parking
(parking.py): its head is built and sent once the model's route serves (`resume`), its body held meanwhile;
or it is answered 503 with why no load came (`give_up`).
"""

from __future__ import annotations

import json
import time
from http import HTTPStatus
from typing import Any

import httptools

from controlplane.gateway import grpcmeta
from controlplane.gateway import httpnames as hn
from controlplane.gateway.table import LiveTarget, RouteRefusal

_perf = time.perf_counter
KEEP_FOR_RETRY = 1 << 20  # a request up to this size is kept whole, to send again on a stale connection
_DROP_REQUEST = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"te", b"trailer", b"transfer-encoding",
                           b"upgrade", b"expect", b"host", b"content-length"})
_DROP_RESPONSE = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"content-length",
                            b"upgrade", b"trailer"})
_REASONS = {s.value: s.phrase.encode() for s in HTTPStatus}
BUFFER, BINARY, SSE, STREAMED = range(4)
PARKS = frozenset({hn.INFER, hn.GENERATE, hn.STREAM, hn.META, hn.CONFIG})  # wait for a loadable model's load
REFUSED_LOAD = ("models are loaded and unloaded by tritonctl, not through the gateway: "
                "use `tritonctl load MODEL` / `tritonctl unload MODEL`")


def http_failure(status: int) -> str | None:
    if status < 400:
        return None
    if status == 500:
        return "model"
    if status in (502, 503, 504):
        return "unavailable"
    return "client"


def response_head(status: int, headers: list[tuple[bytes, bytes]], length: int | None, keep_alive: bool) -> bytes:
    parts = [b"HTTP/1.1 %d %s\r\n" % (status, _REASONS.get(status, b"Unknown"))]
    for name, value in headers:
        if name not in _DROP_RESPONSE:
            parts.append(name + b": " + value + b"\r\n")
    parts.append(b"Transfer-Encoding: chunked\r\n" if length is None else b"Content-Length: %d\r\n" % length)
    if not keep_alive:
        parts.append(b"Connection: close\r\n")
    parts.append(b"\r\n")
    return b"".join(parts)


def simple_response(status: int, message: str, keep_alive: bool = True, body: bytes | None = None) -> bytes:
    payload = hn.error_body(message) if body is None else body
    return response_head(status, [(b"content-type", b"application/json")], len(payload), keep_alive) + payload


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data) if data else b""


class Exchange:
    __slots__ = ("front", "gw", "table", "keep_alive", "method", "t0", "kind", "info", "target", "local", "up",
                 "early", "kept", "started", "req_ended", "done", "chunked", "expect", "head_out", "status",
                 "mode", "rheaders", "rbuf", "rsize", "json_len", "sse", "chunked_out", "retries", "pin",
                 "parked", "pending", "shadow")

    def __init__(self, front: Any, url: bytes, headers: list[tuple[bytes, bytes]], method: bytes,
                 keep_alive: bool, version: str) -> None:
        self.front = front
        gw = self.gw = front.gw
        self.table = gw.table
        self.keep_alive = keep_alive
        self.method = method
        self.t0 = _perf()
        self.target: LiveTarget | None = None
        self.local: bytes | None = None  # an answer of the gateway's own, sent once the request is read
        self.up: Any = None
        self.early: list[bytes] | None = []
        self.kept: list[bytes] | None = []
        self.started = self.req_ended = self.done = False
        self.status = 0
        self.mode = STREAMED
        self.rheaders: list[tuple[bytes, bytes]] = []
        self.rbuf: list[bytes] = []
        self.rsize = 0
        self.json_len = 0
        self.sse: hn.SseRenamer | None = None
        self.chunked_out = False
        self.retries = 0
        self.parked: str | None = None  # the model whose load it waits for (parking.py)
        self.pending: tuple[list[tuple[bytes, bytes]], dict[bytes, bytes], str, bytes | None] | None = None
        self.shadow: Any = None  # a copied request's Pair (controlplane/gateway/shadow.py)
        found = dict(headers)
        self.pin = found.get(b"x-tritonctl-route")
        self.chunked = b"chunked" in found.get(b"transfer-encoding", b"").lower()
        self.expect = found.get(b"expect", b"").lower() == b"100-continue"
        try:
            parsed = httptools.parse_url(url)
        except httptools.HttpParserInvalidURLError:
            self.kind, self.info, self.head_out = hn.PASS, hn.PathInfo(hn.PASS), b""
            self.local = simple_response(400, "malformed request URL", keep_alive)
            return
        path = parsed.path.decode("latin-1")
        info = self.info = hn.classify(path)
        self.kind = info.kind
        self.head_out = b""
        path_out = self._route(info, found, path)
        if self.parked is not None:  # waits for its model's load: the head is built once it goes on (resume)
            self.pending = (headers, found, path, parsed.query)
        elif self.local is None:
            self.head_out = self._head(path_out, parsed.query, headers, found)

    def _head(self, path_out: str, query: bytes | None, headers: list[tuple[bytes, bytes]],
              found: dict[bytes, bytes]) -> bytes:
        """The request's head toward tritonserver: the private path, the client's headers less hop-by-hop ones."""
        parts = [self.method, b" ", path_out.encode("latin-1"), b"?" + query if query else b"", b" HTTP/1.1\r\nHost: ",
                 self.gw.http_authority, b"\r\n"]
        for name, value in headers:
            if name not in _DROP_REQUEST:
                parts += [name, b": ", value, b"\r\n"]
        if self.chunked:
            parts.append(b"Transfer-Encoding: chunked\r\n")
        elif b"content-length" in found:
            parts += [b"Content-Length: ", found[b"content-length"], b"\r\n"]
        parts.append(b"\r\n")
        if self.shadow is not None:  # the copy's head: the same, with the shadow's private name in the path
            self.shadow.http_head(self.method, self.info.private_path(self.shadow.state.name).encode("latin-1") +
                                  (b"?" + query if query else b""), headers)
        return b"".join(parts)

    def _route(self, info: hn.PathInfo, headers: dict[bytes, bytes], path: str) -> str:
        kind = info.kind
        if kind == hn.REFUSE:
            self.local = simple_response(403, REFUSED_LOAD, self.keep_alive)
            return path
        if kind in (hn.PASS, hn.STATS_ALL, hn.INDEX):
            return path
        pin = self.pin.strip().lower() if self.pin is not None else None
        try:
            route = self.table.route(info.name.encode())
            if kind in hn.COUNTED:
                if pin is None and route.single is not None:
                    target = route.single
                else:
                    target = route.choose(pin, headers.get(route.sticky) if route.sticky else None)
                    if route.shadow is not None and kind == hn.INFER and pin is None:
                        self.shadow = route.shadow.pair(self.gw, "http")
            else:
                target = route.primary(pin)
        except RouteRefusal as exc:
            if exc.kind == "loadable" and kind in PARKS:
                self._park(info.name)
                return path
            self.local = self._refusal(kind, exc, info.name)
            if kind in hn.COUNTED:
                self._unrouted("client" if exc.kind in ("not_found", "bad_pin") else "unavailable")
            return path
        self.target = target
        slot = target.slot
        slot.inflight += 1
        if kind in hn.COUNTED:
            slot.http.requests += 1
            self.gw.figures.last[target.model] = time.time()  # the model's last use (the memory budget's LRU)
        return info.private_path(target.name)

    def _unrouted(self, failure: str) -> None:
        unrouted = self.gw.figures.unrouted
        unrouted.requests += 1
        unrouted.fail(failure)

    # -- waiting for the model's load (parking.py) --------------------------------------------------------

    def _park(self, model: str) -> None:
        refusal = self.gw.parking.park(model, self)
        if refusal is None:
            self.parked = model
        else:
            self.local = simple_response(503, refusal, self.keep_alive)
            if self.kind in hn.COUNTED:
                self._unrouted("unavailable")

    def resume(self) -> None:
        """Its model's route is no longer `loadable` (loaded, or gone): routed again against the table now,
        then sent on with the body that arrived meanwhile (or answered as the route says)."""
        pending, self.pending, self.parked = self.pending, None, None
        if pending is None or self.done:
            return
        headers, found, path, query = pending
        self.table = self.gw.table
        path_out = self._route(self.info, found, path)
        if self.parked is not None:  # loadable again: waits again
            self.pending = pending
            return
        if self.local is None:
            self.head_out = self._head(path_out, query, headers, found)
        if self.started:
            self.start()

    def give_up(self, message: str) -> None:
        """No load came (refused, past gateway_load_wait_s, a bound): 503 with `message`."""
        self.pending, self.parked = None, None
        if self.done:
            return
        self.early = []
        if self.kind in hn.COUNTED:
            self._unrouted("unavailable")
        if self.started and not self.req_ended:  # its body's rest is not read: the connection closes after
            self.keep_alive = False
        self.local = simple_response(503, message, self.keep_alive)
        if self.started:
            self._answer_local()

    def _refusal(self, kind: int, exc: RouteRefusal, name: str) -> bytes:
        if exc.kind == "bad_pin":
            return simple_response(400, exc.message, self.keep_alive)
        if kind == hn.READY:
            return simple_response(400, "Model version not ready", self.keep_alive)
        if exc.kind in ("unavailable", "loadable"):
            return simple_response(503, exc.message, self.keep_alive)
        if kind == hn.STATS:
            return simple_response(400, f"requested model '{name}' is not available", self.keep_alive)
        return simple_response(404, exc.message, self.keep_alive)

    # -- the request --------------------------------------------------------------------------------

    def start(self) -> None:
        """This exchange is the connection's first unanswered one: send it on (or answer it)."""
        self.started = True
        if self.local is not None or self.kind == hn.INDEX:
            if self.req_ended:
                self._answer_local()
            return
        if self.parked is not None:  # goes on from resume(), or is answered by give_up()
            return
        if self.expect:
            self.front.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        conn = self.gw.http_pool.acquire(self)
        if conn is not None:
            self.up_ready(conn)

    def up_ready(self, conn: Any) -> None:
        if self.done:
            self.gw.http_pool.release(conn)
            return
        self.up = conn
        early = self.early or []
        if not early and not self.req_ended and self.expects_body():
            conn.ex = self  # hold the head: it leaves with the first body bytes, one write instead of two
            return
        self.early = None
        conn.send(self, self.head_out + b"".join(early) if early else self.head_out)
        if self.kept is not None:
            self.kept = [self.head_out, *early]

    def expects_body(self) -> bool:
        return self.chunked or self.head_out.find(b"\r\nContent-Length: ") >= 0 and \
            not self.head_out.endswith(b"\r\nContent-Length: 0\r\n\r\n")

    def client_body(self, body: bytes) -> None:
        if self.local is not None or self.done:
            if self.kind == hn.INDEX and self.early is not None:
                self.early.append(body)
            return
        if self.kind == hn.INDEX:
            if self.early is not None and sum(len(b) for b in self.early) < 65536:
                self.early.append(body)
            return
        if self.shadow is not None:
            self.shadow.request_piece(body)
        self.client_body_raw(chunk(body) if self.chunked else body)

    def client_end(self) -> None:
        self.req_ended = True
        if self.local is not None or self.kind == hn.INDEX:
            if self.started:
                self._answer_local()
            return
        if self.shadow is not None:
            self.shadow.request_end()
        if self.chunked:
            self.client_body_raw(b"0\r\n\r\n")

    def client_body_raw(self, data: bytes) -> None:
        if self.up is not None and self.early is not None:  # the held head goes with these bytes
            self.early.append(data)
            self.up_ready(self.up)
            return
        if self.up is not None:
            self.up.write(data)
            if self.kept is not None:
                self.kept.append(data)
                if len(self.kept) > 64 or sum(len(p) for p in self.kept) > KEEP_FOR_RETRY:
                    self.kept = None
        elif self.early is not None:
            self.early.append(data)
            if self.parked is not None and not self.gw.parking.hold(self, len(data)):
                parking = self.gw.parking
                parking.leave(self.parked, self)
                self.give_up(parking.over_bytes())

    def _answer_local(self) -> None:
        if self.kind == hn.INDEX and self.local is None:
            try:
                body = json.loads(b"".join(self.early or []) or b"{}")
                ready = bool(body.get("ready")) if isinstance(body, dict) else False
            except ValueError:
                self.local = simple_response(400, "the repository index request is not JSON", self.keep_alive)
            else:
                payload = hn.index_json(grpcmeta.index_entries(self.table, ready))
                self.local = simple_response(200, "", self.keep_alive, payload)
        local = self.local
        assert local is not None
        self.front.write(local)
        self._finish(int(local[9:12]))

    # -- the answer ---------------------------------------------------------------------------------

    def up_head(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.status = status
        self.rheaders = headers
        if self.shadow is not None:
            self.shadow.serving_head(status, headers)
        kind = self.kind
        if status >= 400 or kind in (hn.META, hn.CONFIG, hn.STATS, hn.STATS_ALL) or \
                (kind in (hn.INFER, hn.GENERATE) and status == 200):
            self.mode = BUFFER
            if kind == hn.INFER and status == 200:
                for name, value in headers:
                    if name == b"inference-header-content-length":
                        self.mode, self.json_len = BINARY, int(value)
                        break
        elif kind == hn.STREAM and status == 200 and self.target is not None:
            self.mode = SSE
            self.sse = hn.SseRenamer(self.target.private, self.target.public)
            self._send_head(None)
        else:
            self.mode = STREAMED
            length = next((int(v) for n, v in headers if n == b"content-length"), None)
            self._send_head(length)

    def _send_head(self, length: int | None, headers: list[tuple[bytes, bytes]] | None = None,
                   body: bytes = b"") -> None:
        """The answer's head (and, in the same write, `body`)."""
        self.chunked_out = length is None
        self.front.write(response_head(self.status, self.rheaders if headers is None else headers, length,
                                       self.keep_alive) + body)

    def up_body(self, body: bytes) -> None:
        if self.shadow is not None:
            self.shadow.answer(body)
        mode = self.mode
        if mode == BUFFER:
            self.rbuf.append(body)
            self.rsize += len(body)
            if self.rsize > self.gw.max_message:
                self.up_failed("an answer over the gateway's message limit", False)
        elif mode == STREAMED:
            self.front.write(chunk(body) if self.chunked_out else body)
        elif mode == SSE:
            assert self.sse is not None
            self.front.write(chunk(self.sse.feed(body)))
        else:
            self._binary(body)

    def _binary(self, body: bytes) -> None:
        if self.json_len < 0:  # the JSON part went out: tensors stream
            self.front.write(body)
            return
        self.rbuf.append(body)
        self.rsize += len(body)
        if self.rsize < self.json_len:
            return
        data = b"".join(self.rbuf)
        self.rbuf = []
        head, rest = data[: self.json_len], data[self.json_len :]
        target = self.target
        assert target is not None
        new = hn.renamed_first(head, b"model_name", target.private, target.public)
        total = next((int(v) for n, v in self.rheaders if n == b"content-length"), None)
        headers = [(n, v) for n, v in self.rheaders if n != b"inference-header-content-length"]
        headers.append((b"inference-header-content-length", b"%d" % len(new)))
        length = None if total is None else total + len(new) - len(head)
        self._send_head(length, headers, new + rest if length is not None else chunk(new + rest))
        self.json_len = -1

    def up_end(self) -> None:
        mode = self.mode
        if mode == BUFFER:
            body = self._rewritten(b"".join(self.rbuf))
            self.rbuf = []
            self._send_head(len(body), body=body)
        elif mode == SSE:
            assert self.sse is not None
            self.front.write(chunk(self.sse.end()) + b"0\r\n\r\n")
        elif mode == BINARY and self.json_len >= 0:  # shorter than its JSON part: pass it as it came
            data = b"".join(self.rbuf)
            self._send_head(len(data), body=data)
        elif self.chunked_out:
            self.front.write(b"0\r\n\r\n")
        self.up = None
        self._finish(self.status)

    def _rewritten(self, body: bytes) -> bytes:
        kind, target = self.kind, self.target
        try:
            if self.status >= 400:
                return hn.public_json_text(body)
            if target is not None and kind in (hn.INFER, hn.GENERATE):
                return hn.renamed_first(body, b"model_name", target.private, target.public)
            if target is not None and kind == hn.META:
                return hn.renamed_first(body, b"name", target.private, target.public)
            if kind == hn.CONFIG:
                return hn.rename_config_json(body)
            if kind in (hn.STATS, hn.STATS_ALL):
                return hn.rename_stats_json(body, grpcmeta.shown_statistics(target, self.table))
        except (ValueError, AttributeError, TypeError):
            return hn.public_json_text(body)
        return body

    def up_failed(self, reason: str, reused: bool) -> None:
        """The connection to tritonserver failed under this exchange."""
        if self.done:
            return
        up, self.up = self.up, None
        if up is not None and not up.closed:
            up.close()
        if self.status == 0 and reused and self.kept is not None and self.req_ended and self.retries < 2:
            self.retries += 1  # a kept-alive connection tritonserver had closed: send it again
            self.early, self.kept = self.kept[1:], []
            conn = self.gw.http_pool.acquire(self)
            if conn is not None:
                self.up_ready(conn)
            return
        if self.status == 0:
            self.front.write(simple_response(503, reason, self.keep_alive))
            self.status = 503
            self._finish(503)
        else:  # part of the answer went out: the client can only see the connection end
            self.keep_alive = False
            self._finish(502)

    def pause_upstream(self) -> None:
        if self.up is not None:
            self.up.pause_reading()

    def resume_upstream(self) -> None:
        if self.up is not None:
            self.up.resume_reading()

    def client_gone(self) -> None:
        self.abandon()

    def abandon(self) -> None:
        """The client's connection ends before the answer: drop tritonserver's side of it."""
        if self.done:
            return
        self.keep_alive = False
        if self.up is not None:
            self.up.ex = None
            self.up.close()
            self.up = None
        else:
            self.gw.http_pool.cancel(self)
        self._finish(499, front=False)

    def _finish(self, status: int, front: bool = True) -> None:
        if self.done:
            return
        self.done = True
        if self.parked is not None:  # its client went while it waited for the load
            self.gw.parking.leave(self.parked, self)
            self.parked = self.pending = None
        target = self.target
        if target is not None:
            slot = target.slot
            slot.inflight -= 1
            if self.kind in hn.COUNTED:
                fig = slot.http
                seconds = _perf() - self.t0
                fig.observe(seconds)
                if self.shadow is not None:
                    self.shadow.serving_done(status, seconds)
                failure = http_failure(status)
                if failure is not None:
                    fig.fail(failure)
        if front:
            self.front.exchange_done(self)
