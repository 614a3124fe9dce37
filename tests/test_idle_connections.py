"""Idle connections cannot take the control API down (issue 58, item 1).

A real daemon runs under systemd's default file limit, 1,024, made its hard limit too (`prlimit`), so
raising the soft limit at start cannot help and the connection cap must. 1,100 TCP connections that never
send a byte, re-opened as fast as the daemon closes them, hold its TCP listener while a model is edited:
the control socket and the TCP API keep answering, the daemon's log stays small, and the edit deploys
(before: both listeners unreachable, 170 MB of accept tracebacks in 13 s, the capture failed with "Too
many open files" and the model was left `invalid`). Also: the soft file limit is raised to the hard one
at start, and a capture or validation that fails for want of file descriptors is retried, never judged.
"""

from __future__ import annotations

import errno
import http.client
import json
import os
import resource
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane.api.connections import ConnectionTable
from controlplane.errors import SnapshotEnvironmentError, SnapshotUnreadableError
from controlplane.intake.decision import Verdict, decide_capture
from controlplane.triton.launcher import free_port
from tests.harness import DaemonProcess, answers, api_get, triton_client, wait_for, write_gen_model

TOKEN = "0123456789abcdef0123456789abcdef"
ATTACKERS = 1100
FILE_LIMIT = 1024


