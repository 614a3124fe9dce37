"""The registry's read-only questions for a SQLite file, through the standard library's sqlite3.

`tritonctl versions`, `audit` and `diff` are short processes: importing SQLAlchemy alone takes longer
than their whole budget (150 ms). For a `sqlite:///` URL they read through this module instead, which
answers the same read methods as `Registry` (find_model, list_snapshots, get_snapshot, query_audit,
serving_at) with the same records and the same statements, so both plan the same way on the same
indexes. Everything else (the daemon, writes, PostgreSQL) goes through `Registry`.

Times are stored the way SQLAlchemy's SQLite dialect stores them: 'YYYY-MM-DD HH:MM:SS.ffffff' text,
which compares in time order; parameters are formatted the same way.
"""

from __future__ import annotations

import json
import sqlite3
from datetime import datetime
from pathlib import Path
from typing import Any

from controlplane.errors import NotFoundError, StoreError, UsageError
from controlplane.store.records import (
    AuditQuery,
    AuditRecord,
    CompletedConfigRecord,
    FootprintRecord,
    ModelRecord,
    ServingRecord,
    SnapshotRecord,
    TagRecord,
)

BUSY_TIMEOUT_S = 10.0

_MODEL_COLUMNS = "name, policy, pinned, active_digest, state, last_error, active_since, updated_at, removed_at"
_SNAPSHOT_COLUMNS = ("model, digest, manifest, config, versions, served_versions, valid, problems, total_bytes, "
                     "first_seen, last_seen, quarantined, quarantine_reason, collected")
_AUDIT_COLUMNS = "id, time, actor, action, model, digest, outcome, duration_ms, message, host, claimed"

# audit --at T: for each (model, host) in the log, its last change at or before T, one index seek each
# (ix_serving_model_host_time). Sorted in Python: an ORDER BY here would add a temporary b-tree.
SERVING_AT_SQL = (
    "SELECT time, model, digest, versions, host FROM serving_log WHERE id IN ("
    "SELECT (SELECT latest.id FROM serving_log AS latest "
    "WHERE latest.model = names.model AND latest.host = names.host AND latest.time <= ? "
    "ORDER BY latest.time DESC, latest.id DESC LIMIT 1) "
    "FROM (SELECT DISTINCT model, host FROM serving_log{where}) AS names)"
)

# tags MODEL --at T: for each (model, name) in tag_moves, its last move at or before T (one index seek each on
# ix_tag_moves_model_name_time); a move whose new_digest is NULL deleted the tag.
TAGS_AT_SQL = (
    "SELECT model, name, new_digest, actor, time FROM tag_moves WHERE id IN ("
    "SELECT (SELECT latest.id FROM tag_moves AS latest "
    "WHERE latest.model = names.model AND latest.name = names.name AND latest.time <= ? "
    "ORDER BY latest.time DESC, latest.id DESC LIMIT 1) "
    "FROM (SELECT DISTINCT model, name FROM tag_moves{where}) AS names)"
)


def sqlite_path(url: str) -> Path | None:
    """The file of a plain `sqlite:///PATH` URL; None for anything else (memory, options, other databases)."""
    for prefix in ("sqlite:///", "sqlite+pysqlite:///"):
        if url.startswith(prefix):
            rest = url[len(prefix):]
            if rest and rest != ":memory:" and "?" not in rest:
                return Path(rest)
    return None


def audit_statement(query: AuditQuery) -> tuple[str, tuple[Any, ...]]:
    """The SELECT (and its parameters) answering `tritonctl audit` with these filters."""
    where: list[str] = []
    params: list[Any] = []
    for column, value in (("model", query.model), ("action", query.action), ("outcome", query.outcome),
                          ("actor", query.actor)):
        if value is not None:
            where.append(f"{column} = ?")
            params.append(value)
    if query.since is not None:
        where.append("time >= ?")
        params.append(to_db_time(query.since))
    if query.until is not None:
        where.append("time <= ?")
        params.append(to_db_time(query.until))
    sql = (f"SELECT {_AUDIT_COLUMNS} FROM audit_events{' WHERE ' + ' AND '.join(where) if where else ''} "
           "ORDER BY time DESC, id DESC LIMIT ?")
    return sql, (*params, max(1, query.limit))


