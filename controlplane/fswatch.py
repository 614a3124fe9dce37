"""Decide how to watch a source repository: inotify events, or polling stat signatures.

inotify reports only what happens through this kernel's own VFS. On a network or FUSE filesystem a
write made by another machine (NFS, SMB, CephFS, sshfs...) or underneath the mount (a FUSE bind mount
written from the directory it shows) raises no event at all, so the daemon would never see it. Such a
repository is polled instead. The filesystem type is the kernel's own word for it: the mount holding
the repository's real path (the longest mount-point prefix in /proc/self/mountinfo), its type field.
"""

from __future__ import annotations

import ctypes
import errno
import os
from dataclasses import dataclass
from pathlib import Path

MOUNTINFO = "/proc/self/mountinfo"
# Filesystem types whose changes can come from elsewhere without an inotify event: network and
# cluster filesystems, FUSE (any fuse.* subtype: sshfs, bindfs, s3fs, gcsfuse, rclone, glusterfs...),
# host-shared guest filesystems (9p, virtiofs, vboxsf, vmhgfs) and SMB/AFS variants. docs/watching.md.
POLLED_FS_TYPES = frozenset({
    "nfs", "nfs4", "cifs", "smb", "smb2", "smb3", "smbfs", "ncpfs", "afs", "coda",
    "fuse", "fuseblk", "9p", "virtiofs", "vboxsf", "vmhgfs", "ceph", "glusterfs", "lustre", "gpfs",
    "beegfs", "ocfs2", "gfs2", "davfs", "orangefs", "pvfs2",
})  # fmt: skip


@dataclass(frozen=True)
class WatchMode:
    """How a repository is watched and why; `status` shows it as {"mode": ..., "reason": ...}."""

    mode: str  # "inotify" | "poll"
    reason: str

    def as_dict(self) -> dict[str, str]:
        return {"mode": self.mode, "reason": self.reason}


def _unescape(field: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as \\ooo octal."""
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 4 <= len(field) and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def filesystem_type(path: Path, mountinfo: str = MOUNTINFO) -> tuple[str, str] | None:
    """(type, mount point) of the mount holding `path`'s real path; None when it cannot be read."""
    real = os.path.realpath(path)
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    best: tuple[str, str] | None = None
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if not sep or len(fields) < 5 or not right.split():
            continue
        point = _unescape(fields[4])
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        # a later line for the same point is a mount stacked over the earlier one: it wins
        if inside and (best is None or len(point) >= len(best[1])):
            best = (right.split()[0], point)
    return best


def is_polled_type(fstype: str) -> bool:
    return fstype in POLLED_FS_TYPES or fstype.startswith("fuse.")


def choose_mode(root: Path, setting: str = "auto", mountinfo: str = MOUNTINFO) -> WatchMode:
    """The mode for `root` under the `watch` setting (auto | inotify | poll)."""
    if setting == "poll":
        return WatchMode("poll", "watch = poll (operator setting)")
    if setting == "inotify":
        return WatchMode("inotify", "watch = inotify (operator setting)")
    found = filesystem_type(root, mountinfo)
    if found is None:
        return WatchMode("inotify", "filesystem type unknown (no /proc/self/mountinfo); assuming local")
    fstype, point = found
    if is_polled_type(fstype):
        return WatchMode("poll", f"{fstype} filesystem at {point} delivers no inotify events for writes made elsewhere")
    return WatchMode("inotify", f"local {fstype} filesystem at {point}")


def watches_exhausted(path: Path) -> bool:
    """Whether this user is out of inotify watches (`fs.inotify.max_user_watches`): a probe watch on
    `path` in an inotify instance of its own fails with ENOSPC. watchdog skips a sub-directory it
    cannot watch without a word, so this is how the daemon learns that new directories go unwatched."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.inotify_init1(os.O_CLOEXEC)
    except (OSError, AttributeError):
        return False
    if fd < 0:
        return False  # out of instances (EMFILE) is a different limit; the daemon's own still works
    try:
        wd = libc.inotify_add_watch(fd, os.fsencode(path), 0x00000100)  # IN_CREATE
        return wd < 0 and ctypes.get_errno() == errno.ENOSPC
    finally:
        os.close(fd)
