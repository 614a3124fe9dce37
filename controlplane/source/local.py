"""`LocalSource`: a model repository directory as a `Source` (controlplane/source/protocol.py).

Why: the local source's parts live in their own modules, each for one concern: the watcher turns
inotify events, polls and rescans into "model settled" (controlplane/source/inotify.py, poller.py,
watchmode.py: inotify, or polling where inotify cannot see writes, and symlink publishes taken at
once); the content store snapshots a directory (controlplane/snapshot/content.py). This module puts
them behind the one interface the plane asks, and holds the directory's own rules: the settle
window's quiet check (plus a network mount's attribute-cache margin), the stat signature recorded
with the content, the commit marker at a model's directory or at the repository root, and the
repository-level hold file (docs/watching.md).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from controlplane.errors import ConfigError, SnapshotError
from controlplane.settings.config import Settings
from controlplane.snapshot import HOLD_FILE, MAX_CONFIG_BYTES, ContentStore
from controlplane.snapshot.fsutil import read_small_text
from controlplane.source.inotify import RepositoryWatcher
from controlplane.source.poller import recordable_signature
from controlplane.source.protocol import Captured, OnChange


@dataclass(frozen=True)
class LocalCapture:
    """One model's capture from a repository directory, as picklable data: the daemon's own, or a
    capture worker's in another process (the start-up scan, controlplane/startup/cores.py)."""

    root: Path
    model: str
    commit_marker: str | None
    quiet_s: float
    marker_dir: Path | None  # the repository root when its commit marker commits every model
    link_roots: tuple[str, ...]

    def run(self, content: ContentStore) -> Captured:
        signature, trusted = recordable_signature(self.root, self.model)  # before any read
        snapshot = content.capture(self.root / self.model, self.model, commit_marker=self.commit_marker,
                                   quiet_s=self.quiet_s, marker_dir=self.marker_dir, link_roots=self.link_roots)
        return Captured(snapshot, signature, trusted)


class LocalSource:
    """A model repository directory: one subdirectory (or symlink to one) per model."""

    def __init__(self, root: Path, *, settle_s: float = 1.0, commit_marker: str | None = None,
                 watch: str = "auto", poll_interval_s: float = 2.0, rescan_interval_s: float = 30.0,
                 events_later: bool = False, allowed_link_roots: Sequence[Path] = ()) -> None:
        self.root = Path(root)
        # where a model entry may resolve to: the repository, and the directories `allowed_link_roots` names
        self.allowed_link_roots = tuple(allowed_link_roots)
        self.events_later = events_later  # the inotify watches added by start_events (the daemon's, after READY)
        self.commit_marker = commit_marker
        self._on_change: OnChange | None = None
        self.watcher = RepositoryWatcher(
            self.root, self._settled, settle_s, commit_marker=commit_marker, watch=watch,
            poll_interval_s=poll_interval_s, rescan_interval_s=rescan_interval_s, on_complete=self._complete)

    def _settled(self, model: str) -> None:
        if self._on_change is not None:
            self._on_change(model, False)

    def _complete(self, model: str) -> None:
        if self._on_change is not None:
            self._on_change(model, True)

    # -- listing and reading ------------------------------------------------------------------------
    def names(self) -> list[str]:
        return self.watcher.initial_scan()

    def has(self, model: str) -> bool:
        return (self.root / model).is_dir()

    def missing(self, model: str) -> str:
        return f"no directory {self.root / model}"

    def read_text(self, model: str, name: str) -> str | None:
        try:  # the source may be mid-edit: a fifo or a huge file is no config here
            return read_small_text(self.root / model / name, MAX_CONFIG_BYTES)
        except OSError:
            return None

    def entry_problem(self, model: str) -> str | None:
        entry = self.root / model
        if not entry.is_symlink() or entry.is_dir():
            return None
        try:
            target = os.readlink(entry)
        except OSError:
            target = "?"
        what = "a dangling symlink" if not os.path.lexists(os.path.realpath(entry)) else "a symlink to no directory"
        return f"model entry {model} is {what} (-> {target}); nothing changed"

    # -- capture --------------------------------------------------------------------------------------
    def capture_into(self, content: ContentStore, model: str, *, settled: bool = True,
                     complete: bool = False) -> Captured:
        return self.capture_job(model, settled=settled, complete=complete).run(content)

    def capture_job(self, model: str, *, settled: bool = True, complete: bool = False) -> LocalCapture:
        """`capture_into`'s work as data, to run here or in another process (`LocalCapture`)."""
        # a network mount's stat facts may lag writes made elsewhere: its cache margin on the window
        quiet_s = self.watcher.settle_s + self.watcher.capture_margin_s() if settled and not complete else 0.0
        return LocalCapture(self.root, model, self.commit_marker, quiet_s, self._marker_root(),
                            tuple(self.link_roots()))

    def link_roots(self) -> list[str]:
        """The resolved directories a model entry may lie in (resolved at each capture: a root that is
        itself a symlink may be re-pointed)."""
        return [os.path.realpath(root) for root in (self.root, *self.allowed_link_roots)]

    def signature(self, model: str) -> str | None:
        return self.watcher.signature(model)

    def signatures(self) -> dict[str, str]:
        return self.watcher.signatures()

    # -- watching -------------------------------------------------------------------------------------
    def watch(self, on_change: OnChange) -> None:
        self._on_change = on_change
        self.watcher.start(events=not self.events_later)

    def start_events(self) -> None:
        self.watcher.start_events()

    def stop(self) -> None:
        self.watcher.stop()

    def reschedule(self, model: str, delay_s: float) -> None:
        self.watcher.reschedule(model, delay_s)

    def set_settle(self, settle_s: float) -> None:
        self.watcher.set_settle(settle_s)

    def watch_info(self) -> Mapping[str, str | None]:
        return self.watcher.watch_info()

    def settling(self) -> dict[str, float | None]:
        return self.watcher.settling()

    def backlog(self) -> int:
        return self.watcher.backlog()

    def held(self) -> dict[str, str]:
        return {}  # a directory offers every model it holds

    # -- the repository level -------------------------------------------------------------------------
    def repository_held(self) -> bool:
        return (self.root / HOLD_FILE).exists()

    def _marker_root(self) -> Path | None:
        """The root when it holds the commit marker: that marker then commits every model, and a
        model's own marker is not looked at."""
        marker = self.commit_marker
        return self.root if marker and (self.root / marker).is_file() else None

    def repository_marked(self) -> bool:
        return self._marker_root() is not None

    def repository_wait(self, model: str) -> str | None:
        if self.repository_held():
            return f"on hold ({HOLD_FILE} present at the repository root)"
        root = self._marker_root()
        if root is None or self.commit_marker is None:
            return None
        try:
            ContentStore.check_marker(root / model, model, self.commit_marker, root)
        except SnapshotError as exc:
            return str(exc).removeprefix(f"{model}: ")
        return None


def check_repository(settings: Settings) -> None:
    """Before the daemon creates anything (controlplane/startup/preflight.py): a repository directory
    that is missing, not a directory or unreadable is one line. Another kind of source checks itself
    when it first answers."""
    repository = settings.repository
    if repository is None:
        return
    if not repository.exists():
        raise ConfigError(f"repository {repository}: no such directory")
    if not repository.is_dir():
        raise ConfigError(f"repository {repository}: not a directory")
    if not os.access(repository, os.R_OK | os.X_OK):
        raise ConfigError(f"repository {repository}: cannot read it (permission denied)")
