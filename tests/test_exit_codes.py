"""docs/cli.md "Exit codes", row by row and clause by clause, asserted exactly: the installed `tritonctl`
as a process (the status a shell sees) against a real daemon whose tritonserver is an external one
this test stops (so "tritonserver unreachable" is real, not a stand-in).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane.triton.launcher import TritonServer
from tests import registry_fixtures
from tests.harness import TRITONCTL, DaemonProcess, wait_for, write_gen_model

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


def code(daemon: DaemonProcess, *args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """The installed `tritonctl` as a process (the exit status a shell or a script sees), its stderr."""
    full = [TRITONCTL, *args]
    if args[0] not in ("validate", "daemon") and "--state-dir" not in args:
        full += ["--state-dir", str(daemon.state_dir)]
    result = subprocess.run(full, capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})})
    return result.returncode, result.stderr


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


def digests(daemon: DaemonProcess) -> dict[str, str]:
    """m's digests by role: 'active', 'older' (good, not active), 'broken' (quarantined), when present."""
    out: dict[str, str] = {}
    for v in daemon.json("versions", "m"):
        role = "active" if v["active"] else "broken" if v["quarantined"] else "older"
        out.setdefault(role, v["digest"])
    return out


def test_every_row_of_the_table(external: tuple[DaemonProcess, TritonServer], tmp_path: Path) -> None:
    daemon, server = external
    # 0: ok, and nothing to do
    assert code(daemon, "status") == (0, "")
    assert code(daemon, "webhooks") == (0, "")
    assert code(daemon, "load", "m")[0] == 0  # already serving: noop
    # 1: the operation failed or was rolled back; validation found an error
    broken = tmp_path / "broken"
    (broken / "1").mkdir(parents=True)
    (broken / "config.pbtxt").write_text('name: "broken"\nbackend: "python"\n')
    assert code(daemon, "validate", str(broken))[0] == 1
    write_gen_model(daemon.repository, "m", 3, init="raise RuntimeError('weights missing')")
    wait_for(lambda: "broken" in digests(daemon), 60, 0.2, "generation 3 rolled back and quarantined")
    rc, err = code(daemon, "load", "m", "--digest", digests(daemon)["broken"][:12], "--force")
    assert rc == 1 and "weights missing" in err, (rc, err)
    assert code(daemon, "status")[0] == 0
    # 2: usage: bad arguments, bad model name or digest, an unknown model or digest, a pinned model without
    # --force, a bad setting, a busy state directory, a tag error, a missing optional dependency, a failed schema
    # migration (collected content: below)
    roles = digests(daemon)
    for args in (["status", "--no-such-flag"], ["load"], ["gc", "--keep", "-1"],
                 ["status", "ghost"], ["load", "ghost"], ["rollback", "ghost"], ["unload", "ghost"],
                 ["pin", "ghost"], ["versions", "ghost"], ["load", "m", "--digest", "deadbeef"],
                 ["load", "m", "--digest", "not-hex!"], ["rollback", "m", "--to", "deadbeef"], ["load", "../x"],
                 # tag errors: a bad tag name, an unknown tag, tracking on one host (tracking is fleet-wide)
                 ["tag", "m", "Stable"], ["tag", "m", "deadbeef"], ["tag", "m", "stable", "deadbeef"],
                 ["load", "m", "--tag", "nosuch"], ["rollback", "m", "--to-tag", "nosuch"],
                 ["policy", "m", "track:nosuch"], ["policy", "m", "track:stable", "--host", "h1"],
                 # an unknown webhook delivery id, or not one at all
                 ["webhooks", "redeliver", "ffffffff"], ["webhooks", "redeliver", "not-hex"]):
        rc, err = code(daemon, *args)
        assert rc == 2, (args, err)
        if args[0] != "gc" and args[1:2] != ["--no-such-flag"] and args != ["load"]:
            assert one_line(err).startswith("error:"), (args, err)  # click's own usage errors print usage lines
    assert code(daemon, "pin", "m")[0] == 0
    try:
        rc, err = code(daemon, "load", "m", "--digest", roles["older"][:12])
        assert rc == 2 and "pinned" in one_line(err), err
    finally:
        assert code(daemon, "unpin", "m")[0] == 0
    rc, err = code(daemon, "daemon", "--repository", str(tmp_path), "--state-dir", str(tmp_path / "st"),
                   env={"TRITONCTL_SETTLE_S": "soon"})
    assert rc == 2 and one_line(err) == ("error: environment TRITONCTL_SETTLE_S: settle_s: invalid value 'soon' "
                                         "(expected a number)"), err
    # a state directory another daemon runs on: a start-up refusal like a bad setting (issue 57: it exited 1)
    rc, err = code(daemon, "daemon", "--repository", str(daemon.repository), "--state-dir", str(daemon.state_dir),
                   "--triton-url", server.grpc_url)
    assert rc == 2 and one_line(err).startswith(f"error: state directory {daemon.state_dir} is in use by another "
                                                "tritonctl daemon (pid "), err
    shim = tmp_path / "no-psycopg"  # as if `tritonctl[postgres]` was not installed
    (shim / "psycopg").mkdir(parents=True)
    (shim / "psycopg" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'psycopg'\", name='psycopg')\n")
    rc, err = code(daemon, "audit", "--db-url", "postgresql+psycopg://u@127.0.0.1:1/db",
                   env={"PYTHONPATH": str(shim)})
    assert rc == 2 and one_line(err) == ("error: postgresql+psycopg://u@127.0.0.1:1/db needs the psycopg driver, "
                                         "which is not installed; pip install 'tritonctl[postgres]'"), err
    # a schema migration that failed and changed nothing (`db upgrade`, as the daemon's start)
    registry = tmp_path / "old-registry"
    registry.mkdir()
    registry_fixtures.build(f"sqlite:///{registry / 'registry.db'}", "0007")
    registry_fixtures.break_migration_0008(f"sqlite:///{registry / 'registry.db'}")
    rc, err = code(daemon, "db", "upgrade", "--state-dir", str(registry))
    assert rc == 2 and one_line(err).startswith("error: registry: migration 0008_footprints failed: "), err
    # 3: the daemon is unreachable; the error says how to fix it
    rc, err = code(daemon, "status", "--state-dir", str(tmp_path / "none"))
    assert rc == 3 and "start one" in one_line(err) and "TRITONCTL_STATE_DIR" in err, err
    rc, err = code(daemon, "webhooks", "--state-dir", str(tmp_path / "none"))
    assert rc == 3 and "start one" in one_line(err), err
    # 4: tritonserver is unreachable during load, rollback, unload
    server.stop()
    wait_for(lambda: not daemon.status()["triton_reachable"], 30, 0.2, "triton unreachable")
    for args in (["load", "m", "--force"], ["rollback", "m"], ["unload", "m"]):
        rc, err = code(daemon, *args)
        assert rc == 4, (args, rc, err)
        assert "unreachable" in one_line(err), err
    assert code(daemon, "status")[0] == 0  # status still answers, saying so
    # 2 again: collected content (gc keeps only what serves)
    assert code(daemon, "gc", "--keep", "0")[0] == 0
    rc, err = code(daemon, "load", "m", "--digest", roles["older"][:12])
    assert rc == 2 and "collected by gc" in one_line(err), err


