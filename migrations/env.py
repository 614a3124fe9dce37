"""Alembic environment: runs migrations on the connection tritonctl hands over (or the ini's URL)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import engine_from_config, pool

from controlplane.store.schema import Base

config = context.config
target_metadata = Base.metadata


def run_migrations_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
        render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        # controlplane/store/migrate.py: SQLite runs every migration in the caller's one transaction;
        # PostgreSQL one transaction per migration. on_version_apply tells it which migration failed.
        options = {}
        if config.attributes.get("on_version_apply") is not None:
            options["on_version_apply"] = config.attributes["on_version_apply"]
        context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True,
                          transaction_per_migration=bool(config.attributes.get("transaction_per_migration")),
                          **options)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = engine_from_config(config.get_section(config.config_ini_section, {}), prefix="sqlalchemy.",
                                poolclass=pool.NullPool)
    with engine.connect() as conn:
        context.configure(connection=conn, target_metadata=target_metadata, render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
