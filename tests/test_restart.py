"""Restart after a crash, as a user (or systemd's `Restart=on-failure`) does it: the same
`tritonctl daemon --repository R --state-dir S --launch-triton [ports]` command again, after a SIGKILL.

The daemon's tritonserver keeps serving through the crash; the restarted daemon adopts it from
`<state>/triton/server.json` whatever its ports — Triton's defaults 8001/8000/8002 (the README's
main job) or fixed ones — instead of refusing the ports its own server holds. Everything runs
through the installed `tritonctl` as a process, against the real tritonserver: a request loop
across the kill and the restart sees 0 failed requests (and answers while no daemon runs), exactly
one tritonserver serves the state directory afterwards, and an edit made after the restart is served.
A port held by anything else is refused in one line naming that process.
"""

from __future__ import annotations

import fcntl
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from controlplane.triton.launcher import free_port
from controlplane.triton.ports import PORT_FLAGS, taken_message
from tests.harness import TRITONCTL, DaemonProcess, request_loop, wait_for, write_gen_model

pytestmark = pytest.mark.triton

TRITON_DEFAULT_PORTS = (8001, 8000, 8002)  # gRPC, HTTP, metrics: Triton's and tritonctl's defaults
# Held while a test uses the default ports: runs in other checkouts or pytest workers on this machine wait.
DEFAULT_PORTS_LOCK = Path("/tmp/tritonctl-tests-default-ports.lock")


def tritonservers_on(serving: Path) -> list[int]:
    """Pids of live tritonservers whose model repository is `serving` (not their python stubs)."""
    wanted = f"--model-repository={serving}"
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if Path(argv[0]).name == "tritonserver" and wanted in argv and stat[stat.rfind(")") + 2] != "Z":
            found.append(int(entry.name))
    return sorted(found)


def distinct_free_ports(count: int = 3) -> list[int]:
    ports: list[int] = []
    while len(ports) < count:
        port = free_port()
        if port not in ports:
            ports.append(port)
    return ports


def port_args(ports: tuple[int, ...] | list[int]) -> list[str]:
    return [arg for flag, port in zip(PORT_FLAGS, ports, strict=True) for arg in (flag, str(port))]


def daemon_command(daemon: DaemonProcess) -> list[str]:
    """The command line DaemonProcess.start runs (launch=False: the ports are only what extra_args say)."""
    return [TRITONCTL, "daemon", "--repository", str(daemon.repository), "--state-dir", str(daemon.state_dir),
            "--settle", str(daemon.settle_s), *daemon.extra_args]


@contextmanager
def default_ports_free(timeout_s: float = 900.0) -> Iterator[None]:
    """Hold Triton's default ports for this test: wait for another run of it on this machine, then
    fail (naming the holder) if something else has one of them. In CI nothing else takes them."""
    with open(DEFAULT_PORTS_LOCK, "a") as lock:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    pytest.fail(f"{DEFAULT_PORTS_LOCK} held for {timeout_s:.0f}s by another run of this test")
                time.sleep(1.0)
        for flag, port in zip(PORT_FLAGS, TRITON_DEFAULT_PORTS, strict=True):
            with socket.socket() as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    probe.bind(("127.0.0.1", port))
                except OSError:
                    pytest.fail(f"this test needs Triton's default ports 8000-8002 free: {taken_message(port, flag)}")
        yield


def launched(tmp_path: Path, args: list[str]) -> DaemonProcess:
    """`tritonctl daemon --repository R --state-dir S --launch-triton *args` (not started), R holding `m`."""
    repo = tmp_path / "repo"
    repo.mkdir()
    write_gen_model(repo, "m", 1)
    return DaemonProcess(repo, tmp_path / "state", launch=False, extra_args=["--launch-triton", *args])


def crash_and_restart(daemon: DaemonProcess, ports: tuple[int, int, int]) -> None:
    """Start the daemon, SIGKILL it under a request loop, run the same command again and edit the
    model; the restarted daemon is left running."""
    repo, state = daemon.repository, daemon.state_dir
    daemon.start()
    url = f"127.0.0.1:{ports[0]}"
    status = daemon.status()
    assert (status["triton_url"], status["triton_http_url"]) == (url, f"http://127.0.0.1:{ports[1]}")
    pid = daemon.triton_pid()
    assert pid is not None and tritonservers_on(state / "serving") == [pid]
    wait_for(lambda: daemon.model_status("m").get("state") == "serving", 60, 0.2, "m serving")

    # While it runs, the same command is refused at once: one daemon per state directory.
    assert daemon.proc is not None
    second = subprocess.run(daemon_command(daemon), capture_output=True, text=True, timeout=120)
    assert second.returncode == 2, second.stderr  # a start-up refusal (docs/cli.md "Exit codes")
    errors = [line for line in second.stderr.splitlines() if line.startswith("error:")]
    assert errors == [f"error: state directory {state} is in use by another tritonctl daemon "
                      f"(pid {daemon.proc.pid}): stop it, or give another --state-dir"], second.stderr

    readies = daemon.log_tail(200_000).count("ready: control socket")
    with request_loop(url, "m") as stats:
        wait_for(lambda: stats["ok"] > 0, 30, 0.05, "the request loop answered")
        daemon.kill()
        at_kill = stats["ok"]
        assert tritonservers_on(state / "serving") == [pid], "the data plane outlives the daemon"
        started = time.monotonic()
        daemon.start()  # the same command; returns once the restarted daemon answers `status`
        wait_for(lambda: daemon.log_tail(200_000).count("ready: control socket") == readies + 1, 60, 0.1,
                 "the restarted daemon READY (what it tells systemd)")
        restart_s = time.monotonic() - started
        assert stats["ok"] > at_kill, "requests were answered while no daemon ran"
        write_gen_model(repo, "m", 2)  # an edit after the restart, deployed through the adopted server
        wait_for(lambda: stats["gens"].get(2.0, 0) > 0, 60, 0.1, "the edit served to the request loop")
    print(f"restart: {restart_s:.1f}s to READY; requests {stats['ok']} ok, {stats['failed']} failed")
    assert stats["failed"] == 0, stats["errors"]
    assert stats["ok"] > 0
    assert tritonservers_on(state / "serving") == [pid], "exactly one tritonserver: the adopted one"
    assert daemon.triton_url() == url
    assert "adopted the running tritonserver pid" in daemon.log_tail(200_000)
    # clients are answered by the edit once Triton loaded it; its deploy commits after verify and smoke
    row = wait_for(lambda: (r := daemon.model_status("m"))["sync"] != "pending" and r, 30, 0.1, "the edit committed")
    assert (row["state"], row["sync"]) == ("serving", "synced"), row


