"""Run the Alembic migrations in `migrations/` against the registry (no alembic.ini needed), and open an
existing registry for the read-only commands WITHOUT importing Alembic.

Importing Alembic costs about half a second; `tritonctl versions` / `audit` / `diff` only need to know
that the schema is the one this tritonctl was written for. That is one query of `alembic_version`
against `HEAD_REVISION`, a constant tests/test_layers.py keeps equal to the head of migrations/.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from controlplane.errors import NotFoundError, StoreError

if TYPE_CHECKING:
    from alembic.config import Config

    from controlplane.store.registry import Registry
    from controlplane.store.sqlite_reader import SqliteReader

# The newest revision in migrations/versions/ (a test fails when a migration is added without this).
HEAD_REVISION = "0009"


def _config() -> Config:
    from alembic.config import Config

    import migrations

    config = Config()
    config.set_main_option("script_location", str(Path(migrations.__file__).parent))
    return config


def head_revision() -> str:
    """The head revision as Alembic computes it from migrations/ (imports Alembic)."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(_config()).get_current_head()
    assert head is not None
    return head


def current_revision(registry: Registry) -> str | None:
    """The registry's schema revision (None: no schema yet), by one query of `alembic_version`."""
    from sqlalchemy import inspect
    from sqlalchemy.exc import SQLAlchemyError

    try:
        with registry.engine.connect() as conn:
            if not inspect(conn).has_table("alembic_version"):
                return None
            row = conn.exec_driver_sql("SELECT version_num FROM alembic_version").first()
            return None if row is None else str(row[0])
    except SQLAlchemyError as exc:
        raise StoreError(f"registry: cannot read the schema revision: {exc}") from exc


def upgrade(registry: Registry, revision: str = "head") -> tuple[str | None, str]:
    """Upgrade the registry's schema; returns (revision before, revision after)."""
    from alembic import command
    from sqlalchemy.exc import SQLAlchemyError

    before = current_revision(registry)
    config = _config()
    try:
        with registry.engine.begin() as conn:
            config.attributes["connection"] = conn
            command.upgrade(config, revision)
    except SQLAlchemyError as exc:
        raise StoreError(f"registry: migration failed: {str(exc).splitlines()[0]}") from exc
    return before, current_revision(registry) or ""


def check_revision(revision: str | None, close: Any) -> None:
    """Refuse a registry without the schema this tritonctl needs (`close` releases it first)."""
    if revision == HEAD_REVISION:
        return
    close()
    if revision is None:
        raise StoreError("registry has no schema yet: run `tritonctl db upgrade`")
    raise StoreError(f"registry schema is at {revision}, this tritonctl needs {HEAD_REVISION}: "
                     "run `tritonctl db upgrade`")


def open_existing(url: str) -> Registry:
    """A registry that must already exist with the current schema (read-only commands, any URL)."""
    from sqlalchemy.engine import make_url

    from controlplane.store.registry import Registry

    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database and parsed.database != ":memory:":
        if not Path(parsed.database).exists():
            raise NotFoundError(f"no registry at {parsed.database}: start the daemon or run `tritonctl db upgrade`")
    registry = Registry(url)
    check_revision(current_revision(registry), registry.close)
    return registry


def open_reader(url: str) -> Registry | SqliteReader:
    """What `versions`, `audit` and `diff` read: a SQLite file through the standard library's sqlite3
    (importing SQLAlchemy alone costs more than these commands' whole budget), any other URL through
    the Registry. Both answer the same read methods with the same records."""
    from controlplane.store import sqlite_reader

    path = sqlite_reader.sqlite_path(url)
    if path is None:
        return open_existing(url)
    reader = sqlite_reader.SqliteReader(path)
    check_revision(reader.schema_revision(), reader.close)
    return reader


# The PostgreSQL advisory lock daemons of a fleet take in turn to upgrade the shared registry.
SHARED_MIGRATION_LOCK = 0x7472_6975


def upgrade_shared(registry: Registry) -> tuple[str | None, str]:
    """Upgrade a fleet's shared registry; daemons starting together take turns (an advisory lock).
    Anything but PostgreSQL (a test's SQLite) is upgraded as it is."""
    import logging

    from sqlalchemy import text

    if registry.engine.dialect.name != "postgresql":
        return upgrade(registry)
    with registry.engine.connect() as conn:
        conn.execute(text("SELECT pg_advisory_lock(:key)"), {"key": SHARED_MIGRATION_LOCK})
        conn.commit()
        try:
            before, after = upgrade(registry)
            if before != after:
                logging.getLogger("tritonctl.store").info("shared registry schema upgraded %s -> %s",
                                                          before or "empty", after)
            return before, after
        finally:
            conn.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": SHARED_MIGRATION_LOCK})
            conn.commit()
