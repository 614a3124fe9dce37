"""The idle daemon's wake-ups (issue 39, item 3): its main loop sleeps until its next duty and a signal
handler wakes it at once; its API listeners keep house once a second and stop at once."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

import pytest
import uvicorn

from controlplane.api.quietloop import QuietServer
from controlplane.runtime.waker import Waker, loop_sleep_s


def test_loop_sleeps_until_the_next_duty_within_its_bounds() -> None:
    assert loop_sleep_s(100.0, 100.4, 101.0, None, floor_s=0.1) == pytest.approx(0.4)
    assert loop_sleep_s(100.0, 99.0, None, floor_s=0.1) == 0.1  # due and still running: a tick later
    assert loop_sleep_s(100.0, 150.0, floor_s=0.1) == 1.0  # never longer than a second
    assert loop_sleep_s(100.0, None, floor_s=0.1, ceiling_s=2.0) == 2.0


def test_a_signal_handler_wakes_the_wait_at_once() -> None:
    waker = Waker()
    previous = signal.signal(signal.SIGUSR1, lambda *_: waker.set())
    try:
        threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGUSR1)).start()
        started = time.monotonic()
        assert waker.wait(30.0)
        assert time.monotonic() - started < 10.0
        waker.clear()
        assert not waker.wait(0.0)  # cleared: nothing pending
        for _ in range(100_000):  # many wake-ups never block the setter (the pipe fills, the rest are dropped)
            waker.set()
        assert waker.wait(0.0)
        waker.clear()
        assert not waker.wait(0.0)
    finally:
        signal.signal(signal.SIGUSR1, previous)
        waker.close()
    waker.set()  # closed: a late handler does nothing
    assert not waker.wait(0.0)


async def _hello(scope: dict, receive: object, send: object) -> None:  # type: ignore[type-arg]
    assert scope["type"] == "http"
    await send({"type": "http.response.start", "status": 200, "headers": []})  # type: ignore[operator]
    await send({"type": "http.response.body", "body": b"hi"})  # type: ignore[operator]


def test_the_listener_serves_and_stops_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("controlplane.api.quietloop.TICK_S", 120.0)  # only the stop's wake-up can end it in time
    sock = socket.create_server(("127.0.0.1", 0))
    server = QuietServer(uvicorn.Config(_hello, lifespan="off", log_config=None, access_log=False,
                                        timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.started
    with socket.create_connection(sock.getsockname()) as client:
        client.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert b"200 OK" in client.recv(4096)
    server.stop()
    thread.join(60)
    assert not thread.is_alive()
