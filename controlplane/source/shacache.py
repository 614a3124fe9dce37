"""A small JSON map kept beside the content store: what a remote source captured before.

Object storage and MLflow have no inode to stat: `(key, size, ETag)` -> sha256 (S3) and
`(model, version, run, path, size)` -> sha256 (MLflow) say an object is already in the store, so it is not
downloaded again. Entries only accumulate (the newest `max_entries` kept); another capture may write
between a load and a save, so a save merges into what is on disk.
"""

from __future__ import annotations

import contextlib
import json
import threading
from pathlib import Path

from controlplane.snapshot.fsutil import write_atomic

_LOCK = threading.RLock()  # one lock for every cache file: saves are rare and small
MAX_ENTRIES = 50_000


class ShaCache:
    def __init__(self, path: Path, max_entries: int = MAX_ENTRIES) -> None:
        self.path = path
        self.max_entries = max_entries

    def load(self) -> dict[str, str]:
        with _LOCK:
            try:
                data = json.loads(self.path.read_text())
                return {str(k): str(v) for k, v in data.items()}
            except (OSError, ValueError, AttributeError):
                return {}

    def save(self, entries: dict[str, str]) -> None:
        with _LOCK:
            current = self.load()
            current.update(entries)
            items = list(current.items())[-self.max_entries:]
            with contextlib.suppress(OSError):
                write_atomic(self.path, json.dumps(dict(items)).encode())
