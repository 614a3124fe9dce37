"""Run the Alembic migrations in `migrations/` against the registry (no alembic.ini needed)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.exc import SQLAlchemyError

import migrations
from controlplane.errors import StoreError
from controlplane.store.registry import Registry


def _config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(Path(migrations.__file__).parent))
    return config


def head_revision() -> str:
    head = ScriptDirectory.from_config(_config()).get_current_head()
    assert head is not None
    return head


def current_revision(registry: Registry) -> str | None:
    try:
        with registry.engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    except SQLAlchemyError as exc:
        raise StoreError(f"registry: cannot read the schema revision: {exc}") from exc


def upgrade(registry: Registry, revision: str = "head") -> tuple[str | None, str]:
    """Upgrade the registry's schema; returns (revision before, revision after)."""
    before = current_revision(registry)
    config = _config()
    try:
        with registry.engine.begin() as conn:
            config.attributes["connection"] = conn
            command.upgrade(config, revision)
    except SQLAlchemyError as exc:
        raise StoreError(f"registry: migration failed: {str(exc).splitlines()[0]}") from exc
    return before, current_revision(registry) or ""


def open_existing(url: str) -> Registry:
    """A registry that must already exist with the current schema (read-only commands)."""
    from sqlalchemy.engine import make_url

    from controlplane.errors import NotFoundError

    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite" and parsed.database and parsed.database != ":memory:":
        if not Path(parsed.database).exists():
            raise NotFoundError(f"no registry at {parsed.database}: start the daemon or run `tritonctl db upgrade`")
    registry = Registry(url)
    revision = current_revision(registry)
    if revision is None:
        registry.close()
        raise StoreError("registry has no schema yet: run `tritonctl db upgrade`")
    if revision != head_revision():
        registry.close()
        raise StoreError(f"registry schema is at {revision}, this tritonctl needs {head_revision()}: "
                         "run `tritonctl db upgrade`")
    return registry
