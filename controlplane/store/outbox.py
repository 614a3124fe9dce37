"""The webhooks' outbox and deliveries in the registry (migration 0006); the worker in
controlplane/outcomes/webhooks.py decides what to send and when, this module only records and reads.

Why an outbox: an audit event and its outbox row are written in ONE transaction (`add_audit_event`, the
only place the product appends to `audit_events`), so no event the registry recorded can be missed by
the webhooks, whatever crashes when. The worker then fans each outbox row out into one delivery row per
webhook that wants its action and deletes the outbox row, again in one transaction; the DELETE is
conditional, so two daemons (an old and a new fleet leader) never fan the same event out twice.
Fanning out at delivery time, not at write time, means the deliverer's configuration decides who gets
what: in a fleet every host writes events to the shared registry, and the leader's `[[webhook]]` tables
route them.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

from sqlalchemy import delete, insert, select, update
from sqlalchemy.orm import Session

from controlplane.errors import NotFoundError, UsageError
from controlplane.store import schema
from controlplane.store.records import AuditEntry, AuditRecord, DeliveryRecord, from_row


class Sessions(Protocol):
    """What the outbox uses of the registry (controlplane.store.registry.Registry): its transactions."""

    def session(self) -> AbstractContextManager[Session]: ...

PENDING, DELIVERED, FAILED = "pending", "delivered", "failed"
DELIVERY_STATES = (PENDING, DELIVERED, FAILED)
ANSWER_CHARS = 500  # how much of a receiver's answer is kept


def add_audit_event(session: Session, entry: AuditEntry, host: str, now: datetime, outbox: bool) -> None:
    """Append an audit event and, with `outbox`, its outbox row, in the caller's transaction."""
    row = schema.AuditEvent(time=now, actor=entry.actor, action=entry.action, model=entry.model,
                            digest=entry.digest, outcome=entry.outcome, duration_ms=entry.duration_ms,
                            message=" ".join(entry.message.split()), host=host, claimed=entry.claimed)
    session.add(row)
    if outbox:
        session.flush()  # the event's id
        session.add(schema.WebhookOutbox(audit_id=row.id, created_at=now))


def add_audit_events(session: Session, entries: Sequence[AuditEntry], host: str, now: datetime,
                     outbox: bool) -> None:
    """`add_audit_event` of many events, in order, as two bulk INSERTs (the start-up scan's batches)."""
    rows = [{"time": now, "actor": e.actor, "action": e.action, "model": e.model, "digest": e.digest,
             "outcome": e.outcome, "duration_ms": e.duration_ms, "message": " ".join(e.message.split()), "host": host,
             "claimed": e.claimed}
            for e in entries]
    if not rows:
        return
    if not outbox:
        session.execute(insert(schema.AuditEvent), rows)
        return
    ids = list(session.scalars(insert(schema.AuditEvent).returning(schema.AuditEvent.id, sort_by_parameter_order=True),
                               rows))
    session.execute(insert(schema.WebhookOutbox), [{"audit_id": i, "created_at": now} for i in ids])


@dataclass(frozen=True)
class Outgoing:
    """A delivery due now: the oldest open one of its (url, model) lane."""

    id: str
    event_id: int
    action: str
    model: str | None
    url: str
    body: bytes
    attempts: int
    created_at: datetime
    retry_until: datetime


def _record(row: schema.WebhookDelivery) -> DeliveryRecord:
    return DeliveryRecord(id=row.id, event_id=row.audit_id, action=row.action, model=row.model, url=row.url,
                          state=row.state, attempts=row.attempts, created_at=row.created_at,
                          next_attempt_at=row.next_attempt_at if row.state == PENDING else None,
                          last_attempt_at=row.last_attempt_at, finished_at=row.finished_at,
                          status_code=row.status_code, answer=row.answer)


def _audit(row: schema.AuditEvent) -> AuditRecord:
    return from_row(AuditRecord, row)


