"""The content store: a model directory captured only once complete, as immutable content-addressed objects.

People and CI edit the source repository in place, so at any instant a model directory may be half
written: Triton's poll mode serves such fragments (shared/TRITON_NOTES.md). A snapshot is taken only
when the directory held still for the whole copy: its stat signature (paths, kinds, sizes, mtimes,
ctimes, inodes) is the same before and after every file was copied and hashed, and no hold file or
stale commit marker says the writer is not done. Captured files become read-only objects named by
their sha256 (deduplicated across models and versions); each snapshot gets a manifest whose digest
is defined by content alone, and a read-only tree of hard links to its objects. Nothing here knows
about the registry, gRPC or Triton; `controlplane.deploy.publish` turns a snapshot into what Triton serves.

Also here: gc (drop what no kept manifest references) and the stat cache (dev:ino:size:mtime:ctime →
sha256, kept in statcache.json plus an append-only journal) that spares re-reading unchanged files.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import hashlib
import json
import os
import stat
import sys
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from pathlib import Path

from controlplane.errors import (
    SnapshotAwaitingMarkerError,
    SnapshotChangingError,
    SnapshotCollectedError,
    SnapshotCorruptError,
    SnapshotDigestError,
    SnapshotEnvironmentError,
    SnapshotOnHoldError,
    SnapshotSourceGoneError,
    SnapshotStoreWriteError,
    SnapshotTooLargeError,
    is_environment_error,
    unreadable,
)
from controlplane.snapshot.fsutil import ensure_dir, force_rmtree, link_or_copy, open_private, write_atomic
from controlplane.snapshot.layout import CONFIG_FILE, HOLD_FILE, MAX_CONFIG_BYTES, is_digest
from controlplane.snapshot.manifest import ManifestEntry, Snapshot
from controlplane.snapshot.scan import ScanItem, first_difference, last_change_ns, scan

FICLONE = 0x40049409  # linux/fs.h: _IOW(0x94, 9, int)
_CHUNK = 1 << 20
_STATCACHE_MAX = 50_000
_NO_REFLINK = {errno.EOPNOTSUPP, errno.EXDEV, errno.EINVAL, errno.ENOTTY, errno.ENOSYS, errno.EPERM}
_SAME_FIELDS = ("st_dev", "st_ino", "st_size", "st_mtime_ns", "st_ctime_ns")


def _syncfs(fd: int) -> bool:
    """syncfs(2) of the filesystem holding `fd` (Linux); False where there is none."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return int(ctypes.CDLL(None, use_errno=True).syncfs(fd)) == 0
    except (OSError, AttributeError):
        return False


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


def _size(path: Path) -> int | None:
    """The size of the file at `path`; None when there is none."""
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return None


def _same_file(a: os.stat_result, b: os.stat_result) -> bool:
    return all(getattr(a, f) == getattr(b, f) for f in _SAME_FIELDS)


