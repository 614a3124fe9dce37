"""The registry's history: the audit log (with its webhook outbox rows), the serving log, and tags with
their moves and tracks. `Registry` (controlplane/store/registry.py) is a `History`; this module holds
these tables' reads and writes so the registry's module stays about models, snapshots, footprints and
deployments. Every method is one short transaction of the registry's (`_session`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, aliased

from controlplane.store import schema
from controlplane.store.outbox import add_audit_event, add_audit_events
from controlplane.store.records import AuditEntry, AuditQuery, AuditRecord, ServingRecord, TagRecord, from_row

AUDIT_ADDED = "tritonctl.audit_added"  # session.info flag: this transaction added audit events


class History:
    """The audit log, the serving log and tags, over the registry's transactions."""

    host: str
    outbox: bool
    clock: Callable[[], datetime]

    def _session(self) -> AbstractContextManager[Session]:
        raise NotImplementedError  # the registry's transaction

    def _model_row(self, session: Session, name: str, create: bool = True) -> schema.Model:
        raise NotImplementedError  # the registry's model row

    # -- audit and serving history --------------------------------------------------------------

    def _add_audit(self, session: Session, entry: AuditEntry, now: datetime) -> None:
        session.info[AUDIT_ADDED] = True  # followers of the event stream are woken after the commit
        # With its webhook outbox row, in this transaction (controlplane/store/outbox.py)
        add_audit_event(session, entry, self.host, now, self.outbox)

    def audit(self, *entries: AuditEntry, at: datetime | None = None) -> None:
        """Append audit events (and their webhook outbox rows), in order, in one transaction; several go
        as bulk INSERTs (a reconcile's verification of 10,000 models loaded in Triton's start-up). `at`:
        when, for events written late (controlplane/store/journaled.py)."""
        if not entries:
            return
        with self._session() as session:
            session.info[AUDIT_ADDED] = True  # followers of the event stream are woken after the commit
            add_audit_events(session, entries, self.host, at or self.clock(), self.outbox)

    def events_after(self, after_id: int, limit: int = 500) -> list[AuditRecord]:
        """Audit events with an id above `after_id`, oldest first (the event stream's catch-up)."""
        table = schema.AuditEvent
        stmt = select(table).where(table.id > after_id).order_by(table.id).limit(max(1, limit))
        with self._session() as session:
            return [from_row(AuditRecord, row) for row in session.scalars(stmt)]

    def last_event_id(self) -> int:
        with self._session() as session:
            return int(session.scalar(select(func.max(schema.AuditEvent.id))) or 0)

    def query_audit(self, query: AuditQuery) -> list[AuditRecord]:
        """Newest first, filtered; uses the (model, time) and (time) indexes."""
        stmt = select(schema.AuditEvent)
        table = schema.AuditEvent
        if query.model is not None:
            stmt = stmt.where(table.model == query.model)
        if query.action is not None:
            stmt = stmt.where(table.action == query.action)
        if query.outcome is not None:
            stmt = stmt.where(table.outcome == query.outcome)
        if query.actor is not None:
            stmt = stmt.where(table.actor == query.actor)
        if query.since is not None:
            stmt = stmt.where(table.time >= query.since)
        if query.until is not None:
            stmt = stmt.where(table.time <= query.until)
        stmt = stmt.order_by(table.time.desc(), table.id.desc()).limit(max(1, query.limit))
        with self._session() as session:
            return [from_row(AuditRecord, row) for row in session.scalars(stmt)]

    def serving_at(self, when: datetime, models: list[str] | None = None) -> list[ServingRecord]:
        """What each model served at `when`, by model name.

        One statement: for each model in the log, a correlated index seek on (model, time) finds its
        last change at or before `when`. (One query per model from Python cost ~50 ms for 100 models;
        this is ~5 ms, see bench/audit_query.py.)
        """
        log = schema.ServingLog
        # Per (model, host): in a fleet every host logs what it serves; a single host logs one host.
        stmt = _last_rows_at(log, log.host, when, log.model.in_(models) if models is not None else None)
        with self._session() as session:
            records = [
                ServingRecord(model=row.model, digest=row.digest, versions=json.loads(row.versions), since=row.time,
                              host=row.host)
                for row in session.scalars(stmt)
                if row.digest is not None  # None: nothing served from then on
            ]
        return sorted(records, key=lambda r: (r.model, r.host))

    def serving_history(self, model: str, limit: int = 50) -> list[ServingRecord]:
        """The model's serving changes, newest first (None digest: nothing served from then on)."""
        with self._session() as session:
            rows = session.scalars(
                select(schema.ServingLog)
                .where(schema.ServingLog.model == model)
                .order_by(schema.ServingLog.time.desc(), schema.ServingLog.id.desc())
                .limit(limit)
            )
            return [
                ServingRecord(row.model, row.digest, json.loads(row.versions), row.time, row.host) for row in rows
            ]

    # -- tags (controlplane/intake/tags.py decides; these only record and read) ------------------------

    def list_tags(self, model: str | None = None) -> list[TagRecord]:
        """Every tag (of one model), by model then name."""
        stmt = select(schema.Tag).order_by(schema.Tag.model, schema.Tag.name)
        if model is not None:
            stmt = stmt.where(schema.Tag.model == model)
        with self._session() as session:
            return [TagRecord(r.model, r.name, r.digest, r.moved_by, r.moved_at) for r in session.scalars(stmt)]

    def tags_at(self, when: datetime, model: str | None = None) -> list[TagRecord]:
        """Where each tag pointed at `when`: per (model, name), its last move at or before `when`
        (one index seek each on ix_tag_moves_model_name_time); deleted tags are left out."""
        moves = schema.TagMove
        stmt = _last_rows_at(moves, moves.name, when, moves.model == model if model is not None else None)
        with self._session() as session:
            records = [TagRecord(r.model, r.name, r.new_digest, r.actor, r.time)
                       for r in session.scalars(stmt) if r.new_digest is not None]
        return sorted(records, key=lambda r: (r.model, r.name))

    def move_tag(self, model: str, name: str, digest: str | None, *, actor: str, outcome: str = "ok",
                 message: str = "", attempted: str | None = None) -> str | None:
        """Point `name` at `digest` (None: delete it); in the same transaction append the move to
        `tag_moves` and an audit event (action `tag`). `attempted`: a failed move's target (the tag
        then points at `digest`, what still serves). Returns the digest the tag pointed at before."""
        with self._session() as session:
            self._model_row(session, model)
            row = session.scalar(select(schema.Tag).where(schema.Tag.model == model, schema.Tag.name == name))
            old = row.digest if row is not None else None
            now = self.clock()
            if digest is None:
                if row is not None:
                    session.delete(row)
            elif row is None:
                session.add(schema.Tag(model=model, name=name, digest=digest, moved_by=actor, moved_at=now))
            elif row.digest != digest or outcome == "ok":
                row.digest, row.moved_by, row.moved_at = digest, actor, now
            session.add(schema.TagMove(time=now, model=model, name=name, old_digest=old, new_digest=digest,
                                       attempted_digest=attempted, actor=actor, outcome=outcome,
                                       message=message, host=self.host))
            self._add_audit(session, AuditEntry(actor, "tag", model, attempted or digest, outcome, message), now)
            return old

    def tracks(self) -> dict[str, str]:
        """model → the tag it tracks (`policy MODEL track:NAME`)."""
        with self._session() as session:
            return {row.model: row.tag for row in session.scalars(select(schema.TagTrack))}

    def set_track(self, model: str, tag: str | None, actor: str, message: str = "") -> None:
        """Make `model` track `tag` (None: stop tracking); its policy column reads `track` meanwhile.
        With a `message`, audited (action `policy`) in the same transaction."""
        with self._session() as session:
            model_row = self._model_row(session, model)
            row = session.get(schema.TagTrack, model)
            if tag is None:
                if row is not None:
                    session.delete(row)
                    if model_row.policy == "track":
                        model_row.policy = None
                return
            if row is None:
                session.add(schema.TagTrack(model=model, tag=tag, set_by=actor, set_at=self.clock()))
            else:
                row.tag, row.set_by, row.set_at = tag, actor, self.clock()
            model_row.policy = "track"
            model_row.updated_at = self.clock()
            if message:
                self._add_audit(session, AuditEntry(actor, "policy", model, model_row.active_digest, "ok", message),
                                self.clock())


def _last_rows_at(table: Any, second_key: Any, when: datetime, where: Any = None) -> Any:
    """SELECT of `table`'s rows that are each (model, second_key) group's last at or before `when`: one
    index seek per group on (model, second_key, time). Callers sort in Python: an ORDER BY over the id
    list would cost SQLite a temporary b-tree (tests/test_query_plans.py)."""
    names = select(table.model, second_key).distinct()
    if where is not None:
        names = names.where(where)
    named = names.subquery("names")
    latest = aliased(table, name="latest")
    key = second_key.key
    last = (
        select(latest.id)
        .where(latest.model == named.c.model, getattr(latest, key) == named.c[key], latest.time <= when)
        .order_by(latest.time.desc(), latest.id.desc())
        .limit(1)
        .scalar_subquery()
    )
    return select(table).where(table.id.in_(select(last).select_from(named)))