class DeliveryStore:
    """The outbox and the deliveries of one registry."""

    def __init__(self, registry: Sessions) -> None:
        self.registry = registry

    def fan_out(self, route: Callable[[AuditRecord], Sequence[tuple[str, bytes]]], now: datetime,
                retry_for: timedelta, limit: int = 500) -> int:
        """Turn up to `limit` outbox rows, oldest first, into deliveries: `route` gives each event's
        (url, body) pairs. Returns how many events were taken."""
        with self.registry.session() as session:
            queued = session.execute(select(schema.WebhookOutbox.id, schema.WebhookOutbox.audit_id)
                                     .order_by(schema.WebhookOutbox.id).limit(limit)).all()
            if not queued:
                return 0
            events = {row.id: row for row in session.scalars(
                select(schema.AuditEvent).where(schema.AuditEvent.id.in_([a for _, a in queued])))}
            # one DELETE for the batch (one per row cost most of a start-up's 10,000 audit events); the
            # rows it returns are this daemon's: a row another daemon took meanwhile is not among them
            mine = set(session.scalars(delete(schema.WebhookOutbox)
                                       .where(schema.WebhookOutbox.id.in_([o for o, _ in queued]))
                                       .returning(schema.WebhookOutbox.id)
                                       .execution_options(synchronize_session=False)))
            taken = 0
            for outbox_id, audit_id in queued:
                if outbox_id not in mine:
                    continue  # another daemon took it
                taken += 1
                event = events.get(audit_id)
                if event is None:
                    continue
                record = _audit(event)
                for url, body in route(record):
                    session.add(schema.WebhookDelivery(
                        id=uuid.uuid4().hex, audit_id=record.id, action=record.action, model=record.model,
                        url=url, body=body.decode("utf-8"), state=PENDING, attempts=0, created_at=now,
                        next_attempt_at=now, retry_until=now + retry_for, answer=""))
            return taken

    def lanes(self, now: datetime, urls: Sequence[str], limit: int = 10_000) -> tuple[list[Outgoing], bool]:
        """For each (url, model) lane of the configured `urls`, its oldest pending delivery, if its next
        attempt is due (a delivery waiting for a retry holds back the later ones of its model); and
        whether any delivery to `urls` is pending at all (due now or waiting for a retry)."""
        stmt = (select(schema.WebhookDelivery).where(schema.WebhookDelivery.state == PENDING,
                                                     schema.WebhookDelivery.url.in_(list(urls)))
                .order_by(schema.WebhookDelivery.audit_id, schema.WebhookDelivery.created_at).limit(limit))
        heads: dict[tuple[str, str | None], schema.WebhookDelivery] = {}
        with self.registry.session() as session:
            for row in session.scalars(stmt):
                heads.setdefault((row.url, row.model), row)
            return [Outgoing(r.id, r.audit_id, r.action, r.model, r.url, r.body.encode("utf-8"), r.attempts,
                             r.created_at, r.retry_until)
                    for r in heads.values() if r.next_attempt_at <= now], bool(heads)

    def finish_attempt(self, delivery_id: str, *, state: str, status_code: int | None, answer: str,
                       now: datetime, next_attempt_at: datetime | None = None) -> None:
        """Record one attempt: `delivered`, `failed` for good, or `pending` again at `next_attempt_at`."""
        values: dict[str, Any] = {"state": state, "attempts": schema.WebhookDelivery.attempts + 1,
                                  "last_attempt_at": now, "status_code": status_code,
                                  "answer": " ".join(answer.split())[:ANSWER_CHARS]}
        if state == PENDING:
            values["next_attempt_at"] = next_attempt_at or now
        else:
            values["finished_at"] = now
        with self.registry.session() as session:
            session.execute(update(schema.WebhookDelivery)
                            .where(schema.WebhookDelivery.id == delivery_id, schema.WebhookDelivery.state == PENDING)
                            .values(**values).execution_options(synchronize_session=False))

    def fail_unrouted(self, urls: Sequence[str], now: datetime) -> int:
        """Pending deliveries to a URL no `[[webhook]]` table names any more end `failed`."""
        with self.registry.session() as session:
            result = session.execute(
                update(schema.WebhookDelivery)
                .where(schema.WebhookDelivery.state == PENDING, schema.WebhookDelivery.url.not_in(list(urls)))
                .values(state=FAILED, finished_at=now, answer="webhook no longer configured")
                .execution_options(synchronize_session=False))
            return int(getattr(result, "rowcount", 0) or 0)

    def list(self, state: str | None = None, limit: int = 100) -> list[DeliveryRecord]:
        """Deliveries, newest first (by event, then by when they were made)."""
        stmt = select(schema.WebhookDelivery)
        if state is not None:
            stmt = stmt.where(schema.WebhookDelivery.state == state)
        stmt = stmt.order_by(schema.WebhookDelivery.audit_id.desc(), schema.WebhookDelivery.created_at.desc(),
                             schema.WebhookDelivery.id).limit(max(1, limit))
        with self.registry.session() as session:
            return [_record(row) for row in session.scalars(stmt)]

    def redeliver(self, delivery_id: str, now: datetime, retry_for: timedelta, urls: Sequence[str]) -> DeliveryRecord:
        """Send a delivery (by id or unique prefix) again, with the same id, from now for `retry_for`; its
        URL must still be one of the configured `urls`."""
        if not delivery_id or any(c not in "0123456789abcdef" for c in delivery_id.lower()):
            raise UsageError(f"delivery id {delivery_id!r}: expected the hex id `tritonctl webhooks` shows")
        with self.registry.session() as session:
            rows = list(session.scalars(select(schema.WebhookDelivery)
                                        .where(schema.WebhookDelivery.id.startswith(delivery_id.lower()))
                                        .limit(2)))
            if not rows:
                raise NotFoundError(f"no webhook delivery {delivery_id}")
            if len(rows) > 1:
                raise UsageError(f"delivery id prefix {delivery_id} is ambiguous")
            row = rows[0]
            if row.url not in urls:
                raise UsageError(f"delivery {row.id[:12]}: {row.url} is no longer a configured webhook")
            row.state, row.next_attempt_at, row.retry_until, row.finished_at = PENDING, now, now + retry_for, None
            return _record(row)

    def prune(self, before: datetime) -> int:
        """Delete deliveries that ended (delivered or failed) before `before`; the audit log keeps the
        events themselves."""
        with self.registry.session() as session:
            result = session.execute(delete(schema.WebhookDelivery)
                                     .where(schema.WebhookDelivery.state != PENDING,
                                            schema.WebhookDelivery.finished_at < before)
                                     .execution_options(synchronize_session=False))
            return int(getattr(result, "rowcount", 0) or 0)

    def count(self, state: str) -> int:
        from sqlalchemy import func

        with self.registry.session() as session:
            return int(session.scalar(select(func.count()).select_from(schema.WebhookDelivery)
                                      .where(schema.WebhookDelivery.state == state)) or 0)
