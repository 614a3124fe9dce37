"""Running as a systemd service: the real daemon (subprocess, launched tritonserver) talking sd_notify
to a real AF_UNIX datagram socket this test binds, real signals, and the example unit files checked
with `systemd-analyze verify`.

What this proves: READY=1 comes only after migrations, the first reconcile, the initial deploy and
the control socket; WATCHDOG=1 at half WATCHDOG_USEC; SIGHUP → RELOADING=1 … READY=1 with the new
config applied and Triton's models untouched (a bad file is refused, the running settings kept);
SIGTERM → STOPPING=1, exit 0 within the bound, launched tritonserver gone; a second SIGINT exits at
once.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from controlplane.base import systemd
from tests.harness import DaemonProcess, copy_example, wait_for

ROOT = Path(__file__).resolve().parent.parent
UNITS = ROOT / "examples" / "systemd"
WATCHDOG_USEC = 400_000  # the daemon pings every 0.2 s
STOP_BOUND_S = 20.0


@dataclass
class Message:
    at: float
    fields: dict[str, str]
    socket_existed: bool  # the control socket, when the message arrived


@dataclass
class NotifyListener:
    """A stand-in for systemd's notify socket: records every datagram the daemon sends."""

    path: Path
    control_socket: Path
    messages: list[Message] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(self.path))
        self.sock.settimeout(0.1)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            exists = self.control_socket.is_socket()
            lines = data.decode().split("\n")
            parsed = dict(line.split("=", 1) for line in lines if "=" in line)
            with self._lock:
                self.messages.append(Message(time.monotonic(), parsed, exists))

    def snapshot(self) -> list[Message]:
        with self._lock:
            return list(self.messages)

    def wait(self, key: str, after: float = 0.0, timeout_s: float = 60.0) -> Message:
        def found() -> Message | None:
            return next((m for m in self.snapshot() if m.at > after and key in m.fields), None)

        return wait_for(found, timeout_s, 0.02, f"{key} from the daemon")  # type: ignore[no-any-return]

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


@dataclass
class Service:
    daemon: DaemonProcess
    notify: NotifyListener
    config: Path
    started: float


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    base = tmp_path_factory.mktemp("systemd")
    repo = base / "repo"
    repo.mkdir()
    copy_example("linear", repo)
    config = base / "tritonctl.toml"
    config.write_text('policy = "auto"\nlog_level = "info"\n')
    short = Path(tempfile.mkdtemp(prefix="notify-", dir="/tmp"))  # AF_UNIX paths are short
    notify = NotifyListener(short / "notify.sock", base / "state" / "tritonctl.sock")
    daemon = DaemonProcess(
        repo, base / "state", extra_args=["--config", str(config)],
        env={"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": str(WATCHDOG_USEC)},
    )
    started = time.monotonic()
    daemon.start(wait=False)
    try:
        yield Service(daemon, notify, config, started)
    finally:
        daemon.stop(timeout_s=STOP_BOUND_S)
        notify.close()
        shutil.rmtree(short, ignore_errors=True)


def test_ready_only_once_started(service: Service) -> None:
    ready = service.notify.wait("READY", timeout_s=90)
    assert ready.socket_existed, "READY=1 before the control socket listened"
    before = [m for m in service.notify.snapshot() if m.at < ready.at]
    assert not any("READY" in m.fields for m in before)
    # The initial reconcile and deploy finished before READY: the STATUS line already says so.
    assert ready.fields["STATUS"].startswith("1 models serving, triton reachable"), ready.fields
    assert service.daemon.model_status("linear")["state"] == "serving"
    # While the start-up scan deploys, STATUS= is its progress; a deploy's outcome does not write the
    # serving count over it (one registry count per deploy: 1,000 in a first start at 1,000 models).
    statuses = [m.fields["STATUS"] for m in before if "STATUS" in m.fields]
    scan_done = next(i for i, s in enumerate(statuses) if s.startswith("initial scan: 1/1 "))
    assert not any("models serving" in s for s in statuses[:scan_done]), statuses
    starts = service.daemon.audit("--action", "daemon_start")
    assert len(starts) == 1 and starts[0]["outcome"] == "ok"


