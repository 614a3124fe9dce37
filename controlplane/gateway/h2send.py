"""The sending half of an HTTP/2 connection: windows, DATA within them, header blocks, resets, GOAWAY.

DATA leaves within the peer's connection and stream windows and its MAX_FRAME_SIZE; what does not fit
waits in the stream's queue until WINDOW_UPDATE (or a larger INITIAL_WINDOW_SIZE) opens the window, and
trailers queued behind data leave after it. Bytes received are granted again (`consumed`) only once
the relay handed them on. `H2Sender` is a mixin of h2.H2Connection, which owns the attributes.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from controlplane.gateway import frames as f
from controlplane.gateway.h2state import DIRTY, Limits, Stream

log = logging.getLogger("tritonctl.gateway")
_frame_header = f.frame_header
_pack = f.FRAME_HEADER.pack  # (length >> 8, length & 0xFF, type, flags, stream id): inline on the hot paths
_END_HEADERS = f.FLAG_END_HEADERS
_DATA, _HEADERS = f.DATA, f.HEADERS
_END_STREAM = f.FLAG_END_STREAM


class H2Sender:
    limits: Limits
    transport: asyncio.Transport | None
    streams: dict[int, Stream]
    out: list[Any]
    peer_max_frame: int
    peer_initial_window: int
    send_window: int
    recv_window: int
    conn_unacked: int
    blocked: dict[int, Stream]
    table_update_due: bool
    closed: bool
    goaway_sent: bool
    last_peer_sid: int

    def on_window(self, st: Stream) -> None:
        """The stream's queued data all left: a relay may credit the other side."""

    def _window_update(self, sid: int, increment: int) -> None:
        if sid == 0:
            if increment == 0:
                raise f.ProtocolError("WINDOW_UPDATE of 0 on the connection")
            self.send_window += increment
            if self.send_window > f.MAX_WINDOW:
                raise f.ProtocolError("connection window above 2^31-1", f.FLOW_CONTROL_ERROR)
            if self.blocked:
                waiting = list(self.blocked.values())
                self.blocked.clear()
                for st in waiting:
                    if self.send_window <= 0:
                        self.blocked[st.sid] = st
                    else:
                        self.drain(st)
            return
        found = self.streams.get(sid)
        if found is None:
            return
        st = found
        if increment == 0:
            self.reset(st, f.PROTOCOL_ERROR)
            return
        st.send_window += increment
        if st.send_window > f.MAX_WINDOW:
            self.reset(st, f.FLOW_CONTROL_ERROR)
            return
        if st.pending or st.pending_trailers is not None:
            self.drain(st)

    def consumed(self, st: Stream | None, n: int) -> None:
        """`n` received bytes left the gateway (or were dropped): grant them again to the peer."""
        if self.closed or n <= 0:
            return
        self.conn_unacked += n
        if self.conn_unacked >= self.limits.conn_window >> 2:
            self.queue(f.window_update(0, self.conn_unacked))
            self.recv_window += self.conn_unacked
            self.conn_unacked = 0
        if st is not None and not st.remote_closed:
            st.unacked += n
            if st.unacked >= self.limits.stream_window >> 2:
                self.queue(f.window_update(st.sid, st.unacked))
                st.recv_window += st.unacked
                st.unacked = 0

    # -- sending ------------------------------------------------------------------------------------

    def queue(self, *pieces: Any) -> None:
        if not self.out:
            DIRTY.append(self)
        self.out.extend(pieces)

    def flush(self) -> None:
        if self.out:
            out, self.out = self.out, []
            if self.transport is not None and not self.closed:
                if len(out) <= 8 and sum(map(len, out)) < 65536:  # a few small frames: uvloop's direct write
                    self.transport.write(b"".join(out))
                else:
                    self.transport.writelines(out)

    def header_block(self, block: bytes) -> bytes:
        if self.table_update_due:
            self.table_update_due = False
            return f.TABLE_SIZE_ZERO + block
        return block

    def send_headers(self, st: Stream, block: bytes, end_stream: bool = False) -> None:
        """A header block (already encoded) on `st`; trailers wait behind queued data."""
        if st.local_closed:
            return
        if not st.pending and not self.table_update_due and len(block) <= self.peer_max_frame:
            if not self.out:
                DIRTY.append(self)
            if end_stream:
                size = len(block)
                self.out += (_pack(size >> 8, size & 0xFF, _HEADERS, _END_STREAM | _END_HEADERS, st.sid), block)
                st.local_closed = True
                if st.remote_closed:
                    self.streams.pop(st.sid, None)
            else:
                size = len(block)
                self.out += (_pack(size >> 8, size & 0xFF, _HEADERS, _END_HEADERS, st.sid), block)
            return
        if end_stream and st.pending:
            st.pending_trailers = [block]
            st.local_closed = True
            return
        if end_stream:
            st.local_closed = True
        block = self.header_block(block)
        if len(block) <= self.peer_max_frame:
            flags = (_END_STREAM | f.FLAG_END_HEADERS) if end_stream else f.FLAG_END_HEADERS
            self.queue(_frame_header(len(block), _HEADERS, flags, st.sid), block)
        else:
            self.queue(*f.header_frames(st.sid, block, end_stream, self.peer_max_frame))
        if end_stream:
            self._maybe_close(st)

    def send_data(self, st: Stream, data: Any, end_stream: bool = False) -> bool:
        """DATA on `st` within the windows; what does not fit waits for WINDOW_UPDATE. True when all of it
        left now (the caller credits its source at once); otherwise `on_window` says when it has."""
        if st.local_closed:
            return True
        n = len(data)
        if not st.pending and n <= self.send_window and n <= st.send_window and n <= self.peer_max_frame:
            self.send_window -= n
            st.send_window -= n
            if not self.out:
                DIRTY.append(self)
            if end_stream:
                self.out += (_pack(n >> 8, n & 0xFF, _DATA, _END_STREAM, st.sid), data) if n else \
                    (_frame_header(0, _DATA, _END_STREAM, st.sid),)
                st.local_closed = True
                self._maybe_close(st)
            elif n:
                self.out += (_pack(n >> 8, n & 0xFF, _DATA, 0, st.sid), data)
            return True
        if n:
            st.pending.append(data)
        if end_stream:
            st.pending_end = True
            st.local_closed = True
        self.drain(st)
        return not st.pending

    def drain(self, st: Stream) -> None:
        """Send what `st` has queued as far as the windows allow."""
        max_frame = self.peer_max_frame
        pending = st.pending
        while pending:
            room = min(self.send_window, st.send_window, max_frame)
            if room <= 0:
                if self.send_window <= 0:
                    self.blocked[st.sid] = st
                return
            piece = pending[0]
            if len(piece) <= room:
                pending.pop(0)
                n = len(piece)
            else:
                if not isinstance(piece, memoryview):
                    piece = memoryview(piece)
                pending[0] = piece[room:]
                piece = piece[:room]
                n = room
            self.send_window -= n
            st.send_window -= n
            last = not pending and st.pending_end and st.pending_trailers is None
            if last:
                st.pending_end = False
            self.queue(_frame_header(n, _DATA, _END_STREAM if last else 0, st.sid), piece)
        if st.pending_trailers is not None:
            block = self.header_block(b"".join(st.pending_trailers))
            st.pending_trailers = None
            self.queue(*f.header_frames(st.sid, block, True, max_frame))
        elif st.pending_end:
            st.pending_end = False
            self.queue(_frame_header(0, _DATA, _END_STREAM, st.sid))
        self._maybe_close(st)
        if not pending:  # all of it left: its source may be credited now, not before
            self.on_window(st)

    def _maybe_close(self, st: Stream) -> None:
        if st.local_closed and st.remote_closed and not st.pending and st.pending_trailers is None:
            self.streams.pop(st.sid, None)
            self.blocked.pop(st.sid, None)

    def open_stream(self, sid: int, call: Any) -> Stream:
        st = Stream(sid, self.peer_initial_window, self.limits.stream_window, call)
        self.streams[sid] = st
        return st

    def forget(self, st: Stream) -> None:
        """Drop a stream from the tables (both directions over, or reset)."""
        self.streams.pop(st.sid, None)
        self.blocked.pop(st.sid, None)

    def reset(self, st: Stream, code: int) -> None:
        """RST_STREAM to the peer; the stream is forgotten (its unread bytes credited)."""
        if st.sid in self.streams:
            self.forget(st)
            st.pending.clear()
            st.pending_trailers = None
            st.local_closed = st.remote_closed = True
            if not self.closed:
                self.queue(f.rst_stream(st.sid, code))

    def fail(self, code: int, message: str) -> None:
        """Connection error: GOAWAY with `message` as debug data, then close."""
        if self.closed:
            return
        log.info("gateway: closing an HTTP/2 connection: %s", message)
        self.out.clear()
        self.queue(f.goaway(self.last_peer_sid, code, message.encode("utf-8", "replace")))
        self.goaway_sent = True
        self.flush()
        if self.transport is not None:
            self.transport.close()
        self.closed = True

    def send_goaway(self, code: int = f.NO_ERROR) -> None:
        """A graceful GOAWAY: the peer opens no new stream; those open finish."""
        if not self.closed and not self.goaway_sent:
            self.goaway_sent = True
            self.queue(f.goaway(self.last_peer_sid, code))