class IdleFlood:
    """`count` TCP connections to `address` that never send anything; one the daemon closes is opened
    again at once (a client that keeps its idle connections up), until `stop`."""

    def __init__(self, address: tuple[str, int], count: int) -> None:
        self.address, self.count = address, count
        self.socks: dict[int, socket.socket] = {}
        self.reopened = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="idle-flood", daemon=True)

    def _open(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        err = sock.connect_ex(self.address)
        if err not in (0, errno.EINPROGRESS):
            sock.close()
            return
        self.socks[sock.fileno()] = sock

    def _run(self) -> None:
        poller = select.poll()
        while not self._stop.is_set():
            while len(self.socks) < self.count:
                self._open()
                poller.register(list(self.socks.values())[-1], select.POLLIN | select.POLLHUP | select.POLLERR)
            for fd, _event in poller.poll(200):
                sock = self.socks.pop(fd, None)
                poller.unregister(fd)
                if sock is not None:
                    sock.close()
                    self.reopened += 1

    def __enter__(self) -> IdleFlood:
        self._thread.start()
        wait_for(lambda: len(self.socks) >= self.count, 30, what="the idle connections opened")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        for sock in self.socks.values():
            sock.close()


@pytest.fixture
def many_files() -> Iterator[None]:
    """This test process opens more than 1,100 sockets: its soft file limit raised to the hard one."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < ATTACKERS + 200:
        pytest.skip(f"the test needs {ATTACKERS + 200} open files, the hard limit here is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def tcp_live(address: tuple[str, int]) -> int:
    conn = http.client.HTTPConnection(*address, timeout=10)
    try:
        conn.request("GET", "/v1/live", headers={"Authorization": f"Bearer {TOKEN}"})
        return conn.getresponse().status
    finally:
        conn.close()


class EventFollower:
    """`GET /v1/events` over the control socket, its lines kept as they come (a connection being answered
    for longer than the daemon's request deadline)."""

    def __init__(self, daemon: DaemonProcess) -> None:
        from controlplane.api.client import UnixHTTPConnection

        self.lines: list[str] = []
        self.ended = False
        self.conn = UnixHTTPConnection(str(daemon.state_dir / "tritonctl.sock"), 120)
        self.conn.request("GET", "/v1/events")
        self.answer = self.conn.getresponse()
        assert self.answer.status == 200
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            while line := self.answer.readline():
                self.lines.append(line.decode(errors="replace"))
        except (OSError, ValueError, AttributeError):  # closed by the test (http.client drops its file)
            pass
        self.ended = True

    def close(self) -> None:
        self.conn.close()


def daemon_limits(pid: int) -> tuple[str, str]:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return soft, hard
    raise AssertionError("no 'Max open files' in /proc/PID/limits")


def limited_daemon(tmp_path: Path, limit: str) -> tuple[DaemonProcess, Path, tuple[str, int]]:
    repo = tmp_path / "repo"
    repo.mkdir()
    write_gen_model(repo, "m", 1)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    port = free_port()
    daemon = DaemonProcess(repo, tmp_path / "state", wrapper=["prlimit", f"--nofile={limit}", "--"],
                           extra_args=["--listen", f"127.0.0.1:{port}", "--token-file", str(token_file)])
    return daemon, repo, ("127.0.0.1", port)


@pytest.mark.triton
def test_idle_connections_leave_both_listeners_answering_and_the_edit_deploys(tmp_path: Path,
                                                                             many_files: None) -> None:
    daemon, repo, address = limited_daemon(tmp_path, f"{FILE_LIMIT}:{FILE_LIMIT}")
    daemon.start()
    try:
        assert daemon.proc is not None
        pid = daemon.proc.pid
        assert daemon_limits(pid) == (str(FILE_LIMIT), str(FILE_LIMIT))
        wait_for(lambda: daemon.model_status("m").get("state") == "serving", 60, what="m serving")
        first = daemon.model_status("m")["digest"]
        follower = EventFollower(daemon)
        with IdleFlood(address, ATTACKERS) as flood:
            time.sleep(2)  # the daemon has taken (and dropped) what it could
            log_before = daemon.log_path.stat().st_size
            write_gen_model(repo, "m", 2)
            edited_at = time.monotonic()
            unix_failures, tcp_failures = [], []
            # longer than the daemon's request deadline: idle connections are closed and opened again meanwhile
            while time.monotonic() - edited_at < 20:
                try:
                    status, _ = api_get(daemon, "/v1/live")
                    assert status == 200
                except Exception as exc:  # noqa: BLE001 - counted, reported below
                    unix_failures.append(repr(exc))
                try:
                    assert tcp_live(address) == 200
                except Exception as exc:  # noqa: BLE001 - counted, reported below
                    tcp_failures.append(repr(exc))
                time.sleep(1)
            assert unix_failures == [], unix_failures
            assert tcp_failures == [], tcp_failures
            row = wait_for(lambda: (r := daemon.model_status("m")) and r["digest"] != first and r["sync"] == "synced"
                           and r, 60, what="the edit deployed during the flood")
            assert row["state"] == "serving" and row["sync"] != "invalid", row
            with triton_client(daemon) as client:
                assert answers(client, "m", 2.0)
            fds = len(os.listdir(f"/proc/{pid}/fd"))
            assert flood.reopened > 0, "the daemon closed none of the idle connections"
            # a connection being answered (the event stream, open 20 s and more) is never closed as idle
            assert not follower.ended, "the event stream was closed"
            daemon.json("pin", "m")
            wait_for(lambda: any('"pin"' in line for line in follower.lines), 30, what="the pin on the event stream")
            follower.close()
            grown = daemon.log_path.stat().st_size - log_before
        assert fds < FILE_LIMIT - 100, f"{fds} open files of {FILE_LIMIT}"
        assert grown < 256 * 1024, f"the log grew {grown} bytes during the flood: {daemon.log_tail(2000)}"
        assert "Traceback" not in daemon.log_path.read_text(errors="replace")
        audit = daemon.audit("--model", "m")
        assert not [e for e in audit if e["outcome"] == "invalid"], audit
    finally:
        assert daemon.stop() == 0, daemon.log_tail()


@pytest.mark.triton
def test_the_soft_file_limit_is_raised_to_the_hard_one(tmp_path: Path) -> None:
    daemon, _repo, _address = limited_daemon(tmp_path, "1024:4096")
    daemon.start()
    try:
        assert daemon.proc is not None
        assert daemon_limits(daemon.proc.pid) == ("4096", "4096")
    finally:
        assert daemon.stop() == 0, daemon.log_tail()


FILL_AND_CAPTURE = """
import os, resource, sys, json
from pathlib import Path
from controlplane.snapshot import ContentStore
from controlplane.validation.modelconfig import validate_model_dir
store = ContentStore(Path(sys.argv[1]) / "store")
held = []
try:
    while True:
        held.append(os.open("/dev/null", os.O_RDONLY))
except OSError:
    pass
results = {}
for name, call, free in (("validate", lambda: validate_model_dir(Path(sys.argv[2]), name="m"), 0),
                         ("capture", lambda: store.capture(Path(sys.argv[2]), "m"), 1)):
    for _ in range(free):  # one free descriptor: the scan's directory, not the file
        os.close(held.pop())
    try:
        outcome = call()
        results[name] = ["ok", getattr(outcome, "ok", None)]
    except Exception as exc:
        results[name] = [type(exc).__name__, str(exc), getattr(exc, "retryable", None)]
print(json.dumps(results))
"""


def test_a_capture_out_of_file_descriptors_is_retried_not_judged(tmp_path: Path) -> None:
    write_gen_model(tmp_path / "repo", "m", 1)
    result = subprocess.run([sys.executable, "-c", FILL_AND_CAPTURE, str(tmp_path), str(tmp_path / "repo" / "m")],
                            capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parent.parent)
    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout)
    assert outcome["capture"][0] == "SnapshotEnvironmentError" and outcome["capture"][2] is True, outcome
    assert "Too many open files" in outcome["capture"][1]
    assert outcome["validate"][0] == "SnapshotEnvironmentError", outcome


@pytest.mark.parametrize("code", [errno.EMFILE, errno.ENFILE, errno.ENOSPC, errno.EIO])
def test_an_environment_error_waits_and_a_content_error_is_judged(code: int) -> None:
    waits = decide_capture(SnapshotEnvironmentError(f"m: cannot read x ({os.strerror(code)})"), "m", 0.2)
    assert waits.verdict is Verdict.WAIT and waits.delay_s >= 1.0
    judged = decide_capture(SnapshotUnreadableError("m: cannot read x (Permission denied)"), "m", 0.2)
    assert judged.verdict is not Verdict.WAIT


def _pair(table: ConnectionTable) -> tuple[socket.socket, socket.socket]:
    """(the server's end, entered in `table`; the client's end)."""
    server, client = socket.socketpair()
    assert table.admit(server)
    return server, client


def _shut(sock: socket.socket) -> bool:
    """Whether the other end shut `sock`'s peer down (it reads the end at once)."""
    sock.settimeout(2)
    try:
        return sock.recv(1) == b""
    except OSError:
        return True


def _closed(sock: socket.socket) -> bool:
    """Whether the server closed `sock`'s peer (False: still open, nothing to read within 0.2 s)."""
    sock.settimeout(0.2)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:  # reset
        return True


def test_over_the_cap_the_oldest_idle_connection_goes_not_one_whose_request_waits() -> None:
    table = ConnectionTable("test", cap=2, request_timeout_s=60)
    (_s1, spoke), (_s2, idle) = _pair(table), _pair(table)
    spoke.sendall(b"GET /v1/live HTTP/1.1\r\n")  # unread by the server yet: not idle
    _s3, newest = _pair(table)
    assert _shut(idle) and len(table) == 2
    spoke.settimeout(0.2)
    with pytest.raises(TimeoutError):
        spoke.recv(1)  # still open


def test_a_connection_being_answered_is_never_closed_and_a_newcomer_is_refused() -> None:
    table = ConnectionTable("test", cap=1, request_timeout_s=0.05)
    server, client = _pair(table)
    table.answering(server.fileno(), True)
    time.sleep(0.1)
    table.sweep()
    other, _peer = socket.socketpair()
    assert not table.admit(other) and other.fileno() == -1  # refused, closed
    client.settimeout(0.2)
    with pytest.raises(TimeoutError):
        client.recv(1)


def test_a_connection_sending_too_little_in_time_is_closed() -> None:
    table = ConnectionTable("test", cap=8, request_timeout_s=0.2)
    _server, slow = _pair(table)
    slow.sendall(b"GET / HT")  # a head that never ends
    table.sweep()
    slow.settimeout(0.1)
    with pytest.raises(TimeoutError):
        slow.recv(1)
    time.sleep(0.3)
    table.sweep()
    assert _shut(slow)


def test_the_control_apis_listener_applies_its_cap_on_the_event_loop_it_runs() -> None:
    """The real listener (uvicorn over the guarded socket), its cap set to 2: of 4 idle connections, the
    oldest are closed to make room. The cap lives in the listening socket's `accept`, which only asyncio's
    own event loop calls; uvloop (installed for the gateway) accepts on the file descriptor itself, and then
    no connection was ever counted: the daemon held every idle one (measured: 900 of its 1,024 files)."""
    from controlplane.api.server import _Listener

    async def app(scope: dict[str, object], receive: object, send: object) -> None:  # never reached
        raise AssertionError(scope)

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    address = sock.getsockname()
    listener = _Listener(app, sock, "cap-test")
    listener.table.cap = 2
    listener.start()
    clients = []
    try:
        for _ in range(4):
            clients.append(socket.create_connection(address, timeout=5))
            time.sleep(0.2)  # accepted one by one, oldest first
        wait_for(lambda: _closed(clients[0]) and _closed(clients[1]), 10, 0.1, "the oldest idle connections closed")
        assert not _closed(clients[2]) and not _closed(clients[3]), "a newer connection was closed"
        assert len(listener.table) == 2
    finally:
        for client in clients:
            client.close()
        listener.stop(1.0)
