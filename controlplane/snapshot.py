"""Capture a model directory only once it is complete, into an immutable content-addressed store.

People and CI edit the source repository in place, so at any instant a model directory may be half
written: Triton's poll mode serves such fragments (shared/TRITON_NOTES.md). A snapshot is taken only
when the directory held still for the whole copy: its stat signature (paths, kinds, sizes, mtimes,
ctimes, inodes) is the same before and after every file was copied and hashed, and no hold file or
stale commit marker says the writer is not done. Captured files become read-only objects named by
their sha256 (deduplicated across models and versions); each snapshot gets a manifest whose digest
is defined by content alone, and a read-only tree of hard links to its objects. Nothing here knows
about the registry, gRPC or Triton; `controlplane.publish` turns a snapshot into what Triton serves.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import stat
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from controlplane.errors import (
    SnapshotAwaitingMarkerError,
    SnapshotChangingError,
    SnapshotCollectedError,
    SnapshotCorruptError,
    SnapshotDigestError,
    SnapshotOnHoldError,
    SnapshotSourceGoneError,
    SnapshotStoreWriteError,
    SnapshotTooLargeError,
    SnapshotUnreadableError,
    SnapshotUnsupportedError,
)

HOLD_FILE = ".tritonctl-hold"
CONFIG_FILE = "config.pbtxt"
MAX_CONFIG_BYTES = 1 << 20  # a real config.pbtxt is a few KiB: refuse before copying gigabytes of one
FICLONE = 0x40049409  # linux/fs.h: _IOW(0x94, 9, int)
_CHUNK = 1 << 20
_STATCACHE_MAX = 50_000
_HEX = frozenset("0123456789abcdef")
_NO_REFLINK = {errno.EOPNOTSUPP, errno.EXDEV, errno.EINVAL, errno.ENOTTY, errno.ENOSYS, errno.EPERM}
_SAME_FIELDS = ("st_dev", "st_ino", "st_size", "st_mtime_ns", "st_ctime_ns")


def is_ignored_name(name: str) -> bool:
    """Editor and tool debris that never belongs to a model: dotfiles (.git, .x.swp, .#x, rsync temps,
    the hold file), backups (x~), temp files (x.tmp) and __pycache__."""
    return name.startswith(".") or name.endswith("~") or name.endswith(".tmp") or name == "__pycache__"


def is_digest(text: str) -> bool:  # 64 lowercase hex digits: a digest or object name, safe in a path
    return len(text) == 64 and set(text) <= _HEX


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


@dataclass(frozen=True)
class ManifestEntry:
    """One file or directory of a snapshot; `path` is posix and relative to the model directory."""

    path: str
    kind: str  # "file" | "dir"
    size: int
    mode: int  # permission bits
    sha256: str  # "" for directories


def _canonical(entries: tuple[ManifestEntry, ...]) -> bytes:
    rows = [asdict(e) for e in entries]
    return json.dumps(rows, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


@dataclass(frozen=True)
class Snapshot:
    """A model's content at one instant: sorted entries and the digest that names them."""

    model: str
    digest: str
    entries: tuple[ManifestEntry, ...]
    total_bytes: int

    @classmethod
    def from_entries(cls, model: str, entries: list[ManifestEntry] | tuple[ManifestEntry, ...]) -> Snapshot:
        ordered = tuple(sorted(entries, key=lambda e: e.path))
        digest = hashlib.sha256(_canonical(ordered)).hexdigest()
        total = sum(e.size for e in ordered if e.kind == "file")
        return cls(model=model, digest=digest, entries=ordered, total_bytes=total)

    def manifest_json(self) -> str:
        rows = [asdict(e) for e in self.entries]
        body = {"format": 1, "digest": self.digest, "total_bytes": self.total_bytes, "entries": rows}
        return json.dumps(body, sort_keys=True, indent=1, ensure_ascii=True) + "\n"

    @classmethod
    def from_manifest_json(cls, model: str, text: str) -> Snapshot:
        try:
            body = json.loads(text)
            entries = [ManifestEntry(**row) for row in body["entries"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise SnapshotCorruptError(f"{model}: malformed snapshot manifest ({exc})") from exc
        snap = cls.from_entries(model, entries)
        if body.get("digest", snap.digest) != snap.digest:
            raise SnapshotCorruptError(f"{model}: manifest digest {body['digest']} does not match its entries")
        return snap

    def file(self, path: str) -> ManifestEntry | None:
        return next((e for e in self.entries if e.path == path), None)


@dataclass(frozen=True)
class _Item:
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


def scan(model_dir: Path, model: str, skip: frozenset[str] = frozenset()) -> list[_Item]:
    """Every entry of a model directory worth capturing, sorted by path; refuses what it cannot take.

    `skip` names entries at the model root to leave out (the commit marker). Symlinks are resolved
    and must stay inside the model directory; their target is captured as a regular file or dir.
    """
    base = os.path.realpath(model_dir)
    items: list[_Item] = []

    def walk(real_dir: str, rel_dir: str, ancestors: frozenset[str]) -> None:
        try:
            with os.scandir(real_dir) as it:
                children = sorted(it, key=lambda d: d.name)
        except FileNotFoundError:
            raise SnapshotChangingError(f"{model}: still changing ({rel_dir or '.'} vanished)") from None
        except OSError as exc:
            raise SnapshotUnreadableError(f"{model}: cannot read directory {rel_dir or '.'} ({exc.strerror})") from None
        for child in children:
            name = child.name
            if is_ignored_name(name) or (not rel_dir and name in skip):
                continue
            rel = f"{rel_dir}/{name}" if rel_dir else name
            path = os.path.join(real_dir, name)
            try:
                if child.is_symlink():
                    real = os.path.realpath(path)
                    if real != base and not real.startswith(base.rstrip("/") + "/"):
                        raise SnapshotUnsupportedError(f"{model}: symlink {rel} points outside the model directory")
                    st = os.stat(real)
                else:
                    real, st = path, os.lstat(path)
            except FileNotFoundError:
                if os.path.islink(path):
                    raise SnapshotUnsupportedError(f"{model}: symlink {rel} is dangling") from None
                raise SnapshotChangingError(f"{model}: still changing ({rel} vanished during the scan)") from None
            except OSError as exc:
                raise SnapshotUnreadableError(f"{model}: cannot read {rel} ({exc.strerror})") from None
            if stat.S_ISDIR(st.st_mode):
                if real in ancestors:
                    raise SnapshotUnsupportedError(f"{model}: symlink {rel} makes a directory loop")
                items.append(_Item(rel, "dir", real, st))
                walk(real, rel, ancestors | {real})
            elif stat.S_ISREG(st.st_mode):
                items.append(_Item(rel, "file", real, st))
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


def _first_difference(before: list[_Item], after: list[_Item]) -> str:
    old, new = ({i.rel: i.signature for i in items} for items in (before, after))
    rel = min(r for r in old.keys() | new.keys() if old.get(r) != new.get(r))
    return f"{rel} {'removed' if rel not in new else 'added' if rel not in old else 'modified'}"


def _open_source(path: str) -> int:
    """Open a file to capture without following a symlink swapped in since the scan."""
    return os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)


def _reflink(src_fd: int, dst_fd: int) -> bool:
    """Clone src into dst (copy-on-write, no data copied) where the filesystem supports it."""
    try:
        fcntl.ioctl(dst_fd, FICLONE, src_fd)
    except OSError as exc:
        if exc.errno in _NO_REFLINK:
            return False
        raise
    return True


def _same_file(a: os.stat_result, b: os.stat_result) -> bool:
    return all(getattr(a, f) == getattr(b, f) for f in _SAME_FIELDS)


class ContentStore:
    """`objects/ab/cdef…` (read-only file contents by sha256), `trees/<digest>/` (read-only snapshot
    trees of hard links) and `trees/<digest>.json` (manifests) under `root` = `<state>/store`.

    Thread-safe: captures of different models may run concurrently. `files_read`/`bytes_read` count
    source files actually read (the stat cache spares unchanged big files).
    """

    def __init__(self, root: Path, *, fsync: bool = True) -> None:
        self.root = Path(root)
        self.fsync = fsync
        self.files_read = self.bytes_read = self.reflinks = 0  # counters for tests and metrics
        self._reflink_ok = True
        self._lock = threading.RLock()
        try:
            for sub in ("objects", "trees", "tmp"):
                (self.root / sub).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SnapshotStoreWriteError(f"content store {self.root}: {exc.strerror}") from exc
        self._statcache_path = self.root / "statcache.json"
        # new entries are appended to a journal, folded into statcache.json only once the journal
        # outgrows the cache: rewriting the whole cache after every capture made an initial scan of
        # N models cost O(N^2) (bench/scale.py: 10,000 models)
        self._journal_path = self.root / "statcache.log"
        self._journal_lines = 0
        self._statcache_new: list[tuple[str, str]] = []
        self._statcache: OrderedDict[str, str] = self._load_statcache()
        self._statcache_dirty = False
        self._statcache_rewrite = False

    # -- paths ---------------------------------------------------------------------------------
    def object_path(self, sha256: str) -> Path:  # read-only; hard-link it, never write through it
        return self.root / "objects" / sha256[:2] / sha256[2:]

    def tree_path(self, digest: str) -> Path:
        return self.root / "trees" / digest

    def manifest_path(self, digest: str) -> Path:
        return self.root / "trees" / f"{digest}.json"

    @contextlib.contextmanager
    def _flock(self, how: int) -> Iterator[None]:
        fd = os.open(self.root / "lock", os.O_RDONLY | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, how)
            yield
        finally:
            os.close(fd)

    def reading(self) -> contextlib.AbstractContextManager[None]:
        """Hold while linking objects out of the store (publish): gc, even another process's, waits."""
        return self._flock(fcntl.LOCK_SH)

    # -- capture -------------------------------------------------------------------------------
    def capture(
        self, model_dir: Path, model: str, *, commit_marker: str | None = None, quiet_s: float = 0.0
    ) -> Snapshot:
        """Snapshot `model_dir` if it is complete and held still; raise SnapshotError otherwise.

        `quiet_s` > 0: also refuse ("still changing") unless nothing in the directory, debris included,
        changed during the last `quiet_s` seconds or during the capture. The watcher hands a model on
        once it was quiet for the settle window, but the capture may run later (a busy daemon, a fleet
        leader's queue) when the writer has started the next edit: measured by bench/edit_torture.py.
        """
        self._check_present(model_dir := Path(model_dir), model)
        skip = frozenset({commit_marker}) if commit_marker else frozenset()
        changed = last_change_ns(model_dir) if quiet_s > 0 else 0
        if quiet_s > 0:
            self._check_quiet(model, changed, quiet_s)
        before = scan(model_dir, model, skip)
        self._check_config_size(model, before)
        if commit_marker:
            self._check_marker(model_dir, model, commit_marker, before)
        try:
            with self.reading():  # objects written here are unreferenced until the manifest exists
                snapshot = self._record(model_dir, model, skip, before)
        finally:
            self._save_statcache()
        if quiet_s > 0 and last_change_ns(model_dir) != changed:
            # the stored objects and tree stay unreferenced (gc takes them) unless captured again whole
            raise SnapshotChangingError(f"{model}: still changing (written to during the capture)")
        return snapshot

    @staticmethod
    def _check_quiet(model: str, changed_ns: int, quiet_s: float) -> None:
        age_s = time.time() - changed_ns / 1e9
        # more than a second in the future: a clock step or a skewed file server, not a writer
        if -1.0 <= age_s < quiet_s:
            raise SnapshotChangingError(
                f"{model}: still changing (last change {max(age_s, 0.0):.2f} s ago, settle window {quiet_s:g} s)"
            )

    @staticmethod
    def _check_config_size(model: str, items: list[_Item]) -> None:
        for item in items:
            if item.rel == CONFIG_FILE and item.kind != "dir" and item.st.st_size > MAX_CONFIG_BYTES:
                raise SnapshotTooLargeError(
                    f"{model}: {CONFIG_FILE} is {item.st.st_size} bytes, over the {MAX_CONFIG_BYTES}-byte limit;"
                    " refusing to capture it"
                )

    def _record(self, model_dir: Path, model: str, skip: frozenset[str], before: list[_Item]) -> Snapshot:
        entries: list[ManifestEntry] = []
        for item in before:
            mode = stat.S_IMODE(item.st.st_mode)
            if item.kind == "dir":
                entries.append(ManifestEntry(item.rel, "dir", 0, mode, ""))
            else:
                sha = self._ingest(item, model)
                entries.append(ManifestEntry(item.rel, "file", item.st.st_size, mode, sha))
        after = scan(model_dir, model, skip)
        if [i.signature for i in after] != [i.signature for i in before]:
            raise SnapshotChangingError(f"{model}: still changing ({_first_difference(before, after)})")
        self._check_present(model_dir, model)
        snapshot = Snapshot.from_entries(model, entries)
        try:
            self._materialize(snapshot)
        except OSError as exc:
            raise SnapshotStoreWriteError(f"{model}: cannot record the snapshot in the store ({exc})") from exc
        return snapshot

    @staticmethod
    def _check_present(model_dir: Path, model: str) -> None:
        if not model_dir.exists():
            raise SnapshotSourceGoneError(f"{model}: model directory {model_dir} is gone")
        if not model_dir.is_dir():
            raise SnapshotSourceGoneError(f"{model}: {model_dir} is not a directory")
        if os.path.lexists(model_dir / HOLD_FILE):
            raise SnapshotOnHoldError(f"{model}: on hold ({HOLD_FILE} present)")

    @staticmethod
    def _check_marker(model_dir: Path, model: str, marker: str, items: list[_Item]) -> None:
        try:
            marked = os.stat(model_dir / marker).st_mtime_ns
        except FileNotFoundError:
            raise SnapshotAwaitingMarkerError(f"{model}: awaiting commit marker {marker}") from None
        newer = [i.rel for i in items if i.kind == "file" and i.st.st_mtime_ns > marked]
        if newer:
            raise SnapshotAwaitingMarkerError(f"{model}: awaiting commit marker {marker} (older than {newer[0]})")

    def _ingest(self, item: _Item, model: str) -> str:
        """The sha256 of one source file, its content stored as an object (read at most once)."""
        st = item.st
        key = f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}"
        with self._lock:
            cached = self._statcache.get(key)
            if cached is not None:
                self._statcache.move_to_end(key)
        if cached is not None:
            try:
                if os.stat(self.object_path(cached)).st_size == st.st_size:
                    return cached
            except FileNotFoundError:
                pass
        try:
            src = _open_source(item.real)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ELOOP):
                raise SnapshotChangingError(f"{model}: still changing ({item.rel} replaced during capture)") from None
            raise SnapshotUnreadableError(f"{model}: cannot read {item.rel} ({exc.strerror})") from None
        try:
            sha = self._copy_in(src, item, model)
        except OSError as exc:  # the source failing mid-read, or the store (disk full)
            raise SnapshotUnreadableError(f"{model}: cannot capture {item.rel} ({exc.strerror})") from exc
        finally:
            os.close(src)
        with self._lock:
            self._statcache[key] = sha
            self._statcache.move_to_end(key)
            self._statcache_new.append((key, sha))
            while len(self._statcache) > _STATCACHE_MAX:
                self._statcache.popitem(last=False)
            self._statcache_dirty = True
        return sha

    def _copy_in(self, src: int, item: _Item, model: str) -> str:
        changing = SnapshotChangingError(f"{model}: still changing ({item.rel} modified during capture)")
        if not _same_file(os.fstat(src), item.st):
            raise changing
        fd, tmp = tempfile.mkstemp(dir=self.root / "tmp", prefix="obj-")
        try:
            digest, copied = hashlib.sha256(), 0
            view = memoryview(buf := bytearray(_CHUNK))
            cloned = self._reflink_ok = self._reflink_ok and _reflink(src, fd)
            self.reflinks += cloned
            # a clone is a point-in-time copy: hash the clone; otherwise hash while writing
            os.lseek(fd if cloned else src, 0, os.SEEK_SET)
            with os.fdopen(os.dup(fd if cloned else src), "rb", buffering=0) as reader:
                while n := reader.readinto(buf):
                    digest.update(view[:n])
                    if not cloned:
                        mv = view[:n]
                        while mv:
                            mv = mv[os.write(fd, mv) :]
                    copied += n
            if copied != item.st.st_size or not _same_file(os.fstat(src), item.st):
                raise changing
            with self._lock:
                self.files_read += 1
                self.bytes_read += copied
            sha = digest.hexdigest()
            final = self.object_path(sha)
            if not final.exists():
                os.fchmod(fd, 0o444)
                if self.fsync:
                    os.fsync(fd)
                final.parent.mkdir(exist_ok=True)
                os.replace(tmp, final)
            return sha
        finally:
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def _materialize(self, snapshot: Snapshot) -> None:
        """Build the read-only tree and write the manifest unless this digest is already stored."""
        tree, manifest = self.tree_path(snapshot.digest), self.manifest_path(snapshot.digest)
        with self._lock:
            if not tree.is_dir():
                tmp = Path(tempfile.mkdtemp(dir=self.root / "trees", prefix=".tmp-"))
                try:
                    dirs = [tmp]
                    for e in snapshot.entries:
                        dest = tmp / e.path
                        if e.kind == "dir":
                            dest.mkdir()
                            dirs.append(dest)
                        else:
                            link_or_copy(self.object_path(e.sha256), dest)
                    for d in reversed(dirs):
                        d.chmod(0o555)
                    os.rename(tmp, tree)
                finally:
                    if tmp.exists():
                        force_rmtree(tmp)
            if not manifest.exists():
                write_atomic(manifest, snapshot.manifest_json().encode(), mode=0o444)

    # -- lookup and collection -----------------------------------------------------------------
    def load(self, model: str, digest: str) -> Snapshot:
        if not is_digest(digest):
            raise SnapshotDigestError(f"{model}: {digest!r} is not a snapshot digest")
        try:
            text = self.manifest_path(digest).read_text()
        except FileNotFoundError:
            raise SnapshotCollectedError(f"{model}: unknown snapshot {digest[:12]}") from None
        snap = Snapshot.from_manifest_json(model, text)
        if snap.digest != digest:
            raise SnapshotCorruptError(f"{model}: manifest {digest[:12]} holds snapshot {snap.digest[:12]}")
        return snap

    def digests(self) -> set[str]:
        return {p.name[:-5] for p in (self.root / "trees").glob("*.json") if is_digest(p.name[:-5])}

    def gc(self, keep: set[str]) -> int:
        """Drop snapshots not in `keep` and objects no kept manifest references; bytes freed.

        Objects still hard-linked from a published tree free their space only when that tree goes.
        Waits for running captures and publishes (of any process) to finish.
        """
        freed = 0
        with self._flock(fcntl.LOCK_EX), self._lock:
            for leftover in (self.root / "tmp").iterdir():  # from a process that died mid-copy
                leftover.unlink(missing_ok=True)
            trees = self.root / "trees"
            for digest in self.digests() - set(keep):
                self.manifest_path(digest).unlink(missing_ok=True)
                if self.tree_path(digest).exists():
                    force_rmtree(self.tree_path(digest))
            for stale in trees.iterdir():  # trees of a crashed capture: no manifest, or half built
                if stale.is_dir() and not (trees / f"{stale.name}.json").exists():
                    force_rmtree(stale)
            referenced: set[str] = set()
            for digest in self.digests():
                snap = self.load("gc", digest)
                referenced.update(e.sha256 for e in snap.entries if e.kind == "file")
            for sub in (self.root / "objects").iterdir():
                for obj in sub.iterdir():
                    if sub.name + obj.name not in referenced:
                        st = obj.stat()
                        obj.unlink()
                        freed += st.st_size if st.st_nlink == 1 else 0
            live = {k: v for k, v in self._statcache.items() if v in referenced}
            if len(live) != len(self._statcache):
                self._statcache = OrderedDict(live)
                self._statcache_dirty = self._statcache_rewrite = True
        self._save_statcache()
        return freed

    # -- stat cache ----------------------------------------------------------------------------
    def _load_statcache(self) -> OrderedDict[str, str]:
        cache: OrderedDict[str, str] = OrderedDict()
        try:
            rows = json.loads(self._statcache_path.read_text())["entries"]
            cache.update((str(k), str(v)) for k, v in rows[-_STATCACHE_MAX:] if is_digest(str(v)))
        except (OSError, ValueError, KeyError, TypeError):
            cache.clear()
        try:
            with open(self._journal_path, encoding="ascii", errors="replace") as journal:
                for line in journal:  # "<dev:ino:size:mtime:ctime> <sha256>"; a torn last line is skipped
                    self._journal_lines += 1
                    parts = line.split()
                    if len(parts) == 2 and is_digest(parts[1]):
                        cache[parts[0]] = parts[1]
                        cache.move_to_end(parts[0])
        except OSError:
            pass
        while len(cache) > _STATCACHE_MAX:
            cache.popitem(last=False)
        return cache

    def _save_statcache(self) -> None:
        """Append the new entries to the journal; rewrite statcache.json (and empty the journal) when
        entries went away (gc) or the journal outgrew half the cache: amortized O(1) per entry."""
        with self._lock:
            if not self._statcache_dirty:
                return
            new, self._statcache_new = self._statcache_new, []
            self._statcache_dirty = False
            try:
                fold_at = max(1000, len(self._statcache) // 2)
                if not self._statcache_rewrite and self._journal_lines + len(new) <= fold_at:
                    with open(self._journal_path, "a", encoding="ascii") as journal:
                        journal.write("".join(f"{key} {sha}\n" for key, sha in new))
                    self._journal_lines += len(new)
                    return
                body = json.dumps({"format": 1, "entries": list(self._statcache.items())}, separators=(",", ":"))
                write_atomic(self._statcache_path, body.encode(), mode=0o644)
                self._journal_path.unlink(missing_ok=True)
                self._journal_lines = 0
                self._statcache_rewrite = False
            except OSError:
                pass  # only a cache: the next capture re-reads what it cannot find
