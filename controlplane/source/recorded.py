"""What the registry remembers of each model's source: the newest recorded content, the stat (or
listing) signature it was captured at, and an ensemble's steps; kept in memory, up to date on every
record.

Why: a start, and every change set's grouping, must not cost a read of every model's source. The
start compares each model's signature with the recorded one and captures only the models that differ
(controlplane/startup/scan.py); a change set is grouped over this graph of recorded configs
(controlplane/intake/changeset.py), reading the source config only of the models that changed. The graph is
read from the registry in one query (`Registry.source_index`) the first time it is needed, then each
record (`recorded`) updates it.
"""

from __future__ import annotations

import threading

from controlplane.store.records import SourceEntry
from controlplane.store.registry import Registry


class SourceGraph:
    """Each model's newest recorded source entry, and the reverse map step -> ensembles over it."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self._lock = threading.Lock()
        self._entries: dict[str, SourceEntry] | None = None
        self._over: dict[str, set[str]] = {}

    def _loaded(self) -> dict[str, SourceEntry]:
        with self._lock:
            if self._entries is not None:
                return self._entries
        entries = self.registry.source_index()
        with self._lock:
            if self._entries is None:
                self._entries = entries
                self._over = {}
                for entry in entries.values():
                    for step in entry.steps or []:
                        self._over.setdefault(step, set()).add(entry.model)
            return self._entries

    def entries(self) -> dict[str, SourceEntry]:
        """Every model's entry (a copy)."""
        entries = self._loaded()
        with self._lock:
            return dict(entries)

    def entry(self, model: str) -> SourceEntry | None:
        entries = self._loaded()
        with self._lock:
            return entries.get(model)

    def steps(self, model: str) -> list[str] | None:
        """The step models of `model`'s newest recorded content; None when it is no ensemble (or unknown)."""
        entry = self.entry(model)
        return None if entry is None or entry.steps is None else list(entry.steps)

    def ensembles_over(self, model: str) -> set[str]:
        """The models whose newest recorded content is an ensemble naming `model` as a step."""
        self._loaded()
        with self._lock:
            return set(self._over.get(model, ()))

    def recorded(self, entry: SourceEntry) -> None:
        """A content of `entry.model`'s source was just recorded (the registry holds it already)."""
        with self._lock:
            if self._entries is None:
                return  # read in full when first needed
            old = self._entries.get(entry.model)
            for step in (old.steps or []) if old is not None else []:
                self._over.get(step, set()).discard(entry.model)
            self._entries[entry.model] = entry
            for step in entry.steps or []:
                self._over.setdefault(step, set()).add(entry.model)
