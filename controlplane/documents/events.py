"""One audit record as the JSON object every consumer outside the daemon sees: the body of a webhook,
the data of a `/v1/events` server-sent event, and an element of `tritonctl audit --json`.

Why one function: a receiver that reads webhooks, a follower of the event stream and a script over
`audit --json` must see the same keys with the same meanings, so all three are built here from the
registry's `AuditRecord` (controlplane/store/records.py). Keys may be added, never renamed or removed
(docs/schemas/audit.schema.json publishes the shape).
"""

from __future__ import annotations

import json
from typing import Any

from controlplane.store.records import AuditRecord, iso

# The document's keys, in order: what every audit event carries (a field may be null: the model of a
# `daemon_start`, the digest of an unload, the duration of an event that is not timed).
EVENT_KEYS = ("id", "time", "actor", "action", "model", "digest", "outcome", "duration_ms", "message", "host",
              "claimed")


def event_document(record: AuditRecord) -> dict[str, Any]:
    """The audit record as a JSON object: `id` (the audit log's id, increasing), `time` (ISO 8601 UTC
    with a Z), `actor`, `action` (deploy, rollback, tag, changeset, ...), `model`, `digest`, `outcome`
    (ok, failed, rolled_back, noop, invalid), `duration_ms`, `message`, `host` ("" off a fleet) and `claimed`
    (what the caller declared in `x-tritonctl-actor` when it differs from the authenticated `actor`; null
    otherwise: never the actor itself)."""
    return {
        "id": record.id,
        "time": iso(record.time),
        "actor": record.actor,
        "action": record.action,
        "model": record.model,
        "digest": record.digest,
        "outcome": record.outcome,
        "duration_ms": record.duration_ms,
        "message": record.message,
        "host": record.host,
        "claimed": record.claimed,
    }


def event_body(document: dict[str, Any]) -> bytes:
    """The document as the exact bytes sent (and signed): compact UTF-8 JSON, keys in document order."""
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
