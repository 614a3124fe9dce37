"""The answer half of a relayed gRPC call: tritonserver's headers, messages and trailers, made public.

A ModelInfer or ModelMetadata answer's first field (the model name) is renamed as the message passes;
a stream's answers, ModelConfig's and ModelStatistics' are held whole and rewritten; trailers'
grpc-message loses its private names. Bytes from tritonserver are credited back to it once the client's
side took them. A reset or GOAWAY from tritonserver reaches the client (REFUSED_STREAM, which gRPC
clients retry by themselves, for a stream tritonserver never processed). `Answers` is a mixin of
grpccall.GrpcCall, which owns the attributes.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.message import DecodeError

from controlplane.gateway import frames as f
from controlplane.gateway import grpcwire as g
from controlplane.gateway.wire import (
    WireError,
    grpc_prefix,
    public_text,
    rename_stream_response,
    response_head,
    stream_error,
)

JOIN_BELOW = 32 << 10  # pieces of a message smaller than this leave as one DATA frame


class Answers:
    gw: Any
    front: Any
    fst: Any
    up: Any
    ust: Any
    kind: int
    target: Any
    done: bool
    resp_started: bool
    rleft: int
    rbuf: bytes
    whole: list[Any] | None
    early: list[Any] | None
    public_field: bytes
    owed_up: int
    shadow: Any

    def refuse(self, status: int, message: bytes, failure: str) -> None:
        raise NotImplementedError

    def _end(self, status: int, failure: str | None = None) -> None:
        raise NotImplementedError

    def client_window(self) -> None:
        raise NotImplementedError


    def up_headers(self, head: g.ResponseHead, end: bool) -> None:
        if self.done:
            return
        if not end:
            if not self.resp_started:
                self.resp_started = True
                self.front.send_headers(self.fst, head.block or g.RESPONSE_HEADERS)
            return
        if self.whole is not None:
            self._whole_answers(True)
            if self.done:
                return
        status = head.status if head.status is not None else g.UNKNOWN
        if self.shadow is not None:
            self.shadow.serving_text = head.message
        first = bool(head.http_status) and not self.resp_started  # trailers-only: a whole answer in one block
        if head.block and (first or not head.http_status):
            block = head.block
        else:
            pairs = [(b":status", head.http_status)] if first else []
            pairs += head.trailer_pairs
            if head.message:
                pairs.append((b"grpc-message", g.percent(public_text(head.message))))
            block = f.encode_headers(pairs)
        self.front.send_headers(self.fst, block, True)
        self._end(status)

    def up_data(self, payload: Any, end: bool) -> None:
        if self.done:
            return
        if self.shadow is not None:  # a copied request: its answer is kept to compare with the shadow's
            self.shadow.answer(payload)
        kind = self.kind
        n = len(payload)
        if kind == g.INFER or kind == g.META:
            pf = self.public_field
            # the usual case, one whole answer whose first field is a short name: rename at once
            if not self.rleft and not self.rbuf and n > 7 and payload[5] == 0x0A and payload[6] < 0x80 and \
                    int.from_bytes(payload[1:5], "big") == n - 5 and pf:
                name_end = 7 + payload[6]
                if n - name_end < JOIN_BELOW:
                    sent = self.front.send_data(self.fst, grpc_prefix(n - name_end + len(pf)) + pf + payload[name_end:])
                else:
                    self.front.send_data(self.fst, grpc_prefix(n - name_end + len(pf)) + pf)
                    sent = self.front.send_data(self.fst, payload[name_end:])
                if sent:
                    self.up.consumed(self.ust, n)
                else:
                    self.owed_up += n
            else:
                self._renamed_answer(payload)
        elif kind == g.PASS or kind == g.READY:
            self.owed_up += n
            if self.front.send_data(self.fst, payload):
                self.client_window()
        else:
            if self.whole is None:
                self.whole = []
            self.whole.append(bytes(payload))
            if self.fst.pending:  # the client reads slowly: credit tritonserver only as it catches up
                self.owed_up += n
            else:
                self.up.consumed(self.ust, n)
            if sum(len(p) for p in self.whole) > self.gw.max_message + 5:
                self.refuse(g.RESOURCE_EXHAUSTED, b"an answer over the gateway's message limit", "unavailable")
                return
            if kind == g.STREAM:
                self._whole_answers(False)
        if end and not self.done:
            self.refuse(g.INTERNAL, b"tritonserver ended the call without a status", "unavailable")

    def _renamed_answer(self, data: Any) -> None:
        """Answers whose first field is the model name: rename it as the message passes."""
        pos, n = 0, len(data)
        out: list[Any] = []
        while pos < n:
            if self.rleft > 0:
                take = min(self.rleft, n - pos)
                out.append(data[pos : pos + take])
                self.rleft -= take
                pos += take
                continue
            had = len(self.rbuf)
            buf: Any = self.rbuf + bytes(data[pos:]) if had else data[pos:]
            if len(buf) < 5:
                self.rbuf = bytes(buf)
                break
            length = int.from_bytes(buf[1:5], "big")
            span = buf[5 : 5 + length]
            found = response_head(span)
            if found is None and len(buf) - 5 < length and len(buf) < 4096:
                self.rbuf = bytes(buf)
                break
            avail = min(len(buf), 5 + length)
            if found is None or found == (0, 0) or not self.public_field:
                out.append(buf[:avail])
            else:
                delta = len(self.public_field) - found[1]
                out.append(grpc_prefix(length + delta) + self.public_field)
                if avail > 5 + found[1]:
                    out.append(buf[5 + found[1] : avail])
            self.rleft = 5 + length - avail
            pos += avail - had
            self.rbuf = b""
        self.owed_up += n
        sent = not self.fst.pending  # nothing queued toward the client: what was owed has left
        if out:
            if len(out) > 1 and sum(len(p) for p in out) < JOIN_BELOW:
                out = [b"".join(out)]
            for piece in out:
                sent = self.front.send_data(self.fst, piece)
        if sent:
            self.client_window()

    def _whole_answers(self, final: bool) -> None:
        """Answers held whole: a stream's (renamed as each completes), ModelConfig's, ModelStatistics'."""
        whole = self.whole or []
        data = whole[0] if len(whole) == 1 else b"".join(whole)
        pos, out = 0, []
        while len(data) - pos >= 5:
            length = int.from_bytes(data[pos + 1 : pos + 5], "big")
            if len(data) - pos - 5 < length:
                break
            body = data[pos + 5 : pos + 5 + length]
            if data[pos] != 0:
                self.refuse(g.INTERNAL, b"tritonserver sent a compressed answer", "unavailable")
                return
            pos += 5 + length
            try:
                body = self._stream_answer(body) if self.kind == g.STREAM else self.gw.meta_answer(self, body)
            except (WireError, ValueError, DecodeError) as exc:
                self.refuse(g.INTERNAL, f"the gateway could not read tritonserver's answer: {exc}".encode(),
                            "unavailable")
                return
            out.append(grpc_prefix(len(body)) + body)
        self.whole = [data[pos:]] if pos < len(data) else None
        if final and self.whole is not None:
            self.refuse(g.INTERNAL, b"tritonserver's answer ends inside a message", "unavailable")
            return
        for piece in out:
            self.front.send_data(self.fst, piece)
        if not self.fst.pending:
            self.client_window()

    def _stream_answer(self, body: bytes) -> bytes:
        error = stream_error(body)
        if error and self.target is not None:
            self.target.slot.grpc.model += 1  # an error response counts as the model's failure
        return rename_stream_response(body)

    def up_reset(self, code: int) -> None:
        if self.done:
            return
        if code == f.REFUSED_STREAM and not self.resp_started:
            self.front.reset(self.fst, f.REFUSED_STREAM)
            self._end(g.UNAVAILABLE)
            return
        self.ust = None
        status = g.CANCELLED if code == f.CANCEL else g.INTERNAL
        self.refuse(status, b"tritonserver reset the call (HTTP/2 error %d)" % code,
                    "client" if status == g.CANCELLED else "unavailable")

    def up_refused(self) -> None:
        """tritonserver will not process this stream (GOAWAY): the client may retry it elsewhere."""
        self.ust = None
        if not self.done:
            self.front.reset(self.fst, f.REFUSED_STREAM)
            self._end(g.UNAVAILABLE)

    def up_lost(self, reason: str) -> None:
        self.ust = None
        self.early = None
        if not self.done:
            self.refuse(g.UNAVAILABLE, reason.encode(), "unavailable")
