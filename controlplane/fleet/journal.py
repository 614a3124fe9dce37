"""What this host did while the shared registry did not answer, kept until it answers again.

A rollout step or a converge that deploys, rolls back or unloads on this host changes what it serves at
once, whatever the database does; its record on the fleet's tables (the step's end, the host's serving
row, the serving log, the audit event: `FleetStore.finish_step`, one transaction) is what an outage
would lose. When that write fails for want of the registry, the record goes to this journal instead:
one JSON line per record in `<state_dir>/fleet-journal.jsonl`, flushed and fsynced before the host
goes on. When the registry answers again (`RegistryHealth.on_return`, and at the daemon's start for a
journal a stop left behind), every entry is written once, stamped with the time it happened (so
`audit --at` is right for the outage too), and the journal is rewritten without it.

Replaying twice writes nothing twice: an entry's key is (host, time, action, model), and
`FleetStore.finish_step` writes nothing for an entry whose audit event is already there (a crash
between the write and the journal's rewrite replays it again, harmlessly).
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict
from datetime import datetime
from pathlib import Path
from typing import Any

from controlplane.errors import StoreError
from controlplane.store.fleet import FleetStore, Step
from controlplane.store.records import AuditEntry

JOURNAL_NAME = "fleet-journal.jsonl"


class Journal:
    """The step records that wait for the registry (thread-safe; one file per host)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.RLock()
        self._replaying = False  # a replay's own first write may be what tells the registry is back

    def append(self, step: Step, state: str, message: str, host: str, serving: str | None, audit: AuditEntry,
               at: datetime) -> None:
        kept = {k: v for k, v in asdict(step).items() if k not in ("started_at", "finished_at")}
        line = json.dumps({"step": kept, "state": state, "message": message, "host": host,
                           "serving": serving, "audit": asdict(audit), "at": at.isoformat()})
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as f:
                f.write(line + "\n")
                f.flush()
                os.fsync(f.fileno())

    def entries(self) -> list[dict[str, Any]]:
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

    def replay(self, store: FleetStore) -> int:
        """Write every entry to the registry, once; keep those it could not write. Returns how many it
        wrote (an entry already there is dropped, not written again)."""
        with self._lock:
            pending = [] if self._replaying else self.entries()
            if not pending:
                return 0
            self._replaying = True
            try:
                written, left = self._write(store, pending)
                self._rewrite(left)
            finally:
                self._replaying = False
        return written

    @staticmethod
    def _write(store: FleetStore, pending: list[dict[str, Any]]) -> tuple[int, list[dict[str, Any]]]:
        written = 0
        for i, entry in enumerate(pending):
            try:
                written += store.finish_step(
                    Step(**entry["step"]), entry["state"], entry["message"], host=entry["host"],
                    serving=entry["serving"], audit=AuditEntry(**entry["audit"]),
                    at=datetime.fromisoformat(entry["at"]))
            except StoreError:  # away again: the rest waits for the next return
                return written, pending[i:]
        return written, []

    def _rewrite(self, entries: list[dict[str, Any]]) -> None:
        if not entries:
            self.path.unlink(missing_ok=True)
            return
        tmp = self.path.with_suffix(".tmp")
        with tmp.open("w", encoding="utf-8") as f:
            f.write("".join(json.dumps(e) + "\n" for e in entries))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
