"""Turn inotify's stream of file events in the source repository into "model X settled" calls.

Writers edit in place, in bursts: chunks with pauses, editor temp files renamed over the real one,
`cp -r`, `rsync` (which writes dot-named temp files, then renames), delete and recreate. The watcher
maps every event to its model (the first path component under the root), coalesces them per model
and hands the model on only after `settle_s` without events for it, from a debounce thread of its
own: watchdog's thread only updates a deadline, never hashes, queries or blocks. Two events are handed
on at once: a directory moved into the repository (how careful writers publish a finished model)
and a model directory deleted (the consumer decides it is removed).

A model entry may be a symlink to a complete directory (inside or outside the repository): a deploy
tool's publish. Its flip (the entry replaced, or its target changed) is taken at once, like a
directory renamed in; inotify does not follow the link, so such entries are also polled every
`poll_interval_s`. Events are not trusted alone: a `SignaturePoller` rescans every model's stat
signature every `rescan_interval_s` (an overflow of the inotify queue rescans at once) and hands what
changed to the same settle path. Where inotify cannot see writes (network and FUSE filesystems,
`controlplane.source.watchmode`), or it runs out of watches, the poller is the only source, every
`poll_interval_s`: the same settle window, and the capture's own quiescence, hold-file and commit
marker checks, so the same atomic-snapshot guarantee (docs/watching.md).

Debris (editor swap and backup files, `.git`, temp files; `snapshot.is_ignored_name`) never starts a
check, but writes to it keep an already pending check waiting: rsync fills `.weights.bin.XXXXXX` for
as long as a big file takes to copy, and the model is not complete until it is renamed. The hold file
and the commit marker are not debris: creating or removing them starts a check.
"""

from __future__ import annotations

import contextlib
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
from controlplane.source import watchmode
from controlplane.source.poller import (
    ADDED,
    REMOVED,
    REPLACED,
    DirectorySource,
    SignaturePoller,
    model_entries,
    stable_signature,
)
from controlplane.source.watchmode import WatchMode, choose_mode

log = logging.getLogger("tritonctl.watcher")

MIN_SETTLE_S = 0.05
# test-only hook (like TRITONCTL_FAULT): drop inotify events of models whose name starts with this,
# so a test can prove the rescan catches what events missed
DROP_EVENTS_ENV = "TRITONCTL_TEST_DROP_EVENTS"
WATCHES_SYSCTL = "fs.inotify.max_user_watches"
# The rescan keeps to this share of one core: where a round of every model's stat signature costs
# more than that at `rescan_interval_s` (bench/rescan_cost.py: 10,000 models on a slow 2-vCPU VM),
# it runs less often, so an idle daemon stays within its idle-CPU target (docs/watching.md).
RESCAN_CPU_BUDGET = 0.004
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
    changed: float | None = None  # monotonic time of the last change seen (None: the consumer's reschedule)
    complete: bool = False  # the writer declared it whole (renamed in, symlink flipped, commit marker)


class _Handler(FileSystemEventHandler):
    def __init__(self, watcher: RepositoryWatcher) -> None:
        self._watcher = watcher

    def on_any_event(self, event: FileSystemEvent) -> None:
        try:
            self._watcher._on_event(event)
        except Exception:  # never let one odd event stop the observer thread
            log.exception("watcher: cannot handle %r", event)


class _WatchdogLog(logging.Handler):
    """watchdog reports a queue overflow and a failed watch only in its log: turn those into a
    rescan now, or polling."""

    def __init__(self, watcher: RepositoryWatcher) -> None:
        super().__init__(logging.WARNING)
        self._watcher = watcher

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage().lower()
            exc = record.exc_info[1] if record.exc_info else None
            if isinstance(exc, OSError) and exc.errno == errno.ENOSPC or "watch limit" in text:
                self._watcher._switch_to_poll(f"out of inotify watches (raise {WATCHES_SYSCTL})")
            elif "overflow" in text:
                self._watcher._on_overflow()
        except Exception:  # noqa: BLE001 - a log handler must never raise
            pass


