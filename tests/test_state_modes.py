"""The daemon's state does not depend on the umask it was started with (issue 58, item 4).

Before: under umask 002, `triton/`, `triton/backends/python/`, `store/` and `bakes.json` became writable by
the state directory's group, whose members could replace the python backend stub a root daemon's
tritonserver runs; a symlink planted at `triton/server.json.tmp` made the daemon write the Triton key into
the planter's file; a registry copied before a migration (`registry.db.before-<revision>`) took the
umask's mode whatever the registry's. Now: a real daemon started under umask 002 (a shell wrapper) leaves
nothing group- or world-writable in its state directory but the control socket, and does not follow the
planted link; the pieces that create files keep their modes under umask 002 in this process too.
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from controlplane.store.migrate import backup_sqlite
from tests.harness import DaemonProcess, wait_for, write_gen_model

UMASK_002 = ["sh", "-c", 'umask 002; exec "$@"', "sh"]


def writable_by_others(root: Path) -> list[str]:
    """Every entry under `root` (links not followed) that its group or others may write, with its mode."""
    found = []
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(directory) / name
            info = path.lstat()
            if stat.S_ISLNK(info.st_mode) or stat.S_ISSOCK(info.st_mode):
                continue
            if info.st_mode & 0o022:
                found.append(f"{path.relative_to(root)} {stat.filemode(info.st_mode)}")
    return found


@contextmanager
def umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


@pytest.mark.triton
def test_a_daemon_under_umask_002_leaves_nothing_writable_by_others_and_follows_no_planted_link(
        tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_gen_model(repo, "m", 1)
    state = tmp_path / "state"
    (state / "triton").mkdir(parents=True)
    state.chmod(0o750)
    planted = tmp_path / "planted"  # whoever planted the link can read this file
    planted.write_text("")
    (state / "triton" / "server.json.tmp").symlink_to(planted)
    daemon = DaemonProcess(repo, state, wrapper=UMASK_002, extra_args=["--bake", "1s"])
    daemon.start()
    try:
        wait_for(lambda: daemon.model_status("m").get("state") == "serving", 60, what="m serving")
        write_gen_model(repo, "m", 2)  # a second digest: a bake (bakes.json) and a published tree
        wait_for(lambda: (state / "bakes.json").exists(), 60, what="the bake of the second digest recorded")
        assert (state / "triton" / "backends" / "python" / "triton_python_backend_stub").exists()
        assert planted.read_text() == "", "the Triton key was written through the planted link"
        record = json.loads((state / "triton" / "server.json").read_text())
        assert record["restricted_key"] and stat.S_IMODE((state / "triton" / "server.json").stat().st_mode) == 0o600
        assert writable_by_others(state) == []
        sock = (state / "tritonctl.sock").stat()
        assert stat.S_IMODE(sock.st_mode) == 0o660
    finally:
        assert daemon.stop() == 0, daemon.log_tail()
    assert writable_by_others(state) == []


def test_the_state_files_keep_their_modes_under_umask_002(tmp_path: Path) -> None:
    from controlplane.snapshot.content import ContentStore
    from controlplane.startup.statedir import StateDir
    from controlplane.triton.launcher import assemble_backend_dir, find_tritonserver

    with umask(0o002):
        StateDir(tmp_path / "state").prepare()
        store = ContentStore(tmp_path / "state" / "store", fsync=False)
        write_gen_model(tmp_path / "repo", "m", 1)
        store.capture(tmp_path / "repo" / "m", "m")
        assemble_backend_dir(tmp_path / "state" / "triton" / "backends", find_tritonserver())
    assert writable_by_others(tmp_path / "state") == []


@pytest.mark.parametrize("mode", [0o600, 0o640])
def test_a_registry_copied_before_a_migration_keeps_the_registrys_mode(tmp_path: Path, mode: int) -> None:
    database = tmp_path / "registry.db"
    sqlite3.connect(database).close()
    database.chmod(mode)
    with umask(0o002):
        copy = backup_sqlite(database, "0009")
    assert copy.name == "registry.db.before-0009"
    assert stat.S_IMODE(copy.stat().st_mode) == mode
