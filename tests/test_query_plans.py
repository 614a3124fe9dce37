"""`tritonctl audit` stays fast on a long history because SQLite answers it from the intended indexes.

EXPLAIN QUERY PLAN of the statements actually sent (by the sqlite3 reader the CLI uses, and by the
SQLAlchemy registry the daemon uses): one model's window seeks ix_audit_model_time, a window without a
model seeks ix_audit_time, `--at T` lists (model, host) pairs and seeks each one's last change in
ix_serving_model_host_time, and none of them sorts through a temporary b-tree (what made `--at` a full
scan before migration 0004). bench/audit_query.py measures the times on 1,000,000 events.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from controlplane.store import migrate, sqlite_reader
from controlplane.store.records import AuditQuery, utcnow
from controlplane.store.registry import Registry

NOW = utcnow()
DAY = timedelta(days=1)
CASES: dict[str, tuple[AuditQuery | None, str]] = {
    "model + window": (AuditQuery(model="linear", since=NOW - DAY, until=NOW), "ix_audit_model_time"),
    "model, no window": (AuditQuery(model="linear"), "ix_audit_model_time"),
    "window, no model": (AuditQuery(outcome="failed", since=NOW - DAY), "ix_audit_time"),
    "--at T": (None, "ix_serving_model_host_time"),
}


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Registry, Path]]:
    path = tmp_path_factory.mktemp("plans") / "registry.db"
    registry = Registry(f"sqlite:///{path}")
    migrate.upgrade(registry)
    yield registry, path
    registry.close()


def plan(conn: sqlite3.Connection, sql: str, params: Any) -> list[str]:
    return [str(row[-1]) for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", params).fetchall()]


def assert_uses(lines: list[str], index: str, case: str) -> None:
    text = "\n".join(lines)
    assert "TEMP B-TREE" not in text, f"{case}:\n{text}"
    assert f"USING INDEX {index}" in text or f"USING COVERING INDEX {index}" in text, f"{case}:\n{text}"
    assert not any(line.startswith("SCAN audit_events") for line in lines), f"{case}:\n{text}"


@pytest.mark.parametrize("case", list(CASES))
def test_the_cli_reader_uses_the_intended_index(db: tuple[Registry, Path], case: str) -> None:
    _, path = db
    query, index = CASES[case]
    if query is None:
        sql, params = sqlite_reader.serving_at_statement(NOW, None)
    else:
        sql, params = sqlite_reader.audit_statement(query)
    with sqlite3.connect(path) as conn:
        assert_uses(plan(conn, sql, params), index, case)


def sent_statements(registry: Registry, call: Callable[[], object]) -> list[tuple[str, Any]]:
    seen: list[tuple[str, Any]] = []

    def capture(conn: Any, cursor: Any, stmt: str, params: Any, context: Any, executemany: bool) -> None:
        if stmt.lstrip().upper().startswith("SELECT"):
            seen.append((stmt, params))

    sa.event.listen(registry.engine, "before_cursor_execute", capture)
    try:
        call()
    finally:
        sa.event.remove(registry.engine, "before_cursor_execute", capture)
    return seen


@pytest.mark.parametrize("case", list(CASES))
def test_the_registry_uses_the_intended_index(db: tuple[Registry, Path], case: str) -> None:
    registry, path = db
    query, index = CASES[case]
    statements = sent_statements(registry, (lambda: registry.serving_at(NOW)) if query is None
                                 else (lambda: registry.query_audit(query)))
    assert len(statements) == 1
    with sqlite3.connect(path) as conn:
        assert_uses(plan(conn, *statements[0]), index, case)
