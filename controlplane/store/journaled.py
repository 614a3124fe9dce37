"""A host's own registry through an outage: what it does meanwhile is kept, and written once when it returns.

A deploy, rollback, restore, unload or eviction changes what this host's tritonserver serves at once,
whatever the database does. Its record (the deployment's intent, steps and end, the model's state and
active digest, the serving log, the audit event; a failed content's quarantine, a load's footprint, the
config Triton completed at a load) is what an outage would lose: a SQLite registry whose disk is full, a
PostgreSQL that restarts.
`JournaledRegistry` is the daemon's registry: each of those writes goes to the registry, and when it
fails because the registry is unreachable or cannot be written (`registry.unreachable`, what
`RegistryHealth` counts as an outage) it goes to a journal under the state directory instead
(`registry-journal.jsonl`, fsynced: controlplane/store/journal.py, the same mechanism as the fleet's
step records). The operation goes on; nothing it does waits for the database.

Meanwhile the host answers from what it knows: model reads see the journal's ends over the registry's
rows (a reconcile never undoes a deploy made during the outage, and `status` shows it), and a read
the registry cannot answer at all (PostgreSQL down) answers what the same read last returned.

When the registry answers again (`RegistryHealth.on_return`; the daemon's start for a journal a stop
left behind) every entry is written once, in order, stamped with the time it happened (`audit` and
`audit --at` are right for the outage too), and the journal is rewritten without it; meanwhile the
reads a reconcile recovers by (`open_deployments`, `deployment_open`) wait for the replay. A write of a
model whose records still wait is journaled behind them (never overtaking them). Written once: an
intent is found again by (model, kind, actor, started_at), an end by its deployment being finished,
an audit event by (host, time, action, model).

A full disk still reads, so only a write ends that outage: while one is on, a transaction that
committed probes with a one-row write at most every PROBE_S (the reconcile reads every round). A full
disk also takes a small write now and then (SQLite reuses its WAL's space), so under SQLite that outage
ends only once the database's filesystem has ROOM_BYTES free again (`RegistryHealth.room`) and the
journal is written.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from controlplane.errors import NotFoundError, StoreError
from controlplane.store import schema
from controlplane.store.batches import DeploymentEnd, DeploymentIntent
from controlplane.store.journal import Entry, Journal
from controlplane.store.records import (
    AuditEntry,
    CompletedConfigRecord,
    DeploymentRecord,
    FootprintRecord,
    ModelRecord,
    ServingRecord,
)
from controlplane.store.registry import Registry, unreachable
from controlplane.vocab import SERVING_STATES

log = logging.getLogger("tritonctl.store")

JOURNAL_NAME = "registry-journal.jsonl"
PROBE_S = 2.0  # a full disk's outage: how often a committed read is followed by a probing write
REMEMBERED = 64  # reads remembered for an outage (by method and arguments)
JOURNALED_FIELDS = {"state", "last_error"}  # update_model fields a journal entry may carry
ROOM_BYTES = 1 << 20  # a SQLite registry's full disk has room again with this much free


def _away(exc: StoreError) -> bool:
    """The registry failed for being unreachable or unwritable, not for refusing the statement."""
    cause = exc.__cause__
    return isinstance(cause, SQLAlchemyError) and unreachable(cause)


def _free_bytes(directory: Path) -> int:
    try:
        st = os.statvfs(directory)
    except OSError:
        return ROOM_BYTES  # cannot tell: a write that commits decides
    return st.f_bavail * st.f_frsize


def _at(entry: Entry) -> datetime:
    return datetime.fromisoformat(entry["at"])


class JournaledRegistry(Registry):
    """The daemon's own registry, with its journal (`journal_path`) for outages."""

    def __init__(self, url: str, journal_path: Path, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self.journal = Journal(journal_path)
        self._ids: dict[int, int] = {}  # a deployment begun in the journal (negative id) → its registry id
        self._overlay: dict[str, dict[str, Any]] = {}  # model → the fields its journaled records set
        self._waiting: set[str] = set()  # models with journaled records not written yet
        self._finished: set[int] = set()  # registry deployments whose end is journaled
        self._remembered: dict[tuple[Any, ...], Any] = {}  # the last answer of each read, for an outage
        self._probe_lock = threading.Lock()
        # Held while the journal is written: a deployment's intent written and not yet its end looks open
        # in the registry, so the reads that decide what a reconcile recovers wait for the whole replay
        # (measured: a rollback journaled through a full disk was recovered as "interrupted" mid-replay
        # and audited twice, tests/test_host_outage_e2e.py).
        self._replaying = threading.RLock()
        self._last_probe = 0.0
        self._replayed = False  # the owner's first replay_journal (after migrations) done: probes may replay
        self._refresh(self.journal.entries())
        self.health.on_return.append(self._on_return)
        database = self.engine.url.database
        if self.engine.url.get_backend_name() == "sqlite" and database and database != ":memory:":
            directory = Path(database).resolve().parent
            self.health.room = lambda: _free_bytes(directory) >= ROOM_BYTES

    # -- the writes an outage must not lose -----------------------------------------------------

    def begin_deployment(self, model: str, kind: str, digest: str | None, previous_digest: str | None, actor: str,
                         at: datetime | None = None) -> DeploymentRecord:
        at = at or self.clock()
        if model not in self._waiting:
            try:
                return super().begin_deployment(model, kind, digest, previous_digest, actor, at=at)
            except StoreError as exc:
                self._unless_away(exc)
        local = -time.time_ns()  # never a registry id; mapped to one when written
        self._keep({"op": "begin", "id": local, "model": model, "kind": kind, "digest": digest,
                    "previous": previous_digest, "actor": actor, "at": at.isoformat()})
        return DeploymentRecord(local, model, kind, digest, previous_digest, "intent", actor, at, None, None, None)

    def advance(self, deployment_id: int, step: str) -> None:
        deployment_id = self._real(deployment_id)
        if deployment_id > 0:  # begun in the registry: a step recorded late only matters to crash recovery
            try:
                super().advance(deployment_id, step)
                return
            except StoreError as exc:
                self._unless_away(exc)
        self._keep({"op": "advance", "id": deployment_id, "step": step, "at": self.clock().isoformat()})

    def finish_deployment(self, deployment_id: int, *, outcome: str, error: str | None, audit: AuditEntry,
                          serving: ServingRecord | None, model_state: str,
                          at: datetime | None = None) -> DeploymentRecord:
        at = at or self.clock()
        deployment_id = self._real(deployment_id)
        model = audit.model or ""
        if deployment_id > 0 and model not in self._waiting:
            try:
                return super().finish_deployment(deployment_id, outcome=outcome, error=error, audit=audit,
                                                 serving=serving, model_state=model_state, at=at)
            except StoreError as exc:
                self._unless_away(exc)
        self._keep({"op": "finish", "id": deployment_id, "model": model, "outcome": outcome, "error": error,
                    "audit": dataclasses.asdict(audit), "model_state": model_state,
                    "serving": dataclasses.asdict(serving) if serving is not None else None,
                    "at": at.isoformat()})
        return DeploymentRecord(deployment_id, model, audit.action, audit.digest, None, "done", audit.actor, at, at,
                                outcome, error)

    # many at once (controlplane/store/batches.py): one transaction, else each as above (journaled in an outage)

    def begin_deployments(self, intents: Sequence[DeploymentIntent]) -> list[DeploymentRecord]:
        if not any(i.model in self._waiting for i in intents):
            try:
                return super().begin_deployments(intents)
            except StoreError as exc:
                self._unless_away(exc)
        return [self.begin_deployment(i.model, i.kind, i.digest, i.previous_digest, i.actor) for i in intents]

    def advance_all(self, deployment_ids: Sequence[int], step: str) -> None:
        real = [self._real(i) for i in deployment_ids]
        if all(i > 0 for i in real):
            try:
                super().advance_all(real, step)
                return
            except StoreError as exc:
                self._unless_away(exc)
        for i in deployment_ids:
            self.advance(i, step)

    def finish_deployments(self, ends: Sequence[DeploymentEnd]) -> None:
        real = [dataclasses.replace(e, deployment_id=self._real(e.deployment_id)) for e in ends]
        if all(e.deployment_id > 0 and (e.audit.model or "") not in self._waiting for e in real):
            try:
                super().finish_deployments(real)
                return
            except StoreError as exc:
                self._unless_away(exc)
        for e in ends:
            self.finish_deployment(e.deployment_id, outcome=e.outcome, error=e.error, audit=e.audit, serving=e.serving,
                                   model_state=e.model_state)

    def audit(self, *entries: AuditEntry, at: datetime | None = None) -> None:
        if not entries:
            return
        at = at or self.clock()
        models = {e.model for e in entries if e.model}
        if not models & self._waiting:
            try:
                super().audit(*entries, at=at)
                return
            except StoreError as exc:
                self._unless_away(exc)
        self._keep({"op": "audit", "entries": [dataclasses.asdict(e) for e in entries], "at": at.isoformat()})

    def update_model(self, name: str, **fields: Any) -> ModelRecord:
        journaled = set(fields) <= JOURNALED_FIELDS  # a restore's state and error; others are never journaled
        if not (journaled and name in self._waiting):
            try:
                return super().update_model(name, **fields)
            except StoreError as exc:
                if not journaled:
                    raise
                self._unless_away(exc)
        self._keep({"op": "update_model", "model": name, "fields": fields, "at": self.clock().isoformat()})
        return self.get_model(name)

    def record_footprint(self, model: str, digest: str, memory_mb: float | None, gpu_memory_mb: float | None,
                         source: str) -> FootprintRecord:
        """A load's measured footprint (the memory budget weighs it): journaled like the load's record."""
        try:
            return super().record_footprint(model, digest, memory_mb, gpu_memory_mb, source)
        except StoreError as exc:
            self._unless_away(exc)
        self._keep({"op": "footprint", "model": model, "digest": digest, "memory_mb": memory_mb,
                    "gpu_memory_mb": gpu_memory_mb, "source": source, "at": self.clock().isoformat()})
        return FootprintRecord(model, digest, memory_mb, gpu_memory_mb, source, self.clock())

    def record_completed_config(self, model: str, digest: str, config: dict[str, Any]) -> CompletedConfigRecord:
        """The config Triton completed at a load (an ensemble over the model is checked against it): journaled
        like the load's record."""
        try:
            return super().record_completed_config(model, digest, config)
        except StoreError as exc:
            self._unless_away(exc)
        self._keep({"op": "completed", "model": model, "digest": digest, "config": config,
                    "at": self.clock().isoformat()})
        return CompletedConfigRecord(model, digest, config, self.clock())

    def set_quarantine(self, model: str, digest: str, reason: str | None) -> None:
        """A failed deploy quarantines its content before it rolls back: journaled, the rollback goes on."""
        if model not in self._waiting:
            try:
                super().set_quarantine(model, digest, reason)
                return
            except StoreError as exc:
                self._unless_away(exc)
        self._keep({"op": "quarantine", "model": model, "digest": digest, "reason": reason,
                    "at": self.clock().isoformat()})

    def open_deployments(self) -> list[DeploymentRecord]:
        """Open in the registry and not ended in the journal (a reconcile never recovers what ended);
        never in the middle of a replay."""
        with self._replaying:
            opened = self._recall(("open_deployments",), super().open_deployments)
            return [d for d in opened if d.id not in self._finished]

    def deployment_open(self, deployment_id: int) -> bool:
        with self._replaying:
            return deployment_id not in self._finished and super().deployment_open(deployment_id)

    def _real(self, deployment_id: int) -> int:
        """The registry's id of a deployment (one begun in the journal: once written)."""
        return self._ids.get(deployment_id, deployment_id)

    def _unless_away(self, exc: StoreError) -> None:
        if not _away(exc):
            raise exc

    def _keep(self, entry: Entry) -> None:
        try:
            self.journal.keep(entry)
        except OSError as exc:  # the state directory cannot keep it either: the registry's error stands
            raise StoreError(f"registry {self.health.name} unreachable and journal {self.journal.path}: {exc}") from exc
        self._refresh(self.journal.entries())
        if self.health.reachable:  # it answered meanwhile: written now, behind what waited
            self.replay_journal()

    # -- the replay ---------------------------------------------------------------------------

    def replay_journal(self) -> int:
        """Write what the journal holds, once; returns how many entries it wrote."""
        self._replayed = True
        with self._replaying:
            try:
                written = self.journal.replay_with(self._write)
            finally:
                self._refresh(self.journal.entries())
        return written

    def _on_return(self, _outage_s: float) -> str:
        """The registry answers again: the journal is written; when part of it could not be (a full disk
        took one small write, not these), the outage goes on (StoreError: RegistryHealth.answered)."""
        written = self.replay_journal()
        left = len(self.journal)
        if left:
            raise StoreError(f"registry {self.health.name}: {left} journal entries not written yet")
        return f"{written} journal entr{'y' if written == 1 else 'ies'} written"

    def _write(self, entry: Entry) -> bool:
        try:
            return self._write_entry(entry)
        except StoreError as exc:
            if _away(exc):
                raise  # away again: the rest waits (Journal.replay_with)
            refused: Exception = exc  # a statement the registry refuses would refuse it at every return
        except NotFoundError as exc:  # the registry lost what it refers to (restored from a backup?)
            refused = exc
        log.warning("journal %s: %s entry of %s left out: %s", self.journal.path, entry["op"],
                    entry.get("model") or "-", refused)
        return False

    def _write_entry(self, entry: Entry) -> bool:
        op, at = entry["op"], _at(entry)
        if op == "begin":
            found = self._begun(entry["model"], entry["kind"], entry["actor"], at)
            if found is not None:
                self._ids[entry["id"]] = found
                return False
            record = super().begin_deployment(entry["model"], entry["kind"], entry["digest"], entry["previous"],
                                              entry["actor"], at=at)
            self._ids[entry["id"]] = record.id
            return True
        if op in ("advance", "finish"):
            deployment_id = self._real(int(entry["id"]))
            if deployment_id < 0 or not super().deployment_open(deployment_id):
                return False  # its intent never reached the journal, or it was finished already
            if op == "advance":
                super().advance(deployment_id, entry["step"])
                return True
            serving = entry["serving"]
            super().finish_deployment(deployment_id, outcome=entry["outcome"], error=entry["error"],
                                      audit=AuditEntry(**entry["audit"]),
                                      serving=ServingRecord(**serving) if serving is not None else None,
                                      model_state=entry["model_state"], at=at)
            return True
        if op == "audit":
            entries = [AuditEntry(**e) for e in entry["entries"]]
            if self._audited(entries[0], at):
                return False
            super().audit(*entries, at=at)
            return True
        if op == "quarantine":
            super().set_quarantine(entry["model"], entry["digest"], entry["reason"])
            return True
        if op == "footprint":
            super().record_footprint(entry["model"], entry["digest"], entry["memory_mb"], entry["gpu_memory_mb"],
                                     entry["source"])
            return True
        if op == "update_model":
            super().update_model(entry["model"], **entry["fields"])
            return True
        if op == "completed":
            super().record_completed_config(entry["model"], entry["digest"], entry["config"])
            return True
        log.warning("journal %s: unknown entry %r left out", self.journal.path, op)
        return False

    def _begun(self, model: str, kind: str, actor: str, at: datetime) -> int | None:
        d = schema.Deployment
        with self._session() as session:
            found = session.scalar(select(d.id).where(d.model == model, d.kind == kind, d.actor == actor,
                                                      d.started_at == at).limit(1))
            return int(found) if found is not None else None

    def _audited(self, entry: AuditEntry, at: datetime) -> bool:
        a = schema.AuditEvent
        with self._session() as session:
            model = a.model == entry.model if entry.model is not None else a.model.is_(None)
            return session.scalar(select(a.id).where(a.host == self.host, a.time == at, a.action == entry.action,
                                                     model).limit(1)) is not None

    def _refresh(self, entries: list[Entry]) -> None:
        """The models whose records wait, and the fields their journaled ends set (in order)."""
        overlay: dict[str, dict[str, Any]] = {}
        models: dict[int, str] = {}
        waiting: set[str] = set()
        finished: set[int] = set()
        for entry in entries:
            op = entry["op"]
            if op == "begin":
                models[entry["id"]] = entry["model"]
            model = entry.get("model") or models.get(entry.get("id", 0))
            for e in entry.get("entries", ()):
                if e.get("model"):
                    waiting.add(e["model"])
            if not model:
                continue
            waiting.add(model)
            if op == "finish":
                finished.add(self._real(int(entry["id"])))
                fields = overlay.setdefault(model, {})
                fields.update(state=entry["model_state"], last_error=entry["error"])
                if entry["serving"] is not None:
                    digest = entry["serving"]["digest"]
                    if fields.get("active_digest", "-") != digest:
                        fields["active_since"] = _at(entry)
                    fields["active_digest"] = digest
            elif op == "update_model":
                overlay.setdefault(model, {}).update(entry["fields"])
        self._overlay, self._waiting, self._finished = overlay, waiting, finished

    # -- what the host knows meanwhile --------------------------------------------------------

    def _known(self, record: ModelRecord) -> ModelRecord:
        fields = self._overlay.get(record.name)
        if not fields:
            return record
        if "active_digest" in fields and fields["active_digest"] == record.active_digest:
            fields = {k: v for k, v in fields.items() if k != "active_since"}
        return dataclasses.replace(record, **fields)

    def _recall(self, key: tuple[Any, ...], read: Callable[[], Any],
                otherwise: Callable[[], Any] | None = None) -> Any:
        """`read()`, remembered; while the registry cannot be read, what it returned last (or what
        `otherwise()` finds elsewhere in what was read)."""
        try:
            value = read()
        except StoreError as exc:
            if not _away(exc):
                raise
            if key in self._remembered:
                return self._remembered[key]
            found = otherwise() if otherwise is not None else None
            if found is None:
                raise
            return found
        if key not in self._remembered and len(self._remembered) >= REMEMBERED:
            self._remembered.pop(next(iter(self._remembered)))
        self._remembered[key] = value
        return value

    def get_model(self, name: str) -> ModelRecord:
        return self._known(self._recall(("get_model", name), lambda: super(JournaledRegistry, self).get_model(name),
                                        lambda: self._listed(name)))

    def find_model(self, name: str) -> ModelRecord | None:
        found = self._recall(("find_model", name), lambda: super(JournaledRegistry, self).find_model(name),
                             lambda: self._listed(name))
        return self._known(found) if found is not None else None

    def _listed(self, name: str) -> ModelRecord | None:
        """The model's row in the last list of models read (a model read only in lists before the outage)."""
        for key, value in reversed(list(self._remembered.items())):
            if key[0] == "list_models":
                for record in value:
                    if record.name == name:
                        return record
        return None

    def ensure_model(self, name: str) -> ModelRecord:
        return self._known(super().ensure_model(name))

    def list_models(self, states: Sequence[str] | None = None,
                    names: Sequence[str] | None = None) -> list[ModelRecord]:
        overlaid = bool(self._overlay)
        asked = None if overlaid or states is None else tuple(states)  # a journaled end may change the state
        key = ("list_models", asked, None if names is None else tuple(names))
        records = self._recall(key, lambda: super(JournaledRegistry, self).list_models(
            states=None if asked is None else list(asked), names=names))
        if not overlaid:
            return list(records)
        known = [self._known(r) for r in records]
        return known if states is None else [r for r in known if r.state in states]

    def serving_models(self) -> list[ModelRecord]:
        if not self._overlay and self.health.reachable:
            return super().serving_models()
        return self.list_models(states=SERVING_STATES)

    def active_digests(self) -> dict[str, str | None]:
        digests = dict(self._recall(("active_digests",), super().active_digests))
        for model, fields in self._overlay.items():
            if "active_digest" in fields:
                digests[model] = fields["active_digest"]
        return digests

    def source_heads(self, models: Sequence[str] | None = None) -> Any:
        key = ("source_heads", None if models is None else tuple(models))
        return self._recall(key, lambda: super(JournaledRegistry, self).source_heads(models))

    def last_deployments(self, models: Sequence[str] | None = None) -> Any:
        key = ("last_deployments", None if models is None else tuple(models))
        return self._recall(key, lambda: super(JournaledRegistry, self).last_deployments(models))

    def footprints(self, models: Sequence[str] | None = None) -> Any:
        key = ("footprints", None if models is None else tuple(models))
        return self._recall(key, lambda: super(JournaledRegistry, self).footprints(models))

    def completed_configs(self, models: Sequence[str] | None = None) -> Any:
        key = ("completed_configs", None if models is None else tuple(models))
        return self._recall(key, lambda: super(JournaledRegistry, self).completed_configs(models))

    def completed_config(self, model: str, digest: str) -> Any:
        return self._recall(("completed_config", model, digest),
                            lambda: super(JournaledRegistry, self).completed_config(model, digest))

    def list_tags(self, model: str | None = None) -> Any:
        return self._recall(("list_tags", model), lambda: super(JournaledRegistry, self).list_tags(model))

    def tracks(self) -> dict[str, str]:
        return dict(self._recall(("tracks",), super().tracks))

    # -- the probe that ends a full disk's outage ----------------------------------------------

    @contextmanager
    def _session(self) -> Iterator[Session]:
        with super()._session() as session:
            yield session
        if self._replayed and (not self.health.reachable or self._waiting):
            self._probe()

    def _probe(self) -> None:
        """While an outage is on, a one-row write (at most every PROBE_S): when it commits, the outage
        ends and the journal is written (on_return). Records left waiting while it answers are written."""
        now = time.monotonic()
        if now - self._last_probe < PROBE_S or not self._probe_lock.acquire(blocking=False):
            return
        try:
            self._last_probe = now
            if self.health.reachable:
                self.replay_journal()
                return
            with super()._session() as session:
                session.execute(text("UPDATE alembic_version SET version_num = version_num"))
        except StoreError:
            pass  # still away: the outage is told by the registry's health
        finally:
            self._probe_lock.release()
