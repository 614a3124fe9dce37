"""Storage faults: the state directory's filesystem full, the registry locked by another writer.

Each ends in a clear one-line reason, nothing half-recorded, and nothing that serves changes; a full disk
is retried, never taken for bad content. The
unreadable-source case is in tests/test_snapshot.py (test_unreadable_file_is_named).
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient

from controlplane.store.registry import Registry
from tests.harness import DaemonProcess, answers, infer_gen, wait_for, write_gen_model


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 48 MiB tmpfs for the state directory (root only). Where mounting is refused the test fails,
    so a Guarantees row is never silently unproven, unless TRITONCTL_TEST_NO_MOUNT=1 opts out."""
    mount = tmp_path / "smallfs"
    mount.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(mount)],
                            capture_output=True, text=True)
    if result.returncode != 0:
        reason = (f"cannot mount a small tmpfs here ({result.stderr.strip() or 'not root'}); the full-disk case "
                  "needs one (run as root, or set TRITONCTL_TEST_NO_MOUNT=1 to skip it knowingly)")
        if os.environ.get("TRITONCTL_TEST_NO_MOUNT") == "1":
            pytest.skip(reason)
        pytest.fail(reason)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_full_state_filesystem_puts_the_snapshot_off_and_keeps_serving(tmp_path: Path, small_fs: Path) -> None:
    """A full disk is the host's fault, not the content's (issue 58): the capture is tried again, the
    model never recorded invalid; `status` says why it waits."""
    repo = tmp_path / "repo"
    repo.mkdir()
    write_gen_model(repo, "roomy", 1)
    daemon = DaemonProcess(repo, small_fs / "state").start()
    try:
        wait_for(lambda: daemon.model_status("roomy").get("state") == "serving", 30, what="serving")
        versions_before = daemon.json("versions", "roomy")
        hold = repo / "roomy" / ".tritonctl-hold"  # the writer says: not complete yet
        hold.touch()
        write_gen_model(repo, "roomy", 2)
        (repo / "roomy" / "1" / "weights.bin").write_bytes(os.urandom(64 * 1024 * 1024))  # > the filesystem
        hold.unlink()
        row = wait_for(lambda: (r := daemon.model_status("roomy")) and "No space left on device" in str(
            r.get("sync_reason")) and r, 30, what="the capture put off for want of space")
        assert row["sync"] != "invalid" and "\n" not in row["sync_reason"], row
        assert daemon.audit("--model", "roomy", "--action", "snapshot", "--outcome", "failed") == [], "judged"
        assert daemon.json("versions", "roomy") == versions_before, "nothing half-recorded"
        leftovers = [p for p in (small_fs / "state" / "store").rglob("*") if ".tmp" in p.name]
        assert not leftovers, leftovers
        client = grpcclient.InferenceServerClient(daemon.triton_url())
        assert infer_gen(client, "roomy") == 1.0
        assert daemon.proc is not None and daemon.proc.poll() is None
        # Room again (the big file goes): the next settled change is taken normally.
        (repo / "roomy" / "1" / "weights.bin").unlink()
        wait_for(lambda: answers(client, "roomy", 2.0), 30, 0.2, "generation 2 once there is room")
    finally:
        assert daemon.stop() == 0


def test_registry_locked_longer_than_the_busy_timeout(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    write_gen_model(repo, "locky", 1)
    daemon = DaemonProcess(repo, tmp_path / "state", env={"TRITONCTL_DB_BUSY_TIMEOUT_S": "0.5"}).start()
    try:
        wait_for(lambda: daemon.model_status("locky").get("state") == "serving", 30, what="serving")
        client = grpcclient.InferenceServerClient(daemon.triton_url())
        holder = sqlite3.connect(daemon.state_dir / "registry.db", isolation_level=None, timeout=10)
        holder.execute("BEGIN EXCLUSIVE")
        try:
            write_gen_model(repo, "locky", 2)
            wait_for(lambda: "database is locked" in daemon.log_tail(20000), 20, what="locked error logged")
            assert infer_gen(client, "locky") == 1.0, "nothing that serves changes while the registry is locked"
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        line = next(x for x in daemon.log_tail(20000).splitlines() if "database is locked" in x)
        assert line.split(" ", 2)[1] in ("ERROR", "WARNING") and "Traceback" not in daemon.log_tail(20000)  # TIME LEVEL
        # Released: the change is retried and deploys; nothing was half-recorded meanwhile.
        wait_for(lambda: answers(client, "locky", 2.0), 30, 0.2, "generation 2 after the lock is released")
        registry = Registry(f"sqlite:///{daemon.state_dir / 'registry.db'}")
        try:
            assert len(registry.list_snapshots("locky")) == 2
            wait_for(lambda: not registry.open_deployments(), 20, what="no open deployment")
        finally:
            registry.close()
    finally:
        assert daemon.stop() == 0