class ContentStore:
    """`objects/ab/cdef…` (read-only file contents by sha256), `trees/<digest>/` (read-only snapshot
    trees of hard links) and `trees/<digest>.json` (manifests) under `root` = `<state>/store`.

    Thread-safe: captures of different models may run concurrently. `files_read`/`bytes_read` count
    source files actually read (the stat cache spares unchanged big files).
    """

    def __init__(self, root: Path, *, fsync: bool = True, max_model_bytes: int | None = None,
                 journal: bool = True) -> None:
        self.root = Path(root)
        self.fsync = fsync
        # False: new stat cache entries are only kept (`take_remembered`): a capture worker's store
        # (controlplane/startup/cores.py) hands them to the daemon's, which alone writes the journal
        self.journal = journal
        self.max_model_bytes = max_model_bytes  # a capture of more bytes is refused (None: no cap)
        self.files_read = self.bytes_read = self.reflinks = 0  # counters for tests and metrics
        self._reflink_ok = True
        self._lock = threading.RLock()
        self._deferring = threading.local()  # `deferred_sync` on this thread
        try:
            self.root.mkdir(mode=0o750, parents=True, exist_ok=True)
            for sub in ("objects", "trees", "tmp"):
                ensure_dir(self.root / sub, 0o750)
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
    @contextlib.contextmanager
    def deferred_sync(self) -> Iterator[None]:
        """Captures on this thread write their objects without an fsync each; the caller calls `sync`
        before it records any of them (the start-up scan: one syncfs per batch instead of an fsync per
        file, 3 ms each here; controlplane/startup/record.py)."""
        self._deferring.on = True
        try:
            yield
        finally:
            self._deferring.on = False

    def sync(self) -> None:
        """Make every object written so far durable (syncfs of the store's filesystem; sync elsewhere)."""
        if not self.fsync:
            return
        fd = os.open(self.root, os.O_RDONLY)
        try:
            if not _syncfs(fd):
                os.sync()
        finally:
            os.close(fd)

    def object_path(self, sha256: str) -> Path:  # read-only; hard-link it, never write through it
        return self.root / "objects" / sha256[:2] / sha256[2:]

    def has_object(self, sha256: str, size: int) -> bool:
        """Whether the object is stored whole (of the expected size)."""
        try:
            return os.stat(self.object_path(sha256)).st_size == size
        except OSError:
            return False

    def add_object(self, tmp: Path, sha256: str, size: int) -> None:
        """A file fetched from elsewhere (object storage), its sha256 verified, made the object of that
        hash: read-only and, with fsync, durable before it is visible. `tmp` is gone afterwards."""
        try:
            if not self.has_object(sha256, size):
                os.chmod(tmp, 0o444)
                if self.fsync:
                    with open(tmp, "rb") as fh:
                        os.fsync(fh.fileno())
                final = self.object_path(sha256)
                final.parent.mkdir(mode=0o750, exist_ok=True)
                os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)

    def tree_path(self, digest: str) -> Path:
        return self.root / "trees" / digest

    def manifest_path(self, digest: str) -> Path:
        return self.root / "trees" / f"{digest}.json"

    @contextlib.contextmanager
    def _flock(self, how: int) -> Iterator[None]:
        fd = open_private(self.root / "lock", os.O_RDONLY, 0o640)
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
        self, model_dir: Path, model: str, *, commit_marker: str | None = None, quiet_s: float = 0.0,
        marker_dir: Path | None = None, link_roots: Sequence[str] | None = None,
    ) -> Snapshot:
        """Snapshot `model_dir` if it is complete and held still; raise SnapshotError otherwise.

        `quiet_s` > 0: also refuse ("still changing") unless nothing in the directory, debris included,
        changed during the last `quiet_s` seconds or during the capture. The watcher hands a model on
        once it was quiet for the settle window, but the capture may run later (a busy daemon, a fleet
        leader's queue) when the writer has started the next edit: measured by bench/edit_torture.py.
        `marker_dir`: where the commit marker is (the repository root's marker; default the model's own).
        `link_roots`: where the model directory may resolve to (controlplane.snapshot.scan; None: anywhere).
        """
        self._check_present(model_dir := Path(model_dir), model)
        skip = frozenset({commit_marker}) if commit_marker else frozenset()
        changed = last_change_ns(model_dir) if quiet_s > 0 else 0
        if quiet_s > 0:
            self._check_quiet(model, changed, quiet_s)
        before = scan(model_dir, model, skip, link_roots)
        self._check_config_size(model, before)
        self.check_model_size(model, sum(item.st.st_size for item in before if item.kind == "file"))
        if commit_marker:
            self._check_marker(marker_dir or model_dir, model, commit_marker, before, marker_dir is not None)
        try:
            with self.reading():  # objects written here are unreferenced until the manifest exists
                snapshot = self._record(model_dir, model, skip, before, link_roots)
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
    def _check_config_size(model: str, items: list[ScanItem]) -> None:
        for item in items:
            if item.rel == CONFIG_FILE and item.kind != "dir" and item.st.st_size > MAX_CONFIG_BYTES:
                raise SnapshotTooLargeError(
                    f"{model}: {CONFIG_FILE} is {item.st.st_size} bytes, over the {MAX_CONFIG_BYTES}-byte limit;"
                    " refusing to capture it"
                )

    def check_model_size(self, model: str, total_bytes: int) -> None:
        """Refuse a model whose files are together over `max_model_bytes`, before any is copied."""
        if self.max_model_bytes is not None and total_bytes > self.max_model_bytes:
            raise SnapshotTooLargeError(
                f"{model}: its files are {total_bytes} bytes, over max_model_bytes ({self.max_model_bytes});"
                " refusing to capture it")

    def _record(self, model_dir: Path, model: str, skip: frozenset[str], before: list[ScanItem],
                link_roots: Sequence[str] | None = None) -> Snapshot:
        entries: list[ManifestEntry] = []
        for item in before:
            mode = stat.S_IMODE(item.st.st_mode)
            if item.kind == "dir":
                entries.append(ManifestEntry(item.rel, "dir", 0, mode, ""))
            else:
                sha = self._ingest(item, model)
                entries.append(ManifestEntry(item.rel, "file", item.st.st_size, mode, sha))
        after = scan(model_dir, model, skip, link_roots)
        if [i.signature for i in after] != [i.signature for i in before]:
            raise SnapshotChangingError(f"{model}: still changing ({first_difference(before, after)})")
        self._check_present(model_dir, model)
        snapshot = Snapshot.from_entries(model, entries)
        try:
            self.add_snapshot(snapshot)
        except OSError as exc:
            if is_environment_error(exc):  # a full disk, not the content: tried again
                raise SnapshotEnvironmentError(f"{model}: cannot record the snapshot in the store ({exc})") from exc
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
    def _check_marker(marker_dir: Path, model: str, marker: str, items: list[ScanItem], root: bool = False) -> None:
        where = " at the repository root" if root else ""
        try:
            marked = os.stat(marker_dir / marker).st_mtime_ns
        except FileNotFoundError:
            raise SnapshotAwaitingMarkerError(f"{model}: awaiting commit marker {marker}{where}") from None
        newer = [i.rel for i in items if i.kind == "file" and i.st.st_mtime_ns > marked]
        if newer:
            raise SnapshotAwaitingMarkerError(
                f"{model}: awaiting commit marker {marker}{where} (older than {newer[0]})")

    @staticmethod
    def check_marker(model_dir: Path, model: str, marker: str, marker_dir: Path) -> None:
        """SnapshotAwaitingMarkerError unless `marker_dir/marker` is newer than every file of the model
        (what a capture checks first; reads no file)."""
        ContentStore._check_marker(marker_dir, model, marker, scan(model_dir, model, frozenset({marker})), True)

    def _ingest(self, item: ScanItem, model: str) -> str:
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
            raise unreadable(f"{model}: cannot read {item.rel} ({exc.strerror})", exc) from None
        try:
            sha = self._copy_in(src, item, model)
        except OSError as exc:  # the source failing mid-read, or the store (disk full)
            raise unreadable(f"{model}: cannot capture {item.rel} ({exc.strerror})", exc) from exc
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

    def _copy_in(self, src: int, item: ScanItem, model: str) -> str:
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
            # an object of the wrong size (written under `deferred_sync`, then a power loss before the
            # sync: the rename survived, the data did not) is written again, not trusted
            if _size(final) != copied:
                os.fchmod(fd, 0o444)
                if self.fsync and not getattr(self._deferring, "on", False):
                    os.fsync(fd)
                final.parent.mkdir(mode=0o750, exist_ok=True)
                os.replace(tmp, final)
            return sha
        finally:
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    def add_snapshot(self, snapshot: Snapshot) -> None:
        """Build the read-only tree and write the manifest unless this digest is already stored. Every file
        object of `snapshot` must be in the store already: the capture's own, or `add_object`'s (object
        storage, a fleet's shared content)."""
        tree, manifest = self.tree_path(snapshot.digest), self.manifest_path(snapshot.digest)
        with self._lock:
            if tree.is_dir() and not self._tree_intact(tree, snapshot):
                # linked to objects a power loss emptied before their `sync` (`deferred_sync`): this
                # content was never recorded; built again from the objects just written again
                force_rmtree(tree)
                with contextlib.suppress(FileNotFoundError):
                    manifest.unlink()
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
                    try:
                        os.rename(tmp, tree)
                    except OSError:
                        if not tree.is_dir():  # else another process built the same content meanwhile
                            raise
                finally:
                    if tmp.exists():
                        force_rmtree(tmp)
            if not manifest.exists():
                write_atomic(manifest, snapshot.manifest_json().encode(), mode=0o444)

    @staticmethod
    def _tree_intact(tree: Path, snapshot: Snapshot) -> bool:
        """Every file of a stored tree has its manifest size (one stat per file)."""
        return all(_size(tree / e.path) == e.size for e in snapshot.entries if e.kind != "dir")

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

    def take_remembered(self) -> list[tuple[str, str]]:
        """The stat cache entries added since the last call (a store without a journal)."""
        with self._lock:
            new, self._statcache_new = self._statcache_new, []
            self._statcache_dirty = False
            return new

    def remember(self, entries: Sequence[tuple[str, str]], files_read: int, bytes_read: int) -> None:
        """Stat cache entries and reads of a capture another process made into this store (a capture
        worker's `take_remembered`), kept as this store's own captures keep theirs."""
        with self._lock:
            self.files_read += files_read
            self.bytes_read += bytes_read
            for key, sha in entries:
                self._statcache[key] = sha
                self._statcache.move_to_end(key)
                self._statcache_new.append((key, sha))
            while len(self._statcache) > _STATCACHE_MAX:
                self._statcache.popitem(last=False)
            self._statcache_dirty = self._statcache_dirty or bool(entries)
        self._save_statcache()

    def _save_statcache(self) -> None:
        """Append the new entries to the journal; rewrite statcache.json (and empty the journal) when
        entries went away (gc) or the journal outgrew half the cache: amortized O(1) per entry."""
        with self._lock:
            if not self._statcache_dirty or not self.journal:
                return
            new, self._statcache_new = self._statcache_new, []
            self._statcache_dirty = False
            try:
                fold_at = max(1000, len(self._statcache) // 2)
                if not self._statcache_rewrite and self._journal_lines + len(new) <= fold_at:
                    fd = open_private(self._journal_path, os.O_WRONLY | os.O_APPEND, 0o640)
                    with open(fd, "a", encoding="ascii") as journal:
                        journal.write("".join(f"{key} {sha}\n" for key, sha in new))
                    self._journal_lines += len(new)
                    return
                body = json.dumps({"format": 1, "entries": list(self._statcache.items())}, separators=(",", ":"))
                write_atomic(self._statcache_path, body.encode(), mode=0o640)
                self._journal_path.unlink(missing_ok=True)
                self._journal_lines = 0
                self._statcache_rewrite = False
            except OSError:
                pass  # only a cache: the next capture re-reads what it cannot find
