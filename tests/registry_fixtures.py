"""Registries as each released schema revision wrote them: the fixtures of tests/test_upgrades.py.

`build(url, revision)` runs the project's migrations up to `revision` (nothing later), then writes rows
into every table that revision has (models, snapshots, deployments, audit events, serving log, fleet
hosts / rollouts / host models, tags and their moves, tracked tags, webhook outbox and deliveries,
source signatures, footprints, placements, leases) through that revision's own columns, reflected
from the database: a column a later revision added is not written, so each row is what a daemon of
that revision could have left. Values go through SQLAlchemy's column types, as the registry writes
them (a SQLite DATETIME is the text SQLAlchemy stores, a PostgreSQL one a timestamp).

`EXPECTED` is what the new code must answer from such a registry once upgraded: `versions linear`,
`audit`, `audit --at`, `tags`. Run as a script to leave one registry behind for a look:

    python -m tests.registry_fixtures 0005 /tmp/registry.db
"""

from __future__ import annotations

import json
import sys
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from controlplane.store import migrate
from controlplane.store.registry import Registry
from controlplane.store.sqlite_reader import sqlite_path

T0 = datetime(2026, 11, 29, 10, 0, 0, 123456)
D1, D2, D3 = "a" * 64, "b" * 64, "c" * 64
DE = "e" * 64  # the ensemble's content
HOST = "host-a"
LINEAR_CONFIG = {"name": "linear", "backend": "python", "max_batch_size": 8}
ENSEMBLE_CONFIG = {"name": "pipeline", "platform": "ensemble",
                   "ensemble_scheduling": {"step": [{"model_name": "linear"}, {"model_name": "linear"},
                                                    {"model_name": "post"}]}}
# every revision before head
RELEASED = ["0001", "0002", "0003", "0004", "0005", "0006", "0007", "0008", "0009", "0010"]


def t(minutes: float) -> datetime:
    return T0 + timedelta(minutes=minutes)


def _manifest(digest: str) -> str:
    return json.dumps({"model": "linear", "digest": digest, "entries": [
        {"path": "config.pbtxt", "kind": "file", "size": 42, "sha256": digest, "mode": 420}]})


def _snapshot(model: str, digest: str, config: dict[str, Any], first: float, last: float,
              total_bytes: int = 1234) -> dict[str, Any]:
    return {"model": model, "digest": digest, "manifest": _manifest(digest), "config": json.dumps(config),
            "versions": "[1]", "served_versions": "[1]", "valid": True, "problems": "[]",
            "total_bytes": total_bytes, "first_seen": t(first), "last_seen": t(last), "quarantined": False,
            "quarantine_reason": None, "collected": False}


def _audit(minutes: float, action: str, model: str | None, digest: str | None, outcome: str = "ok",
           message: str = "", actor: str = "tritonctl:watcher", duration_ms: int | None = 120) -> dict[str, Any]:
    return {"time": t(minutes), "actor": actor, "action": action, "model": model, "digest": digest,
            "outcome": outcome, "duration_ms": duration_ms, "message": message, "host": HOST}


