"""The gateway's HTTP/2 connections to tritonserver's gRPC port, shared by every client.

A few connections (`size`, opened on demand) carry all clients' calls multiplexed, each call one
stream. A call picks a connection round-robin among those with room under tritonserver's
MAX_CONCURRENT_STREAMS; when none has room, or none is connected yet, the call waits in the pool's
queue and starts when a stream frees or a connection comes up. A connection that receives GOAWAY takes
no new stream; the streams above its last id were never processed, so their calls are answered with
RST_STREAM(REFUSED_STREAM), which gRPC clients retry by themselves. A lost connection ends its calls
with UNAVAILABLE. tritonserver unreachable: the waiting calls get UNAVAILABLE naming the address.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections import deque
from typing import Any

from controlplane.gateway import frames as f
from controlplane.gateway.grpcwire import ResponseHead
from controlplane.gateway.h2 import H2Connection
from controlplane.gateway.h2state import DIRTY, Limits, Stream, flush_dirty

log = logging.getLogger("tritonctl.gateway")
_pack = f.FRAME_HEADER.pack
GROW_AT = 64  # open another connection (up to `size`) once every open one carries this many streams
LAST_SID = 2**31 - 64


def nodelay(transport: asyncio.BaseTransport) -> None:
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass


class UpstreamConnection(H2Connection):
    client_side = True

    def __init__(self, pool: UpstreamPool) -> None:
        super().__init__(pool.limits)
        self.pool = pool
        self.next_sid = 1
        self.ready = False

    def make_head(self, headers: list[tuple[bytes, bytes]]) -> Any:
        return ResponseHead(headers)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        nodelay(transport)
        super().connection_made(transport)
        self.ready = True

    def has_room(self) -> bool:
        return (self.ready and not self.closed and self.peer_goaway is None and not self.goaway_sent
                and len(self.streams) < self.peer_max_streams and self.next_sid < LAST_SID)

    def start(self, call: Any, block: bytes, data: Any, end_stream: bool) -> tuple[Stream, bool]:
        """Open a stream for `call`: its header block and, when given, its first DATA (END_STREAM with
        `end_stream`). Returns the stream and whether the DATA left at once."""
        sid = self.next_sid
        self.next_sid += 2
        st = Stream(sid, self.peer_initial_window, self.limits.stream_window, call)
        self.streams[sid] = st
        if data is None:
            self.send_headers(st, block, end_stream)
            return st, True
        n = len(data)
        if n <= self.send_window and n <= st.send_window and n <= self.peer_max_frame and \
                len(block) <= self.peer_max_frame and not self.table_update_due:
            self.send_window -= n
            st.send_window -= n
            if not self.out:
                DIRTY.append(self)
            size = len(block)
            self.out += (_pack(size >> 8, size & 0xFF, f.HEADERS, f.FLAG_END_HEADERS, sid), block,
                         _pack(n >> 8, n & 0xFF, f.DATA, f.FLAG_END_STREAM if end_stream else 0, sid), data)
            if end_stream:
                st.local_closed = True
            return st, True
        self.send_headers(st, block)
        return st, self.send_data(st, data, end_stream)

    def on_headers(self, sid: int, head: Any, end_stream: bool) -> None:
        st = self.streams.get(sid)
        if st is None:
            if sid % 2 == 0 or sid >= self.next_sid:
                raise f.ProtocolError(f"HEADERS on stream {sid} we never opened")
            return  # a stream we reset meanwhile
        if end_stream:
            st.remote_closed = True
        st.call.up_headers(head, end_stream)
        if end_stream:
            self._ended(st)

    def on_data(self, st: Stream, payload: Any, end_stream: bool) -> None:
        st.call.up_data(payload, end_stream)
        if end_stream:
            self._ended(st)

    def on_reset(self, st: Stream, code: int) -> None:
        st.call.up_reset(code)
        self.pool.freed()
        self._retire_if_done()

    def on_window(self, st: Stream) -> None:
        call = st.call
        if call is not None:
            call.up_window()

    def on_goaway(self, last_sid: int, code: int) -> None:
        log.info("gateway: tritonserver sent GOAWAY (last stream %d, code %d)", last_sid, code)
        for st in [s for s in self.streams.values() if s.sid > last_sid]:
            self.forget(st)
            st.call.up_refused()
        self.pool.lost(self, keep=bool(self.streams))

    def _ended(self, st: Stream) -> None:
        """tritonserver ended `st`: forget it once ours ended too; a waiting call may take its place."""
        if st.local_closed and not st.pending and st.pending_trailers is None:
            self.streams.pop(st.sid, None)
            self.blocked.pop(st.sid, None)
        if self.pool.waiting:
            self.pool.freed()
        if not self.ready:
            self._retire_if_done()

    def _retire_if_done(self) -> None:
        """A connection out of the pool (GOAWAY) closes once its last stream ended."""
        if not self.ready and not self.streams and self.transport is not None and not self.closed:
            self.send_goaway()
            self.flush()
            self.transport.close()

    def on_lost(self) -> None:
        self.ready = False
        self.pool.lost(self)
        for st in list(self.streams.values()):
            st.call.up_lost("the connection to tritonserver was lost")

    def release(self, st: Stream) -> None:
        """The call is over on our side: cancel the stream if tritonserver has not ended it."""
        if st.sid in self.streams:  # (usually gone already: both sides ended)
            if st.remote_closed and st.local_closed:
                self.forget(st)
            else:
                self.reset(st, f.CANCEL)
            self.pool.freed()
            self._retire_if_done()


class UpstreamPool:
    def __init__(self, host: str, port: int, size: int, limits: Limits) -> None:
        self.host, self.port, self.size, self.limits = host, port, size, limits
        self.address = f"{host}:{port}"
        self.conns: list[UpstreamConnection] = []
        self.waiting: deque[Any] = deque()
        self.connecting = 0
        self._rr = 0
        self._tasks: set[asyncio.Task[None]] = set()

    def pick(self) -> UpstreamConnection | None:
        """A connection with room for one more stream, or None (then `wait`)."""
        conns = self.conns
        n = len(conns)
        if n == 1:
            conn = conns[0]
            if conn.has_room():
                if len(conn.streams) >= GROW_AT and n < self.size and not self.connecting:
                    self._connect()
                return conn
        elif n:
            for _ in range(n):
                self._rr = (self._rr + 1) % n
                conn = conns[self._rr]
                if conn.has_room():
                    if len(conn.streams) >= GROW_AT and n < self.size and not self.connecting:
                        self._connect()
                    return conn
        if not self.connecting and n < self.size:
            self._connect()
        return None

    def wait(self, call: Any) -> None:
        self.waiting.append(call)
        if not self.connecting and len(self.conns) < self.size:
            self._connect()

    def cancel(self, call: Any) -> None:
        try:
            self.waiting.remove(call)
        except ValueError:
            pass

    def freed(self) -> None:
        if self.waiting:
            self._serve_waiting()

    def _serve_waiting(self) -> None:
        while self.waiting:
            conn = self.pick()
            if conn is None:
                return
            self.waiting.popleft().upstream_ready(conn)

    def _connect(self) -> None:
        self.connecting += 1
        task = asyncio.get_running_loop().create_task(self._dial())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _dial(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, conn = await loop.create_connection(lambda: UpstreamConnection(self), self.host, self.port)
        except OSError as exc:
            self.connecting -= 1
            reason = exc.strerror or str(exc)
            waiting, self.waiting = self.waiting, deque()
            for call in waiting:
                call.up_lost(f"tritonserver at {self.address} is unreachable: {reason}")
            flush_dirty()
            return
        self.connecting -= 1
        self.conns.append(conn)
        self._serve_waiting()
        flush_dirty()

    def lost(self, conn: UpstreamConnection, keep: bool = False) -> None:
        """`conn` takes no new stream (GOAWAY, or closed): out of the pool, so a fresh one can open; with
        `keep` its open streams still finish on it (it closes once they have)."""
        conn.ready = False
        if conn in self.conns:
            self.conns.remove(conn)
        if not keep and conn.transport is not None and not conn.closed:
            conn.transport.close()
        if self.waiting and not self.connecting:
            self._connect()

    def close(self) -> None:
        for conn in list(self.conns):
            conn.send_goaway()
            conn.flush()
            if conn.transport is not None:
                conn.transport.close()
        self.conns.clear()
