"""Repository functions over the registry: every version, every deploy step, every action.

`Registry` is the only writer of the database. Each method is one short transaction; methods that
change what serves (`finish_deployment`) write the deployment's end, the model's active digest, the
serving log and the audit event in the same transaction, so a crash never leaves them disagreeing.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

from sqlalchemy import event, func, insert, select, update
from sqlalchemy.exc import IntegrityError, InterfaceError, OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from controlplane.errors import NotFoundError, StoreError, UsageError
from controlplane.store import schema
from controlplane.store.batches import Batches
from controlplane.store.completed import CompletedConfigs
from controlplane.store.contentmemo import ContentMemo
from controlplane.store.engine import BUSY_TIMEOUT_S, make_engine, redact
from controlplane.store.footprints import Footprints
from controlplane.store.health import RegistryHealth
from controlplane.store.history import AUDIT_ADDED, History
from controlplane.store.outbox import add_audit_events
from controlplane.store.records import (  # AuditEntry, AuditQuery, utcnow: re-exported, they live in records
    AuditEntry,
    AuditQuery,  # noqa: F401 - re-exported
    DeploymentRecord,
    ModelRecord,
    ServingRecord,
    SnapshotContent,
    SnapshotRecord,
    SourceEntry,
    SourceHead,
    first_error,
    from_row,
    utcnow,
)
from controlplane.store.records import model_record as _model_record
from controlplane.store.records import snapshot_record as _snapshot_record
from controlplane.store.tokens import Tokens
from controlplane.vocab import SERVING_STATES

FULL_WORDS = ("full", "readonly", "read-only", "disk i/o")


def unreachable(exc: BaseException) -> bool:
    """The registry could not be reached or written (a lost connection, a server shutting down or
    starting, a full disk), not a refused statement: PostgreSQL's SQLSTATE classes 08, 57P and 53
    (none at all: the client never reached it); SQLite's "database is locked" is contention."""
    if isinstance(exc, InterfaceError) or getattr(exc, "connection_invalidated", False):
        return True
    if not isinstance(exc, OperationalError):
        return False
    state = getattr(exc.orig, "sqlstate", None)
    if state is not None:
        return str(state).startswith(("08", "57P", "53"))
    return "locked" not in str(exc.orig or "")