class RepositoryWatcher:
    """Watch `root` recursively and call `on_settled(model)` once a model held still `settle_s`."""

    def __init__(
        self,
        root: Path,
        on_settled: Callable[[str], None],
        settle_s: float = 1.0,
        *,
        commit_marker: str | None = None,
        watch: str = "auto",
        poll_interval_s: float = 2.0,
        rescan_interval_s: float = 30.0,
        on_complete: Callable[[str], None] | None = None,
    ) -> None:
        self.root = Path(root)
        self._prefix = os.path.abspath(self.root).rstrip("/") + "/"
        self._on_settled = on_settled
        # a model the writer declared whole: a directory renamed in, a symlink flipped, its commit
        # marker created; handed on at once, to `on_complete` when given (the consumer then
        # captures it without a quiet window: the snapshot's own before/after check still holds)
        self._on_complete = on_complete or on_settled
        self._marker = commit_marker
        self._settle = self._checked(settle_s)
        self._signals = frozenset({HOLD_FILE} | ({commit_marker} if commit_marker else set()))
        self._pending: dict[str, _Pending] = {}
        self._handing: dict[str, _Pending] = {}  # due and being handed on now (still "settling" to status)
        self._cond = threading.Condition()
        self._stopping = False
        self._observer: BaseObserver | None = None
        self._events_thread: threading.Thread | None = None  # start_events: the watches being added
        self._events_rescan = False  # start_events asked for the rescan that follows the watches: not done yet
        self._thread: threading.Thread | None = None
        self._watch_setting = watch
        self.poll_interval_s = poll_interval_s
        self.rescan_interval_s = rescan_interval_s
        self.mode: WatchMode = choose_mode(self.root, watch)  # known before start: status may ask
        self._links: set[str] = set()  # model entries that are symlinks: polled, inotify cannot follow
        self._poller = SignaturePoller(DirectorySource(self._prefix[:-1]), self._on_poll_change)
        self._poller.on_full_round = self._on_full_round
        self._log_hook: _WatchdogLog | None = None
        self._drop_prefix = os.environ.get(DROP_EVENTS_ENV) or None
        self._stretch_logged = False
        self._next_watch_check = 0.0
        # when each model's last event came (monotonic), and when the last full round began: a change a rescan
        # finds is "without an event" only when no event came for its model since the round before began
        self._evented: dict[str, float] = {}
        self._round_began = time.monotonic()

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self, events: bool = True) -> None:
        """Baseline every model's signature, then watch. `events` False: the inotify watches are added
        later, by `start_events` (the daemon's, after READY: at 10,000 models adding 20,000 watches
        costs about 0.7 s of CPU, a third of a restart; bench/scale.py)."""
        if not self.root.is_dir():
            raise ConfigError(f"model repository {self.root}: not a directory")
        self._stopping = False
        self.mode = choose_mode(self.root, self._watch_setting)
        self._links = {n for n in self._entries() if os.path.islink(self._prefix + n)}
        self._round_began = time.monotonic()
        self._poller.baseline()  # before any event: a change from now on is either seen or polled
        self._thread = threading.Thread(target=self._debounce_loop, name="tritonctl-debounce", daemon=True)
        self._thread.start()
        if self.mode.mode == "inotify" and events:
            self._start_observer()
        if self.mode.mode == "poll":
            self._poller.start(self.poll_interval_s)
        else:
            self._poller.start(self.rescan_interval_s, self.poll_interval_s, self._linked, RESCAN_CPU_BUDGET)
        log.info("watching %s by %s: %s", self.root, self.mode.mode, self.mode.reason)

    def start_events(self) -> None:
        """Add the inotify watches that `start(events=False)` left out, in a thread of its own, then
        rescan at once: a change made between the baseline and its directory's watch raised no event,
        and the rescan (against that baseline) hands it on, as an overflowed queue's rescan does."""
        if self.mode.mode != "inotify" or self._observer is not None or self._events_thread is not None:
            return
        self._events_thread = threading.Thread(target=self._start_events, name="tritonctl-watch-start",
                                               daemon=True)
        self._events_thread.start()

    def _start_events(self) -> None:
        self._start_observer(refuse=False)
        if not self._stopping:
            self._events_rescan = True
            self._poller.request_full()

    def _start_observer(self, refuse: bool = True) -> None:
        """`refuse`: a directory that cannot be watched fails the start (ConfigError); False (after
        READY, too late to refuse): it is polled instead, every `poll_interval_s`."""
        observer = _new_observer()
        observer.schedule(_Handler(self), self._prefix[:-1], recursive=True, event_filter=_EVENT_FILTER)
        self._log_hook = _WatchdogLog(self)
        watchdog_log = logging.getLogger("watchdog.observers")
        watchdog_log.addHandler(self._log_hook)
        if watchdog_log.getEffectiveLevel() > logging.WARNING:
            watchdog_log.setLevel(logging.WARNING)
        try:
            observer.start()
        except OSError as exc:
            with contextlib.suppress(Exception):
                observer.stop()
            if exc.errno == errno.ENOSPC:
                self._switch_to_poll(f"out of inotify watches (raise {WATCHES_SYSCTL})")
                return
            if not refuse:
                self._switch_to_poll(exc.strerror or str(exc))
                return
            self.stop()
            raise ConfigError(f"cannot watch {self.root}: {exc.strerror}") from exc
        self._observer = observer

    def stop(self) -> None:
        """Stop watching and join both threads; pending checks are dropped."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._poller.stop()
        if self._log_hook is not None:
            logging.getLogger("watchdog.observers").removeHandler(self._log_hook)
            self._log_hook = None
        if self._events_thread is not None and self._events_thread is not threading.current_thread():
            self._events_thread.join()
        self._events_thread = None
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
            earlier = self._pending.get(model)  # an event since the hand-on: keep when it was
            changed = earlier.changed if earlier is not None and not earlier.removal else None
            self._pending[model] = _Pending(time.monotonic() + max(0.0, delay_s), changed=changed)
            self._cond.notify_all()

    def backlog(self) -> int:
        """How many models wait for their check."""
        with self._cond:
            return len(self._pending)

    def settling(self) -> dict[str, float | None]:
        """The models with a check pending now (settling, or waiting to be looked at again), each with
        the seconds since its last change seen (None: the consumer asked to look again, e.g. on hold).
        What `status` reports as `sync: pending`; safe from any thread."""
        now = time.monotonic()
        with self._cond:
            return {m: None if p.changed is None else max(0.0, now - p.changed)
                    for m, p in (self._handing | self._pending).items()}

    def set_settle(self, settle_s: float) -> None:
        self._settle = self._checked(settle_s)

    @property
    def settle_s(self) -> float:
        return self._settle

    def initial_scan(self) -> list[str]:
        """Model entries present now (what to capture at start-up, before any event): directories and
        symlinks (a dangling one is reported by the consumer)."""
        return sorted(self._entries())

    def signatures(self) -> dict[str, str]:
        """Each model entry's stat signature as the watcher's baseline at `start` saw it (no file read):
        a start captures only the models whose signature differs from the recorded one."""
        return {name: sig for name, signature in self._poller.signatures().items()
                if (sig := stable_signature(signature)) is not None}

    def signature(self, model: str) -> str | None:
        """The model entry's stat signature now (None: gone), comparable with the recorded one."""
        return stable_signature(DirectorySource(self._prefix[:-1]).signature(model))

    def capture_margin_s(self) -> float:
        """Seconds a capture must wait beyond the settle window: how long stat facts read through
        this mount may lag writes made elsewhere (0 on a local filesystem)."""
        return self.mode.cache_s

    def watch_info(self) -> dict[str, str]:
        """{"mode": "inotify" | "poll", "reason": ...}: what `status` shows."""
        return self.mode.as_dict()

    def rescan_now(self) -> None:
        """Compare every model's signature at once (what an inotify overflow triggers)."""
        self._poller.request_full()

    def _entries(self) -> list[str]:
        try:
            return model_entries(self.root)
        except FileNotFoundError:
            return []

    def _linked(self) -> list[str]:
        with self._cond:
            return list(self._links)

    # -- lost events: overflow, out of watches, polling ----------------------------------------------
    def _on_overflow(self) -> None:
        log.warning("inotify queue overflowed under %s: events were lost; rescanning every model now", self.root)
        self._poller.request_full()

    def _switch_to_poll(self, reason: str) -> None:
        with self._cond:
            if self.mode.mode == "poll" or self._stopping:
                return
            self.mode = WatchMode("poll", reason, self.mode.cache_s)
        log.warning("cannot watch %s by inotify: %s; polling every %g s instead", self.root, reason,
                    self.poll_interval_s)
        self._poller.set_intervals(self.poll_interval_s, None)
        self._poller.request_full()

    def _check_watches(self) -> None:
        """Out of inotify watches: new directories go unwatched (watchdog skips them silently)."""
        if self.mode.mode == "inotify" and not self._stopping and watchmode.watches_exhausted(self.root):
            self._switch_to_poll(f"out of inotify watches (raise {WATCHES_SYSCTL})")

    def _on_full_round(self, elapsed_s: float, models: int, changes: dict[str, str]) -> None:
        observer = self._observer
        self._check_watches()
        if self.mode.mode == "inotify" and observer is not None and not self._stopping:
            if not observer.is_alive() or not all(e.is_alive() for e in observer.emitters):
                self._switch_to_poll(f"inotify stopped (out of watches? raise {WATCHES_SYSCTL})")
        stretched = self._poller.effective_full_interval_s
        if self.mode.mode == "inotify" and stretched > self.rescan_interval_s * 1.5 and not self._stretch_logged:
            self._stretch_logged = True
            log.info("a rescan of %d models costs %.0f ms of CPU: rescanning every %.0f s instead of %g s to stay "
                     "under %.1f %% of a core", models, self._poller.last_round_cpu_s * 1000, stretched,
                     self.rescan_interval_s, RESCAN_CPU_BUDGET * 100)
        unannounced = self._unannounced(changes, time.monotonic() - elapsed_s)
        if unannounced and self.mode.mode == "inotify":
            log.info("rescan of %d models (%.0f ms) found changes without an event: %s", models,
                     elapsed_s * 1000, ", ".join(f"{m} {k}" for m, k in sorted(unannounced.items())[:10]))
        else:
            log.debug("%s round of %d models: %.1f ms, %d changed", self.mode.mode, models, elapsed_s * 1000,
                      len(changes))
        if self._events_rescan:  # from here on every change raises an event (tests wait for this line)
            self._events_rescan = False
            log.info("inotify watches in place under %s; the rescan after them is done (%d models)", self.root,
                     models)

    def _unannounced(self, changes: dict[str, str], began: float) -> dict[str, str]:
        """Of the changes a full round found, those no event announced: none came for the model since the
        round before began (the signature it is compared with was read from then on). An edit inside its
        settle window, its event in, is announced (issue 57: 6 of 6 edits were logged as found without one at
        a 0.5 s rescan interval). `began`: this round's start, the next round's reference."""
        with self._cond:
            since, self._round_began = self._round_began, began
            found = {m: k for m, k in changes.items() if self._evented.get(m, float("-inf")) < since}
            self._evented = {m: t for m, t in self._evented.items() if t >= began}
        return found

    def _on_poll_change(self, model: str, kind: str) -> None:
        """The poller saw `model` change: the same deadlines as for its events."""
        now = time.monotonic()
        with self._cond:
            if os.path.islink(self._prefix + model):
                self._links.add(model)
            else:
                self._links.discard(model)
            pending = self._pending.get(model)
            if kind == REMOVED:
                # the debounce loop looks again when due: a flip by unlink + symlink is back by then
                self._pending[model] = _Pending(now + self._settle, removal=True, changed=now)
            elif kind in (ADDED, REPLACED):
                self._pending[model] = _Pending(now, changed=now)
            elif pending is None or pending.removal:
                self._pending[model] = _Pending(now + self._settle, changed=now)
            else:
                pending.deadline = max(pending.deadline, now + self._settle)
                pending.changed = now
            self._cond.notify_all()

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

    def _is_marker(self, info: tuple[str, bool, bool], path: str | bytes) -> bool:
        """Whether `path` is the model's commit marker (`<model>/<marker>`)."""
        return self._marker is not None and os.fsdecode(path) == f"{self._prefix}{info[0]}/{self._marker}"

    def _on_event(self, event: FileSystemEvent) -> None:
        kind = event.event_type
        if event.is_directory and kind in ("created", "moved") and time.monotonic() >= self._next_watch_check:
            self._next_watch_check = time.monotonic() + 1.0  # a new directory needs a watch of its own
            self._check_watches()
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
                self._note(dest, event.is_directory, arrived=True, marker=self._is_marker(dest, event.dest_path))
            return
        info = self._classify(event.src_path)
        if info is not None:
            self._note(info, event.is_directory, gone=kind == "deleted", marker=self._is_marker(info, event.src_path))

    def _note(
        self, info: tuple[str, bool, bool], is_dir: bool, *, gone: bool = False, arrived: bool = False,
        marker: bool = False,
    ) -> None:
        model, debris, top = info
        if self._drop_prefix is not None and model.startswith(self._drop_prefix):
            return  # test hook: as if inotify had lost this event
        now = time.monotonic()
        with self._cond:
            self._evented[model] = now  # a rescan finding this model changed was told (`_unannounced`)
        if top and not is_dir:
            # a symlink model entry (inotify reports links as files; a plain file is no model)
            linked = os.path.islink(self._prefix + model)
            with self._cond:
                if linked and not gone:  # created, or renamed over the entry: a flip
                    self._links.add(model)
                    self._pending[model] = _Pending(now, changed=now, complete=True)
                elif gone and model in self._links and not linked:
                    self._links.discard(model)
                    self._pending[model] = _Pending(now + self._settle, removal=True, changed=now)
                else:
                    return
                self._cond.notify_all()
            return
        with self._cond:
            pending = self._pending.get(model)
            if debris:
                if pending is not None and not pending.removal:
                    pending.deadline = max(pending.deadline, now + self._settle)
                    pending.changed = now
                return
            if top and gone:
                self._pending[model] = _Pending(now, removal=True, changed=now)
            elif (top and arrived) or (marker and not gone):
                self._pending[model] = _Pending(now, changed=now, complete=True)
            else:
                self._pending[model] = _Pending(now + self._settle, changed=now)
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
                    self._handing[model] = pending
                    return model, pending
                self._cond.wait(wait)
            return None

    def _debounce_loop(self) -> None:
        while (due := self._next_due()) is not None:
            model, pending = due
            if pending.removal and os.path.lexists(self.root / model):
                # deleted and already being recreated: wait for the new content to settle
                with self._cond:
                    self._pending.setdefault(model, _Pending(time.monotonic() + self._settle, changed=pending.changed))
                    self._handing.pop(model, None)
                continue
            try:
                self._poller.refresh(model)  # handed on now: the rescan reports only later changes
                (self._on_complete if pending.complete else self._on_settled)(model)
            except Exception:
                log.exception("watcher: on_settled(%r) failed", model)
            finally:
                with self._cond:
                    self._handing.pop(model, None)
