"""One HTTP/2 connection as an asyncio Protocol: framing, settings, flow control, PING, GOAWAY, RST_STREAM.

Both of the gateway's HTTP/2 sides build on `H2Connection`: toward clients it is the server
(grpcfront.py), toward tritonserver the client (upstream.py). Each connection keeps its own HPACK
decoder (the peer's table) and encodes with frames.py (no table of ours), its own stream ids, its own
SETTINGS, and both flow-control directions:

- receiving: the peer may send within the windows we grant; DATA it sends is *credited back*
  (WINDOW_UPDATE) only when the relay says it was consumed (`consumed`), that is handed on to the
  other side. So a side that cannot send on (the other peer's windows are shut) stops granting, and
  its peer stops sending: backpressure both ways, memory bounded by the windows.
- sending: DATA goes out within the peer's connection and stream windows and its MAX_FRAME_SIZE; the
  rest waits in the stream's queue and leaves when WINDOW_UPDATE (or a larger INITIAL_WINDOW_SIZE)
  opens the window. Trailers queued behind data leave after it.

Frames queued on any connection are written once per event loop callback: `queue` marks the connection
dirty and `flush_dirty` (called at the end of every data_received) writes each dirty connection's
frames with one `writelines`. A peer that breaks the protocol gets GOAWAY and its connection closes;
nothing it sends can raise out of `data_received` (an unexpected exception is logged and closes only
that connection).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from controlplane.gateway import frames as f
from controlplane.gateway.h2send import H2Sender
from controlplane.gateway.h2state import HeaderDecoder, Limits, Stream, flush_dirty

log = logging.getLogger("tritonctl.gateway")

_unpack_header = f.FRAME_HEADER.unpack_from
_frame_header = f.frame_header
_DATA, _HEADERS, _CONTINUATION, _WINDOW_UPDATE = f.DATA, f.HEADERS, f.CONTINUATION, f.WINDOW_UPDATE
_END_STREAM = f.FLAG_END_STREAM
_PLAIN_HEADERS = f.FLAG_END_HEADERS | f.FLAG_PADDED | f.FLAG_PRIORITY  # a whole block, nothing to strip
_SLICE_BELOW = 64 << 10  # DATA payloads smaller than this are copied out as bytes; larger ones are views
_PARTIAL_MIN = 4096  # a DATA frame at least this large is passed on as its bytes arrive
_u32 = f._U32.unpack_from

class H2Connection(H2Sender, asyncio.Protocol):
    """The shared machinery; subclasses implement the `on_*` hooks and `make_head`."""

    client_side = False  # True on the connection toward tritonserver (we sent the preface)

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, Stream] = {}
        self.out: list[Any] = []
        self.decoder = HeaderDecoder(limits, self.make_head)
        self.peer_max_frame = f.DEFAULT_MAX_FRAME
        self.peer_initial_window = f.DEFAULT_WINDOW
        self.peer_max_streams = 2**31
        self.send_window = f.DEFAULT_WINDOW
        self.recv_window = f.DEFAULT_WINDOW  # raised to limits.conn_window by our first WINDOW_UPDATE
        self.conn_unacked = 0
        self.blocked: dict[int, Stream] = {}  # streams with data waiting for the connection window
        self.table_update_due = False
        self.closed = False
        self.goaway_sent = False
        self.peer_goaway: int | None = None  # last stream id the peer will process, once it sent GOAWAY
        self.last_peer_sid = 0
        self._preface_left = 0 if self.client_side else len(f.PREFACE)
        self._hb: list[Any] | None = None  # a header block still waiting for CONTINUATION
        self._rest = b""  # the start of a frame cut by the end of the last read
        self._data_left = 0  # bytes still to come of a large DATA frame delivered as it arrives
        self._data_st: Stream | None = None
        self._data_end = False

    # -- hooks ------------------------------------------------------------------------------------

    def make_head(self, headers: list[tuple[bytes, bytes]]) -> Any:
        return headers

    def on_headers(self, sid: int, head: Any, end_stream: bool) -> None:
        raise NotImplementedError

    def on_data(self, st: Stream, payload: Any, end_stream: bool) -> None:
        raise NotImplementedError

    def on_reset(self, st: Stream, code: int) -> None:
        """The peer reset the stream (it is already removed)."""

    def on_goaway(self, last_sid: int, code: int) -> None:
        """The peer will process no stream above `last_sid`."""

    def on_lost(self) -> None:
        """The connection is gone: end every stream's call."""

    # -- asyncio.Protocol ---------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        limits = self.limits
        settings = {f.S_MAX_CONCURRENT_STREAMS: limits.max_streams, f.S_INITIAL_WINDOW_SIZE: limits.stream_window,
                    f.S_MAX_FRAME_SIZE: limits.max_frame, f.S_MAX_HEADER_LIST_SIZE: limits.max_header_list,
                    f.S_HEADER_TABLE_SIZE: limits.header_table}
        if self.client_side:
            settings[f.S_ENABLE_PUSH] = 0
            self.out.append(f.PREFACE)
        self.out.append(f.settings_frame(settings))
        grow = self.limits.conn_window - f.DEFAULT_WINDOW
        if grow > 0:
            self.out.append(f.window_update(0, grow))
            self.recv_window += grow
        self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.transport = None
        try:
            self.on_lost()
        except Exception:  # noqa: BLE001 - one connection's end must not stop the process
            log.exception("gateway: error while closing a connection")
        self.streams.clear()
        self.blocked.clear()
        flush_dirty()

    def data_received(self, data: bytes) -> None:
        try:
            if self._preface_left:
                data = self._check_preface(data)
            n = len(data)
            pos = 0
            while pos < n and not self.closed:
                if self._data_left:
                    pos = self._continue_data(data, pos)
                elif self._rest:
                    pos = self._complete_rest(data, pos)
                else:
                    pos = self._frames(data, pos)
        except f.ProtocolError as exc:
            self.fail(exc.code, str(exc))
        except Exception:  # noqa: BLE001 - a bug must cost this connection only, never the process
            log.exception("gateway: internal error on a connection; closing it")
            self.fail(f.INTERNAL_ERROR, "internal error")
        flush_dirty()  # this connection among them: whatever queued output registered it

    def _continue_data(self, data: bytes, pos: int) -> int:
        """More of a large DATA frame: pass it on as it comes (no frame is ever copied whole)."""
        take = min(self._data_left, len(data) - pos)
        part: Any = data if pos == 0 and take == len(data) else memoryview(data)[pos : pos + take]
        self._data_left -= take
        st = self._data_st
        if st is None or st.sid not in self.streams or st.remote_closed:
            self.consumed(None, take)
        else:
            last = not self._data_left and self._data_end
            if last:
                st.remote_closed = True
            self.on_data(st, part, last)
        if not self._data_left:
            self._data_st = None
        return pos + take

    def _complete_rest(self, data: bytes, pos: int) -> int:
        """Add to a frame cut by the last read just the bytes it lacks, then handle it."""
        rest = self._rest
        n = len(data)
        if len(rest) < 9:
            take = min(9 - len(rest), n - pos)
            rest += data[pos : pos + take]
            pos += take
            if len(rest) < 9:
                self._rest = rest
                return pos
        length = (rest[0] << 16) | (rest[1] << 8) | rest[2]
        self._check_length(length, rest[3])
        if rest[3] == _DATA and not rest[4] & f.FLAG_PADDED and length >= _PARTIAL_MIN:
            self._rest = b""
            self._frames(rest, 0)  # its header, and the start of its payload: delivered as they are
            return pos
        take = min(9 + length - len(rest), n - pos)
        rest += data[pos : pos + take]
        pos += take
        if len(rest) < 9 + length:
            self._rest = rest
            return pos
        self._rest = b""
        self._frames(rest, 0)
        return pos

    def _check_length(self, length: int, ftype: int) -> None:
        if length > self.limits.max_frame:
            raise f.ProtocolError(f"frame of {length} bytes over our MAX_FRAME_SIZE {self.limits.max_frame}",
                                  f.FRAME_SIZE_ERROR)
        if ftype != _DATA and length > self.limits.max_header_block + 16:
            raise f.ProtocolError(f"a frame of type {ftype} and {length} bytes", f.ENHANCE_YOUR_CALM
                                  if ftype in (_HEADERS, _CONTINUATION) else f.FRAME_SIZE_ERROR)

    def _check_preface(self, data: bytes) -> bytes:
        done = len(f.PREFACE) - self._preface_left
        take = data[: self._preface_left]
        if take != f.PREFACE[done : done + len(take)]:
            raise f.ProtocolError("not an HTTP/2 connection preface")
        self._preface_left -= len(take)
        return data[len(take) :]

    def _frames(self, data: bytes, pos: int) -> int:
        """Handle every whole frame from `pos`; keep a cut one for the next read. Returns len(data)."""
        n = len(data)
        view: memoryview | None = None
        max_frame = self.limits.max_frame
        streams = self.streams
        cache = self.decoder.cache
        while n - pos >= 9:
            hi, lo, ftype, flags, sid = _unpack_header(data, pos)
            length = (hi << 8) | lo
            if length > max_frame:
                self._check_length(length, ftype)
            end = pos + 9 + length
            if end > n:
                if ftype == _DATA and length >= _PARTIAL_MIN and not flags & f.FLAG_PADDED:
                    self._partial_data(data, pos, length, flags, sid & 0x7FFFFFFF)
                    return n
                break
            sid &= 0x7FFFFFFF
            if self._hb is not None and ftype != _CONTINUATION:
                raise f.ProtocolError("a frame inside a header block")
            # the common frames first, inline: DATA, a whole HEADERS block, a stream's WINDOW_UPDATE
            if ftype == _DATA:
                if length < _SLICE_BELOW:
                    payload: Any = data[pos + 9 : end]
                else:
                    if view is None:
                        view = memoryview(data)
                    payload = view[pos + 9 : end]
                st = streams.get(sid)
                if flags & f.FLAG_PADDED or st is None or st.remote_closed or st.recv_window < length:
                    self._on_data_frame(flags, sid, payload, length)
                else:
                    self.recv_window -= length
                    if self.recv_window < 0:
                        raise f.ProtocolError("DATA beyond the connection window", f.FLOW_CONTROL_ERROR)
                    st.recv_window -= length
                    if flags & _END_STREAM:
                        st.remote_closed = True
                        self.on_data(st, payload, True)
                    else:
                        self.on_data(st, payload, False)
            elif ftype == _HEADERS and flags & _PLAIN_HEADERS == f.FLAG_END_HEADERS and sid:
                block = data[pos + 9 : end]
                head = cache.get(block)
                if head is None:
                    if length > self.limits.max_header_block:
                        raise f.ProtocolError(f"header block over {self.limits.max_header_block} bytes",
                                              f.ENHANCE_YOUR_CALM)
                    head = self.decoder.decode(block)
                self.on_headers(sid, head, bool(flags & _END_STREAM))
            elif ftype == _HEADERS or ftype == _CONTINUATION:
                self._on_header_frame(ftype, flags, sid, data[pos + 9 : end])
            elif ftype == _WINDOW_UPDATE and length == 4:
                increment = _u32(data, pos + 9)[0] & 0x7FFFFFFF
                if sid:
                    st = streams.get(sid)
                    if st is not None and increment and not st.pending and st.pending_trailers is None:
                        st.send_window += increment
                        if st.send_window > f.MAX_WINDOW:
                            self.reset(st, f.FLOW_CONTROL_ERROR)
                        pos = end
                        continue
                elif increment and not self.blocked and self.send_window + increment <= f.MAX_WINDOW:
                    self.send_window += increment
                    pos = end
                    continue
                self._window_update(sid, increment)
            else:
                self._on_control_frame(ftype, flags, sid, data[pos + 9 : end])
            pos = end
            if self.closed:
                return n
        if pos < n:
            if n - pos >= 9:
                self._check_length((data[pos] << 16) | (data[pos + 1] << 8) | data[pos + 2], data[pos + 3])
            self._rest = data[pos:]
        return n

    def _partial_data(self, data: bytes, pos: int, length: int, flags: int, sid: int) -> None:
        """A large DATA frame whose payload is not all here: account for all of it now, pass on what came."""
        if self._hb is not None:
            raise f.ProtocolError("a frame inside a header block")
        if sid == 0:
            raise f.ProtocolError("DATA on stream 0")
        self.recv_window -= length
        if self.recv_window < 0:
            raise f.ProtocolError("DATA beyond the connection window", f.FLOW_CONTROL_ERROR)
        st = self.streams.get(sid)
        have = len(data) - pos - 9
        self._data_left = length - have
        self._data_end = bool(flags & _END_STREAM)
        if st is None or st.remote_closed:
            if sid > self.last_peer_sid and not (self.client_side and sid % 2):
                raise f.ProtocolError(f"DATA on idle stream {sid}")
            self._data_st = None
            self.consumed(None, have)
            return
        st.recv_window -= length
        if st.recv_window < 0:
            self.reset(st, f.FLOW_CONTROL_ERROR)
            self._data_st = None
            self.consumed(None, have)
            return
        self._data_st = st
        if have:
            self.on_data(st, memoryview(data)[pos + 9 :], False)

    # -- receiving ------------------------------------------------------------------------------------

    def _on_data_frame(self, flags: int, sid: int, payload: Any, length: int) -> None:
        if sid == 0:
            raise f.ProtocolError("DATA on stream 0")
        self.recv_window -= length
        if self.recv_window < 0:
            raise f.ProtocolError("DATA beyond the connection window", f.FLOW_CONTROL_ERROR)
        st = self.streams.get(sid)
        padding = 0
        if flags & f.FLAG_PADDED:
            if length < 1 or payload[0] >= length:
                raise f.ProtocolError("DATA padding longer than the frame")
            padding = payload[0] + 1
            payload = payload[1 : length - payload[0]]
        if st is None or st.remote_closed:
            if sid > self.last_peer_sid and not (self.client_side and sid % 2):
                raise f.ProtocolError(f"DATA on idle stream {sid}")
            self.consumed(None, length)  # a stream already closed: its bytes still count for the connection
            return
        st.recv_window -= length
        if st.recv_window < 0:
            self.reset(st, f.FLOW_CONTROL_ERROR)
            self.consumed(None, length)
            return
        if padding:
            self.consumed(st, padding)
        end = bool(flags & _END_STREAM)
        if end:
            st.remote_closed = True
        self.on_data(st, payload, end)

    def _on_header_frame(self, ftype: int, flags: int, sid: int, payload: bytes) -> None:
        if sid == 0:
            raise f.ProtocolError("HEADERS on stream 0")
        if ftype == _CONTINUATION:
            hb = self._hb
            if hb is None or hb[0] != sid:
                raise f.ProtocolError("CONTINUATION without its HEADERS")
            hb[2].append(payload)
            hb[3] += len(payload)
            if hb[3] > self.limits.max_header_block:
                raise f.ProtocolError(f"header block over {self.limits.max_header_block} bytes", f.ENHANCE_YOUR_CALM)
            if flags & f.FLAG_END_HEADERS:
                self._hb = None
                self._header_block(sid, hb[1], b"".join(hb[2]))
            return
        if flags & f.FLAG_PADDED:
            if not payload or payload[0] >= len(payload):
                raise f.ProtocolError("HEADERS padding longer than the frame")
            payload = payload[1 : len(payload) - payload[0]]
        if flags & f.FLAG_PRIORITY:
            if len(payload) < 5:
                raise f.ProtocolError("HEADERS priority fields cut short", f.FRAME_SIZE_ERROR)
            payload = payload[5:]
        if len(payload) > self.limits.max_header_block:
            raise f.ProtocolError(f"header block over {self.limits.max_header_block} bytes", f.ENHANCE_YOUR_CALM)
        if flags & f.FLAG_END_HEADERS:
            self._header_block(sid, flags, payload)
        else:
            self._hb = [sid, flags, [payload], len(payload)]

    def _header_block(self, sid: int, flags: int, block: bytes) -> None:
        head = self.decoder.decode(block)  # always: the peer's table must stay in step even for a refused stream
        self.on_headers(sid, head, bool(flags & _END_STREAM))

    def _on_control_frame(self, ftype: int, flags: int, sid: int, payload: bytes) -> None:
        if ftype == f.SETTINGS:
            if sid:
                raise f.ProtocolError("SETTINGS on a stream")
            if flags & f.FLAG_ACK:
                if payload:
                    raise f.ProtocolError("SETTINGS ACK with a payload", f.FRAME_SIZE_ERROR)
                return
            self._apply_settings(f.parse_settings(payload))
            self.queue(f.SETTINGS_ACK)
        elif ftype == f.WINDOW_UPDATE:
            if len(payload) != 4:
                raise f.ProtocolError("WINDOW_UPDATE of the wrong size", f.FRAME_SIZE_ERROR)
            self._window_update(sid, f.u32(payload) & 0x7FFFFFFF)
        elif ftype == f.PING:
            if len(payload) != 8 or sid:
                raise f.ProtocolError("malformed PING", f.FRAME_SIZE_ERROR)
            if not flags & f.FLAG_ACK:
                self.queue(f.frame(f.PING, f.FLAG_ACK, 0, payload))
        elif ftype == f.RST_STREAM:
            if len(payload) != 4 or not sid:
                raise f.ProtocolError("malformed RST_STREAM", f.FRAME_SIZE_ERROR)
            st = self.streams.pop(sid, None)
            if st is not None:
                self.blocked.pop(sid, None)
                st.remote_closed = st.local_closed = True
                self.on_reset(st, f.u32(payload))
            elif sid > self.last_peer_sid and not (self.client_side and sid % 2):
                raise f.ProtocolError(f"RST_STREAM on idle stream {sid}")
        elif ftype == f.GOAWAY:
            if len(payload) < 8 or sid:
                raise f.ProtocolError("malformed GOAWAY", f.FRAME_SIZE_ERROR)
            last, code = f.u32(payload) & 0x7FFFFFFF, f.u32(payload, 4)
            self.peer_goaway = last if self.peer_goaway is None else min(last, self.peer_goaway)
            self.on_goaway(last, code)
        elif ftype == f.PRIORITY:
            if len(payload) != 5:
                raise f.ProtocolError("PRIORITY of the wrong size", f.FRAME_SIZE_ERROR)
        elif ftype == f.PUSH_PROMISE:
            raise f.ProtocolError("PUSH_PROMISE (push is disabled)")
        # unknown frame types are ignored (RFC 9113 §4.1)

    def _apply_settings(self, values: list[tuple[int, int]]) -> None:
        for key, value in values:
            if key == f.S_INITIAL_WINDOW_SIZE:
                if value > f.MAX_WINDOW:
                    raise f.ProtocolError("INITIAL_WINDOW_SIZE above 2^31-1", f.FLOW_CONTROL_ERROR)
                delta = value - self.peer_initial_window
                self.peer_initial_window = value
                for st in list(self.streams.values()):
                    st.send_window += delta
                    if delta > 0 and st.pending:
                        self.drain(st)
            elif key == f.S_MAX_FRAME_SIZE:
                if not f.DEFAULT_MAX_FRAME <= value <= 16_777_215:
                    raise f.ProtocolError(f"MAX_FRAME_SIZE {value} out of range")
                self.peer_max_frame = value
            elif key == f.S_MAX_CONCURRENT_STREAMS:
                self.peer_max_streams = value
            elif key == f.S_HEADER_TABLE_SIZE:
                self.table_update_due = True
            elif key == f.S_ENABLE_PUSH and value > 1:
                raise f.ProtocolError("ENABLE_PUSH neither 0 nor 1")
