"""The event document: one audit record as the webhook body, the SSE data and an `audit --json` entry."""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from controlplane.documents.events import EVENT_KEYS, event_body, event_document
from controlplane.documents.results import AuditResult
from controlplane.store.records import AuditRecord

pytestmark = pytest.mark.unit

RECORD = AuditRecord(id=42, time=datetime(2026, 3, 4, 5, 6, 7, 890000), actor="alice", action="deploy",
                     model="resnet", digest="ab" * 32, outcome="rolled_back", duration_ms=1234,
                     message="smoke test failed: élan", host="gpu-1", claimed="bob")


def test_the_document_carries_every_field_of_the_audit_record() -> None:
    document = event_document(RECORD)
    assert list(document) == list(EVENT_KEYS)
    assert document == {"id": 42, "time": "2026-03-04T05:06:07.890000Z", "actor": "alice", "action": "deploy",
                        "model": "resnet", "digest": "ab" * 32, "outcome": "rolled_back", "duration_ms": 1234,
                        "message": "smoke test failed: élan", "host": "gpu-1", "claimed": "bob"}


def test_audit_json_prints_the_same_document() -> None:
    assert AuditResult([RECORD]).to_json() == [event_document(RECORD)]
    assert event_document(RECORD) == RECORD.to_json()


def test_nullable_fields_stay_null() -> None:
    record = AuditRecord(7, datetime(2026, 1, 1), "tritonctl", "daemon_start", None, None, "ok", None, "triton x")
    document = event_document(record)
    assert document["model"] is None and document["digest"] is None and document["duration_ms"] is None
    assert document["host"] == ""
    assert document["claimed"] is None  # no claim, or the caller declared itself


def test_the_body_is_compact_utf8_json_of_the_document() -> None:
    body = event_body(event_document(RECORD))
    assert json.loads(body.decode("utf-8")) == event_document(RECORD)
    assert b", " not in body and "élan".encode() in body  # compact, not \\u-escaped
