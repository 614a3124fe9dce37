"""Run the Alembic migrations in `migrations/` against the registry (no alembic.ini needed), and open an
existing registry for the read-only commands WITHOUT importing Alembic.

Importing Alembic costs about half a second; `tritonctl versions` / `audit` / `diff` only need to know
that the schema is the one this tritonctl was written for. That is one query of `alembic_version`
against `HEAD_REVISION`, a constant tests/test_layers.py keeps equal to the head of migrations/.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from controlplane.errors import MigrationError, NotFoundError, StoreError

if TYPE_CHECKING:
    from alembic.config import Config

    from controlplane.store.registry import Registry
    from controlplane.store.sqlite_reader import SqliteReader

# The newest revision in migrations/versions/ (a test fails when a migration is added without this).
HEAD_REVISION = "0012"


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


@dataclass(frozen=True)
class Migration:
    """One migration of migrations/versions/: its revision, file name (`0007_source_signatures`) and the
    first line of its docstring."""

    revision: str
    name: str
    title: str


def plan(registry: Registry, revision: str = "head") -> list[Migration]:
    """The migrations an upgrade of the registry to `revision` would run, oldest first (imports Alembic)."""
    return pending(current_revision(registry), revision)


def pending(current: str | None, revision: str = "head") -> list[Migration]:
    """The migrations from schema revision `current` (None: none yet) to `revision`, oldest first."""
    from alembic.script import ScriptDirectory
    from alembic.script.revision import RevisionError
    from alembic.util import CommandError

    script = ScriptDirectory.from_config(_config())
    try:
        steps = list(script.iterate_revisions(revision, current or "base"))
    except (CommandError, RevisionError) as exc:  # a newer tritonctl upgraded it: no way from there here
        raise StoreError(f"registry schema is at {current}, which this tritonctl does not know (it goes up to "
                         f"{HEAD_REVISION}): run the release that upgraded it, or put back its copy from before "
                         "(docs/operations.md \"Upgrading\")") from exc
    return [Migration(str(step.revision), Path(step.path).stem,
                      (step.doc or "").strip().splitlines()[0] if step.doc else "")
            for step in reversed(steps) if step.revision != current]


def backup_path(database: Path, revision: str) -> Path:
    """Where the copy of a SQLite registry taken before migrating it from `revision` goes."""
    return database.with_name(f"{database.name}.before-{revision}")


def backup_sqlite(database: Path, revision: str) -> Path:
    """Copy a SQLite registry aside through SQLite's backup API (a consistent copy, WAL included,
    even while another connection reads it); a copy from an earlier attempt at the same revision is
    replaced. Written to a temporary name first, so a crash never leaves a half copy under the name."""
    import os
    import sqlite3
    import stat

    target = backup_path(database, revision)
    partial = target.with_name(target.name + ".partial")
    partial.unlink(missing_ok=True)
    try:
        # the copy is born with the registry's own mode, not the umask's (issue 58: a 0600 registry gave a
        # 0644 copy), created here exclusively (a link planted at its name is not followed) and empty
        mode = stat.S_IMODE(os.stat(database).st_mode)
        os.close(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode))
        os.chmod(partial, mode)
        source = sqlite3.connect(database)  # it exists (it has a revision); the copy only reads it
        try:
            copy = sqlite3.connect(partial)
            try:
                source.backup(copy)
            finally:
                copy.close()
        finally:
            source.close()
        os.replace(partial, target)
    except (OSError, sqlite3.Error) as exc:
        partial.unlink(missing_ok=True)
        raise StoreError(f"registry: cannot copy {database} to {target} before migrating it: {exc}") from exc
    return target


def upgrade(registry: Registry, revision: str = "head") -> tuple[str | None, str]:
    """Upgrade the registry's schema; returns (revision before, revision after) (see `run_upgrade`)."""
    done = run_upgrade(registry, revision)
    return done.before, done.after


