"""Poll a source for changes: every interval, compare each model's signature with the last one seen
and hand the changed models on.

Events can be lost (an inotify queue overflow, a filesystem that raises none for writes made
elsewhere, a symlinked model whose target lives outside the watched tree), so the watcher does not
trust them alone: this poller is its safety net (a full rescan every `rescan_interval_s`) and, where
events cannot be had, its only source (every `poll_interval_s`). It knows nothing of files: a
`SignatureSource` lists the names and gives each a signature; `DirectorySource` is the local one
(stat facts of every entry, no file read), and another source (an object store's listing with
ETags) plugs in the same way.

A signature is a pair (identity, content). A changed identity is a model *replaced* as a whole: a
directory renamed over it, a symlink flipped to another target; the watcher takes those at once. A
changed content is an edit in place, handed to the settle window like an inotify event.
"""

from __future__ import annotations

import hashlib
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Hashable, Iterable
from pathlib import Path
from typing import Protocol

from controlplane.snapshot.debris import is_ignored_name

log = logging.getLogger("tritonctl.poller")


def name_os_thread(name: str) -> None:
    """Name the calling thread in the kernel too (Python < 3.14 names it only in `threading`), so
    `top -H` and /proc/PID/task/TID/comm tell the poll thread apart: bench/rescan_daemon.py reads the
    rescan's own CPU time there. Best effort: Linux keeps 15 bytes; elsewhere nothing happens."""
    try:
        Path(f"/proc/self/task/{threading.get_native_id()}/comm").write_text(name[:15])
    except OSError:
        pass

Signature = tuple[Hashable, int]  # (identity, content hash)
ADDED, CHANGED, REPLACED, REMOVED = "added", "changed", "replaced", "removed"
RACY_RECORD_NS = 1_000_000_000  # an entry younger than this at capture: its signature is not recorded


class SignatureSource(Protocol):
    def names(self) -> Iterable[str]:
        """Every model name the source holds now."""

    def signature(self, name: str) -> Signature | None:
        """The model's signature now; None when it is gone."""


def model_entries(root: os.PathLike[str] | str) -> list[str]:
    """The names in a repository directory that may be models: directories and symlinks, not debris.
    Raises OSError (each caller decides what an unreadable or missing repository means to it)."""
    with os.scandir(root) as it:
        return [e.name for e in it if not is_ignored_name(e.name) and (e.is_dir() or e.is_symlink())]


class DirectorySource:
    """Model entries of a local directory: sub-directories and symlinks (to a directory, or dangling).

    The signature is stat facts only (kind, inode, size, mtime, ctime of every entry, debris
    included, so a temp file being filled keeps the model "changing"); a symlinked model entry is
    followed for its content and its target is part of its identity. A directory is listed again
    only when its own stat changed: its listing is kept while its inode, mtime and ctime stay, and
    only once its ctime is older than `RACY_NS` (as git does for "racily clean" files: an entry
    added within the timestamp granularity of the listing must not hide), so a round costs one
    lstat per entry (bench/rescan_cost.py).
    """

    RACY_NS = 2_000_000_000

    def __init__(self, root: os.PathLike[str] | str) -> None:
        self.root = os.fspath(root)
        self._listings: dict[str, dict[str, tuple[tuple[int, ...], list[str]]]] = {}

    def names(self) -> list[str]:
        try:
            return model_entries(self.root)
        except OSError:
            return []

    def signature(self, name: str) -> Signature | None:
        return self._signature(name, [])

    def _signature(self, name: str, facts: list[object]) -> Signature | None:
        path = f"{self.root}/{name}"
        try:
            lst = os.lstat(path)
        except OSError:
            self._listings.pop(name, None)
            return None
        link = None
        st = lst
        if stat.S_ISLNK(lst.st_mode):
            try:
                link = os.readlink(path)
                st = os.stat(path)
            except OSError:
                return ("dangling", link), 0
            if not stat.S_ISDIR(st.st_mode):
                return ("not a directory", link), 0
            identity: Hashable = (link, os.path.realpath(path), st.st_dev, st.st_ino)
        elif stat.S_ISDIR(lst.st_mode):
            identity = (None, None, st.st_dev, st.st_ino)
        else:
            self._listings.pop(name, None)
            return None  # a plain file at the root is no model
        old = self._listings.get(name, {})
        kept: dict[str, tuple[tuple[int, ...], list[str]]] = {}
        self._walk(path, st, facts, old, kept)
        self._listings[name] = kept
        return identity, stable_hash(facts)

    def _walk(self, path: str, st: os.stat_result, facts: list[object],
              old: dict[str, tuple[tuple[int, ...], list[str]]],
              kept: dict[str, tuple[tuple[int, ...], list[str]]]) -> None:
        key = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
        cached = old.get(path)
        if cached is not None and cached[0] == key:
            names = cached[1]
            kept[path] = cached
        else:
            try:
                names = sorted(os.listdir(path))
            except OSError as exc:
                facts.append(("unreadable", path, exc.errno))
                return
            if time.time_ns() - st.st_ctime_ns > self.RACY_NS:
                kept[path] = (key, names)
        lstat, isdir, append = os.lstat, stat.S_ISDIR, facts.append
        for entry in names:
            child = f"{path}/{entry}"
            try:
                s = lstat(child)
            except OSError:
                continue  # vanished between listing and stat: the directory's own stat changed too
            append((entry, s.st_mode, s.st_ino, s.st_size, s.st_mtime_ns, s.st_ctime_ns))
            if isdir(s.st_mode) and not is_ignored_name(entry):
                self._walk(child, s, facts, old, kept)
                append("}")


