"""The control API's connections: capped per listener, and closed when they send no whole request in time.

Why (issue 58, item 1): the token is checked only once a whole request has arrived, so connections that
send nothing cost an attacker nothing. Before this, uvicorn kept them open for ever: 1,100 idle TCP
connections used up a daemon's 1,024 file descriptors, both listeners stopped answering, captures failed
with "Too many open files", and asyncio's accept loop logged 2,048 tracebacks per turn.

Each listener's socket is a `GuardedListener`: every accepted connection is entered in its
`ConnectionTable` (before any TLS handshake, so a handshake never begun holds a place too), and leaves it
when asyncio closes it. Over the cap, the oldest idle connection (waiting for a request, nothing unread) is
closed to make room; one that is being answered, or whose request waits unread, never is; when none is
idle, the newcomer is closed at once. A connection must deliver a whole request (head and body) within
`REQUEST_TIMEOUT_S` of connecting or of its last answer, or it is closed (`sweep`, once a second). An accept
that fails for want of descriptors pauses that listener for a second, logged once a minute at most, without
a traceback.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
import socket
import time
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("tritonctl.api")

REQUEST_TIMEOUT_S = 10.0  # a whole request within this long of connecting, or of the last answer
MIN_CONNECTIONS, MAX_CONNECTIONS = 32, 1024  # per listener; between them an eighth of the file limit
ACCEPT_PAUSE_S = 1.0  # a listener whose accept failed for want of descriptors waits this long
REPORT_EVERY_S = 60.0  # closed and refused connections are summed up in one log line at most this often
RESOURCE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


def connection_cap() -> int:
    """Connections one listener keeps open: an eighth of the process's file limit (set at start,
    controlplane/runtime/process.py), at least MIN_CONNECTIONS, at most MAX_CONNECTIONS."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_CONNECTIONS
    return max(MIN_CONNECTIONS, min(MAX_CONNECTIONS, soft // 8))


@dataclass
class _Entry:
    conn: socket.socket
    waiting_since: float | None  # None: a whole request arrived and is being answered
    closing: bool = False


class ConnectionTable:
    """One listener's open connections (see the module docstring); used on its event loop's thread only."""

    def __init__(self, name: str, cap: int | None = None, request_timeout_s: float = REQUEST_TIMEOUT_S) -> None:
        self.name = name
        self.cap = cap if cap is not None else connection_cap()
        self.request_timeout_s = request_timeout_s
        self._entries: dict[int, _Entry] = {}  # by file descriptor
        self._paused_until = 0.0
        self._closed_idle = self._evicted = self._refused = 0
        self._counting_since = time.monotonic()
        self._reported_at = self._counting_since - REPORT_EVERY_S  # the first closing is logged at once

    def __len__(self) -> int:
        return sum(1 for e in self._entries.values() if not e.closing)

    def admit(self, conn: socket.socket) -> bool:
        """Enter a newly accepted connection; False (and `conn` closed) when every place is being answered."""
        if len(self) >= self.cap:
            idle = next((e for e in self._entries.values() if self._idle(e)), None)  # oldest first
            if idle is None:
                conn.close()
                self._refused += 1
                return False
            self._close(idle)
            self._evicted += 1
        self._entries[conn.fileno()] = _Entry(conn, time.monotonic())
        return True

    @staticmethod
    def _idle(entry: _Entry) -> bool:
        """Waiting for a request with nothing unread: a client that has sent its request (still in the
        kernel's buffer, not read by the event loop yet) is not idle, so a flood of new connections cannot
        push out one that connected and spoke a moment ago."""
        if entry.closing or entry.waiting_since is None:
            return False
        try:
            return not entry.conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)  # b"": the peer has gone
        except BlockingIOError:
            return True
        except OSError:
            return True

    def forget(self, conn: socket.socket) -> None:
        entry = self._entries.get(conn.fileno())
        if entry is not None and entry.conn is conn:
            del self._entries[conn.fileno()]

    def answering(self, fd: int, answering: bool) -> None:
        """A whole request arrived on `fd` (True), or its answer is complete and it waits again (False)."""
        entry = self._entries.get(fd)
        if entry is not None:
            entry.waiting_since = None if answering else time.monotonic()

    def sweep(self) -> None:
        """Close the connections that have waited over `request_timeout_s` for a whole request."""
        now = time.monotonic()
        for entry in list(self._entries.values()):
            waited = now - entry.waiting_since if entry.waiting_since is not None else 0.0
            if not entry.closing and waited > self.request_timeout_s:
                self._close(entry)
                self._closed_idle += 1
        if (self._closed_idle or self._evicted or self._refused) and now - self._reported_at >= REPORT_EVERY_S:
            self._report(now)

    def _report(self, now: float) -> None:
        """One line for what was closed since the last one (at most one a minute: a flood logs little)."""
        log.warning("control API (%s): in %.0f s, closed %d connections that sent no whole request within %g s and "
                    "%d idle ones to make room (at most %d open), refused %d while none was idle",
                    self.name, now - self._counting_since, self._closed_idle, self.request_timeout_s, self._evicted,
                    self.cap, self._refused)
        self._closed_idle = self._evicted = self._refused = 0
        self._counting_since = self._reported_at = now

    @staticmethod
    def _close(entry: _Entry) -> None:
        """Shut the connection down; its transport sees the end and closes it (and `forget`s it)."""
        entry.closing = True
        try:
            entry.conn.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def accept_failed(self, exc: OSError) -> bool:
        """An accept failed for want of descriptors or memory: True the first time in a pause (asyncio then
        stops this listener for a second), False while paused (asyncio just ends this turn)."""
        now = time.monotonic()
        if now < self._paused_until:
            return False
        self._paused_until = now + ACCEPT_PAUSE_S
        return True


class _GuardedConnection(socket.socket):
    """An accepted connection that leaves its table when closed."""

    table: ConnectionTable | None = None

    def close(self) -> None:
        if self.table is not None and self.fileno() != -1:
            self.table.forget(self)
        super().close()


class GuardedListener(socket.socket):
    """A listening socket whose `accept` (called by asyncio's accept loop) enters each connection in `table`."""

    table: ConnectionTable

    @classmethod
    def wrap(cls, sock: socket.socket, table: ConnectionTable) -> GuardedListener:
        guarded = cls(sock.family, sock.type, sock.proto, fileno=sock.detach())
        guarded.table = table
        return guarded

    def accept(self) -> tuple[socket.socket, Any]:
        try:
            fd, addr = self._accept()  # type: ignore[attr-defined]
        except OSError as exc:
            if exc.errno in RESOURCE_ERRNOS and not self.table.accept_failed(exc):
                raise BlockingIOError(errno.EAGAIN, "paused") from None  # asyncio ends this turn quietly
            raise
        conn = _GuardedConnection(self.family, self.type, self.proto, fileno=fd)
        if not self.table.admit(conn):
            raise ConnectionAbortedError(errno.ECONNABORTED, "over the connection cap")  # asyncio goes on
        conn.table = self.table
        return conn, addr


def quiet_exception_handler(name: str) -> Any:
    """An event loop exception handler that logs asyncio's accept failures as one line a minute at most,
    without a traceback, and anything else as asyncio would."""
    last = {"at": -REPORT_EVERY_S}

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in RESOURCE_ERRNOS:
            now = time.monotonic()
            if now - last["at"] >= REPORT_EVERY_S:
                last["at"] = now
                log.error("control API (%s): cannot accept connections: %s; pausing %g s at a time (logged once a "
                          "minute at most)", name, exc.strerror, ACCEPT_PAUSE_S)
            return
        loop.default_exception_handler(context)

    return handler


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol that tells its listener's table when a whole request has arrived and when
    its answer is complete. `table` is set on a subclass per listener (`guarded_protocol`)."""

    table: ConnectionTable
    _fd = -1

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        self._fd = sock.fileno() if sock is not None else -1

    def handle_events(self) -> None:
        super().handle_events()  # after data arrived, or after an answer (a pipelined request may start)
        cycle = self.cycle
        if cycle is not None and not cycle.more_body and not cycle.response_complete:
            self.table.answering(self._fd, True)

    def on_response_complete(self) -> None:
        self.table.answering(self._fd, False)
        super().on_response_complete()

    def handle_websocket_upgrade(self, event: Any) -> None:
        self.table.answering(self._fd, True)  # the websocket protocol owns the connection from here
        super().handle_websocket_upgrade(event)


def guarded_protocol(base: type[GuardedH11Protocol], table: ConnectionTable) -> type[GuardedH11Protocol]:
    """`base` bound to one listener's table."""
    return type(f"{base.__name__}_{table.name}", (base,), {"table": table})