@contextmanager
def _ddl_transaction(registry: Registry) -> Iterator[Any]:
    """A connection in one transaction that DDL joins. Python's sqlite3 opens a transaction only before
    INSERT/UPDATE/DELETE, so a CREATE TABLE would commit on its own: on SQLite the driver opens none here
    and BEGIN IMMEDIATE opens one that the DDL and the data roll back in together."""
    with registry.engine.connect() as conn:
        if registry.engine.dialect.name != "sqlite":
            with conn.begin():
                yield conn
            return
        raw: Any = conn.connection.driver_connection
        level = raw.isolation_level
        raw.isolation_level = None
        try:
            with conn.begin():
                conn.exec_driver_sql("BEGIN IMMEDIATE")
                yield conn
        finally:
            raw.isolation_level = level


def create_fresh(registry: Registry) -> bool:
    """On a database without any table, create the head schema from the table definitions and record
    `HEAD_REVISION` in `alembic_version`, in one transaction, without Alembic: a first start took 0.65 s
    to import Alembic and run every migration in turn on an empty registry, 0.1 s this way (issue 39,
    item 4). tests/test_registry.py keeps the migrations and the definitions equal, and
    tests/test_fresh_schema.py the two schemas. False (nothing done) when any table exists."""
    from sqlalchemy import Column, MetaData, PrimaryKeyConstraint, String, Table, inspect
    from sqlalchemy.exc import SQLAlchemyError

    from controlplane.store.schema import Base

    version = Table("alembic_version", MetaData(), Column("version_num", String(32), nullable=False),
                    PrimaryKeyConstraint("version_num", name="alembic_version_pkc"))  # as Alembic makes it
    try:
        with _ddl_transaction(registry) as conn:
            if inspect(conn).get_table_names():
                return False
            Base.metadata.create_all(conn)
            version.create(conn)
            conn.execute(version.insert().values(version_num=HEAD_REVISION))
    except SQLAlchemyError as exc:
        raise MigrationError(f"registry: cannot create the schema: {str(exc).splitlines()[0]}",
                             revision=HEAD_REVISION, backup=None) from exc
    return True


@dataclass(frozen=True)
class Upgrade:
    """What an upgrade did: the revisions before (None: no schema) and after, the migrations it ran and
    the copy of the SQLite registry it took first (None: none needed)."""

    before: str | None
    after: str
    migrations: list[Migration]
    backup: Path | None


def run_upgrade(registry: Registry, revision: str = "head") -> Upgrade:
    """Upgrade the registry's schema to `revision`.

    A failed migration changes nothing: SQLite runs every pending migration in one transaction (its DDL
    is transactional), after copying the registry aside (`registry.db.before-<revision>`); PostgreSQL
    runs each migration in its own transaction (Alembic's transaction_per_migration), so a failure
    leaves it at the revision before the failing one. The failure (MigrationError) names the migration
    and, on SQLite, the copy."""
    import logging

    from alembic import command

    from controlplane.store import sqlite_reader

    before = current_revision(registry)
    todo = pending(before, revision)
    if not todo:
        return Upgrade(before, before or "", [], None)
    database = sqlite_reader.sqlite_path(str(registry.engine.url))
    backup: Path | None = None
    if database is not None and before is not None:
        backup = backup_sqlite(database, before)
        logging.getLogger("tritonctl.store").info(
            "registry schema %s -> %s: copied the registry to %s first (to go back: stop the daemon and copy it "
            "over %s)", before, todo[-1].revision, backup, database.name)
    applied: list[str] = []
    config = _config()
    config.attributes["on_version_apply"] = lambda **kw: applied.append(str(kw["step"].up_revision_id))
    try:
        if registry.engine.dialect.name == "sqlite":
            with _ddl_transaction(registry) as conn:
                config.attributes["connection"] = conn
                command.upgrade(config, revision)
        else:
            with registry.engine.connect() as conn:
                config.attributes["connection"] = conn
                config.attributes["transaction_per_migration"] = True
                command.upgrade(config, revision)
    except Exception as exc:  # a migration's own bug is as much a failure as the database's refusal
        failed = todo[min(len(applied), len(todo) - 1)]
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if registry.engine.dialect.name == "sqlite":
            where = f"the registry is unchanged at {before or 'no schema'}"
            if backup is not None:
                where += f"; its copy from before the upgrade is {backup}"
        else:
            where = f"the registry stays at {current_revision(registry) or 'no schema'}"
        raise MigrationError(f"registry: migration {failed.name} failed: {reason}; {where}",
                             revision=failed.revision, backup=backup) from exc
    return Upgrade(before, current_revision(registry) or "", todo, backup)


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