def test_restart_after_sigkill_adopts_on_fixed_ports(tmp_path: Path) -> None:
    ports = distinct_free_ports()
    daemon = launched(tmp_path, port_args(ports))
    try:
        crash_and_restart(daemon, (ports[0], ports[1], ports[2]))
        assert daemon.stop() == 0, daemon.log_tail()
    finally:
        daemon.stop()


def test_a_restart_asking_for_other_ports_adopts_and_warns(tmp_path: Path) -> None:
    """The recorded server serves on other ports than the restarted daemon asks for (the config changed
    while it ran): the daemon adopts it anyway, since inference must not stop for a port change, and says
    so in one warning; the new ports apply once a SIGTERM (no keep_triton) has stopped the server."""
    ports = distinct_free_ports()
    daemon = launched(tmp_path, port_args(ports))
    try:
        daemon.start()
        pid = daemon.triton_pid()
        assert pid is not None
        daemon.kill()
        other = distinct_free_ports(1)[0]
        daemon.extra_args = ["--launch-triton", *port_args([other, ports[1], ports[2]])]
        daemon.start()
        assert daemon.triton_url() == f"127.0.0.1:{ports[0]}"
        assert tritonservers_on(daemon.state_dir / "serving") == [pid]
        warning = [line for line in daemon.log_tail(200_000).splitlines() if "keeps its ports" in line]
        assert len(warning) == 1 and f"--triton-grpc-port {other} (serves on {ports[0]})" in warning[0], warning
        assert daemon.stop() == 0, daemon.log_tail()
        daemon.start()
        assert daemon.triton_url() == f"127.0.0.1:{other}"
        assert tritonservers_on(daemon.state_dir / "serving") == [daemon.triton_pid()] != [pid]
        assert daemon.stop() == 0, daemon.log_tail()
    finally:
        daemon.stop()


def test_restart_after_sigkill_adopts_on_the_default_ports(tmp_path: Path) -> None:
    """Triton's default ports, as the README's main job runs: no port flag at all."""
    daemon = launched(tmp_path, [])
    with default_ports_free():
        try:
            crash_and_restart(daemon, TRITON_DEFAULT_PORTS)
            assert daemon.stop() == 0, daemon.log_tail()
        finally:
            daemon.stop()


LISTENER = ("import socket,time;s=socket.socket();s.bind(('127.0.0.1',0));s.listen();"
            "print(s.getsockname()[1],flush=True);time.sleep(300)")


def test_a_port_held_by_another_process_is_refused_naming_it(tmp_path: Path) -> None:
    """Exit 2 (a bad argument, checked before anything is created: issue 47) with one line naming the
    holder's pid and command; nothing is started, no state directory is made, the holder keeps its port."""
    holder = subprocess.Popen([sys.executable, "-c", LISTENER], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        port = int(holder.stdout.readline())
        (tmp_path / "repo").mkdir()
        write_gen_model(tmp_path / "repo", "m", 1)
        state = tmp_path / "state"
        result = subprocess.run(
            [TRITONCTL, "daemon", "--repository", str(tmp_path / "repo"), "--state-dir", str(state),
             "--launch-triton", *port_args([0, port, 0])],
            capture_output=True, text=True, timeout=120, env={k: v for k, v in os.environ.items()
                                                               if k != "NOTIFY_SOCKET"})
        assert result.returncode == 2, result.stderr
        assert "Traceback" not in result.stderr
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, result.stderr
        assert errors[0].startswith(f"error: port {port} (--triton-http-port) is taken on 127.0.0.1 by pid "
                                    f"{holder.pid} ({sys.executable} -c import socket"), errors
        assert errors[0].endswith(": stop it, choose another port, or 0 for a free one"), errors
        assert tritonservers_on(state / "serving") == []
        assert not state.exists()
        assert holder.poll() is None
    finally:
        holder.kill()
        holder.wait()
