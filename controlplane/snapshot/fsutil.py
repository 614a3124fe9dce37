"""Filesystem helpers the store and its neighbours borrow: atomic replace, link-or-copy, forced removal,
a guarded read of a small text file in a source being edited, a directory with its mode.

Modes are given here, never left to the umask (issue 58, item 4): `write_atomic` writes through a
temporary file created exclusively (a link planted at any name is never followed) and sets its mode on the
open file; `ensure_dir` creates a directory with its mode, and puts the mode back on one found wider.

Nothing here knows about snapshots; publish, the fleet's shared store and the S3 source use them too.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
import tempfile
from pathlib import Path


def write_atomic(path: Path, data: bytes, mode: int = 0o640, fsync: bool = False) -> None:
    """Replace `path` with `data` in one step: a temporary file of a new random name in the same directory,
    created exclusively (O_EXCL: nothing planted is followed) with mode 0600, given `mode`, then renamed
    over `path` (a rename replaces a link at `path` itself, never its target); `fsync`: durable first."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            os.fchmod(fh.fileno(), mode)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def ensure_dir(path: Path, mode: int = 0o750) -> Path:
    """`path` as a directory of exactly `mode` (its parents must exist): created so, or set so when the
    umask of an earlier start made it wider. A link or another kind of file there is an error."""
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        pass
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, "not a directory", str(path))
    if stat.S_IMODE(info.st_mode) != mode and info.st_uid == os.geteuid():
        os.chmod(path, mode)
    return path


def open_private(path: Path, flags: int, mode: int = 0o640) -> int:
    """os.open for a file the daemon writes (a log, a journal): created with `mode`, never through a link
    planted at `path` (O_NOFOLLOW: ELOOP instead)."""
    return os.open(path, flags | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, mode)


def link_or_copy(src: Path, dest: Path) -> None:
    """Hard-link a store object (no data copied); copy when the inode is out of links."""
    try:
        os.link(src, dest)
    except OSError as exc:
        if exc.errno != errno.EMLINK:
            raise
        shutil.copy2(src, dest)


def force_rmtree(path: Path) -> None:
    """Remove a tree even where read-only directories (store trees are 0555) would refuse it."""
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
        return
    for dirpath, _, _ in os.walk(path):  # r-x is enough to walk; removing entries needs w
        os.chmod(dirpath, 0o755)
    shutil.rmtree(path, ignore_errors=True)


def read_small_text(path: Path, limit: int) -> str | None:
    """The text of a regular file of at most `limit` bytes in a source someone may be editing; None for
    anything else. Opened non-blocking and checked with fstat before reading: a fifo named config.pbtxt
    must not block a worker, nor an 8 GiB sparse one be read (tests/corpus: gen_fifo_config,
    gen_huge_sparse_config)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            return None
        try:
            return fh.read(limit + 1)[:limit].decode(errors="replace")
        except OSError:
            return None
