"""The history verbs (versions, diff, audit, audit --at, audit --follow), each one HTTP call to the daemon
(or, given --db-url, that registry read directly: cli/offline.py); and `db upgrade`, which needs none."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from cli import render
from cli.options import json_option, reader_options, state_option
from controlplane.base.bounds import MAX_LIMIT
from controlplane.errors import UsageError

if TYPE_CHECKING:
    from controlplane.api.client import ControlClient
from controlplane.base.defaults import OUTCOMES


@click.command()
@click.argument("model")
@json_option
@reader_options
def versions(reader: Any, model: str, as_json: bool) -> None:
    """List every distinct content MODEL ever had, newest first, with the active one marked.

    \b
    Example:
      tritonctl versions linear --json
    """
    render.versions(model, reader.versions(model), as_json)


@click.command()
@click.argument("model")
@click.argument("digest_a")
@click.argument("digest_b")
@json_option
@reader_options
def diff(reader: Any, model: str, digest_a: str, digest_b: str, as_json: bool) -> None:
    """Show files added, removed and changed between two snapshots of MODEL (digests or tags), with text diffs.

    \b
    Examples:
      tritonctl diff linear 3f2a9c1b 9e01d4aa
      tritonctl diff linear stable canary
    """
    render.diff(reader.diff(model, digest_a, digest_b), as_json)


@click.command()
@click.option("--model", help="Only this model.")
@click.option("--action", help="Only this action (deploy, rollback, unload, snapshot, restore, policy, pin...).")
@click.option("--outcome", type=click.Choice(list(OUTCOMES)), help="Only this outcome.")
@click.option("--actor", help="Only this actor (OS user, watcher, tritonctl).")
@click.option("--since", help="ISO 8601 or relative (30m, 2h, 7d).")
@click.option("--until", help="ISO 8601 or relative (30m, 2h, 7d).")
@click.option("--limit", type=click.IntRange(min=1, max=MAX_LIMIT), default=100, show_default=True)
@click.option("--at", "at", help="Instead: what each model was serving at this time.")
@click.option("-f", "--follow", is_flag=True, help="Instead: print each new event as the daemon writes it (its "
              "event stream; --json: one document per line); Ctrl-C to stop.")
@json_option
@reader_options(with_client=True)
def audit(reader: Any, client: ControlClient, model: str | None, action: str | None, outcome: str | None,
          actor: str | None, since: str | None, until: str | None, limit: int, at: str | None, follow: bool,
          as_json: bool) -> None:
    """Query the append-only audit log (newest first), or what served at a given time, or follow it.

    \b
    Examples:
      tritonctl audit --model linear --since 2h
      tritonctl audit --outcome rolled_back --since 7d --json
      tritonctl audit --at 2026-11-29T03:00:00Z
      tritonctl audit --follow --model linear
    """
    if follow:
        from cli.follow import follow_audit

        if at or since or until:
            raise UsageError("--follow prints new events as they come: it takes no --at, --since or --until")
        follow_audit(client, {"model": model, "action": action, "outcome": outcome, "actor": actor}, as_json)
        return
    if at:
        render.serving_at(reader.serving_at(at, model), as_json)
        return
    render.audit(reader.audit(model=model, action=action, outcome=outcome, actor=actor, since=since, until=until,
                              limit=limit), as_json)


@click.group()
def db() -> None:
    """Registry schema management.

    \b
    Example:
      tritonctl db upgrade --state-dir /var/lib/tritonctl
    """


@db.command("upgrade")
@click.option("--db-url", envvar="TRITONCTL_DB_URL", help="SQLAlchemy URL (default sqlite:///<state-dir>/registry.db).")
@click.option("--dry-run", is_flag=True, help="Say which migrations would run; change nothing.")
@state_option
@json_option
def db_upgrade(db_url: str | None, dry_run: bool, state_dir: Path, as_json: bool) -> None:
    """Create or upgrade the registry schema (the daemon does the same at start).

    A SQLite registry is first copied to registry.db.before-<revision>; a failed migration changes
    nothing (exit 2, naming the migration and the copy).

    \b
    Examples:
      tritonctl db upgrade --dry-run --state-dir /var/lib/tritonctl
      tritonctl db upgrade --db-url postgresql+psycopg://tritonctl@db/tritonctl
    """
    from controlplane.documents.results import DbUpgradeResult, MigrationRow
    from controlplane.settings.config import Settings
    from controlplane.store import migrate
    from controlplane.store.registry import Registry
    from controlplane.store.sqlite_reader import sqlite_path

    settings = Settings(state_dir=state_dir, db_url=db_url)
    url = settings.registry_url
    if dry_run:
        path = sqlite_path(url)
        if path is not None and not path.exists():  # a new registry: every migration, nothing created
            before, todo = None, migrate.pending(None)
        else:
            registry = Registry(url)
            try:
                before, todo = migrate.current_revision(registry), migrate.plan(registry)
            finally:
                registry.close()
        render.db_upgrade(DbUpgradeResult(before, todo[-1].revision if todo else before or "",
                                          [MigrationRow(m.revision, m.title) for m in todo], dry_run=True), as_json)
        return
    if settings.db_url is None:
        state_dir.mkdir(parents=True, exist_ok=True)
    registry = Registry(url)
    try:
        done = migrate.run_upgrade(registry)
    finally:
        registry.close()
    ran = [MigrationRow(m.revision, m.title) for m in done.migrations]
    render.db_upgrade(DbUpgradeResult(done.before, done.after, ran, str(done.backup) if done.backup else None), as_json)


COMMANDS = [versions, diff, audit, db]