def test_watchdog_pings_at_half_the_interval(service: Service) -> None:
    service.notify.wait("READY", timeout_s=90)
    time.sleep(1.2)
    pings = [m.at for m in service.notify.snapshot() if m.fields.get("WATCHDOG") == "1"]
    assert len(pings) >= 4, pings
    gaps = sorted(b - a for a, b in zip(pings[-5:-1], pings[-4:], strict=True))
    # About WATCHDOG_USEC / 2 (0.2 s; the loop ticks every 0.1 s): not more often, and well inside 0.4 s.
    assert gaps[0] > 0.15 and gaps[len(gaps) // 2] < 0.35, gaps


def test_sighup_reloads_the_config_and_leaves_models_alone(service: Service) -> None:
    daemon = service.daemon
    service.notify.wait("READY", timeout_s=90)
    before = daemon.model_status("linear")
    service.config.write_text('policy = "manual"\nlog_level = "debug"\nload_timeout_s = 60\n')
    sent = time.monotonic()
    assert daemon.proc is not None
    daemon.proc.send_signal(signal.SIGHUP)
    reloading = service.notify.wait("RELOADING", after=sent, timeout_s=10)
    assert int(reloading.fields["MONOTONIC_USEC"]) > 0
    ready = service.notify.wait("READY", after=reloading.at, timeout_s=10)
    assert "models serving" in ready.fields["STATUS"]
    after = daemon.model_status("linear")
    assert after["policy"] == "manual"
    assert (after["state"], after["digest"], after["versions"]) == (before["state"], before["digest"],
                                                                   before["versions"])
    history = [(e["action"], e["outcome"]) for e in daemon.audit("--model", "linear")]
    assert history == [("deploy", "ok"), ("snapshot", "ok")], "a reload must not touch Triton's models"
    log = wait_for(lambda: "reloaded: policy=manual" in daemon.log_tail(20000) and daemon.log_tail(20000),
                   5, 0.1, "reload logged")
    assert "load_timeout_s changed but take effect only after a restart" in log


def test_sighup_with_a_bad_file_keeps_the_running_settings(service: Service) -> None:
    daemon = service.daemon
    service.notify.wait("READY", timeout_s=90)
    service.config.write_text('policy = "sometimes"\n')
    sent = time.monotonic()
    assert daemon.proc is not None
    daemon.proc.send_signal(signal.SIGHUP)
    reloading = service.notify.wait("RELOADING", after=sent, timeout_s=10)
    service.notify.wait("READY", after=reloading.at, timeout_s=10)
    wait_for(lambda: "reload refused" in daemon.log_tail(20000), 5, 0.1, "refusal logged")
    assert "policy: invalid value 'sometimes'" in daemon.log_tail(20000)
    assert daemon.model_status("linear")["policy"] == "manual"  # from the previous, good reload


def test_sigterm_stops_cleanly(service: Service) -> None:
    daemon = service.daemon
    service.notify.wait("READY", timeout_s=90)
    triton_pid = daemon.triton_pid()
    assert triton_pid is not None
    assert daemon.proc is not None
    sent = time.monotonic()
    daemon.proc.send_signal(signal.SIGTERM)
    stopping = service.notify.wait("STOPPING", after=sent, timeout_s=10)
    assert stopping.fields["STOPPING"] == "1"
    assert daemon.proc.wait(STOP_BOUND_S) == 0, daemon.log_tail()
    assert time.monotonic() - sent < STOP_BOUND_S
    assert not Path(f"/proc/{triton_pid}").exists() or _is_zombie(triton_pid), "launched tritonserver left running"
    assert not (daemon.state_dir / "tritonctl.sock").exists()
    stops = daemon.audit("--action", "daemon_stop")
    assert len(stops) == 1 and stops[0]["outcome"] == "ok"


def test_sigterm_leaves_an_external_tritonservers_models_loaded(tmp_path: Path) -> None:
    """With --triton-url (key from TRITONCTL_TRITON_KEY, as the units do) the daemon deploys, and
    on SIGTERM exits 0 without unloading anything: inference keeps working without it."""
    import tritonclient.grpc as grpcclient

    from controlplane.triton.launcher import TritonServer
    from tests.harness import TRITONCTL

    repo, state = tmp_path / "repo", tmp_path / "state"
    repo.mkdir()
    copy_example("linear", repo)
    key = secrets.token_hex(16)
    server = TritonServer(model_repository=state / "serving", workdir=tmp_path / "triton", restricted_key=key)
    server.start()
    short = Path(tempfile.mkdtemp(prefix="notify-", dir="/tmp"))
    notify = NotifyListener(short / "notify.sock", state / "tritonctl.sock")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRITONCTL_")}
    env.update(NOTIFY_SOCKET=str(notify.path), TRITONCTL_TRITON_KEY=key)
    log = tmp_path / "daemon.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([TRITONCTL, "daemon", "--repository", str(repo), "--state-dir", str(state),
                                 "--triton-url", server.grpc_url, "--settle", "0.2"],
                                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        ready = notify.wait("READY", timeout_s=60)
        assert ready.socket_existed and ready.fields["STATUS"].startswith("1 models serving"), log.read_text()
        assert client.is_model_ready("linear")
        proc.send_signal(signal.SIGTERM)
        notify.wait("STOPPING", after=ready.at, timeout_s=10)
        assert proc.wait(STOP_BOUND_S) == 0, log.read_text()
        assert server.is_running()
        assert client.is_model_ready("linear"), "the daemon's exit must not unload an external server's models"
        x = grpcclient.InferInput("x", [1, 3], "FP32")
        x.set_data_from_numpy(np.array([[1, 2, 3]], dtype=np.float32))
        assert client.infer("linear", [x]).as_numpy("y").tolist() == [[6.0]]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        client.close()
        notify.close()
        shutil.rmtree(short, ignore_errors=True)
        server.stop()


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except OSError:
        return True


