"""What a host did while a registry could not be written, kept on local disk until it can be.

One mechanism for both records an outage would lose: a single host's own registry (its deployments,
serving rows and audit events: controlplane/store/journaled.py) and a fleet host's step records on the
shared registry (controlplane/fleet/journal.py). Each keeps its own file under the state directory:
one JSON object per line, flushed and fsynced before the host goes on. `replay_with(write)` hands every
entry, in order, to `write`, which writes it to the registry (True) or finds it already there (False:
a crash between the write and the journal's rewrite replays it again, harmlessly); a StoreError stops
the replay, and the entries not written stay for the next one. The journal is then rewritten without
the entries done (atomically), or removed.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from controlplane.errors import StoreError
from controlplane.snapshot.fsutil import open_private, write_atomic

Entry = dict[str, Any]


class Journal:
    """Records that wait for a registry (thread-safe; one file)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.RLock()
        self._replaying = False  # a replay's own first write may be what tells the registry is back

    def keep(self, entry: Entry) -> None:
        """Append `entry`, flushed and fsynced (an OSError, e.g. a full disk here too, is the caller's)."""
        line = json.dumps(entry)
        with self._lock:
            self.path.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
            with open(open_private(self.path, os.O_WRONLY | os.O_APPEND), "a", encoding="utf-8") as f:
                f.write(line + "\n")
                f.flush()
                os.fsync(f.fileno())

    def entries(self) -> list[Entry]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        out = []
        for line in text.splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # a line a crash cut short: never written in full, never acted on
                continue
        return out

    def __len__(self) -> int:
        return len(self.entries())

    def replay_with(self, write: Callable[[Entry], bool]) -> int:
        """Write every entry with `write`, once, in order; keep those it could not write. Returns how many
        it wrote (an entry already there is dropped, not written again)."""
        with self._lock:
            pending = [] if self._replaying else self.entries()
            if not pending:
                return 0
            self._replaying = True
            try:
                written, left = 0, []
                for i, entry in enumerate(pending):
                    try:
                        written += bool(write(entry))
                    except StoreError:  # away again: the rest waits for the next return
                        left = pending[i:]
                        break
                self._rewrite(left)
            finally:
                self._replaying = False
        return written

    def _rewrite(self, entries: list[Entry]) -> None:
        if not entries:
            self.path.unlink(missing_ok=True)
            return
        write_atomic(self.path, "".join(json.dumps(e) + "\n" for e in entries).encode(), mode=0o640, fsync=True)