class Registry(History, Footprints, CompletedConfigs, Batches, Tokens):
    """The registry database behind any SQLAlchemy URL."""

    def __init__(self, url: str, host: str = "", busy_timeout_s: float = BUSY_TIMEOUT_S,
                 clock: Callable[[], datetime] | None = None, outbox: bool = True) -> None:
        self.url = url
        self.host = host
        # Every audit event also goes to the webhooks' outbox (False: a fleet host's own registry, whose
        # events the webhooks do not send; the shared registry's are sent by the leader)
        self.outbox = outbox
        # naive UTC "now" of every row this registry writes; tests pass a settable one (tests/clock.py)
        self.clock: Callable[[], datetime] = clock or (lambda: utcnow())
        self.engine = make_engine(url, busy_timeout_s)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        # Called (with no argument, on the writer's thread) after a transaction that added audit events
        # committed: the event stream wakes its followers instead of polling (controlplane/api/stream.py).
        self.audit_listeners: list[Callable[[], None]] = []
        # statements that may have changed a row, through this registry: a reader that caches what it
        # read (the reconcile's serving models) reads again only when this moved
        self.writes = 0
        self._serving: tuple[int, list[ModelRecord]] | None = None  # (writes, the serving models)
        self.contents = ContentMemo()  # what recorded contents hold: never changes once recorded
        # reachable or not, and the one voice about an outage (controlplane/store/health.py)
        self.health = RegistryHealth(redact(url))

        @event.listens_for(self.engine, "after_cursor_execute")
        def _count_writes(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
            if statement.lstrip()[:6].upper() in ("INSERT", "UPDATE", "DELETE"):
                self.writes += 1

    def close(self) -> None:
        self.engine.dispose()

    @contextmanager
    def session(self) -> Iterator[Session]:
        """One transaction on the registry; SQLAlchemy failures become StoreError (for adapters that
        add tables of their own, e.g. controlplane.fleet)."""
        with self._session() as session:
            yield session

    @contextmanager
    def _session(self) -> Iterator[Session]:
        session = self._sessions()
        writes = self.writes
        try:
            yield session
            session.commit()
            self.health.answered(wrote=self.writes != writes)
            if session.info.pop(AUDIT_ADDED, False):
                self._audit_committed()
        except SQLAlchemyError as exc:
            try:
                session.rollback()
            except SQLAlchemyError:  # the connection is gone: nothing to roll back
                pass
            reason = str(getattr(exc, "orig", None) or exc).splitlines()[0] or type(exc).__name__
            if unreachable(exc):  # a full disk still reads: only a write that commits ends that outage
                self.health.failed(reason, reads_end_it=not any(w in reason.lower() for w in FULL_WORDS))
            raise StoreError(f"registry {redact(self.url)}: {reason}") from exc
        except BaseException:
            session.rollback()
            raise
        finally:
            session.close()

    def _audit_committed(self) -> None:
        for listener in list(self.audit_listeners):
            try:
                listener()
            except Exception:  # noqa: BLE001 - a follower's wake-up must never fail a committed write
                logging.getLogger("tritonctl.store").exception("audit listener failed")

    # -- models ---------------------------------------------------------------------------------

    def _model_row(self, session: Session, name: str, create: bool = True) -> schema.Model:
        row = session.scalar(select(schema.Model).where(schema.Model.name == name))
        if row is None:
            if not create:
                raise NotFoundError(f"model '{name}' is unknown to the registry")
            now = self.clock()
            row = schema.Model(name=name, pinned=False, state="new", created_at=now, updated_at=now)
            session.add(row)
            session.flush()
        return row

    def ensure_model(self, name: str) -> ModelRecord:
        try:
            with self._session() as session:
                return _model_record(self._model_row(session, name))
        except StoreError as exc:
            if isinstance(exc.__cause__, IntegrityError):  # created concurrently: read it back
                return self.get_model(name)
            raise

    def get_model(self, name: str) -> ModelRecord:
        with self._session() as session:
            return _model_record(self._model_row(session, name, create=False))

    def find_model(self, name: str) -> ModelRecord | None:
        with self._session() as session:
            row = session.scalar(select(schema.Model).where(schema.Model.name == name))
            return _model_record(row) if row else None

    def list_models(self, states: Sequence[str] | None = None,
                    names: Sequence[str] | None = None) -> list[ModelRecord]:
        """Every model, or only those in `states` (the periodic reconcile needs only the serving ones:
        listing all 10,000 models of a big repository every round cost ~0.4 s of CPU), or named in `names`."""
        m = schema.Model  # columns, not ORM objects: a third of the cost at 10,000 models (status, reconcile)
        query = select(m.name, m.policy, m.pinned, m.active_digest, m.state, m.last_error, m.active_since,
                       m.updated_at, m.removed_at).order_by(m.name)
        if states is not None:
            query = query.where(m.state.in_(list(states)))
        if names is not None:
            query = query.where(m.name.in_(list(names)))
        with self._session() as session:
            return [ModelRecord(name, policy, bool(pinned), digest, state, error, since, updated, removed)
                    for name, policy, pinned, digest, state, error, since, updated, removed in session.execute(query)]

    def serving_models(self) -> list[ModelRecord]:
        """The models meant to serve (SERVING_STATES), read again only after a write through this
        registry: the reconcile and the on-demand sweep ask every round, and reading 1,000 serving rows
        each second was 42 % of an idle daemon's CPU (py-spy, issue 26). The list is shared: do not
        change it."""
        writes = self.writes
        cached = self._serving
        if cached is None or cached[0] != writes:
            cached = self._serving = (writes, self.list_models(states=SERVING_STATES))
        return cached[1]

    def model_page(self, *, state: str | None = None, name_contains: str | None = None, offset: int = 0,
                   limit: int = 100) -> tuple[int, list[str]]:
        """How many models match, and the names of one page of them by name: in SQL, so a page of a
        10,000-model registry reads 100 names (the web view's overview)."""
        m = schema.Model
        conditions = []
        if state:
            conditions.append(m.state == state)
        if name_contains:
            escaped = name_contains.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
            conditions.append(func.lower(m.name).like(f"%{escaped}%", escape="\\"))
        with self._session() as session:
            total = int(session.scalar(select(func.count()).select_from(m).where(*conditions)) or 0)
            names = list(session.scalars(select(m.name).where(*conditions).order_by(m.name)
                                         .offset(max(offset, 0)).limit(limit)))
        return total, names

    def model_states(self) -> list[str]:
        """The states models are in now, each once."""
        with self._session() as session:
            return sorted(session.scalars(select(schema.Model.state).distinct()))

    def active_digests(self) -> dict[str, str | None]:
        """Every model's active digest, in one light query (the served view's `wanted` map)."""
        with self._session() as session:
            return {name: digest for name, digest in session.execute(select(schema.Model.name,
                                                                            schema.Model.active_digest))}

    def count_models(self, state: str | None = None) -> int:
        query = select(func.count()).select_from(schema.Model)
        if state is not None:
            query = query.where(schema.Model.state == state)
        with self._session() as session:
            return int(session.scalar(query) or 0)

    def update_model(self, name: str, **fields: Any) -> ModelRecord:
        """Set policy / pinned / state / last_error / removed_at on a model (created if new)."""
        allowed = {"policy", "pinned", "state", "last_error", "removed_at"}
        unknown = set(fields) - allowed
        if unknown:
            raise UsageError(f"cannot set model field(s) {sorted(unknown)}")
        with self._session() as session:
            row = self._model_row(session, name)
            for key, value in fields.items():
                setattr(row, key, value)
            row.updated_at = self.clock()
            return _model_record(row)

    # -- snapshots ------------------------------------------------------------------------------

    def record_snapshot(
        self,
        model: str,
        digest: str,
        manifest: str,
        *,
        config: dict[str, Any] | None,
        versions: list[int],
        served_versions: list[int],
        valid: bool,
        problems: list[dict[str, str]],
        total_bytes: int,
        source: SourceEntry | None = None,
    ) -> tuple[SnapshotRecord, bool]:
        """Record a snapshot; the same content seen again only updates last_seen. Returns (record, new).
        `source`: the content is what the model's source holds now, captured at that signature: it
        becomes the model's entry in `source_index` (same transaction)."""
        with self._session() as session:
            self._model_row(session, model)
            row = session.scalar(
                select(schema.Snapshot).where(schema.Snapshot.model == model, schema.Snapshot.digest == digest)
            )
            now = self.clock()
            if source is not None:
                session.merge(schema.SourceSignature(
                    model=model, signature=source.signature, digest=digest, recorded_at=now, trusted=source.trusted,
                    steps=None if source.steps is None else json.dumps(source.steps)))
            if row is not None:
                row.last_seen = now
                row.collected = False
                return _snapshot_record(row), False
            row = schema.Snapshot(
                model=model,
                digest=digest,
                manifest=manifest,
                config=json.dumps(config) if config is not None else None,
                versions=json.dumps(versions),
                served_versions=json.dumps(served_versions),
                valid=valid,
                problems=json.dumps(problems),
                total_bytes=total_bytes,
                first_seen=now,
                last_seen=now,
                quarantined=False,
            )
            session.add(row)
            session.flush()
            return _snapshot_record(row), True

    def record_content(self, model: str, digest: str, content: SnapshotContent,
                       source: SourceEntry | None = None) -> tuple[SnapshotRecord, bool]:
        """`record_snapshot` of a content; another writer recording the same content at the same moment
        (two fleet hosts) is not an error: its record is returned, not new."""
        try:
            return self.record_snapshot(
                model, digest, content.manifest, config=content.config, versions=content.versions,
                served_versions=content.served_versions, valid=content.valid, problems=content.problems,
                total_bytes=content.total_bytes, source=source)
        except StoreError as exc:
            if isinstance(exc.__cause__, IntegrityError):
                return self.get_snapshot(model, digest), False
            raise

    def record_contents(self, items: Sequence[tuple[str, str, SnapshotContent, SourceEntry | None]],
                        audit: Callable[[SnapshotRecord], AuditEntry]) -> list[tuple[SnapshotRecord, bool]]:
        """`record_content` of many contents in ONE transaction, with a few bulk statements (the start-up
        scan's batches: a commit per model, then the ORM's unit of work per row, cost most of a first start
        at 10,000 models): each model's row made if new, each content recorded once (the same content again
        only updates last_seen), its source entry set, and `audit(record)` added for every content new to
        the registry. Returns (record, new) per item."""
        if not items:
            return []
        names = list(dict.fromkeys(model for model, *_ in items))
        now = self.clock()
        out: list[tuple[SnapshotRecord, bool]] = []
        audits: list[AuditEntry] = []
        new_rows: list[dict[str, Any]] = []
        signatures: dict[str, dict[str, Any]] = {}
        fresh: dict[tuple[str, str], SnapshotRecord] = {}
        with self._session() as session:
            known = set(session.scalars(select(schema.Model.name).where(schema.Model.name.in_(names))))
            if len(known) < len(names):
                session.execute(insert(schema.Model), [
                    {"name": n, "pinned": False, "state": "new", "created_at": now, "updated_at": now}
                    for n in names if n not in known])
            existing = {(row.model, row.digest): row for row in session.scalars(
                select(schema.Snapshot).where(schema.Snapshot.model.in_(names)))}
            has_signature = set(session.scalars(
                select(schema.SourceSignature.model).where(schema.SourceSignature.model.in_(names))))
            for model, digest, content, source in items:
                if source is not None:
                    signatures[model] = {"model": model, "signature": source.signature, "digest": digest,
                                         "recorded_at": now, "trusted": source.trusted,
                                         "steps": None if source.steps is None else json.dumps(source.steps)}
                if (model, digest) in fresh:  # the same content twice in one batch: recorded once
                    out.append((fresh[model, digest], False))
                    continue
                row = existing.get((model, digest))
                if row is not None:
                    row.last_seen = now
                    row.collected = False
                    out.append((_snapshot_record(row), False))
                    continue
                record = SnapshotRecord(
                    manifest=content.manifest, config=content.config, versions=list(content.versions),
                    served_versions=list(content.served_versions), valid=content.valid,
                    problems=list(content.problems), total_bytes=content.total_bytes, model=model, digest=digest,
                    first_seen=now, last_seen=now, quarantined=False, quarantine_reason=None, collected=False)
                fresh[model, digest] = record
                new_rows.append({
                    "model": model, "digest": digest, "manifest": content.manifest,
                    "config": json.dumps(content.config) if content.config is not None else None,
                    "versions": json.dumps(content.versions), "served_versions": json.dumps(content.served_versions),
                    "valid": content.valid, "problems": json.dumps(content.problems),
                    "total_bytes": content.total_bytes, "first_seen": now, "last_seen": now, "quarantined": False,
                    "collected": False})
                out.append((record, True))
                audits.append(audit(record))
            if new_rows:
                session.execute(insert(schema.Snapshot), new_rows)
            update_rows = [v for m, v in signatures.items() if m in has_signature]
            if update_rows:
                session.execute(update(schema.SourceSignature), update_rows)  # by primary key
            insert_rows = [v for m, v in signatures.items() if m not in has_signature]
            if insert_rows:
                session.execute(insert(schema.SourceSignature), insert_rows)
            if audits:
                session.info[AUDIT_ADDED] = True
                add_audit_events(session, audits, self.host, now, self.outbox)
        return out

    def get_snapshot(self, model: str, digest: str) -> SnapshotRecord:
        """A model's snapshot by full digest or unique prefix."""
        with self._session() as session:
            rows = list(
                session.scalars(
                    select(schema.Snapshot)
                    .where(schema.Snapshot.model == model, schema.Snapshot.digest.startswith(digest, autoescape=True))
                    .limit(2)
                )
            )
            if not rows:
                raise NotFoundError(f"model '{model}' has no snapshot with digest {digest}")
            if len(rows) > 1:
                raise UsageError(f"digest prefix {digest} is ambiguous for model '{model}'")
            return _snapshot_record(rows[0])

    def snapshot_content(self, model: str, digest: str) -> tuple[dict[str, Any] | None, list[int]]:
        """(config, served versions) of a recorded snapshot: read once per full digest, then kept
        (controlplane/store/contentmemo.py). The config is shared: read it, never change it."""
        def read() -> tuple[tuple[dict[str, Any] | None, list[int]], bool]:
            snap = self.get_snapshot(model, digest)
            return (snap.config, list(snap.served_versions)), snap.digest == digest

        value: tuple[dict[str, Any] | None, list[int]] = self.contents.get(("content", model, digest), read)
        return value

    def list_snapshots(self, model: str) -> list[SnapshotRecord]:
        with self._session() as session:
            rows = session.scalars(
                select(schema.Snapshot)
                .where(schema.Snapshot.model == model)
                .order_by(schema.Snapshot.first_seen.desc(), schema.Snapshot.id.desc())
            )
            return [_snapshot_record(row) for row in rows]

    def source_heads(self, models: Sequence[str] | None = None) -> dict[str, SourceHead]:
        """Each model's newest recorded content (the one last seen in the source), in one query."""
        columns = (schema.Snapshot.model, schema.Snapshot.digest, schema.Snapshot.valid, schema.Snapshot.problems,
                   schema.Snapshot.quarantined, schema.Snapshot.quarantine_reason, schema.Snapshot.first_seen,
                   schema.Snapshot.last_seen)
        query = select(*columns).order_by(schema.Snapshot.model, schema.Snapshot.last_seen, schema.Snapshot.id)
        if models is not None:
            query = query.where(schema.Snapshot.model.in_(list(models)))
        heads: dict[str, SourceHead] = {}
        with self._session() as session:
            for model, digest, valid, problems, quarantined, reason, first_seen, last_seen in session.execute(query):
                error = None if valid else first_error(json.loads(problems or "[]"))
                heads[model] = SourceHead(model, digest, bool(valid), error, bool(quarantined), reason, first_seen,
                                          last_seen)
        return heads

    def source_index(self) -> dict[str, SourceEntry]:
        """Every model's newest recorded source content, with its signature and steps, in one query."""
        with self._session() as session:
            rows = session.execute(select(schema.SourceSignature.model, schema.SourceSignature.signature,
                                          schema.SourceSignature.digest, schema.SourceSignature.steps,
                                          schema.SourceSignature.trusted))
            return {model: SourceEntry(model, signature, digest, None if steps is None else json.loads(steps),
                                       bool(trusted))
                    for model, signature, digest, steps, trusted in rows}

    def last_deployments(self, models: Sequence[str] | None = None) -> dict[str, DeploymentRecord]:
        """Each model's newest deployment (finished or not), in one query."""
        d = schema.Deployment  # columns, not ORM objects: two thirds of the cost (`status` of 5,000 models)
        newest = select(func.max(d.id)).group_by(d.model)
        if models is not None:
            newest = newest.where(d.model.in_(list(models)))
        query = select(d.id, d.model, d.kind, d.digest, d.previous_digest, d.step, d.actor, d.started_at,
                       d.finished_at, d.outcome, d.error).where(d.id.in_(newest.scalar_subquery()))
        with self._session() as session:
            return {row[1]: DeploymentRecord(*row) for row in session.execute(query)}

    def set_quarantine(self, model: str, digest: str, reason: str | None) -> None:
        with self._session() as session:
            row = session.scalar(
                select(schema.Snapshot).where(schema.Snapshot.model == model, schema.Snapshot.digest == digest)
            )
            if row is None:
                raise NotFoundError(f"model '{model}' has no snapshot with digest {digest}")
            row.quarantined = reason is not None
            row.quarantine_reason = reason

    def mark_collected(self, model: str, digests: list[str]) -> None:
        if not digests:
            return
        with self._session() as session:
            rows = session.scalars(
                select(schema.Snapshot).where(schema.Snapshot.model == model, schema.Snapshot.digest.in_(digests))
            )
            for row in rows:
                row.collected = True

    def count_snapshots(self) -> int:
        """Snapshots (distinct model contents) recorded (the metrics' tritonctl_snapshots_total)."""
        with self._session() as session:
            return int(session.scalar(select(func.count()).select_from(schema.Snapshot)) or 0)

    def count_quarantined(self) -> int:
        with self._session() as session:
            return int(session.scalar(select(func.count()).where(schema.Snapshot.quarantined.is_(True))) or 0)

    # -- deployments ----------------------------------------------------------------------------

    def begin_deployment(
        self, model: str, kind: str, digest: str | None, previous_digest: str | None, actor: str,
        at: datetime | None = None,
    ) -> DeploymentRecord:
        """Record the intent before anything is done (crash recovery reads it back). `at`: when, for a
        record written late (controlplane/store/journaled.py)."""
        with self._session() as session:
            self._model_row(session, model)
            now = at or self.clock()
            row = schema.Deployment(
                model=model,
                kind=kind,
                digest=digest,
                previous_digest=previous_digest,
                step="intent",
                actor=actor,
                started_at=now,
                updated_at=now,
            )
            session.add(row)
            session.flush()
            return from_row(DeploymentRecord, row)

    def advance(self, deployment_id: int, step: str) -> None:
        # one UPDATE, not load-modify-flush: three of these run in every deploy (bench/change_latency.py)
        with self._session() as session:
            result = session.execute(
                update(schema.Deployment)
                .where(schema.Deployment.id == deployment_id)
                .values(step=step, updated_at=self.clock())
                .execution_options(synchronize_session=False)
            )
            if not getattr(result, "rowcount", 1):
                raise NotFoundError(f"deployment {deployment_id} is unknown")

    def finish_deployment(
        self,
        deployment_id: int,
        *,
        outcome: str,
        error: str | None,
        audit: AuditEntry,
        serving: ServingRecord | None,
        model_state: str,
        at: datetime | None = None,
    ) -> DeploymentRecord:
        """End a deployment; in the same transaction set what serves, log it and audit it. `at`: when, for
        a record written late (controlplane/store/journaled.py)."""
        with self._session() as session:
            row = session.get(schema.Deployment, deployment_id)
            if row is None:
                raise NotFoundError(f"deployment {deployment_id} is unknown")
            now = at or self.clock()
            row.step = "done"
            row.outcome = outcome
            row.error = error
            row.finished_at = now
            row.updated_at = now
            model = self._model_row(session, row.model)
            model.state = model_state
            model.last_error = error
            model.updated_at = now
            if serving is not None:
                if serving.digest != model.active_digest or model.active_since is None:
                    model.active_since = now
                model.active_digest = serving.digest
                session.add(
                    schema.ServingLog(
                        time=now,
                        model=row.model,
                        digest=serving.digest,
                        versions=json.dumps(serving.versions),
                        host=self.host,
                    )
                )
            self._add_audit(session, audit, now)
            return from_row(DeploymentRecord, row)

    def open_deployments(self) -> list[DeploymentRecord]:
        with self._session() as session:
            rows = session.scalars(
                select(schema.Deployment)
                .where(schema.Deployment.finished_at.is_(None))
                .order_by(schema.Deployment.id)
            )
            return [from_row(DeploymentRecord, row) for row in rows]

    def deployment_open(self, deployment_id: int) -> bool:
        """Whether the deployment has not finished (a list of open ones read a moment ago may be stale)."""
        with self._session() as session:
            finished = session.scalar(select(schema.Deployment.finished_at)
                                      .where(schema.Deployment.id == deployment_id))
            return finished is None

    def last_deployment(self, model: str) -> DeploymentRecord | None:
        with self._session() as session:
            row = session.scalar(
                select(schema.Deployment)
                .where(schema.Deployment.model == model)
                .order_by(schema.Deployment.id.desc())
                .limit(1)
            )
            return from_row(DeploymentRecord, row) if row else None