def test_second_sigint_exits_at_once(tmp_path: Path) -> None:
    """The first SIGINT asks for a clean stop; the second, while that is still running, exits 130."""
    script = textwrap.dedent(
        """
        import os, signal, sys, time
        from controlplane.settings.config import Settings
        from controlplane.daemon import Daemon

        daemon = Daemon(Settings(state_dir=sys.argv[1]))
        daemon.install_signal_handlers()
        os.kill(os.getpid(), signal.SIGINT)
        assert daemon.stop_requested.is_set()
        print("first", flush=True)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)
        print("still here", flush=True)
        """
    )
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True,
                            timeout=30, cwd=ROOT)
    assert result.returncode == 130, result.stderr
    assert result.stdout.split() == ["first"]
    assert time.monotonic() - started < 5


# -- sd_notify helpers (no daemon) ------------------------------------------------------------------


def test_notify_is_a_noop_outside_systemd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert systemd.ready("x") is False
    monkeypatch.setenv("NOTIFY_SOCKET", "/nonexistent/notify.sock")
    assert systemd.watchdog_ping() is False  # never raises


def test_watchdog_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    monkeypatch.setenv("WATCHDOG_USEC", "30000000")
    assert systemd.watchdog_interval_s() == 15.0
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid() + 1))  # meant for another process
    assert systemd.watchdog_interval_s() is None
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    assert systemd.watchdog_interval_s() == 15.0
    for bad in ("0", "soon"):
        monkeypatch.setenv("WATCHDOG_USEC", bad)
        assert systemd.watchdog_interval_s() is None


def test_status_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    listener = NotifyListener(Path(tempfile.mkdtemp(dir="/tmp")) / "n.sock", tmp_path / "none")
    try:
        monkeypatch.setenv("NOTIFY_SOCKET", str(listener.path))
        assert systemd.ready("2 models\nserving")
        assert systemd.status("a\n b")
        wait_for(lambda: len(listener.snapshot()) == 2, 5, 0.02)
        first, second = listener.snapshot()
        assert first.fields == {"READY": "1", "STATUS": "2 models serving"}
        assert second.fields == {"STATUS": "a b"}
    finally:
        listener.close()
        shutil.rmtree(listener.path.parent, ignore_errors=True)


