"""The web view and the TCP control API against the attacks of issue 43, on a real daemon.

One daemon serves the web view on loopback with `--web-require-token` (so the login is exercised without
a non-loopback address) and the control API on TCP. As an attacker would: a rebinding page's Host is
refused (421) before any page is built, while the view's own names are answered; a 10 MiB login body is
refused at once (413) without being read; wrong tokens are slowed down (429); a session cookie is random
per login and dead after logout; every page carries a Content-Security-Policy and nosniff; a websocket
without the token is refused on the TCP listener. The browser's own run of the view under this CSP is
tests/test_web_e2e.py (its console must stay free of errors).
"""

from __future__ import annotations

import asyncio
import http.client
import re
import socket
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode

import pytest

from controlplane.api.access import AccessGate, Authenticator
from controlplane.api.web import gate
from tests.harness import DaemonProcess, token_daemon, wait_for, write_gen_model

pytestmark = pytest.mark.triton

TOKEN = "web-security-test-token-0123456789"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonProcess, int, int]]:
    base = tmp_path_factory.mktemp("websec")
    repo = base / "repo"
    repo.mkdir()
    write_gen_model(repo, "gen", 1)
    proc, address, _ = token_daemon(repo, base, TOKEN, ["--web-address", "127.0.0.1:0", "--web-require-token"])
    api_port = int(address.rsplit(":", 1)[1])
    found = wait_for(lambda: re.search(r"web view: http://127\.0\.0\.1:(\d+)/ui/", proc.log_path.read_text()), 10,
                     what="the daemon's `web view:` log line")
    wait_for(lambda: proc.model_status("gen").get("state") == "serving", 60, what="gen serving")
    yield proc, int(found.group(1)), api_port
    assert proc.stop() == 0, proc.log_tail()


