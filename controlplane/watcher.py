"""Turn inotify's stream of file events in the source repository into "model X settled" calls.

Writers edit in place, in bursts: chunks with pauses, editor temp files renamed over the real one,
`cp -r`, `rsync` (which writes dot-named temp files, then renames), delete and recreate. The watcher
maps every event to its model (the first path component under the root), coalesces them per model
and hands the model on only after `settle_s` without events for it, from a debounce thread of its
own: watchdog's thread only updates a deadline, never hashes, queries or blocks. Two events are handed
on at once: a directory moved into the repository (how careful writers publish a finished model)
and a model directory deleted (the consumer decides it is removed).

Debris (editor swap and backup files, `.git`, temp files; `snapshot.is_ignored_name`) never starts a
check, but writes to it keep an already pending check waiting: rsync fills `.weights.bin.XXXXXX` for
as long as a big file takes to copy, and the model is not complete until it is renamed. The hold file
and the commit marker are not debris: creating or removing them starts a check.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from watchdog import events as ev
from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer
from watchdog.observers.api import BaseObserver

from controlplane.errors import ConfigError
from controlplane.snapshot import HOLD_FILE, is_ignored_name

log = logging.getLogger(__name__)

MIN_SETTLE_S = 0.05
# watchdog re-adds a watch when a new directory's creation races its own recursive scan (cp -r) and
# warns about it from its thread; harmless, and not the operator's to act on
warnings.filterwarnings("ignore", message="Callback with id .* already exists", category=RuntimeWarning)
# what can change a model's content; left out: opens and read-only closes (our own captures read
# the source) and "directory modified", watchdog's echo of every entry created, deleted or moved
_EVENT_FILTER: list[type[FileSystemEvent]] = [
    ev.FileCreatedEvent, ev.DirCreatedEvent, ev.FileDeletedEvent, ev.DirDeletedEvent,
    ev.FileModifiedEvent, ev.FileMovedEvent, ev.DirMovedEvent, ev.FileClosedEvent,
]  # fmt: skip
_NOT_CHANGES = frozenset({"opened", "closed_no_write"})
for _name in ("FileAttribEvent", "DirAttribEvent"):  # chmod/touch; watchdog >= 6 reports them apart
    if hasattr(ev, _name):
        _EVENT_FILTER.append(getattr(ev, _name))


def _new_observer() -> BaseObserver:
    """Watchdog's native observer; on Linux with unmatched moves reported as moves, so a directory
    moved in from outside the repository is recognised (and handed on at once)."""
    try:
        from watchdog.observers.inotify import InotifyObserver

        return InotifyObserver(generate_full_events=True)
    except (ImportError, TypeError, OSError):
        return Observer()


@dataclass
class _Pending:
    deadline: float
    removal: bool = False  # handed on at once because the model dir went away


class _Handler(FileSystemEventHandler):
    def __init__(self, watcher: RepositoryWatcher) -> None:
        self._watcher = watcher

    def on_any_event(self, event: FileSystemEvent) -> None:
        try:
            self._watcher._on_event(event)
        except Exception:  # never let one odd event stop the observer thread
            log.exception("watcher: cannot handle %r", event)


class RepositoryWatcher:
    """Watch `root` recursively and call `on_settled(model)` once a model held still `settle_s`."""

    def __init__(
        self,
        root: Path,
        on_settled: Callable[[str], None],
        settle_s: float = 1.0,
        *,
        commit_marker: str | None = None,
    ) -> None:
        self.root = Path(root)
        self._prefix = os.path.abspath(self.root).rstrip("/") + "/"
        self._on_settled = on_settled
        self._settle = self._checked(settle_s)
        self._signals = frozenset({HOLD_FILE} | ({commit_marker} if commit_marker else set()))
        self._pending: dict[str, _Pending] = {}
        self._cond = threading.Condition()
        self._stopping = False
        self._observer: BaseObserver | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        if not self.root.is_dir():
            raise ConfigError(f"model repository {self.root}: not a directory")
        self._stopping = False
        self._thread = threading.Thread(target=self._debounce_loop, name="tritonctl-debounce", daemon=True)
        self._thread.start()
        observer = _new_observer()
        observer.schedule(_Handler(self), self._prefix[:-1], recursive=True, event_filter=_EVENT_FILTER)
        try:
            observer.start()
        except OSError as exc:
            self.stop()
            hint = " (raise fs.inotify.max_user_watches)" if exc.errno == errno.ENOSPC else ""
            raise ConfigError(f"cannot watch {self.root}: {exc.strerror}{hint}") from exc
        self._observer = observer

    def stop(self) -> None:
        """Stop watching and join both threads; pending checks are dropped."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._observer is not None:
            self._observer.stop()
            self._observer.join()
            self._observer = None
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None

    # -- consumer controls ---------------------------------------------------------------------
    def reschedule(self, model: str, delay_s: float) -> None:
        """Check `model` again after `delay_s` (capture said "still changing" or "on hold")."""
        with self._cond:
            self._pending[model] = _Pending(time.monotonic() + max(0.0, delay_s))
            self._cond.notify_all()

    def backlog(self) -> int:
        """How many models wait for their check."""
        with self._cond:
            return len(self._pending)

    def set_settle(self, settle_s: float) -> None:
        self._settle = self._checked(settle_s)

    @property
    def settle_s(self) -> float:
        return self._settle

    def initial_scan(self) -> list[str]:
        """Model directories present now (what to capture at start-up, before any event)."""
        try:
            with os.scandir(self.root) as it:
                return sorted(e.name for e in it if e.is_dir() and not is_ignored_name(e.name))
        except FileNotFoundError:
            return []

    @staticmethod
    def _checked(settle_s: float) -> float:
        if not settle_s >= MIN_SETTLE_S:
            raise ConfigError(f"settle time {settle_s} s: must be at least {MIN_SETTLE_S} s")
        return float(settle_s)

    # -- observer thread: classify and set deadlines, nothing else --------------------------------
    def _classify(self, path: str | bytes) -> tuple[str, bool, bool] | None:
        """(model, is_debris, is_top_level) for a path under the root; None when it is no model's."""
        text = os.fsdecode(path)
        if not text.startswith(self._prefix):
            return None
        parts = text[len(self._prefix) :].split("/")
        model = parts[0]
        if not model or is_ignored_name(model):
            return None
        debris = any(is_ignored_name(p) and not (i == 1 and p in self._signals) for i, p in enumerate(parts) if i)
        return model, debris, len(parts) == 1

    def _on_event(self, event: FileSystemEvent) -> None:
        kind = event.event_type
        if event.is_synthetic or kind in _NOT_CHANGES or (kind == "modified" and event.is_directory):
            # contents listed after a directory move (the move itself counts); reads (our own
            # captures); the "parent modified" echo (the entry's own event counts: it may be debris)
            return
        if kind == "moved":
            src = self._classify(event.src_path) if event.src_path else None
            dest = self._classify(event.dest_path) if event.dest_path else None
            if src is not None:
                self._note(src, event.is_directory, gone=True)
            if dest is not None:
                self._note(dest, event.is_directory, arrived=True)
            return
        info = self._classify(event.src_path)
        if info is not None:
            self._note(info, event.is_directory, gone=kind == "deleted")

    def _note(self, info: tuple[str, bool, bool], is_dir: bool, *, gone: bool = False, arrived: bool = False) -> None:
        model, debris, top = info
        if top and not is_dir:
            return  # a plain file at the repository root is no model
        now = time.monotonic()
        with self._cond:
            pending = self._pending.get(model)
            if debris:
                if pending is not None and not pending.removal:
                    pending.deadline = max(pending.deadline, now + self._settle)
                return
            if top and gone:
                self._pending[model] = _Pending(now, removal=True)
            elif top and arrived:
                self._pending[model] = _Pending(now)
            else:
                self._pending[model] = _Pending(now + self._settle)
            self._cond.notify_all()

    # -- debounce thread -----------------------------------------------------------------------
    def _next_due(self) -> tuple[str, _Pending] | None:
        """Wait for the earliest deadline; the model due (removed from pending), None on stop."""
        with self._cond:
            while not self._stopping:
                if not self._pending:
                    self._cond.wait()
                    continue
                model, pending = min(self._pending.items(), key=lambda kv: kv[1].deadline)
                wait = pending.deadline - time.monotonic()
                if wait <= 0:
                    del self._pending[model]
                    return model, pending
                self._cond.wait(wait)
            return None

    def _debounce_loop(self) -> None:
        while (due := self._next_due()) is not None:
            model, pending = due
            if pending.removal and (self.root / model).is_dir():
                # deleted and already being recreated: wait for the new content to settle
                with self._cond:
                    self._pending.setdefault(model, _Pending(time.monotonic() + self._settle))
                continue
            try:
                self._on_settled(model)
            except Exception:
                log.exception("watcher: on_settled(%r) failed", model)