# -- unit files -----------------------------------------------------------------------------------


def _unit(name: str) -> dict[str, list[str]]:
    """`Key=value` lines of a unit (continuations joined), every value of a repeated key kept."""
    text = (UNITS / name).read_text().replace("\\\n", " ")
    keys: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.lstrip().startswith(("#", ";")):
            key, value = line.split("=", 1)
            keys.setdefault(key.strip(), []).append(value.strip())
    return keys


def test_tritonctl_unit_settings() -> None:
    unit = _unit("tritonctl.service")
    expected = {
        "Type": "notify", "NotifyAccess": "main", "WatchdogSec": "30", "Restart": "on-failure",
        "ExecStart": "/usr/local/bin/tritonctl daemon --config /etc/tritonctl/tritonctl.toml",
        "ExecReload": "/bin/kill -HUP $MAINPID", "StateDirectory": "tritonctl", "StateDirectoryMode": "0750",
        "User": "tritonctl", "Group": "tritonctl", "NoNewPrivileges": "yes", "ProtectSystem": "strict",
        "ReadWritePaths": "/var/lib/tritonctl", "PrivateTmp": "yes", "ProtectHome": "yes", "KillMode": "mixed",
        "ProtectProc": "invisible",
    }
    for key, value in expected.items():
        assert unit.get(key) == [value], key
    assert "tritonserver.service" in unit["After"][0] and "tritonserver.service" in unit["Wants"][0]
    # systemd must wait longer than the daemon's own shutdown bound before it SIGKILLs.
    assert int(unit["TimeoutStopSec"][0]) > 30 + 10


def test_tritonserver_unit_settings() -> None:
    unit = _unit("tritonserver.service")
    command = unit["ExecStart"][0].split()
    assert "--model-repository=/var/lib/tritonctl/serving" in command
    assert "--model-control-mode=explicit" in command
    rule = "model-repository,shared-memory,logging,trace:tritonctl-key=${TRITONCTL_TRITON_KEY}"
    assert f"--grpc-restricted-protocol={rule}" in command
    assert f"--http-restricted-api={rule}" in command
    assert unit["EnvironmentFile"] == ["/etc/tritonctl/triton.env"]
    assert unit["ProtectProc"] == ["invisible"]
    assert "/etc/tritonctl/triton.env" in _unit("tritonctl.service")["EnvironmentFile"][0]


def _verify(*units: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(UNITS / "verify.sh"), *map(str, units)], capture_output=True, text=True,
                          timeout=60, env={**os.environ, **env})


needs_analyze = pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                                   reason="systemd-analyze not installed (apt-get install systemd)")


@needs_analyze
def test_units_pass_systemd_analyze_verify() -> None:
    """verify.sh points ExecStart at binaries that exist here: this checkout's tritonctl entry point
    and the embedded tritonserver, when installed (else /bin/true)."""
    from controlplane.triton.launcher import find_tritonserver

    try:
        tritonserver = str(find_tritonserver())
    except Exception:  # noqa: BLE001 - not installed: any existing binary lets verify run
        tritonserver = "/bin/true"
    tritonctl = str(Path(sys.executable).parent / "tritonctl")
    result = _verify(TRITONCTL_BIN=tritonctl if os.access(tritonctl, os.X_OK) else "/bin/true",
                     TRITONSERVER_BIN=tritonserver)
    assert result.returncode == 0, result.stderr + result.stdout
    assert "ok (tritonctl.service tritonserver.service)" in result.stdout


@needs_analyze
def test_verify_catches_a_broken_unit(tmp_path: Path) -> None:
    """systemd-analyze exits 0 on unknown keys and bad values; verify.sh must not."""
    broken = tmp_path / "tritonctl.service"
    broken.write_text((UNITS / "tritonctl.service").read_text().replace("WatchdogSec=30", "WatchdogSec=thirty"))
    result = _verify(broken)
    assert result.returncode == 1
    assert "WatchdogSec" in result.stderr or "sec value" in result.stderr, result.stderr


