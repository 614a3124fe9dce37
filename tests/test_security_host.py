"""Other users on the host, as an attacker would try it (issue 43): the launched tritonserver's key read
from its command line as another user (`runuser -u nobody`: it is readable on a host whose /proc is not
mounted hidepid, and the daemon says so), a model entry symlinked to a directory its writer cannot read,
a model too big for `max_model_bytes`, and a shared-store manifest that would write outside the store."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane.errors import SnapshotCorruptError
from controlplane.fleet.sharedcontent import DirectorySharedStore
from controlplane.snapshot import ContentStore, ManifestEntry, Snapshot
from controlplane.triton.exposure import key_exposure, proc_mount_options
from controlplane.triton.launcher import RESTRICTED_HEADER
from tests.harness import TRITONCTL, DaemonProcess, wait_for, write_gen_model

MAX_MODEL_BYTES = 100_000
EXPOSED_WARNING = "tritonserver's key is exposed"

as_root_with_runuser = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("runuser") is None,
    reason="reading as another user needs root and runuser (util-linux)")


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonProcess, Path]]:
    """One daemon (launched tritonserver) over a repository holding, besides a plain model: a symlink to
    a root-only directory outside it, a symlink into an `allowed_link_roots` directory, and a model
    over a small `max_model_bytes`."""
    base = tmp_path_factory.mktemp("host")
    base.chmod(0o755)  # the attacker (nobody) may walk to the repository, not into the secret
    repo, shared, secret = base / "repo", base / "shared", base / "secret"
    for directory in (repo, shared, secret):
        directory.mkdir()
    write_gen_model(repo, "plain", 1)
    write_gen_model(shared, "linked", 2)
    (repo / "linked").symlink_to(shared / "linked")
    write_gen_model(secret, "stolen", 3)
    (secret / "stolen" / "1" / "private.txt").write_text("root's secret\n")
    (secret / "stolen" / "1" / "private.txt").chmod(0o600)
    secret.chmod(0o700)
    (repo / "stolen").symlink_to(secret / "stolen")
    write_gen_model(repo, "huge", 4)
    (repo / "huge" / "1" / "weights.bin").write_bytes(b"\0" * (MAX_MODEL_BYTES + 1))
    daemon = DaemonProcess(repo, base / "state", env={"TRITONCTL_ALLOWED_LINK_ROOTS": str(shared),
                                                      "TRITONCTL_MAX_MODEL_BYTES": str(MAX_MODEL_BYTES)})
    daemon.start()
    try:
        wait_for(lambda: {daemon.model_status(m).get("state") for m in ("plain", "linked")} == {"serving"}, 60,
                 what="plain and linked serving")
        yield daemon, base
    finally:
        daemon.stop(kill_triton=True)


# -- the Triton key ----------------------------------------------------------------------------------


@pytest.mark.triton
@as_root_with_runuser
def test_another_user_reads_the_key_and_the_daemon_says_so(host: tuple[DaemonProcess, Path]) -> None:
    """This host's /proc is not mounted hidepid: user nobody reads the key off tritonserver's command
    line. The daemon knew before it launched: one WARNING line, and `status` says `triton_key_exposed`."""
    daemon, _ = host
    assert key_exposure().exposed, "this test expects a /proc without hidepid (as CI's)"
    pid = daemon.triton_pid()
    assert pid is not None
    read = subprocess.run(["runuser", "-u", "nobody", "--", "cat", f"/proc/{pid}/cmdline"],
                          capture_output=True, timeout=30)
    assert read.returncode == 0, read.stderr
    assert f"{RESTRICTED_HEADER}=".encode() in read.stdout  # the key, as the attacker sees it
    assert daemon.status()["triton_key_exposed"] is True
    warnings = [line for line in daemon.log_tail(200_000).splitlines() if EXPOSED_WARNING in line]
    assert len(warnings) == 1 and warnings[0].startswith("WARNING"), warnings
    assert "hidepid" in warnings[0]
    shown = daemon.run("status")
    assert "KEY EXPOSED" in shown.stdout


@pytest.mark.triton  # it would launch one, were it not refused
def test_refuse_stops_the_daemon_before_it_launches_anything(tmp_path: Path) -> None:
    """`launch_triton_exposed_key = "refuse"` on a host where the key would be readable: exit 2, one
    line naming the key and why, no tritonserver, no state directory."""
    if not key_exposure().exposed:
        pytest.skip("this host's /proc hides other users' command lines: nothing to refuse")
    repo = tmp_path / "repo"
    write_gen_model(repo, "m", 1)
    state = tmp_path / "state"
    result = subprocess.run(
        [TRITONCTL, "daemon", "--repository", str(repo), "--state-dir", str(state), "--launch-triton",
         "--triton-grpc-port", "0", "--triton-http-port", "0", "--triton-metrics-port", "0"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "TRITONCTL_LAUNCH_TRITON_EXPOSED_KEY": "refuse"})
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: launch_triton_exposed_key = \"refuse\": /proc is not mounted with hidepid")
    assert not state.exists()  # nothing was created, so nothing was launched on it
    assert DaemonProcess(repo, state).triton_pid() is None


@pytest.mark.unit
def test_the_mount_table_says_whether_command_lines_are_hidden(tmp_path: Path) -> None:
    """What the check reads, on mount tables this host does not have (hidepid, a gid exemption, a
    service's own procfs stacked on the host's)."""
    host_proc = "22 27 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw\n"
    hidden = "22 27 0:21 / /proc rw,nosuid,relatime shared:12 - proc proc rw,hidepid=invisible,gid=27\n"
    service = "901 22 0:55 / /proc rw,nosuid,relatime - proc proc rw,hidepid=invisible\n"
    assert proc_mount_options(host_proc) == {"rw": "", "nosuid": "", "nodev": "", "noexec": "", "relatime": ""}
    assert proc_mount_options(hidden)["hidepid"] == "invisible"  # type: ignore[index]
    assert proc_mount_options("1 0 8:1 / / rw - ext4 /dev/sda1 rw\n") is None
    for table, exposed, words in ((host_proc, True, "not mounted with hidepid"),
                                  (hidden, False, "members of group 27"),
                                  (host_proc + service, True, "not mounted with hidepid"),  # the host's counts
                                  ("", True, "no /proc mount")):
        proc = tmp_path / str(len(table))
        (proc / "self").mkdir(parents=True)
        (proc / "self" / "mountinfo").write_text(table)
        result = key_exposure(proc)
        assert (result.exposed, words in result.reason) == (exposed, True), result


# -- model links and the size cap -----------------------------------------------------------------


@pytest.mark.triton
def test_a_model_linked_outside_the_repository_is_refused_and_shown(host: tuple[DaemonProcess, Path]) -> None:
    """A writer of the repository points a model entry at a directory only root can read: the daemon
    (root here) does not capture it, says why in status, and nothing of it reaches the registry."""
    daemon, base = host
    row = wait_for(lambda: daemon.model_status("stolen") or None, 30, what="stolen in status")
    assert (row["state"], row["digest"], row["sync"]) == ("new", None, "invalid"), row
    assert row["sync_reason"].startswith("capture refused: stolen: model entry is a symlink to "
                                         f"{base / 'secret' / 'stolen'}, outside the repository and "
                                         "allowed_link_roots; refusing to follow it"), row
    assert row["last_error"] in row["sync_reason"]
    assert daemon.json("versions", "stolen") == []  # nothing of it was captured
    [refusal] = daemon.audit("--model", "stolen")
    assert (refusal["action"], refusal["outcome"]) == ("snapshot", "failed")


@pytest.mark.triton
def test_a_model_linked_into_an_allowed_link_root_serves(host: tuple[DaemonProcess, Path]) -> None:
    daemon, _ = host
    row = daemon.model_status("linked")
    assert (row["state"], row["sync"]) == ("serving", "synced"), row


@pytest.mark.triton
def test_a_model_over_max_model_bytes_is_refused_with_its_size(host: tuple[DaemonProcess, Path]) -> None:
    daemon, _ = host
    row = wait_for(lambda: daemon.model_status("huge") or None, 30, what="huge in status")
    assert (row["state"], row["digest"], row["sync"]) == ("new", None, "invalid"), row
    assert f"over max_model_bytes ({MAX_MODEL_BYTES}); refusing to capture it" in row["sync_reason"], row


# -- shared-store manifests ----------------------------------------------------------------------------


@pytest.mark.unit
@pytest.mark.parametrize("path, sha256, why", [
    ("../x", "ab" * 32, "'..' part"),
    ("1/../../x", "ab" * 32, "'..' part"),
    ("/etc/x", "ab" * 32, "not a relative path"),
    ("1/model.py", "../../../../etc/passwd", "not 64 hex digits"),
    ("1/model.py", "AB" * 32, "not 64 hex digits"),
])
def test_a_shared_manifest_that_would_link_outside_is_refused(tmp_path: Path, path: str, sha256: str,
                                                              why: str) -> None:
    """A fleet host imports only manifests whose paths stay in the tree and whose hashes name objects:
    refused before any object is fetched or any link made."""
    shared = DirectorySharedStore(tmp_path / "shared")
    local = ContentStore(tmp_path / "local")
    evil = Snapshot.from_entries("m", [ManifestEntry("1", "dir", 0, 0o755, ""),
                                       ManifestEntry(path, "file", 3, 0o644, sha256)])
    shared.manifest_path(evil.digest).write_text(evil.manifest_json())
    with pytest.raises(SnapshotCorruptError, match=why):
        shared.import_into(local, "m", evil.digest)
    assert not (tmp_path / "x").exists() and not (tmp_path / "local" / "x").exists()
    assert list((tmp_path / "local" / "trees").iterdir()) == []


@pytest.mark.unit
def test_a_shared_digest_that_is_no_digest_is_refused(tmp_path: Path) -> None:
    shared = DirectorySharedStore(tmp_path / "shared")
    with pytest.raises(SnapshotCorruptError, match="is not a snapshot digest"):
        shared.import_into(ContentStore(tmp_path / "local"), "m", "../../manifests/x")
