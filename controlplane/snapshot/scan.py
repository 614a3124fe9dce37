"""Reading a model directory without trusting it: the scan, its stat signature, and the last change.

A capture scans twice (before and after copying) and compares the signatures; `last_change_ns` sees
debris too, because a writer filling a temp file is still writing. Refusals are typed
(controlplane.errors): a vanished entry is `SnapshotChangingError` (retryable), a symlink leaving the
model, a symlinked model entry leaving the repository and `allowed_link_roots`, or a fifo is
`SnapshotUnsupportedError`.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controlplane.errors import SnapshotChangingError, SnapshotUnsupportedError, unreadable
from controlplane.snapshot.debris import is_ignored_name


@dataclass(frozen=True)
class ScanItem:
    """A scanned entry: where to read it and the stat facts that must hold still."""

    rel: str
    kind: str
    real: str  # the path to read (a symlink's resolved target)
    st: os.stat_result

    @property
    def signature(self) -> tuple[Any, ...]:
        s = self.st
        if self.kind == "dir":  # its entries are items of their own; its times also move for debris
            return (self.rel, self.kind, self.real, s.st_ino, s.st_mode)
        return (self.rel, self.kind, self.real, s.st_size, s.st_mtime_ns, s.st_ctime_ns, s.st_ino, s.st_mode)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def scan(model_dir: Path, model: str, skip: frozenset[str] = frozenset(),
         link_roots: Sequence[str] | None = None) -> list[ScanItem]:
    """Every entry of a model directory worth capturing, sorted by path; refuses what it cannot take.

    `skip` names entries at the model root to leave out (the commit marker). Symlinks are resolved
    and must stay inside the model directory; their target is captured as a regular file or dir.
    `link_roots` (resolved paths; None: unchecked): the model directory, a symlinked model entry
    resolved, must lie inside one of them (the repository, `allowed_link_roots`), else it is refused
    before anything is read: a link to a directory its writer cannot read must not be captured.
    """
    base = os.path.realpath(model_dir)
    if link_roots is not None and not any(_inside(base, root) for root in link_roots):
        raise SnapshotUnsupportedError(
            f"{model}: model entry is a symlink to {base}, outside the repository and allowed_link_roots; "
            "refusing to follow it")
    items: list[ScanItem] = []

    def walk(real_dir: str, rel_dir: str, ancestors: frozenset[str]) -> None:
        try:
            with os.scandir(real_dir) as it:
                children = sorted(it, key=lambda d: d.name)
        except FileNotFoundError:
            raise SnapshotChangingError(f"{model}: still changing ({rel_dir or '.'} vanished)") from None
        except OSError as exc:
            raise unreadable(f"{model}: cannot read directory {rel_dir or '.'} ({exc.strerror})", exc) from None
        for child in children:
            name = child.name
            if is_ignored_name(name) or (not rel_dir and name in skip):
                continue
            rel = f"{rel_dir}/{name}" if rel_dir else name
            path = os.path.join(real_dir, name)
            try:
                if child.is_symlink():
                    real = os.path.realpath(path)
                    if not _inside(real, base):
                        raise SnapshotUnsupportedError(f"{model}: symlink {rel} points outside the model directory")
                    st = os.stat(real)
                else:
                    real, st = path, os.lstat(path)
            except FileNotFoundError:
                if os.path.islink(path):
                    raise SnapshotUnsupportedError(f"{model}: symlink {rel} is dangling") from None
                raise SnapshotChangingError(f"{model}: still changing ({rel} vanished during the scan)") from None
            except OSError as exc:
                raise unreadable(f"{model}: cannot read {rel} ({exc.strerror})", exc) from None
            if stat.S_ISDIR(st.st_mode):
                if real in ancestors:
                    raise SnapshotUnsupportedError(f"{model}: symlink {rel} makes a directory loop")
                items.append(ScanItem(rel, "dir", real, st))
                walk(real, rel, ancestors | {real})
            elif stat.S_ISREG(st.st_mode):
                items.append(ScanItem(rel, "file", real, st))
            else:
                kind = "fifo" if stat.S_ISFIFO(st.st_mode) else "socket or device"
                raise SnapshotUnsupportedError(
                    f"{model}: {rel} is a {kind}, not a regular file; refusing to capture it")

    walk(base, "", frozenset({base}))
    return items


def last_change_ns(model_dir: Path) -> int:
    """The newest ctime (ns) in a model directory: the directory, every entry below it, and the debris
    the scan leaves out (a temp file a writer fills before renaming it, an editor's swap file), without
    descending into debris directories. ctime, because no writer can set it back or forward (mtime can:
    `touch -d`, `cp -p`, rsync)."""
    newest = 0

    def walk(path: str) -> None:
        nonlocal newest
        try:
            with os.scandir(path) as it:
                for entry in it:
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue  # vanished: the scan decides what that means
                    newest = max(newest, st.st_ctime_ns)
                    if entry.is_dir(follow_symlinks=False) and not is_ignored_name(entry.name):
                        walk(entry.path)
        except OSError:
            pass

    try:
        # a symlinked model root (a publish by symlink flip): the link's own ctime and its target's
        newest = max(os.lstat(model_dir).st_ctime_ns, os.stat(model_dir).st_ctime_ns)
    except OSError:
        return 0
    walk(os.fspath(model_dir))
    return newest


def first_difference(before: list[ScanItem], after: list[ScanItem]) -> str:
    old, new = ({i.rel: i.signature for i in items} for items in (before, after))
    rel = min(r for r in old.keys() | new.keys() if old.get(r) != new.get(r))
    return f"{rel} {'removed' if rel not in new else 'added' if rel not in old else 'modified'}"
