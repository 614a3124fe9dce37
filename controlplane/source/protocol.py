"""What the control plane asks of a model source: the `Source` protocol, and `NoSource`.

Why: the plane, change sets, the start-up scan and the fleet leader once branched on the kind of
source (a directory or s3://) wherever they listed, read, captured or watched one, and the watcher's
parts reached the plane as a bag of optional callables. Now the daemon builds one `Source`
(controlplane/source/local.py for a directory, controlplane/source/s3.py for object storage, `NoSource`
without either) and everything else asks it, whatever its kind. A new kind (GCS, Azure) implements
this protocol and nothing else: docs/architecture.md "How to: add a source kind".

The rules every kind keeps: a capture refuses, with a SnapshotError subclass, content that is still
changing (`settled`: within the settle window measured at capture time), on hold or awaiting its
commit marker, and a change during the copy; `complete` (the writer declared the model whole) skips
the quiet window only. Signatures are stat or listing facts, compared with the recorded ones so a
start-up reads no file of an unchanged model (controlplane/startup/scan.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import NamedTuple, Protocol

from controlplane.errors import UsageError
from controlplane.snapshot import ContentStore, Snapshot

# on_change(model, complete): the model settled (complete: its writer declared it whole)
OnChange = Callable[[str, bool], None]


class Captured(NamedTuple):
    """A capture's result: the snapshot in the content store, and the source signature it was taken at
    (None: none recordable) with whether that signature names the content (`trusted`)."""

    snapshot: Snapshot
    signature: str | None
    trusted: bool


class CaptureJob(Protocol):
    """One model's capture as picklable data, to run in a capture worker's process (the start-up
    scan, controlplane/startup/cores.py): what `capture_into` does, against that process's store."""

    @property
    def model(self) -> str: ...

    def run(self, content: ContentStore) -> Captured: ...


class Source(Protocol):
    """A model source: list, read, capture and watch models (see the module docstring)."""

    # -- listing and reading ------------------------------------------------------------------------
    def names(self) -> list[str]:
        """The model entries present now (what the start-up scan and a fleet leader's scan look at)."""
        ...

    def has(self, model: str) -> bool:
        """Whether the source holds `model` now."""
        ...

    def missing(self, model: str) -> str:
        """Where `model` was looked for, for an error that it is not there ("no directory /repo/m")."""
        ...

    def read_text(self, model: str, name: str) -> str | None:
        """A small file of the model (config.pbtxt), None when absent or unreadable; at most
        MAX_CONFIG_BYTES (the source may be mid-edit)."""
        ...

    def entry_problem(self, model: str) -> str | None:
        """Why the model's entry can be neither captured nor called removed (a dangling symlink)."""
        ...

    # -- capture --------------------------------------------------------------------------------------
    def capture_into(self, content: ContentStore, model: str, *, settled: bool = True,
                     complete: bool = False) -> Captured:
        """Snapshot the model into `content` if it is whole and holding still; SnapshotError otherwise."""
        ...

    def capture_job(self, model: str, *, settled: bool = True, complete: bool = False) -> CaptureJob | None:
        """`capture_into`'s work as a job another process can run (the start-up scan's capture
        workers); None: this kind captures only in the daemon."""
        ...

    def signature(self, model: str) -> str | None:
        """The model's signature now (stat or listing facts; None: gone), comparable with a recorded one."""
        ...

    def signatures(self) -> dict[str, str]:
        """Each model's signature as the last `names()` (the start-up scan) saw it."""
        ...

    # -- watching -------------------------------------------------------------------------------------
    def watch(self, on_change: OnChange) -> None:
        """Start watching: `on_change(model, complete)` from the source's own thread once a model settled."""
        ...

    def start_events(self) -> None:
        """Begin the event watching a source built to start it late (LocalSource's `events_later`:
        the daemon's, after READY); until then, and always, the rescan sees every change."""
        ...

    def stop(self) -> None:
        """Stop watching; pending checks are dropped."""
        ...

    def reschedule(self, model: str, delay_s: float) -> None:
        """Hand `model` on again after `delay_s` (a capture was put off)."""
        ...

    def set_settle(self, settle_s: float) -> None:
        """SIGHUP's new settle window."""
        ...

    def watch_info(self) -> Mapping[str, str | None]:
        """{"mode": "inotify" | "poll" | None, "reason": ...}: how the source is watched, and why."""
        ...

    def settling(self) -> dict[str, float | None]:
        """The models with a check pending (settling, on hold, looked at again), each with the seconds
        since its last change seen (None: looked at again on request)."""
        ...

    def backlog(self) -> int:
        """How many models wait for their check (the watcher backlog metric)."""
        ...

    def held(self) -> dict[str, str]:
        """The models the source holds but does not offer to serve yet, each with why (an MLflow model
        whose alias names no version): `status` shows them `held`. Empty for a directory and S3."""
        ...

    # -- the repository level (change sets: controlplane/intake/changeset.py) ----------------------------------
    def repository_held(self) -> bool:
        """Whether the whole repository is on hold (`.tritonctl-hold` at its root)."""
        ...

    def repository_marked(self) -> bool:
        """Whether a commit marker at the repository root commits every model at once."""
        ...

    def repository_wait(self, model: str) -> str | None:
        """Why the repository level holds `model` back (its hold, or a root marker older than the
        model's content); None when nothing does."""
        ...


def last_read(at: float | None) -> str:
    """`last read HH:MM:SSZ (N s ago)`, or `not read yet`: when a polling source last listed its models
    (its `watch_info` reason says it: a poll that hangs or fails shows as an old time)."""
    if at is None:
        return "not read yet"
    return f"last read {time.strftime('%H:%M:%SZ', time.gmtime(at))} ({max(0.0, time.time() - at):.0f} s ago)"


class PerModelOnly:
    """The repository level of a kind that has none (a hold or a marker is per model there, refused in
    `capture_into`): nothing holds or commits the whole repository."""

    def repository_held(self) -> bool:
        return False

    def repository_marked(self) -> bool:
        return False

    def held(self) -> dict[str, str]:
        return {}

    def repository_wait(self, model: str) -> str | None:
        return None


class NoSource(PerModelOnly):
    """A daemon without a source repository: nothing to list, capture or watch (`load --digest` and
    every operation on recorded content still work)."""

    def names(self) -> list[str]:
        return []

    def has(self, model: str) -> bool:
        return False

    def missing(self, model: str) -> str:
        return "the daemon has no source repository (--repository)"

    def read_text(self, model: str, name: str) -> str | None:
        return None

    def entry_problem(self, model: str) -> str | None:
        return None

    def capture_into(self, content: ContentStore, model: str, *, settled: bool = True,
                     complete: bool = False) -> Captured:
        raise UsageError("the daemon has no source repository (--repository)")

    def capture_job(self, model: str, *, settled: bool = True, complete: bool = False) -> CaptureJob | None:
        return None

    def signature(self, model: str) -> str | None:
        return None

    def signatures(self) -> dict[str, str]:
        return {}

    def watch(self, on_change: OnChange) -> None:
        return None

    def start_events(self) -> None:
        return None

    def stop(self) -> None:
        return None

    def reschedule(self, model: str, delay_s: float) -> None:
        return None

    def set_settle(self, settle_s: float) -> None:
        return None

    def watch_info(self) -> Mapping[str, str | None]:
        return {"mode": None, "reason": "no source repository"}

    def settling(self) -> dict[str, float | None]:
        return {}

    def backlog(self) -> int:
        return 0
