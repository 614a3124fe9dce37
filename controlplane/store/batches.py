"""Deployments begun, advanced and ended many at a time, each batch in ONE transaction of a few bulk
statements: a first start's deploys through tritonserver's own start-up (controlplane/deploy/staged.py).

Why: a deploy writes its deployment's intent, each recorded step and its end (with what serves, the
serving log and the audit event), each one short transaction. One at a time, those transactions were
most of a 2,000-model first start once Triton's start-up had loaded every model in a second: 38 % of
staging the deploys and 61 % of ending them (bench/results/first_start_phases.json, a py-spy profile).
Each item is still its own deployment row, its own audit event and serving-log row, exactly as the
one-at-a-time methods write them (`Registry.begin_deployment`, `advance`, `finish_deployment`); only
the transactions are shared. `Registry` (controlplane/store/registry.py) is a `Batches`;
JournaledRegistry keeps an outage's items in its journal one by one, as before.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from controlplane.errors import NotFoundError, StoreError
from controlplane.store import schema
from controlplane.store.contentmemo import ContentMemo
from controlplane.store.history import AUDIT_ADDED
from controlplane.store.outbox import add_audit_events
from controlplane.store.records import (
    AuditEntry,
    DeploymentRecord,
    ModelRecord,
    ServingRecord,
    SnapshotRecord,
    model_record,
    snapshot_record,
)

CHUNK = 500  # names or ids per IN (...) list: well under any backend's limit on bound parameters


@dataclass(frozen=True)
class DeploymentIntent:
    """A deployment to begin (`Registry.begin_deployment`'s arguments)."""

    model: str
    kind: str
    digest: str | None
    previous_digest: str | None
    actor: str


@dataclass(frozen=True)
class DeploymentEnd:
    """A deployment's end (`Registry.finish_deployment`'s arguments): its outcome, the audit event, what
    serves from now on (None: unchanged) and the model's state."""

    deployment_id: int
    outcome: str
    error: str | None
    audit: AuditEntry
    serving: ServingRecord | None
    model_state: str


def _chunks(values: Sequence[Any]) -> list[Sequence[Any]]:
    return [values[i:i + CHUNK] for i in range(0, len(values), CHUNK)]


class Batches:
    """Bulk reads and writes of snapshots, models and deployments, over the registry's transactions."""

    host: str
    outbox: bool
    clock: Callable[[], datetime]
    contents: ContentMemo

    def _session(self) -> AbstractContextManager[Session]:
        raise NotImplementedError  # the registry's transaction

    def snapshots(self, pairs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], SnapshotRecord]:
        """The recorded snapshots of (model, full digest) pairs, in one transaction; a pair not recorded is
        left out. What they derive (config, served versions) goes to the content memo on the way, so the
        deploys' later reads of it (an outcome's bake settings) are not transactions of their own."""
        wanted = set(pairs)
        out: dict[tuple[str, str], SnapshotRecord] = {}
        digests = sorted({digest for _, digest in wanted})
        with self._session() as session:
            for chunk in _chunks(digests):
                for row in session.scalars(select(schema.Snapshot).where(schema.Snapshot.digest.in_(chunk))):
                    if (row.model, row.digest) in wanted:
                        out[row.model, row.digest] = snapshot_record(row)
        for (model, digest), snap in out.items():
            value = (snap.config, list(snap.served_versions))
            self.contents.get(("content", model, digest), lambda v=value: (v, True))  # type: ignore[misc]
        return out

    def ensure_models(self, names: Sequence[str]) -> dict[str, ModelRecord]:
        """`ensure_model` of many names in one transaction: each name's model record, made if new (one made
        by another writer meanwhile is read back)."""
        unique = list(dict.fromkeys(names))
        for attempt in (1, 2):
            out: dict[str, ModelRecord] = {}
            try:
                with self._session() as session:
                    self._read_models(session, unique, out)
                    missing = [n for n in unique if n not in out]
                    if missing:
                        now = self.clock()
                        session.execute(insert(schema.Model), [
                            {"name": n, "pinned": False, "state": "new", "created_at": now, "updated_at": now}
                            for n in missing])
                        self._read_models(session, missing, out)
                return out
            except StoreError as exc:
                if attempt == 2 or not isinstance(exc.__cause__, IntegrityError):
                    raise
        raise AssertionError("unreachable")

    @staticmethod
    def _read_models(session: Session, names: Sequence[str], out: dict[str, ModelRecord]) -> None:
        for chunk in _chunks(names):
            for row in session.scalars(select(schema.Model).where(schema.Model.name.in_(chunk))):
                out[row.name] = model_record(row)

    def begin_deployments(self, intents: Sequence[DeploymentIntent]) -> list[DeploymentRecord]:
        """`begin_deployment` of many, in order, in one transaction (each model's row made if new)."""
        if not intents:
            return []
        self.ensure_models([i.model for i in intents])
        now = self.clock()
        rows = [{"model": i.model, "kind": i.kind, "digest": i.digest, "previous_digest": i.previous_digest,
                 "step": "intent", "actor": i.actor, "started_at": now, "updated_at": now} for i in intents]
        d = schema.Deployment
        with self._session() as session:
            ids = list(session.scalars(insert(d).returning(d.id, sort_by_parameter_order=True), rows))
        return [DeploymentRecord(n, i.model, i.kind, i.digest, i.previous_digest, "intent", i.actor, now, None, None,
                                 None) for n, i in zip(ids, intents, strict=True)]

    def advance_all(self, deployment_ids: Sequence[int], step: str) -> None:
        """`advance` of many deployments to the same step, in one transaction."""
        if not deployment_ids:
            return
        now = self.clock()
        with self._session() as session:
            for chunk in _chunks(list(deployment_ids)):
                session.execute(update(schema.Deployment).where(schema.Deployment.id.in_(chunk))
                                .values(step=step, updated_at=now).execution_options(synchronize_session=False))

    def finish_deployments(self, ends: Sequence[DeploymentEnd]) -> None:
        """`finish_deployment` of many, in order, in one transaction: each deployment's end, its model's
        state (and active digest, with a serving-log row, when `serving` is set) and its audit event."""
        if not ends:
            return
        now = self.clock()
        by_id = {e.deployment_id: e for e in ends}
        with self._session() as session:
            d, m = schema.Deployment, schema.Model
            models: dict[int, str] = {}
            for chunk in _chunks(list(by_id)):
                models.update({i: name for i, name in session.execute(select(d.id, d.model).where(d.id.in_(chunk)))})
            unknown = [i for i in by_id if i not in models]
            if unknown:
                raise NotFoundError(f"deployment {unknown[0]} is unknown")
            names = list(dict.fromkeys(models.values()))
            current: dict[str, dict[str, Any]] = {}
            for chunk in _chunks(names):
                for mid, name, active, since in session.execute(
                        select(m.id, m.name, m.active_digest, m.active_since).where(m.name.in_(chunk))):
                    current[name] = {"id": mid, "active_digest": active, "active_since": since}
            serving_log: list[dict[str, Any]] = []
            for e in ends:  # in order: a model's later end wins, as one call after another would
                fields = current[models[e.deployment_id]]
                fields.update(state=e.model_state, last_error=e.error, updated_at=now)
                if e.serving is not None:
                    if e.serving.digest != fields["active_digest"] or fields["active_since"] is None:
                        fields["active_since"] = now
                    fields["active_digest"] = e.serving.digest
                    serving_log.append({"time": now, "model": models[e.deployment_id], "digest": e.serving.digest,
                                        "versions": json.dumps(e.serving.versions), "host": self.host})
            session.execute(update(d), [{"id": e.deployment_id, "step": "done", "outcome": e.outcome,
                                         "error": e.error, "finished_at": now, "updated_at": now} for e in ends])
            session.execute(update(m), list(current.values()))  # by primary key
            if serving_log:
                session.execute(insert(schema.ServingLog), serving_log)
            session.info[AUDIT_ADDED] = True  # followers of the event stream are woken after the commit
            add_audit_events(session, [e.audit for e in ends], self.host, now, self.outbox)