def rows(bulk_models: int = 0) -> dict[str, list[dict[str, Any]]]:
    """Every table's rows, keyed by table (a table a revision lacks is skipped by `build`). No row names
    its own id: the database numbers them as it did for the daemon (audit event 7 is the `tag` event,
    the one webhook delivery's; 8 the outbox's)."""
    models = [
        {"name": "linear", "policy": None, "pinned": False, "active_digest": D2, "state": "serving",
         "last_error": None, "created_at": t(0), "updated_at": t(30), "active_since": t(30), "removed_at": None},
        {"name": "pipeline", "policy": "manual", "pinned": True, "active_digest": DE, "state": "serving",
         "last_error": None, "created_at": t(1), "updated_at": t(2), "active_since": t(2), "removed_at": None},
    ]
    snapshots = [_snapshot("linear", D1, LINEAR_CONFIG, 0, 0.5), _snapshot("linear", D2, LINEAR_CONFIG, 10, 40),
                 _snapshot("linear", D3, LINEAR_CONFIG, 20, 20), _snapshot("pipeline", DE, ENSEMBLE_CONFIG, 1, 3)]
    for i in range(bulk_models):  # a registry with more models than one backfill batch
        name = f"bulk-{i:05d}"
        models.append({**models[0], "name": name, "active_digest": None, "state": "new",
                       "active_since": None})
        snapshots.append({**_snapshot(name, f"{i:064x}", LINEAR_CONFIG, 5, 5), "model": name})
    deployments = [
        {"model": "linear", "kind": "deploy", "digest": D1, "previous_digest": None, "step": "done",
         "actor": "tritonctl:watcher", "started_at": t(0.5), "updated_at": t(0.6), "finished_at": t(0.6),
         "outcome": "ok", "error": None},
        {"model": "linear", "kind": "deploy", "digest": D2, "previous_digest": D1, "step": "done",
         "actor": "tritonctl:watcher", "started_at": t(10), "updated_at": t(10.1), "finished_at": t(10.1),
         "outcome": "ok", "error": None},
        {"model": "linear", "kind": "deploy", "digest": D3, "previous_digest": D2, "step": "done",
         "actor": "tritonctl:watcher", "started_at": t(20), "updated_at": t(20.1), "finished_at": t(20.1),
         "outcome": "ok", "error": None},
        {"model": "linear", "kind": "rollback", "digest": D2, "previous_digest": D3, "step": "done",
         "actor": "ann", "started_at": t(30), "updated_at": t(30.1), "finished_at": t(30.1), "outcome": "ok",
         "error": None},
    ]
    audit = [
        _audit(0.6, "deploy", "linear", D1),
        _audit(2, "deploy", "pipeline", DE),
        _audit(10.1, "deploy", "linear", D2),
        _audit(20.1, "deploy", "linear", D3),
        _audit(25, "deploy", "linear", D1, outcome="failed", message="load failed: out of memory"),
        _audit(30.1, "rollback", "linear", D2, actor="ann", message="back to what served"),
        _audit(35, "tag", "linear", D2, actor="ann", duration_ms=None),
        _audit(36, "pin", "pipeline", None, actor="bob", duration_ms=None),
    ]
    serving = [
        {"time": t(0.6), "model": "linear", "digest": D1, "versions": "[1]", "host": HOST},
        {"time": t(2), "model": "pipeline", "digest": DE, "versions": "[1]", "host": HOST},
        {"time": t(10.1), "model": "linear", "digest": D2, "versions": "[1]", "host": HOST},
        {"time": t(20.1), "model": "linear", "digest": D3, "versions": "[1]", "host": HOST},
        {"time": t(30.1), "model": "linear", "digest": D2, "versions": "[1]", "host": HOST},
    ]
    return {
        "models": models,
        "snapshots": snapshots,
        "deployments": deployments,
        "audit_events": audit,
        "serving_log": serving,
        "hosts": [{"name": HOST, "triton_url": "127.0.0.1:8001", "version": "2.51.0", "started_at": t(0),
                   "last_heartbeat": t(36), "http_url": "http://127.0.0.1:8000", "memory_budget_mb": 4096.0,
                   "gpu_memory_budget_mb": None}],
        "rollouts": [{"model": "linear", "digest": D2, "previous_digest": D3, "state": "done",
                      "actor": "ann", "created_at": t(30), "updated_at": t(30.1), "finished_at": t(30.1),
                      "error": None}],
        "rollout_hosts": [{"rollout_id": 1, "host": HOST, "wave": 0, "action": "load", "digest": D2, "state": "done",
                           "started_at": t(30), "finished_at": t(30.1), "message": ""}],
        "host_models": [{"host": HOST, "model": "linear", "digest": D2, "state": "serving", "updated_at": t(30.1),
                         "memory_mb": 120.5, "gpu_memory_mb": None, "evictable": False}],
        "tags": [{"model": "linear", "name": "stable", "digest": D2, "moved_by": "ann", "moved_at": t(35)}],
        "tag_moves": [
            {"time": t(12), "model": "linear", "name": "stable", "old_digest": None, "new_digest": D1,
             "attempted_digest": None, "actor": "ann", "outcome": "ok", "message": "", "host": HOST},
            {"time": t(35), "model": "linear", "name": "stable", "old_digest": D1, "new_digest": D2,
             "attempted_digest": None, "actor": "ann", "outcome": "ok", "message": "", "host": HOST},
        ],
        "tag_tracks": [{"model": "pipeline", "tag": "stable", "set_by": "bob", "set_at": t(36)}],
        "webhook_outbox": [{"audit_id": 8, "created_at": t(36)}],
        "webhook_deliveries": [{"id": "d" * 32, "audit_id": 7, "action": "tag", "model": "linear",
                                "url": "https://hooks.example/tritonctl", "body": '{"action": "tag"}',
                                "state": "delivered", "attempts": 1, "created_at": t(35), "next_attempt_at": t(35),
                                "retry_until": t(35 + 24 * 60), "last_attempt_at": t(35.01),
                                "finished_at": t(35.01), "status_code": 204, "answer": "204 No Content"}],
        "source_signatures": [{"model": "linear", "signature": "1:2:3", "digest": D2, "steps": None, "trusted": True,
                               "recorded_at": t(40)},
                              {"model": "pipeline", "signature": "4:5:6", "digest": DE,
                               "steps": '["linear", "post"]', "trusted": True, "recorded_at": t(3)}],
        "footprints": [{"model": "linear", "digest": D2, "memory_mb": 120.5, "gpu_memory_mb": None,
                        "source": "measured", "measured_at": t(30.1)}],
        "placements": [{"model": "linear", "host": HOST, "digest": D2, "state": "loaded", "message": "",
                        "memory_mb": 120.5, "gpu_memory_mb": None, "created_at": t(30), "updated_at": t(30.1)}],
        "fleet_leases": [{"id": "l" * 32, "model": "linear", "until": t(90), "actor": "ann", "created_at": t(31)}],
    }


def build(url: str, revision: str, bulk_models: int = 0) -> dict[str, int]:
    """A registry at `revision` holding `rows()` in every table it has; returns each table's row count."""
    registry = Registry(url)
    try:
        migrate.upgrade(registry, revision)
        metadata = sa.MetaData()
        metadata.reflect(registry.engine)
        counts: dict[str, int] = {}
        with registry.engine.begin() as conn:
            for name, table_rows in rows(bulk_models).items():
                table = metadata.tables.get(name)
                if table is None:
                    continue
                columns = set(table.columns.keys())
                conn.execute(table.insert(), [{k: v for k, v in row.items() if k in columns} for row in table_rows])
                counts[name] = len(table_rows)
        return counts
    finally:
        registry.close()


def break_migration_0008(url: str) -> None:
    """Make migration 0008 fail on purpose, as a database refuses: a table of the name it creates is there."""
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE footprints (stray INTEGER)"))
    finally:
        engine.dispose()


def sqlite_file(url: str) -> Path | None:
    return sqlite_path(url)


def table_counts(url: str) -> dict[str, int]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            names = [n for n in sa.inspect(conn).get_table_names() if n != "alembic_version"]
            return {n: int(conn.execute(sa.text(f"SELECT count(*) FROM {n}")).scalar_one()) for n in names}
    finally:
        engine.dispose()


if __name__ == "__main__":
    build(f"sqlite:///{sys.argv[2]}", sys.argv[1])
