"""What this host did while the shared registry did not answer, kept until it answers again.

A rollout step or a converge that deploys, rolls back or unloads on this host changes what it serves at
once, whatever the database does; its record on the fleet's tables (the step's end, the host's serving
row, the serving log, the audit event: `FleetStore.finish_step`, one transaction) is what an outage
would lose. When that write fails for want of the registry, the record goes to this journal instead:
one JSON line per record in `<state_dir>/fleet-journal.jsonl`, flushed and fsynced before the host
goes on (the one journal mechanism, controlplane/store/journal.py; the host's own registry keeps its
records the same way, controlplane/store/journaled.py). When the registry answers again
(`RegistryHealth.on_return`, and at the daemon's start for a journal a stop left behind), every entry
is written once, stamped with the time it happened (so `audit --at` is right for the outage too), and
the journal is rewritten without it.

Replaying twice writes nothing twice: an entry's key is (host, time, action, model), and
`FleetStore.finish_step` writes nothing for an entry whose audit event is already there (a crash
between the write and the journal's rewrite replays it again, harmlessly).
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import datetime

from controlplane.store.fleet import FleetStore, Step
from controlplane.store.journal import Entry
from controlplane.store.journal import Journal as RecordJournal
from controlplane.store.records import AuditEntry

JOURNAL_NAME = "fleet-journal.jsonl"


class Journal(RecordJournal):
    """The step records that wait for the shared registry (thread-safe; one file per host)."""

    def append(self, step: Step, state: str, message: str, host: str, serving: str | None, audit: AuditEntry,
               at: datetime) -> None:
        kept = {k: v for k, v in asdict(step).items() if k not in ("started_at", "finished_at")}
        self.keep({"step": kept, "state": state, "message": message, "host": host, "serving": serving,
                   "audit": asdict(audit), "at": at.isoformat()})

    def replay(self, store: FleetStore) -> int:
        """Write every entry to the shared registry, once; keep those it could not write. Returns how many
        it wrote (an entry already there is dropped, not written again)."""

        def write(entry: Entry) -> bool:
            return store.finish_step(
                Step(**entry["step"]), entry["state"], entry["message"], host=entry["host"],
                serving=entry["serving"], audit=AuditEntry(**entry["audit"]),
                at=datetime.fromisoformat(entry["at"]))

        return self.replay_with(write)
