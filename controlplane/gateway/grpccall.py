"""One gRPC call relayed: a client's stream on the front, one stream to tritonserver, and what flows between.

Requests that name a model (ModelInfer, ModelStreamInfer, ModelMetadata, ModelReady, ModelConfig,
ModelStatistics: the name is field 1 in each) are walked as their bytes arrive (wire.RequestScan):
the bytes before field 1 are held, the route is chosen when the name is known, field 1 is replaced by
the target's private name, the 5-byte prefix gets the new length, and the rest of the message streams
on untouched. Answers: a ModelInfer or ModelMetadata answer's first field is renamed as it passes; a
stream's answers, ModelConfig's and ModelStatistics' are held whole and rewritten (grpcmeta.py);
trailers' grpc-message loses its private names. Everything else passes byte for byte. A request for a
model whose route is `loadable` (not loaded; a request loads it) is parked (parking.py): its bytes are
held, uncredited, until the route serves (`resume` walks them again) or no load comes (`give_up`).

Flow control is end to end: bytes a side received are credited back to it only once the other side
has sent them on (`up_window` / `client_window`), so a slow reader slows its writer and the gateway
holds at most the windows it granted. A client's RST_STREAM cancels the stream to tritonserver; a
reset or GOAWAY from tritonserver reaches the client (REFUSED_STREAM, which gRPC clients retry, for
streams tritonserver never processed).
"""

from __future__ import annotations

import time
from bisect import bisect_left
from typing import Any

from controlplane.gateway import frames as f
from controlplane.gateway import grpcwire as g
from controlplane.gateway.figures import BUCKETS
from controlplane.gateway.grpcanswer import JOIN_BELOW, Answers
from controlplane.gateway.table import LiveTarget, RouteRefusal
from controlplane.gateway.wire import (
    RequestScan,
    WireError,
    grpc_prefix,
    rest_ok,
)

HOLD_LIMIT = 1 << 20  # bytes of a request held while its model_name (field 1) has not come yet
_perf = time.perf_counter
_COMPRESSED = b"compressed gRPC messages are not supported by the tritonctl gateway: turn request compression off"
_REFUSAL_STATUS = {"not_found": g.NOT_FOUND, "unavailable": g.UNAVAILABLE, "bad_pin": g.INVALID_ARGUMENT,
                   "loadable": g.UNAVAILABLE}
PARKS = frozenset({g.INFER, g.STREAM, g.META, g.CONFIG})  # wait for a loadable model's load (parking.py)


class _Cursor:
    """Where the walk of a client's request messages stands (the general path: a message in pieces)."""

    __slots__ = ("msg_left", "pre", "scan", "held", "held_n", "body_off", "resolved")

    def __init__(self) -> None:
        self.msg_left = -1  # bytes of the current message still to come; -1: at a 5-byte prefix
        self.pre = b""
        self.scan = RequestScan()
        self.held: list[Any] = []
        self.held_n = 0
        self.body_off = 0
        self.resolved = False