def stable_hash(facts: object) -> int:
    """A hash of stat facts (tuples of str and int) that is the same in every process (Python's
    `hash` of a str is salted per process): signatures are recorded in the registry and compared by
    the next start (controlplane/startup/scan.py)."""
    return int.from_bytes(hashlib.blake2b(repr(facts).encode(), digest_size=8).digest(), "big")


def recordable_signature(root: os.PathLike[str] | str, name: str) -> tuple[str | None, bool]:
    """`name`'s stat signature now, as recorded with the content captured after it, and whether a
    restart may trust it: an entry changed within `RACY_RECORD_NS` of now could change again within
    the same timestamp tick without changing its stat facts (git's "racily clean"), so such a model is
    captured again at the next start. (While the daemon runs, a change fires an event anyway.)"""
    facts: list[object] = []
    now = time.time_ns()
    signature = DirectorySource(root)._signature(name, facts)
    if signature is None:
        return None, False
    entries = [f for f in facts if isinstance(f, tuple)]
    unreadable = any(len(f) != 6 for f in entries)  # a directory it could not list
    newest = max((max(f[4], f[5]) for f in entries if len(f) == 6), default=0)
    return stable_signature(signature), not unreadable and signature[1] != 0 and newest < now - RACY_RECORD_NS


def stable_signature(signature: Signature | None) -> str | None:
    """A signature as the registry records it (hex); None for none."""
    if signature is None:
        return None
    return hashlib.blake2b(repr(signature).encode(), digest_size=16).hexdigest()


