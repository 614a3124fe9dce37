"""README "Exit codes", row by row, asserted exactly: the installed CLI against a real daemon whose
tritonserver is an external one this test stops (so "tritonserver unreachable" is real, not a stand-in).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from cli.main import cli
from controlplane.triton.launcher import TritonServer
from tests.harness import DaemonProcess, wait_for, write_gen_model

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def external(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonProcess, TritonServer]]:
    base = tmp_path_factory.mktemp("exit-codes")
    server = TritonServer(model_repository=base / "state" / "serving", workdir=base / "triton-work")
    (base / "state" / "serving").mkdir(parents=True)
    server.start()
    repo = base / "repo"
    repo.mkdir()
    write_gen_model(repo, "m", 1)
    proc = DaemonProcess(repo, base / "state", launch=False, extra_args=["--triton-url", server.grpc_url]).start()
    try:
        wait_for(lambda: proc.model_status("m").get("state") == "serving", 60, 0.2, "m serving")
        write_gen_model(repo, "m", 2)
        wait_for(lambda: len(proc.audit("--model", "m", "--action", "deploy", "--outcome", "ok")) == 2, 60, 0.2,
                 "gen 2 deployed")
        yield proc, server
    finally:
        proc.stop()
        server.stop()


def code(daemon: DaemonProcess, *args: str) -> tuple[int, str]:
    """The CLI in-process (the same code path as the installed script, without an interpreter start per
    row); the one-line stderr is checked on the subprocess too, below."""
    extra = [] if args[0] == "validate" or "--state-dir" in args else ["--state-dir", str(daemon.state_dir)]
    result = CliRunner().invoke(cli, [*args, *extra])
    return result.exit_code, result.stderr


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


def test_every_row_of_the_table(external: tuple[DaemonProcess, TritonServer], tmp_path: Path) -> None:
    daemon, server = external
    # 0: ok, and nothing to do
    assert code(daemon, "status") == (0, "")
    assert code(daemon, "load", "m")[0] == 0  # already serving: noop
    # 1: the operation failed; validation found an error
    broken = tmp_path / "broken"
    (broken / "1").mkdir(parents=True)
    (broken / "config.pbtxt").write_text('name: "broken"\nbackend: "python"\n')
    assert code(daemon, "validate", str(broken))[0] == 1
    # 2: usage, unknown model or digest
    for args in (["status", "ghost"], ["load", "ghost"], ["rollback", "ghost"], ["unload", "ghost"],
                 ["pin", "ghost"], ["versions", "ghost"], ["load", "m", "--digest", "deadbeef"],
                 ["rollback", "m", "--to", "deadbeef"], ["load", "../x"], ["gc", "--keep", "-1"],
                 # tag errors: a bad tag name, an unknown tag, tracking on one host (tracking is fleet-wide)
                 ["tag", "m", "Stable"], ["tag", "m", "deadbeef"], ["tag", "m", "stable", "deadbeef"],
                 ["load", "m", "--tag", "nosuch"], ["rollback", "m", "--to-tag", "nosuch"],
                 ["policy", "m", "track:nosuch"], ["policy", "m", "track:stable", "--host", "h1"]):
        rc, err = code(daemon, *args)
        assert rc == 2, (args, err)
        if args[0] != "gc":  # click's own usage errors print usage lines; ours are one line
            assert one_line(err).startswith("error:"), err
    # 3: the daemon is unreachable; the error says how to fix it
    rc, err = code(daemon, "status", "--state-dir", str(tmp_path / "none"))
    assert rc == 3 and "start one" in one_line(err) and "TRITONCTL_STATE_DIR" in err, err
    # 4: tritonserver is unreachable during load, rollback, unload
    server.stop()
    wait_for(lambda: not daemon.status()["triton_reachable"], 30, 0.2, "triton unreachable")
    for args in (["load", "m", "--force"], ["rollback", "m"], ["unload", "m"]):
        rc, err = code(daemon, *args)
        assert rc == 4, (args, rc, err)
        assert "unreachable" in one_line(err), err
    assert code(daemon, "status")[0] == 0  # status still answers, saying so


def test_missing_optional_dependency_is_one_line_naming_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # as if `tritonctl[postgres]` was not installed
    result = CliRunner().invoke(cli, ["audit", "--db-url", "postgresql+psycopg://u@127.0.0.1:1/db"])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == ("error: postgresql+psycopg://u@127.0.0.1:1/db needs the psycopg driver, "
                                     "which is not installed; pip install 'tritonctl[postgres]'")


def test_missing_daemon_message_in_a_subprocess(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "cli.main", "status", "--state-dir", str(tmp_path)],
                            capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert result.returncode == 3
    assert result.stderr == (f"error: no daemon at {tmp_path / 'tritonctl.sock'}; start one (`tritonctl daemon`) "
                             "or set TRITONCTL_STATE_DIR / --state-dir\n")
