"""HTTP exchanges with a remote service, bounded: one origin, a size, a total time (issue 58, items 2 and 3).

Why: the MLflow source used urllib's defaults. Its redirect handling sent `Authorization: Bearer ...` on
to whatever origin a 302 named, https→http included; an answer was read whole (a 400 MiB one took the
daemon to 821 MiB), and the per-read socket timeout never ended an answer that trickled a byte every 5 s,
which stalled polling for good. Here:

- `opener`: urllib with redirects followed only within the origin (scheme, host, port) the request went
  to; any other (another host, another port, https→http) raises `CrossOrigin` before a byte is sent there;
- every connection it opens is shut down by one watchdog thread once its exchange (connect, TLS, headers,
  body) outlasts the deadline the caller gives (`until`), so no answer outlives it;
- `read_at_most`: an answer's body read by `read1` up to a limit, `TooLarge` past it.
"""

from __future__ import annotations

import heapq
import http.client
import itertools
import socket
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

CHUNK = 1 << 20


class CrossOrigin(Exception):
    """A redirect to another origin (the new URL is the message); nothing was sent there."""


class TooLarge(Exception):
    """An answer longer than its limit; reading stopped just past it."""


def origin(url: str) -> tuple[str, str, int | None]:
    parts = urllib.parse.urlsplit(url)
    default = {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower(), parts.port or default


class _Watchdog:
    """One thread that shuts down sockets whose deadline passed (a blocked read then ends at once)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, socket.socket]] = []
        self._count = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def watch(self, sock: socket.socket, deadline: float) -> None:
        with self._cond:
            heapq.heappush(self._heap, (deadline, next(self._count), sock))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="tritonctl-http-deadlines", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap:
                    self._cond.wait()
                deadline, _, sock = self._heap[0]
                wait = deadline - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                heapq.heappop(self._heap)
            if sock.fileno() != -1:  # closed already: the exchange ended in time
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


_watchdog = _Watchdog()
_deadline = threading.local()


@contextmanager
def until(deadline: float) -> Iterator[None]:
    """Connections opened in this block (on this thread) are shut down at `deadline` (time.monotonic())."""
    previous = getattr(_deadline, "at", None)
    _deadline.at = deadline
    try:
        yield
    finally:
        _deadline.at = previous


def _watch(sock: Any) -> None:
    deadline = getattr(_deadline, "at", None)
    if deadline is not None and sock is not None:
        _watchdog.watch(sock, deadline)


class _HTTPConnection(http.client.HTTPConnection):
    def connect(self) -> None:
        super().connect()
        _watch(self.sock)


class _HTTPSConnection(http.client.HTTPSConnection):
    def connect(self) -> None:
        super().connect()
        _watch(self.sock)


class _HTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_HTTPConnection, req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_HTTPSConnection, req, context=self._context)  # type: ignore[attr-defined]


class _SameOrigin(urllib.request.HTTPRedirectHandler):
    """Redirects followed within the request's origin only; the credentials never leave it."""

    def redirect_request(self, req: urllib.request.Request, fp: Any, code: int, msg: str, headers: Any,
                         newurl: str) -> urllib.request.Request | None:
        target = urllib.parse.urljoin(req.full_url, newurl)
        if origin(target) != origin(req.full_url):
            fp.close()
            raise CrossOrigin(target)
        return super().redirect_request(req, fp, code, msg, headers, target)


def opener(context: Any = None) -> urllib.request.OpenerDirector:
    """urllib for one remote service: same-origin redirects, connections under `until`'s deadline.
    `context`: the SSLContext for https (None: urllib's default)."""
    return urllib.request.build_opener(_SameOrigin(), _HTTPHandler(), _HTTPSHandler(context=context))


def read_at_most(answer: Any, limit: int) -> bytes:
    """The body of `answer`, at most `limit` bytes; TooLarge as soon as more come (nothing past limit + 1
    byte is read). `read1`: a short read returns what came, so a deadline is never waited past by a read."""
    chunks: list[bytes] = []
    size = 0
    while chunk := answer.read1(min(CHUNK, limit + 1 - size)):
        size += len(chunk)
        if size > limit:
            raise TooLarge(f"over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)