class SignaturePoller:
    """Remembers every name's last signature; `poll` compares and reports; a thread of its own polls
    everything every `full_interval_s` and, in between, the names `fast_names()` gives every
    `fast_interval_s`. `on_change(name, kind)` runs on that thread (kind: added, changed, replaced,
    removed) and must not block."""

    def __init__(self, source: SignatureSource, on_change: Callable[[str, str], None], *,
                 name: str = "tritonctl-poll") -> None:
        self.source = source
        self._on_change = on_change
        self._name = name
        self._seen: dict[str, Signature] = {}
        self._lock = threading.Lock()  # _seen: the poll thread and refresh() callers
        self._cond = threading.Condition()
        self._stopping = False
        self._full_now = False
        self._thread: threading.Thread | None = None
        self.full_interval_s = 30.0
        self.fast_interval_s: float | None = None
        self.fast_names: Callable[[], Iterable[str]] | None = None
        self.on_full_round: Callable[[float, int, dict[str, str]], None] | None = None
        # at most this share of one core for full rounds (None: no limit): a round that costs more
        # than the budget allows at `full_interval_s` waits longer (`effective_full_interval_s`)
        self.full_cpu_budget: float | None = None
        self.effective_full_interval_s = self.full_interval_s
        self.rounds = 0
        self.last_round_s = 0.0
        self.last_round_cpu_s = 0.0

    # -- comparing -----------------------------------------------------------------------------
    def baseline(self) -> int:
        """Record every name's signature without reporting anything; how many."""
        seen = {n: sig for n in self.source.names() if (sig := self.source.signature(n)) is not None}
        with self._lock:
            self._seen = seen
        return len(seen)

    def signatures(self) -> dict[str, Signature]:
        """Every name's last signature (a copy): after `baseline`, what the source held at start."""
        with self._lock:
            return dict(self._seen)

    def refresh(self, name: str) -> None:
        """Record `name`'s signature now without reporting it (it is being handled already)."""
        sig = self.source.signature(name)
        with self._lock:
            if sig is None:
                self._seen.pop(name, None)
            else:
                self._seen[name] = sig

    def poll(self, names: Iterable[str] | None = None) -> dict[str, str]:
        """Compare `names` (None: every name, and notice those gone) and report what changed."""
        full = names is None
        listed = list(self.source.names() if names is None else names)
        signature = self.source.signature
        now = {name: signature(name) for name in listed}
        changes: dict[str, str] = {}
        with self._lock:
            seen = self._seen
            for name, sig in now.items():
                old = seen.get(name)
                if sig is None:
                    if old is not None:
                        del seen[name]
                        changes[name] = REMOVED
                    continue
                if old != sig:
                    seen[name] = sig
                    changes[name] = ADDED if old is None else REPLACED if old[0] != sig[0] else CHANGED
            if full:
                gone = [n for n in seen if n not in now]
                for n in gone:
                    del seen[n]
                changes.update(dict.fromkeys(gone, REMOVED))
        for name, kind in changes.items():
            try:
                self._on_change(name, kind)
            except Exception:  # noqa: BLE001 - one bad name must not stop the polling
                log.exception("poll: on_change(%r, %r) failed", name, kind)
        return changes

    # -- thread --------------------------------------------------------------------------------
    def start(self, full_interval_s: float, fast_interval_s: float | None = None,
              fast_names: Callable[[], Iterable[str]] | None = None, full_cpu_budget: float | None = None) -> None:
        self.full_interval_s = self.effective_full_interval_s = full_interval_s
        self.full_cpu_budget = full_cpu_budget
        self.fast_interval_s, self.fast_names = fast_interval_s, fast_names
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None

    def request_full(self) -> None:
        """Poll everything at once (an inotify overflow lost events)."""
        with self._cond:
            self._full_now = True
            self._cond.notify_all()

    def set_intervals(self, full_interval_s: float, fast_interval_s: float | None,
                      full_cpu_budget: float | None = None) -> None:
        with self._cond:
            self.full_interval_s, self.fast_interval_s = full_interval_s, fast_interval_s
            self.full_cpu_budget = full_cpu_budget
            self._cond.notify_all()

    def _loop(self) -> None:
        name_os_thread(self._name)
        next_full = time.monotonic() + self.full_interval_s
        next_fast = time.monotonic() + (self.fast_interval_s or 0.0)
        while True:
            with self._cond:
                while not self._stopping and not self._full_now:
                    now = time.monotonic()
                    due = min(next_full, next_fast) if self.fast_interval_s else next_full
                    if now >= due:
                        break
                    self._cond.wait(due - now)
                if self._stopping:
                    return
                full = self._full_now or time.monotonic() >= next_full
                self._full_now = False
            started, cpu_started = time.monotonic(), time.thread_time()
            try:
                if full:
                    changes = self.poll()
                    self.rounds += 1
                    self.last_round_s = time.monotonic() - started
                    self.last_round_cpu_s = time.thread_time() - cpu_started
                    if self.on_full_round is not None:
                        self.on_full_round(self.last_round_s, len(self._seen), changes)
                elif self.fast_names is not None:
                    fast = list(self.fast_names())
                    if fast:
                        self.poll(fast)
            except Exception:  # noqa: BLE001 - keep polling; the next round tries again
                log.exception("poll round failed")
            now = time.monotonic()
            if full:
                interval = self.full_interval_s
                if self.full_cpu_budget:
                    interval = max(interval, self.last_round_cpu_s / self.full_cpu_budget)
                self.effective_full_interval_s = interval
                next_full = now + interval
            next_fast = now + (self.fast_interval_s or 0.0)