def ask(port: int, method: str, path: str, headers: dict[str, str] | None = None,
        body: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        answer = conn.getresponse()
        return answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read()
    finally:
        conn.close()


def log_in(port: int, token: str = TOKEN, client_headers: dict[str, str] | None = None) -> tuple[int, str]:
    """POST the login form: the status and the session id its cookie holds ('' when none)."""
    status, headers, _ = ask(port, "POST", "/ui/login", {"content-type": "application/x-www-form-urlencoded",
                                                          **(client_headers or {})},
                             urlencode({"token": token, "next": "/ui/"}).encode())
    found = re.match(r"tritonctl_web=([^;]*);", headers.get("set-cookie", ""))
    return status, found.group(1) if found else ""


def test_a_rebinding_host_is_refused_and_the_views_own_names_answer(daemon: tuple[DaemonProcess, int, int]) -> None:
    _, port, _ = daemon
    bearer = {"authorization": f"Bearer {TOKEN}"}
    for host in ("attacker.example", f"attacker.example:{port}", "localhost.attacker.example", "10.0.0.1"):
        status, _, body = ask(port, "GET", "/ui/", {"host": host, **bearer})
        assert status == 421, (host, status)
        assert b"gen" not in body
    status, _, _ = ask(port, "GET", "/ui/login", {"host": "attacker.example"})  # before any page, open ones too
    assert status == 421
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", "localhost", f"[::1]:{port}"):
        status, _, body = ask(port, "GET", "/ui/", {"host": host, **bearer})
        assert status == 200 and b"gen" in body, (host, status)


def test_every_page_sends_a_content_security_policy_and_nosniff(daemon: tuple[DaemonProcess, int, int]) -> None:
    _, port, _ = daemon
    for path, headers in (("/ui/", {"authorization": f"Bearer {TOKEN}"}), ("/ui/login", {}), ("/ui/", {}),
                          ("/ui/static/web.js", {})):
        _, answer, _ = ask(port, "GET", path, headers)
        assert answer.get("x-content-type-options") == "nosniff", path
        policy = answer.get("content-security-policy", "")
        assert "default-src 'none'" in policy and "script-src 'self'" in policy, path
        assert "frame-ancestors 'none'" in policy, path


def test_a_ten_mib_login_body_is_refused_at_once(daemon: tuple[DaemonProcess, int, int]) -> None:
    _, port, _ = daemon
    ten_mib = 10 * 1024 * 1024
    # announced: refused on the headers alone, before the client has sent a byte of it
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        started = time.monotonic()
        conn.sendall(f"POST /ui/login HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/x-www-form-"
                     f"urlencoded\r\nContent-Length: {ten_mib}\r\n\r\ntoken=".encode())
        first = conn.recv(4096)
        assert first.startswith(b"HTTP/1.1 413"), first
        assert time.monotonic() - started < 2
    # chunked, no length: reading stops at the first chunk past the limit
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(f"POST /ui/login HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                     "Transfer-Encoding: chunked\r\n\r\n".encode())
        chunk = b"a" * 65536
        answer = b""
        try:
            for _ in range(ten_mib // len(chunk)):
                conn.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                conn.setblocking(False)
                try:
                    answer += conn.recv(4096)
                except BlockingIOError:
                    pass
                conn.setblocking(True)
                if answer:
                    break
        except (BrokenPipeError, ConnectionResetError):
            pass
        conn.settimeout(10)
        if not answer:
            answer = conn.recv(4096)
        assert answer.startswith(b"HTTP/1.1 413"), answer


def test_sessions_are_random_per_login_and_end_at_logout(daemon: tuple[DaemonProcess, int, int]) -> None:
    _, port, _ = daemon
    status, first = log_in(port)
    assert status == 303 and first and TOKEN not in first
    status, second = log_in(port)
    assert status == 303 and second and second != first  # not a constant of the token
    cookie = {"cookie": f"tritonctl_web={first}"}
    assert ask(port, "GET", "/ui/", cookie)[0] == 200
    status, headers, _ = ask(port, "POST", "/ui/logout", cookie)
    assert status == 303 and "Max-Age=0" in headers.get("set-cookie", "")
    # the old cookie, replayed after logout (a copy the browser did not drop): refused
    assert ask(port, "GET", "/ui/", cookie)[0] == 303
    assert ask(port, "GET", "/ui/stamp", cookie)[0] == 401
    assert ask(port, "GET", "/ui/", {"cookie": f"tritonctl_web={second}"})[0] == 200  # another session lives on


def test_wrong_tokens_are_slowed_down(daemon: tuple[DaemonProcess, int, int]) -> None:
    """Runs last of the login tests: it leaves 127.0.0.1 waiting (the throttle is per client address)."""
    _, port, _ = daemon
    statuses = [log_in(port, "not-the-token-0123456789")[0] for _ in range(gate.FREE_FAILURES)]
    assert statuses == [401] * gate.FREE_FAILURES
    status, headers, body = ask(port, "POST", "/ui/login", {"content-type": "application/x-www-form-urlencoded"},
                                urlencode({"token": TOKEN}).encode())
    assert status == 429 and int(headers["retry-after"]) >= 1, (status, body)  # even the right token waits
    assert b"Too many wrong tokens" in body


def test_the_tcp_api_refuses_a_websocket_without_the_token(daemon: tuple[DaemonProcess, int, int]) -> None:
    _, _, api_port = daemon
    with socket.create_connection(("127.0.0.1", api_port), timeout=10) as conn:
        conn.sendall(f"GET /v1/events HTTP/1.1\r\nHost: 127.0.0.1:{api_port}\r\nUpgrade: websocket\r\n"
                     "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
                     "Sec-WebSocket-Version: 13\r\n\r\n".encode())
        answer = conn.recv(4096)
    assert not answer.startswith(b"HTTP/1.1 101"), answer
    assert answer.split(b" ")[1] in (b"401", b"403"), answer


def test_the_token_gate_passes_no_scope_type_without_the_token() -> None:
    """The gate itself, for every ASGI scope type (the listener above may not speak each of them)."""
    reached: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        reached.append(scope["type"])

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def receive() -> dict[str, Any]:
        return {}

    token_gate = AccessGate(app, Authenticator(shared_token=TOKEN))
    for kind in ("http", "websocket", "lifespan", "something-new"):
        asyncio.run(token_gate({"type": kind, "headers": []}, receive, send))
    assert reached == []
    assert sent[0]["status"] == 401 and {"type": "websocket.close", "code": 1008} in sent
    asyncio.run(token_gate({"type": "websocket", "headers": [(b"authorization", f"Bearer {TOKEN}".encode())]},
                           receive, send))
    assert reached == ["websocket"]
