"""Filesystem helpers the store and its neighbours borrow: atomic replace, link-or-copy, forced removal,
a guarded read of a small text file in a source being edited.

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


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Replace `path` with `data` in one step (temp file in the same directory, then rename)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


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
