"""Start, adopt and stop the gateway process as the daemon does for the launched tritonserver.

The gateway is the data path and outlives the control plane: it runs in its own session with no
parent-death signal, and `<state>/gateway/gateway.json` (mode 0600) records its pid, kernel start time,
command line, bound ports and control socket. A restarted daemon `adopt`s it — the same process (pid
alive with the recorded start time and command line) answering `hello` with that pid — instead of
starting another; a record naming anything else is dropped. No asyncio here: the daemon imports this.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controlplane.errors import GatewayError
from controlplane.gateway.control import GatewayControl

RECORD_FILE = "gateway.json"
SOCKET_FILE = "gateway.sock"
ROUTES_FILE = "routes.json"
LOG_FILE = "gateway.log"
_LOG_TAIL_CHARS = 1500


def start_time(pid: int) -> int | None:
    """The kernel's start time of `pid` (clock ticks since boot); None when no such live process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    after = stat[stat.rfind(")") + 2 :].split()
    if not after or after[0] == "Z":
        return None
    return int(after[19])


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (tests; the gateway itself binds port 0 instead)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass
class GatewayProcess:
    """One gateway process. Addresses are HOST:PORT strings; a port of 0 is chosen by the gateway at bind
    (read back from `hello` into `ports`)."""

    workdir: Path
    triton_grpc: str
    triton_http: str | None = None
    triton_metrics: str | None = None
    grpc_address: str | None = "127.0.0.1:0"
    http_address: str | None = None
    metrics_address: str | None = None
    drain_s: float = 30.0
    python: str = sys.executable
    extra_args: Sequence[str] = ()
    env: dict[str, str] = field(default_factory=dict)
    pid: int | None = field(default=None, init=False)
    ports: dict[str, int] = field(default_factory=dict, init=False)
    _start: int | None = field(default=None, init=False, repr=False)
    _process: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    @property
    def control_socket(self) -> Path:
        return self.workdir / SOCKET_FILE

    @property
    def routes_file(self) -> Path:
        return self.workdir / ROUTES_FILE

    @property
    def record_path(self) -> Path:
        return self.workdir / RECORD_FILE

    @property
    def log_path(self) -> Path:
        return self.workdir / LOG_FILE

    def control(self, timeout_s: float = 5.0) -> GatewayControl:
        return GatewayControl(self.control_socket, timeout_s)

    def command(self) -> list[str]:
        args = [self.python, "-m", "controlplane.gateway", "--triton-grpc", self.triton_grpc,
                "--control-socket", str(self.control_socket), "--routes-file", str(self.routes_file),
                "--drain-s", f"{self.drain_s:g}"]
        for flag, value in (("--grpc-address", self.grpc_address), ("--http-address", self.http_address),
                            ("--metrics-address", self.metrics_address), ("--triton-http", self.triton_http),
                            ("--triton-metrics", self.triton_metrics)):
            if value is not None:
                args += [flag, value]
        return args + list(self.extra_args)

    def is_running(self) -> bool:
        return self.pid is not None and start_time(self.pid) == self._start

    def log_tail(self, chars: int = _LOG_TAIL_CHARS) -> str:
        try:
            return self.log_path.read_bytes()[-chars:].decode("utf-8", "replace")
        except OSError:
            return ""

    # -- the record ---------------------------------------------------------------------------------

    def _write_record(self) -> None:
        assert self.pid is not None
        record = {"pid": self.pid, "start_time": self._start, "command": cmdline(self.pid) or self.command(),
                  "ports": self.ports, "control_socket": str(self.control_socket)}
        tmp = self.record_path.with_name(self.record_path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(record, handle)
        os.chmod(tmp, 0o600)
        os.replace(tmp, self.record_path)

    def forget_record(self) -> None:
        try:
            self.record_path.unlink()
        except FileNotFoundError:
            pass

    def read_record(self) -> dict[str, Any] | None:
        try:
            record = json.loads(self.record_path.read_text())
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) else None

    # -- life -----------------------------------------------------------------------------------------

    def start(self, timeout_s: float = 20.0) -> GatewayProcess:
        """Start the gateway detached and return once `hello` answers; GatewayError with its log tail if not."""
        if self.is_running():
            return self
        self.workdir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.workdir, 0o700)
        env = {**os.environ, **self.env}
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        self.pid = self._process.pid
        self._start = start_time(self.pid)
        self._write_record()  # now: a daemon killed meanwhile leaves no unrecorded gateway
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                self.forget_record()
                raise GatewayError(f"gateway exited with code {self._process.returncode}; log {self.log_path}: "
                                   + self.log_tail().strip().replace("\n", " | "))
            try:
                hello = self.control(1.0).hello()
            except GatewayError:
                time.sleep(0.05)
                continue
            if hello.get("pid") == self.pid:
                self.ports = {str(k): int(v) for k, v in hello.get("ports", {}).items()}
                self._write_record()
                return self
            time.sleep(0.05)
        self.stop(2.0)
        raise GatewayError(f"gateway did not answer on {self.control_socket} within {timeout_s:g}s; "
                           f"log {self.log_path}: " + self.log_tail(600).strip().replace("\n", " | "))

    def adopt(self, timeout_s: float = 5.0) -> bool:
        """Take over the gateway the record names if it is still that process and answers."""
        if self.is_running():
            return True
        record = self.read_record()
        if record is None:
            self.forget_record()
            return False
        try:
            pid, started = int(record["pid"]), int(record["start_time"])
        except (KeyError, TypeError, ValueError):
            self.forget_record()
            return False
        argv = cmdline(pid)
        ours = (start_time(pid) == started and "controlplane.gateway" in argv
                and str(self.control_socket) in argv)
        if not ours:
            self.forget_record()
            return False
        try:
            hello = self.control(timeout_s).hello()
        except GatewayError:
            hello = {}
        if hello.get("pid") != pid:  # ours but not answering: the caller starts a fresh one
            self.pid, self._start = pid, started
            self.stop(2.0)
            return False
        self.pid, self._start = pid, started
        self.ports = {str(k): int(v) for k, v in hello.get("ports", {}).items()}
        return True

    def stop(self, timeout_s: float | None = None) -> int | None:
        """SIGTERM (the gateway drains its calls), then SIGKILL after the bound. Returns the exit code
        when this object started the process (None for an adopted one)."""
        bound = self.drain_s + 5.0 if timeout_s is None else timeout_s
        for sig, wait_s in ((signal.SIGTERM, bound), (signal.SIGKILL, 5.0)):
            if not self.is_running():
                break
            assert self.pid is not None
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + wait_s
            while self.is_running() and time.monotonic() < deadline:
                if self._process is not None:
                    self._process.poll()  # reap our own child so its pid stops counting as alive
                time.sleep(0.02)
        code = None
        if self._process is not None:
            try:
                code = self._process.wait(1.0)
            except subprocess.TimeoutExpired:
                pass
        self.pid = self._start = None
        self._process = None
        self.forget_record()
        return code

    def kill(self) -> None:
        """Abrupt death (fault tests; a supervisor's last resort). The record stays, as after a crash."""
        if self.is_running():
            assert self.pid is not None
            os.kill(self.pid, signal.SIGKILL)
            while self.is_running():
                if self._process is not None:
                    self._process.poll()
                time.sleep(0.01)
