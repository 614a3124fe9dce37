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
    # stat facts read through this mount may lag writes made elsewhere by this long (attribute
    # caches): a capture waits this much longer than the settle window (docs/watching.md)
    cache_s: float = 0.0

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


def _mount_of(path: Path, mountinfo: str) -> tuple[str, str, str] | None:
    """(type, mount point, options) of the mount holding `path`'s real path."""
    real = os.path.realpath(path)
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    best: tuple[str, str, str] | None = None
    for line in lines:
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 6 or not tail:
            continue
        point = _unescape(fields[4])
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        # a later line for the same point is a mount stacked over the earlier one: it wins
        if inside and (best is None or len(point) >= len(best[1])):
            best = (tail[0], point, ",".join([fields[5], *tail[2:3]]))
    return best


def filesystem_type(path: Path, mountinfo: str = MOUNTINFO) -> tuple[str, str] | None:
    """(type, mount point) of the mount holding `path`'s real path; None when it cannot be read."""
    found = _mount_of(path, mountinfo)
    return (found[0], found[1]) if found is not None else None


def is_polled_type(fstype: str) -> bool:
    return fstype in POLLED_FS_TYPES or fstype.startswith("fuse.")


def attribute_cache_s(fstype: str, options: str) -> float:
    """How long this client may show stale stat facts of a file changed elsewhere: NFS and SMB cache
    attributes (`actimeo`, `acregmax`; NFS defaults to 3-60 s by file age, CIFS to 1 s), FUSE for
    1 s by default (libfuse's attr and entry timeouts). 0 for a local filesystem."""
    if not is_polled_type(fstype):
        return 0.0
    opts = dict(o.partition("=")[::2] for o in options.split(","))
    if "noac" in opts:
        return 0.0
    for key in ("actimeo", "acregmax"):
        try:
            return float(opts[key])
        except (KeyError, ValueError):
            continue
    return 3.0 if fstype.startswith("nfs") else 1.0


def choose_mode(root: Path, setting: str = "auto", mountinfo: str = MOUNTINFO) -> WatchMode:
    """The mode for `root` under the `watch` setting (auto | inotify | poll)."""
    found = _mount_of(root, mountinfo)
    cache_s = attribute_cache_s(found[0], found[2]) if found is not None else 0.0
    if setting == "poll":
        return WatchMode("poll", "watch = poll (operator setting)", cache_s)
    if setting == "inotify":
        return WatchMode("inotify", "watch = inotify (operator setting)", cache_s)
    if found is None:
        return WatchMode("inotify", "filesystem type unknown (no /proc/self/mountinfo); assuming local")
    fstype, point, _ = found
    if is_polled_type(fstype):
        return WatchMode("poll", f"{fstype} filesystem at {point} delivers no inotify events for writes made "
                         "elsewhere", cache_s)
    return WatchMode("inotify", f"local {fstype} filesystem at {point}")


_libc: ctypes.CDLL | None = None


def watches_exhausted(path: Path) -> bool:
    """Whether this user is out of inotify watches (`fs.inotify.max_user_watches`): a probe watch on
    `path` in an inotify instance of its own fails with ENOSPC. watchdog skips a sub-directory it
    cannot watch without a word, so this is how the daemon learns that new directories go unwatched."""
    global _libc
    try:
        libc = _libc = _libc or ctypes.CDLL(None, use_errno=True)
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
