"""A first start creates the head schema at once (issue 39, item 4): the same tables, columns, indexes and
constraints as running every migration, recorded at the head revision, and only on an empty database."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa

from controlplane.settings.config import Settings
from controlplane.startup.registries import open_registries
from controlplane.store import migrate
from controlplane.store.registry import Registry


def _schema(url: str) -> dict[str, Any]:
    engine = sa.create_engine(url)
    try:
        inspector = sa.inspect(engine)
        out: dict[str, Any] = {}
        for table in sorted(inspector.get_table_names()):
            out[table] = {
                "columns": [(c["name"], str(c["type"]), c["nullable"], str(c.get("default")))
                            for c in inspector.get_columns(table)],
                "pk": inspector.get_pk_constraint(table)["constrained_columns"],
                "indexes": sorted((i["name"], tuple(i["column_names"]), bool(i["unique"]))
                                  for i in inspector.get_indexes(table)),
                "unique": sorted((u["name"], tuple(u["column_names"]))
                                 for u in inspector.get_unique_constraints(table)),
                "foreign": sorted((tuple(f["constrained_columns"]), f["referred_table"])
                                  for f in inspector.get_foreign_keys(table)),
            }
        return out
    finally:
        engine.dispose()


def test_a_fresh_registry_has_the_schema_the_migrations_make(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    registry, _ = _open(tmp_path, state)  # the daemon's start on a fresh state directory
    try:
        assert migrate.current_revision(registry) == migrate.HEAD_REVISION
        assert not migrate.create_fresh(registry)  # tables exist: nothing done
        assert migrate.upgrade(registry) == (migrate.HEAD_REVISION, migrate.HEAD_REVISION)  # Alembic: at head
    finally:
        registry.close()
    assert _schema(f"sqlite:///{state / 'registry.db'}") == _schema(_migrated(tmp_path))


def test_a_daemon_start_upgrades_an_older_registry_through_the_migrations(tmp_path: Path) -> None:
    """Only an empty database is created at once: one at an older revision runs the migrations after it."""
    state = tmp_path / "state"
    state.mkdir()
    url = f"sqlite:///{state / 'registry.db'}"
    reg = Registry(url)
    try:
        migrate.run_upgrade(reg, "0009")
    finally:
        reg.close()
    registry, _ = _open(tmp_path, state)
    try:
        assert migrate.current_revision(registry) == migrate.HEAD_REVISION
    finally:
        registry.close()
    assert _schema(url) == _schema(_migrated(tmp_path))


def _open(tmp_path: Path, state: Path) -> Any:
    return open_registries(Settings(repository=tmp_path, state_dir=state), fleet=False)


def _migrated(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'reference.db'}"
    reg = Registry(url)
    try:
        migrate.run_upgrade(reg)
    finally:
        reg.close()
    return url