def serving_at_statement(when: datetime, models: list[str] | None) -> tuple[str, tuple[Any, ...]]:
    """The SELECT (and its parameters) answering `tritonctl audit --at T` (rows unsorted)."""
    where = ""
    params: list[Any] = [to_db_time(when)]
    if models is not None:
        where = f" WHERE model IN ({', '.join('?' for _ in models)})"
        params.extend(models)
    return SERVING_AT_SQL.format(where=where), tuple(params)


def to_db_time(value: datetime) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S.%f")


def _time(value: Any) -> datetime | None:
    return None if value is None else datetime.fromisoformat(str(value))


class SqliteReader:
    """Read-only access to a registry file that exists (never creates one)."""

    def __init__(self, path: Path, busy_timeout_s: float = BUSY_TIMEOUT_S) -> None:
        if not path.exists():
            raise NotFoundError(f"no registry at {path}: start the daemon or run `tritonctl db upgrade`")
        try:
            # mode=rw: never create the file; read-write so a WAL registry can be read while the daemon writes.
            self._conn = sqlite3.connect(f"file:{path}?mode=rw", uri=True, timeout=busy_timeout_s,
                                         check_same_thread=False)
        except sqlite3.Error as exc:
            raise StoreError(f"registry {path}: cannot open: {exc}") from exc
        self.path = path

    def close(self) -> None:
        self._conn.close()

    def _rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        try:
            return self._conn.execute(sql, params).fetchall()
        except sqlite3.Error as exc:
            raise StoreError(f"registry {self.path}: {exc}") from exc

    def schema_revision(self) -> str | None:
        """The Alembic revision the registry is at (None: no schema yet), in one query."""
        try:
            rows = self._conn.execute("SELECT version_num FROM alembic_version").fetchall()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return None
            raise StoreError(f"registry {self.path}: {exc}") from exc
        return str(rows[0][0]) if rows else None

    def find_model(self, name: str) -> ModelRecord | None:
        rows = self._rows(f"SELECT {_MODEL_COLUMNS} FROM models WHERE name = ?", (name,))
        if not rows:
            return None
        (name, policy, pinned, active, state, error, since, updated, removed), = rows
        return ModelRecord(name=name, policy=policy, pinned=bool(pinned), active_digest=active, state=state,
                           last_error=error, active_since=_time(since), updated_at=_time(updated),  # type: ignore[arg-type]
                           removed_at=_time(removed))

    @staticmethod
    def _snapshot(row: tuple[Any, ...]) -> SnapshotRecord:
        (model, digest, manifest, config, versions, served, valid, problems, total, first, last, quarantined,
         reason, collected) = row
        return SnapshotRecord(
            model=model, digest=digest, manifest=manifest, config=json.loads(config) if config else None,
            versions=json.loads(versions), served_versions=json.loads(served), valid=bool(valid),
            problems=json.loads(problems), total_bytes=total, first_seen=_time(first),  # type: ignore[arg-type]
            last_seen=_time(last), quarantined=bool(quarantined),  # type: ignore[arg-type]
            quarantine_reason=reason, collected=bool(collected))

    def list_snapshots(self, model: str) -> list[SnapshotRecord]:
        rows = self._rows(f"SELECT {_SNAPSHOT_COLUMNS} FROM snapshots WHERE model = ? "
                          "ORDER BY first_seen DESC, id DESC", (model,))
        return [self._snapshot(row) for row in rows]

    def get_snapshot(self, model: str, digest: str) -> SnapshotRecord:
        """A model's snapshot by full digest or unique prefix (as `Registry.get_snapshot`)."""
        pattern = digest.replace("/", "//").replace("%", "/%").replace("_", "/_") + "%"
        rows = self._rows(f"SELECT {_SNAPSHOT_COLUMNS} FROM snapshots WHERE model = ? AND digest LIKE ? ESCAPE '/' "
                          "LIMIT 2", (model, pattern))
        if not rows:
            raise NotFoundError(f"model '{model}' has no snapshot with digest {digest}")
        if len(rows) > 1:
            raise UsageError(f"digest prefix {digest} is ambiguous for model '{model}'")
        return self._snapshot(rows[0])

    def footprints(self, models: list[str] | None = None) -> dict[tuple[str, str], FootprintRecord]:
        """Recorded footprints by (model, digest); as `Registry.footprints`."""
        where = f" WHERE model IN ({', '.join('?' * len(models))})" if models else ""
        rows = self._rows("SELECT model, digest, memory_mb, gpu_memory_mb, source, measured_at FROM footprints" + where,
                          tuple(models or ()))
        return {(m, d): FootprintRecord(m, d, mem, gpu, src, _time(at))  # type: ignore[arg-type]
                for m, d, mem, gpu, src, at in rows}

    def completed_configs(self, models: list[str] | None = None) -> dict[tuple[str, str], CompletedConfigRecord]:
        """Recorded completed configs by (model, digest); as `Registry.completed_configs`."""
        where = f" WHERE model IN ({', '.join('?' * len(models))})" if models else ""
        rows = self._rows("SELECT model, digest, config, recorded_at FROM completed_configs" + where,
                          tuple(models or ()))
        return {(m, d): CompletedConfigRecord(m, d, json.loads(c), _time(at))  # type: ignore[arg-type]
                for m, d, c, at in rows}

    def query_audit(self, query: AuditQuery) -> list[AuditRecord]:
        """Newest first, filtered; uses the (model, time) and (time) indexes."""
        rows = self._rows(*audit_statement(query))
        return [AuditRecord(id=i, time=_time(t), actor=actor, action=action, model=model,  # type: ignore[arg-type]
                            digest=digest, outcome=outcome, duration_ms=ms, message=message, host=host,
                            claimed=claimed)
                for i, t, actor, action, model, digest, outcome, ms, message, host, claimed in rows]

    def serving_at(self, when: datetime, models: list[str] | None = None) -> list[ServingRecord]:
        """What each model served at `when` (per host), by model name; as `Registry.serving_at`."""
        rows = self._rows(*serving_at_statement(when, models))
        records = [ServingRecord(model=model, digest=digest, versions=json.loads(versions), since=_time(t),
                                 host=host)
                   for t, model, digest, versions, host in rows if digest is not None]
        return sorted(records, key=lambda r: (r.model, r.host))

    def list_tags(self, model: str | None = None) -> list[TagRecord]:
        """Every tag (of one model), by model then name; as `Registry.list_tags`."""
        where, params = (" WHERE model = ?", (model,)) if model is not None else ("", ())
        rows = self._rows(f"SELECT model, name, digest, moved_by, moved_at FROM tags{where} ORDER BY model, name",
                          params)
        return [TagRecord(m, n, d, by, _time(at)) for m, n, d, by, at in rows]  # type: ignore[arg-type]

    def tags_at(self, when: datetime, model: str | None = None) -> list[TagRecord]:
        """Where each tag pointed at `when`; as `Registry.tags_at`."""
        where, params = (" WHERE model = ?", (model,)) if model is not None else ("", ())
        rows = self._rows(TAGS_AT_SQL.format(where=where), (to_db_time(when), *params))
        records = [TagRecord(m, n, d, by, _time(at)) for m, n, d, by, at in rows if d is not None]  # type: ignore[arg-type]
        return sorted(records, key=lambda r: (r.model, r.name))

    def tracks(self) -> dict[str, str]:
        """model → the tag it tracks; as `Registry.tracks`."""
        return dict(self._rows("SELECT model, tag FROM tag_tracks"))  # type: ignore[arg-type]