class GrpcCall(Answers):
    # Defaults as class attributes, set on the instance only when they change: a call is created per
    # request, and most of these stay as they are for a unary call.
    up: Any = None
    ust: Any = None
    early: list[Any] | None = None  # pieces waiting for a connection to tritonserver
    early_end = False
    owed = 0  # client bytes sent on, not yet credited back to the client
    owed_up = 0  # tritonserver bytes sent on, not yet credited back to it
    cur: _Cursor | None = None
    target: LiveTarget | None = None
    done = False
    resp_started = False
    rleft = 0
    rbuf = b""
    whole: list[Any] | None = None  # a whole-message answer being collected
    public_field = b""
    reqbuf: list[Any] | None = None
    shadow: Any = None  # a copied request's Pair (controlplane/gateway/shadow.py)
    parked: str | None = None  # the model whose load this call waits for (parking.py)
    stash: list[bytes] | None = None  # its request bytes held meanwhile, from the first message's start
    stash_end = False

    def __init__(self, gw: Any, front: Any, fst: Any, head: g.RequestHead) -> None:
        self.gw = gw
        self.front = front
        self.fst = fst
        self.head = head
        self.kind = head.kind
        self.table = gw.table  # read once: the whole call keeps the routes it started with
        self.t0 = _perf()

    # -- from the client ----------------------------------------------------------------------------

    def start(self, end: bool) -> None:
        head, kind = self.head, self.kind
        if head.error is not None:
            self.refuse(g.INVALID_ARGUMENT, head.error.encode(), "client")
        elif kind == g.PASS:
            self._emit([], end)
        elif kind == g.REFUSE:
            self.refuse(g.PERMISSION_DENIED, b"models are loaded and unloaded by tritonctl, not through the gateway: "
                        b"use `tritonctl load MODEL` / `tritonctl unload MODEL`", "client")
        elif kind in g.NAMED:
            if end and self._message_name(b"") is not None:
                self._emit([], True)
        else:
            self.reqbuf = []
            if end:
                self.gw.local(self, b"")  # no message: the request's defaults

    def client_data(self, payload: Any, end: bool) -> None:
        if self.done:
            self.front.consumed(None, len(payload))
            return
        kind = self.kind
        if kind == g.PASS:
            self.owed += len(payload)
            self._emit([payload] if payload else [], end)
        elif kind in g.NAMED:
            self._request(payload, end)
            if self.shadow is not None:  # a copied request: its bytes go to the shadow too, once whole
                self.shadow.request_piece(payload)
                if end:
                    self.shadow.request_end()
        else:
            reqbuf = self.reqbuf
            assert reqbuf is not None
            reqbuf.append(bytes(payload))
            self.front.consumed(self.fst, len(payload))
            if sum(len(p) for p in reqbuf) > 1 << 20:
                self.refuse(g.RESOURCE_EXHAUSTED, b"request over 1 MiB for a method that takes a few bytes", "client")
            elif end:
                data = b"".join(reqbuf)
                self.reqbuf = None
                if data and (len(data) < 5 or int.from_bytes(data[1:5], "big") != len(data) - 5):
                    self.refuse(g.INVALID_ARGUMENT, b"expected one request message", "client")
                elif data[:1] == b"\x01":
                    self.refuse(g.UNIMPLEMENTED, _COMPRESSED, "client")
                else:
                    self.gw.local(self, data[5:])

    def _request(self, data: Any, end: bool) -> None:
        """Walk request messages as their bytes come: hold until field 1, rename it, stream the rest."""
        if self.stash is not None:  # waiting for the model's load: held (not credited to the client) until then
            self._hold(data, end)
            return
        cur = self.cur
        if cur is None:
            n = len(data)
            # the usual case, one whole message whose first field is a short name: rename at once
            if n > 7 and data[5] == 0x0A and data[6] < 0x80 and data[0] == 0 and \
                    int.from_bytes(data[1:5], "big") == n - 5 and rest_ok(data, 7 + data[6], n):
                name_end = 7 + data[6]
                target = self._message_name(bytes(data[7:name_end]))
                if target is None:
                    if self.stash is not None:  # parked: the whole message waits
                        self._hold(data, end)
                    return
                self.owed += n
                field = target.field
                head = grpc_prefix(n - name_end + len(field)) + field
                if n - name_end < JOIN_BELOW:
                    self._emit([head + data[name_end:]], end)
                else:
                    self._emit([head, data[name_end:]], end)
                return
            cur = self.cur = _Cursor()
        pos, n = 0, len(data)
        while pos < n and not self.done:
            if cur.msg_left < 0:
                take = 5 - len(cur.pre)
                cur.pre += bytes(data[pos : pos + take])
                pos += take
                if len(cur.pre) < 5:
                    break
                if cur.pre[0] != 0:
                    self.refuse(g.UNIMPLEMENTED, _COMPRESSED, "client")
                    return
                length = int.from_bytes(cur.pre[1:5], "big")
                if length > self.gw.max_message:
                    self.refuse(g.RESOURCE_EXHAUSTED, b"request message of %d bytes over the gateway's limit of %d"
                                % (length, self.gw.max_message), "client")
                    return
                cur.msg_left = length
                cur.scan = RequestScan()
                cur.body_off = 0
                cur.resolved = False
                cur.held, cur.held_n = [], 0
                if length == 0:
                    self._resolve_message(cur, 0)
                    cur.msg_left = -1
                    cur.pre = b""
                continue
            take = min(cur.msg_left, n - pos)
            chunk = data[pos : pos + take]
            pos += take
            cur.msg_left -= take
            scan = cur.scan
            try:
                scan.feed(chunk, cur.body_off)
                if cur.msg_left == 0:
                    scan.finish(cur.body_off + take)
            except WireError as exc:
                self.refuse(g.INVALID_ARGUMENT, f"not a valid request message: {exc}".encode(), "client")
                return
            cur.body_off += take
            if cur.resolved:
                self.owed += take
                self._emit([chunk], False)
            else:
                cur.held.append(chunk)
                cur.held_n += take
                if scan.name is not None or cur.msg_left == 0:
                    self._resolve_message(cur, cur.body_off)
                    if self.stash is not None:  # parked: this message from its start, and what follows, wait
                        self.cur = None
                        self._hold(cur.pre + b"".join(bytes(p) for p in cur.held) + bytes(data[pos:]), end)
                        return
                elif cur.held_n > HOLD_LIMIT:
                    self.refuse(g.INVALID_ARGUMENT, b"model_name (field 1) must come within the first %d bytes of "
                                b"the request message" % HOLD_LIMIT, "client")
                    return
            if cur.msg_left == 0:
                cur.msg_left = -1
                cur.pre = b""
        if self.done:
            return
        if end:
            if cur.msg_left >= 0 or cur.pre:
                self.refuse(g.INVALID_ARGUMENT, b"the request ends inside a message", "client")
            else:
                self._emit([], True)

    def _resolve_message(self, cur: _Cursor, received: int) -> None:
        """Field 1 is known (or the message ended without it): choose the target, send the held bytes."""
        scan = cur.scan
        name = scan.name if scan.name is not None else b""
        target = self._message_name(name)
        if target is None:
            return
        cur.resolved = True
        body_len = cur.msg_left + received
        held, cur.held = cur.held, []
        self.owed += 5 + cur.held_n
        if scan.name is None:  # no name and still served: only ModelStatistics for every model
            self._emit([cur.pre, *held], False)
            return
        joined = held[0] if len(held) == 1 else b"".join(bytes(p) for p in held)
        new_len = body_len - (scan.end - scan.start) + len(target.field)
        head = grpc_prefix(new_len) + bytes(joined[: scan.start]) + target.field
        rest = joined[scan.end :]
        if len(rest) < JOIN_BELOW:
            self._emit([head + rest] if len(rest) else [head], False)
        else:
            self._emit([head, rest], False)

    def _message_name(self, name: bytes) -> LiveTarget | None:
        """The target for a request naming `name`; None when refused (the call is then over)."""
        if not name and self.kind == g.STATS:
            return _ALL_MODELS
        kind = self.kind
        try:
            route = self.table.route(name)
            if kind == g.INFER or kind == g.STREAM:
                pin = self.head.pin
                if pin is None and route.single is not None:
                    target = route.single
                else:
                    target = route.choose(pin, self.head.headers.get(route.sticky) if route.sticky else None)
                    if route.shadow is not None and kind == g.INFER and pin is None and self.target is None:
                        self.shadow = route.shadow.pair(self.gw, "grpc", self.head.up_block)
            else:
                target = route.primary(self.head.pin)
        except RouteRefusal as exc:
            if exc.kind == "loadable" and kind in PARKS and self.target is None:
                self._park(name.decode("utf-8", "replace"))
                return None
            if kind == g.READY and exc.kind != "bad_pin":
                self.answer(b"")  # ready: false, as tritonserver answers for a model it does not serve
            elif kind == g.STATS and exc.kind == "not_found":
                self.refuse(g.INVALID_ARGUMENT, b"requested model '%s' is not available" % name, "client")
            else:
                status = _REFUSAL_STATUS[exc.kind]
                self.refuse(status, exc.message.encode(), "unavailable" if status == g.UNAVAILABLE else "client")
            return None
        slot = target.slot
        if self.target is None:
            self.target = target
            self.public_field = target.public_field
            slot.inflight += 1
        if kind == g.INFER or kind == g.STREAM:
            slot.grpc.requests += 1
            self.gw.figures.last[target.model] = time.time()  # the model's last use (the memory budget's LRU)
        return target

    # -- waiting for the model's load (parking.py) --------------------------------------------------------

    def _park(self, model: str) -> None:
        refusal = self.gw.parking.park(model, self)
        if refusal is not None:
            self.refuse(g.RESOURCE_EXHAUSTED, refusal.encode(), "unavailable")
            return
        self.parked = model
        self.stash = []

    def _hold(self, data: Any, end: bool) -> None:
        stash = self.stash
        assert stash is not None and self.parked is not None
        if data:
            if not self.gw.parking.hold(self, len(data)):
                parking = self.gw.parking
                parking.leave(self.parked, self)
                stash.append(bytes(data))
                self._drop_stash(parking.over_bytes(), g.RESOURCE_EXHAUSTED)
                return
            stash.append(bytes(data))
        if end:
            self.stash_end = True

    def resume(self) -> None:
        """Its model's route is no longer `loadable`: the held bytes walked again against the table now (sent
        on renamed, or refused as the route says)."""
        stash, end = self.stash or [], self.stash_end
        self.parked, self.stash, self.stash_end = None, None, False
        if self.done:
            return
        self.table = self.gw.table
        self.cur = None
        self._request(b"".join(stash), end)

    def give_up(self, message: str) -> None:
        """No load came (refused, past gateway_load_wait_s, the gateway stopping): UNAVAILABLE with `message`."""
        self._drop_stash(message, g.UNAVAILABLE)

    def _drop_stash(self, message: str, status: int) -> None:
        held = sum(len(p) for p in self.stash or ())
        self.parked, self.stash, self.stash_end = None, None, False
        if self.done:
            return
        self.front.consumed(None, held)  # dropped: the client's connection window gets them back
        self.refuse(status, message.encode(), "unavailable")

    def client_reset(self, code: int) -> None:
        if not self.done:
            self._cancel_upstream()
            self._end(g.CANCELLED)

    def client_window(self) -> None:
        if self.owed_up and self.ust is not None:
            self.up.consumed(self.ust, self.owed_up)
            self.owed_up = 0

    # -- toward tritonserver ------------------------------------------------------------------------

    def _emit(self, pieces: list[Any], end: bool) -> None:
        ust = self.ust
        if ust is None:
            if self.early is not None:
                self.early.extend(pieces)
                self.early_end = end
                return
            conn = self.gw.pool.pick()
            if conn is None:
                self.early, self.early_end = list(pieces), end
                self.gw.pool.wait(self)
                return
            self._open(conn, pieces, end)
            return
        up = self.up
        sent = not ust.pending  # nothing queued: what was owed has left
        if not pieces:
            if end:
                sent = up.send_data(ust, b"", True)
        else:
            last = len(pieces) - 1
            for i, piece in enumerate(pieces):
                sent = up.send_data(ust, piece, end and i == last)
        if sent and self.owed:
            self.front.consumed(self.fst, self.owed)
            self.owed = 0

    def _open(self, conn: Any, pieces: list[Any], end: bool) -> None:
        self.up = conn
        if len(pieces) == 1:
            self.ust, sent = conn.start(self, self.head.up_block, pieces[0], end)
            if sent and self.owed:
                self.front.consumed(self.fst, self.owed)
                self.owed = 0
            return
        self.ust, _ = conn.start(self, self.head.up_block, None, end and not pieces)
        if pieces:
            self._emit(pieces, end)

    def upstream_ready(self, conn: Any) -> None:
        pieces, self.early = self.early or [], None
        if not self.done:
            self._open(conn, pieces, self.early_end)

    def up_window(self) -> None:
        if self.owed:
            self.front.consumed(self.fst, self.owed)
            self.owed = 0

    def _cancel_upstream(self) -> None:
        if self.ust is not None:
            self.up.release(self.ust)
        elif self.early is not None:
            self.gw.pool.cancel(self)
            self.early = None

    # -- ending -------------------------------------------------------------------------------------

    def forward(self, message: bytes) -> None:
        """Send tritonserver a whole request message the gateway built (a decoded method's)."""
        self._emit([grpc_prefix(len(message)) + message], True)

    def answer(self, message: bytes) -> None:
        """A whole answer of the gateway's own (the repository index): headers, one message, OK."""
        self.front.send_headers(self.fst, g.RESPONSE_HEADERS)
        self.front.send_data(self.fst, grpc_prefix(len(message)) + message)
        self.front.send_headers(self.fst, g.TRAILERS_OK, True)
        self._end(g.OK)

    def refuse(self, status: int, message: bytes, failure: str) -> None:
        """End the call with `status` (trailers-only when nothing was sent yet); cancel tritonserver's side."""
        if self.done:
            return
        self._cancel_upstream()
        if self.shadow is not None:
            self.shadow.serving_text = message
        if self.resp_started:
            self.front.send_headers(self.fst, g.trailers(status, message), True)
        else:
            self.front.send_headers(self.fst, g.trailers(status, message, only=True), True)
        self._end(status, failure)

    def _end(self, status: int, failure: str | None = None) -> None:
        self.done = True
        if self.parked is not None:  # cancelled (or refused) while it waited for the load
            self.gw.parking.leave(self.parked, self)
            self.front.consumed(None, sum(len(p) for p in self.stash or ()))
            self.parked, self.stash = None, None
        target = self.target
        if failure is None and status:
            failure = g.failure_class(status)
        if target is not None and target is not _ALL_MODELS:
            slot = target.slot
            slot.inflight -= 1
            fig = slot.grpc
            if self.kind == g.INFER:
                seconds = _perf() - self.t0
                fig.counts[bisect_left(BUCKETS, seconds)] += 1
                fig.sum += seconds
                if self.shadow is not None:
                    self.shadow.serving_done(status, seconds)
            if failure is not None and self.kind in (g.INFER, g.STREAM):
                fig.fail(failure)
        elif self.kind in (g.INFER, g.STREAM):
            unrouted = self.gw.figures.unrouted
            unrouted.requests += 1
            if failure is not None:
                unrouted.fail(failure)
        if self.ust is not None:
            self.up.release(self.ust)
            if self.owed_up:
                self.client_window()
        fst = self.fst
        if not fst.remote_closed and not fst.pending and fst.sid in self.front.streams:
            self.front.reset(fst, f.NO_ERROR)  # the answer is complete: the client need send no more
        self.gw.calls -= 1


class _AllModels:
    """ModelStatistics without a name: every model (the answer is filtered to public ones)."""

    model = ""
    field = b""
    public_field = b""
    slot: Any = None


_ALL_MODELS: Any = _AllModels()