def test_missing_daemon_message_in_a_subprocess(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "cli.main", "status", "--state-dir", str(tmp_path)],
                            capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert result.returncode == 3
    assert result.stderr == (f"error: no daemon at {tmp_path / 'tritonctl.sock'}; start one (`tritonctl daemon`) "
                             "or set TRITONCTL_STATE_DIR / --state-dir\n")


def test_a_role_short_of_the_routes_exits_5_and_no_valid_token_exits_1(tmp_path: Path) -> None:
    """Row 5 and the 401 line under the table, through the installed `tritonctl` as a process: the real control
    API server (its TCP listener, the access gate, personal tokens in a real SQLite registry) over the stand-in
    plane of tests/test_cli_daemon_commands.py (the refusal comes before any plane method)."""
    import tempfile
    from concurrent import futures

    from controlplane.api.server import ApiServer
    from controlplane.settings.config import Settings
    from controlplane.store import migrate
    from controlplane.store.registry import Registry
    from controlplane.triton.launcher import free_port
    from tests.test_cli_daemon_commands import StandInPlane

    state = Path(tempfile.mkdtemp(prefix="tctl-exit5-"))
    registry = Registry(f"sqlite:///{state / 'registry.db'}")
    migrate.upgrade(registry)
    plane = StandInPlane()
    plane.registry = registry  # type: ignore[attr-defined]  # where the daemon keeps its tokens
    address = f"127.0.0.1:{free_port()}"
    server = ApiServer(plane, futures.ThreadPoolExecutor(2), Settings(state_dir=state, listen=address))  # type: ignore[arg-type]
    server.start()
    try:
        assert server.tokens is not None
        _, viewer = server.tokens.create("reader", "viewer", "uid:0(root)", None)
        token_file = tmp_path / "reader.token"
        token_file.write_text(viewer)
        token_file.chmod(0o600)
        connect = ["--address", address, "--token-file", str(token_file)]
        result = subprocess.run([TRITONCTL, "gc", *connect], capture_output=True, text=True, timeout=60)
        assert (result.returncode, one_line(result.stderr)) == (
            5, "error: token:reader has role viewer; this needs role admin"), result.stderr
        assert subprocess.run([TRITONCTL, "status", *connect], capture_output=True, timeout=60).returncode == 0
        server.tokens.revoke("reader", "uid:0(root)")
        result = subprocess.run([TRITONCTL, "status", *connect], capture_output=True, text=True, timeout=60)
        assert (result.returncode, one_line(result.stderr)) == (1, "error: token 'reader' was revoked"), result.stderr
    finally:
        server.stop(0.1)
        registry.close()
