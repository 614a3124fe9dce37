"""What the daemon derives from a recorded content, kept by (what, model, full digest).

Why: a content's digest names its files, config included, so what is derived from them - the parsed
config, the versions it serves, an ensemble's steps - never changes once recorded (only a snapshot's
quarantine, validity and collection do, which this never keeps). Every deploy asked the registry for
them up to three times (the ensemble checks, the serving-ensembles map): about a fifth of the daemon's
CPU in a first start under auto policy (issue 26). One memo per Registry, bounded: the oldest entry
goes first. What it returns is shared: read it, never change it. The one value derived later, the config
Triton completed at a load (controlplane/validation/completions.py), is dropped (`forget`) when a load
records it again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

MEMO_SIZE = 8192

Key = tuple[str, str, str]  # (what, model, full digest)


class ContentMemo:
    """Values derived from recorded contents (see the module docstring)."""

    def __init__(self, size: int = MEMO_SIZE) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._values: dict[Key, Any] = {}

    def get(self, key: Key, compute: Callable[[], tuple[Any, bool]]) -> Any:
        """The value kept for `key`, else `compute()`'s value, kept when it says so (False: the digest
        given was a prefix, or the content is not recorded)."""
        with self._lock:
            if key in self._values:
                return self._values[key]
        value, keep = compute()
        if keep:
            with self._lock:
                if len(self._values) >= self.size:
                    self._values.pop(next(iter(self._values)))
                self._values[key] = value
        return value

    def forget(self, key: Key) -> None:
        """Drop what is kept for `key` (a value derived from a record that was replaced)."""
        with self._lock:
            self._values.pop(key, None)

    def __len__(self) -> int:
        return len(self._values)