def test_a_blocked_main_loop_stops_the_watchdog_while_the_process_lives(tmp_path: Path) -> None:
    """The pings come from the loop that does the work: block it (test-only fault) and WATCHDOG=1 stops
    while the process still answers on its control socket, so systemd's watchdog would restart it."""
    repo = tmp_path / "repo"
    repo.mkdir()
    short = Path(tempfile.mkdtemp(prefix="notify-", dir="/tmp"))
    state = tmp_path / "state"
    notify = NotifyListener(short / "notify.sock", state / "tritonctl.sock")
    daemon = DaemonProcess(repo, state, env={"NOTIFY_SOCKET": str(notify.path), "WATCHDOG_USEC": str(WATCHDOG_USEC),
                                             "TRITONCTL_FAULT": "hang_loop"})
    daemon.start(wait=False)
    try:
        ready = notify.wait("READY", timeout_s=90)
        wait_for(lambda: len([m for m in notify.snapshot() if m.at > ready.at and "WATCHDOG" in m.fields]) >= 3,
                 30, 0.05, "pings before the loop blocks")
        (state / "hang-loop").touch()
        blocked = wait_for(lambda: "the main loop blocks" in daemon.log_tail() and time.monotonic(), 30, 0.02,
                           "the loop blocked")
        quiet = 5 * WATCHDOG_USEC / 1e6  # five watchdog intervals
        deadline = blocked + quiet
        wait_for(lambda: time.monotonic() >= deadline, quiet + 5, 0.05, "five watchdog intervals")
        late = [m for m in notify.snapshot() if "WATCHDOG" in m.fields and m.at > blocked + WATCHDOG_USEC / 2e6]
        assert late == [], "WATCHDOG=1 kept coming from a blocked loop"
        assert daemon.proc is not None and daemon.proc.poll() is None
        assert daemon.run("status", "--json").exit_code == 0  # alive and answering: only the loop is stuck
    finally:
        daemon.stop(timeout_s=STOP_BOUND_S)
        notify.close()
        shutil.rmtree(short, ignore_errors=True)


def _shipped_config() -> dict[str, object]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    return dict(tomllib.loads((UNITS / "tritonctl.toml").read_text()))


def test_the_control_socket_has_a_group_tritonserver_is_not_in() -> None:
    """Issue 58, item 5: tritonserver (every model's code) read serving/ through group tritonctl, which was
    also the control socket's group, so any model.py could drive the control plane. The shipped config
    gives the socket a group of its own (`socket_group`), in the runtime directory where its members reach
    it without the state directory's group; tritonserver keeps reading serving/ through that group."""
    config, daemon, server = _shipped_config(), _unit("tritonctl.service"), _unit("tritonserver.service")
    group = config.get("socket_group")
    assert isinstance(group, str) and group, "tritonctl.toml sets no socket_group"
    triton_groups = {*server["Group"], *" ".join(server.get("SupplementaryGroups", [])).split()}
    assert group not in triton_groups, f"tritonserver is in the socket's group {group}"
    assert group != daemon["Group"][0]
    assert daemon["Group"][0] in triton_groups, "tritonserver can no longer read serving/"
    # the daemon may hand its socket to that group (a user can chgrp only to its own groups)
    assert group in " ".join(daemon.get("SupplementaryGroups", [])).split()
    # and its members reach the socket: not under the state directory (0750, group tritonctl)
    socket_path = Path(str(config["socket"]))
    assert socket_path.parent == Path("/run") / daemon["RuntimeDirectory"][0]
    assert int(daemon["RuntimeDirectoryMode"][0], 8) & 0o001, "others cannot reach the runtime directory"
    assert not socket_path.is_relative_to(Path(str(config["state_dir"])))
    assert f"--unix-socket {socket_path} " in daemon["ExecStartPost"][0]
