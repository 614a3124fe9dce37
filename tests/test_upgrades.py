"""Upgrades keep every record: a registry written at each released schema revision (tests/registry_fixtures.py
writes rows into every table that revision has) upgrades to head on SQLite and PostgreSQL with every row
still there and readable by the new code; a migration that fails changes nothing (SQLite: the file is
byte-for-byte as it was, its copy `registry.db.before-<revision>` beside it; PostgreSQL: the revision
before the failing migration); `db upgrade --dry-run` says what would run; the daemon refuses to start
on a failed migration with one line and exit 2.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from controlplane.errors import MigrationError
from controlplane.store import migrate, schema
from controlplane.store.records import AuditQuery
from controlplane.store.registry import Registry
from controlplane.store.sqlite_reader import SqliteReader
from controlplane.views import queries
from tests import registry_fixtures as fx
from tests.cli_helpers import assert_one_line_error, invoke

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'registry.db'}"
    return str(request.getfixturevalue("pg_url"))


def _answers(reader: Registry | SqliteReader, with_tags: bool) -> dict[str, object]:
    """What `versions linear`, `audit`, `audit --at` and `tags` (now and --at) read from a registry."""
    answers: dict[str, object] = {
        "versions": [(v.snapshot.digest, v.active, v.snapshot.valid)
                     for v in queries.versions(reader, "linear").versions],  # type: ignore[arg-type]
        "audit": [(e.time, e.actor, e.action, e.model, e.digest, e.outcome, e.duration_ms, e.message, e.host)
                  for e in reader.query_audit(AuditQuery(limit=100))],
        "at-15": sorted((r.model, r.digest, r.versions, r.since) for r in reader.serving_at(fx.t(15))),
        "at-25": sorted((r.model, r.digest) for r in reader.serving_at(fx.t(25))),
    }
    if with_tags:
        answers["tags"] = [(t.model, t.name, t.digest, t.moved_by, t.moved_at) for t in reader.list_tags()]
        answers["tags-at-20"] = [(t.model, t.name, t.digest) for t in reader.tags_at(fx.t(20))]
        answers["tracks"] = reader.tracks()
    return answers


def _expected(revision: str) -> dict[str, object]:
    rows = fx.rows()
    expected: dict[str, object] = {
        # newest content first (first seen); D2 active again after the rollback
        "versions": [(fx.D3, False, True), (fx.D2, True, True), (fx.D1, False, True)],
        "audit": [(r["time"], r["actor"], r["action"], r["model"], r["digest"], r["outcome"], r["duration_ms"],
                   r["message"], r["host"]) for r in reversed(rows["audit_events"])],
        "at-15": [("linear", fx.D2, [1], fx.t(10.1)), ("pipeline", fx.DE, [1], fx.t(2))],
        "at-25": [("linear", fx.D3), ("pipeline", fx.DE)],
    }
    if revision >= "0005":
        expected["tags"] = [("linear", "stable", fx.D2, "ann", fx.t(35))]
        expected["tags-at-20"] = [("linear", "stable", fx.D1)]
        expected["tracks"] = {"pipeline": "stable"}
    return expected


@pytest.mark.parametrize("revision", fx.RELEASED)
def test_a_registry_of_each_revision_upgrades_with_every_row(revision: str, db_url: str) -> None:
    written = fx.build(db_url, revision)
    registry = Registry(db_url)
    try:
        assert migrate.upgrade(registry) == (revision, migrate.HEAD_REVISION)
        counts = fx.table_counts(db_url)
        for table, count in written.items():
            assert counts[table] == count, table
        if revision < "0007":  # filled from each model's newest snapshot, not trusted
            with registry.engine.connect() as conn:
                signatures = conn.execute(sa.text(
                    "SELECT model, signature, digest, steps, trusted FROM source_signatures ORDER BY model")).all()
            assert [(m, s, d, json.loads(st) if st else None, bool(tr)) for m, s, d, st, tr in signatures] == [
                ("linear", None, fx.D2, None, False), ("pipeline", None, fx.DE, ["linear", "post"], False)]
            with registry.session() as session:  # a datetime, as the DateTime column writes it
                assert session.get(schema.SourceSignature, "linear").recorded_at == fx.t(40)  # type: ignore[union-attr]
        assert _answers(registry, revision >= "0005") == _expected(revision)
        # and the new code writes beside the old rows (PostgreSQL's sequences carry on after them)
        registry.record_snapshot("linear", "f" * 64, "[]", config=None, versions=[1], served_versions=[1],
                                 valid=True, problems=[], total_bytes=3 * 2**30)
        registry.move_tag("linear", "canary", "f" * 64, actor="ann")
    finally:
        registry.close()
    path = fx.sqlite_file(db_url)
    if path is not None:  # the CLI's reader (sqlite3, no SQLAlchemy) answers the same
        reader = SqliteReader(path)
        try:
            answers = _answers(reader, True)
            assert answers["audit"][1:] == _expected(revision)["audit"]  # type: ignore[index]
            assert answers["at-15"] == _expected(revision)["at-15"]
        finally:
            reader.close()


def test_the_0007_backfill_goes_in_batches_over_many_models(tmp_path: Path) -> None:
    """More models than one batch of the source_signatures backfill: each gets its newest snapshot."""
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    module = _migration_module("0007_source_signatures")
    fx.build(url, "0006", bulk_models=module.BATCH * 2 + 7)
    registry = Registry(url)
    try:
        migrate.upgrade(registry)
        signatures = registry.source_index()
        assert len(signatures) == module.BATCH * 2 + 7 + 2  # type: ignore[attr-defined]
        assert signatures["linear"].digest == fx.D2
        assert signatures[f"bulk-{module.BATCH:05d}"].digest == f"{module.BATCH:064x}"  # type: ignore[attr-defined]
    finally:
        registry.close()


def _migration_module(name: str) -> object:
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, ROOT / "migrations" / "versions" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_a_failed_sqlite_migration_leaves_the_registry_byte_for_byte(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    url = f"sqlite:///{state / 'registry.db'}"
    fx.build(url, "0005")
    fx.break_migration_0008(url)
    before = _files(state)
    assert list(before) == ["registry.db"]  # no WAL left: the last connection checkpointed
    registry = Registry(url)
    try:
        with pytest.raises(MigrationError) as caught:
            migrate.upgrade(registry)  # 0006 and 0007 run first, in the same transaction
    finally:
        registry.close()
    backup = state / "registry.db.before-0005"
    assert str(caught.value) == (
        "registry: migration 0008_footprints failed: (sqlite3.OperationalError) table footprints already exists; "
        f"the registry is unchanged at 0005; its copy from before the upgrade is {backup}")
    after = _files(state)
    assert after.pop("registry.db.before-0005")
    assert after == before
    copy = sqlite3.connect(backup)
    try:
        assert copy.execute("SELECT version_num FROM alembic_version").fetchall() == [("0005",)]
        assert copy.execute("SELECT count(*) FROM audit_events").fetchone() == (8,)
    finally:
        copy.close()


@pytest.mark.postgres
def test_a_failed_postgresql_migration_stays_at_the_revision_before_it(pg_url: str) -> None:
    written = fx.build(pg_url, "0005")
    fx.break_migration_0008(pg_url)
    registry = Registry(pg_url)
    try:
        with pytest.raises(MigrationError, match="migration 0008_footprints failed: .*the registry stays at 0007"):
            migrate.upgrade(registry)
        assert migrate.current_revision(registry) == "0007"
        counts = fx.table_counts(pg_url)
        assert {table: counts[table] for table in written} == written
        with registry.engine.begin() as conn:  # the cause removed, the next upgrade carries on from 0007
            conn.execute(sa.text("DROP TABLE footprints"))
        assert migrate.upgrade(registry) == ("0007", migrate.HEAD_REVISION)
        assert _answers(registry, True) == _expected("0005")
    finally:
        registry.close()


def test_db_upgrade_dry_run_says_what_would_run_and_changes_nothing(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    fx.build(f"sqlite:///{state / 'registry.db'}", "0007")
    before = _files(state)
    result = invoke(["db", "upgrade", "--dry-run", "--state-dir", str(state)])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines() == [
        "from: 0007", "to: 0012",
        "would run: 0008 footprints: each deployed digest's memory footprint, measured at load or declared by the "
        "model.",
        "would run: 0009 placements: where the fleet loaded each on-demand model, the leases that hold it, each "
        "host's budget.",
        "would run: 0010 rollout bakes: a fleet rollout's wave bakes on the figures its hosts read from their own "
        "tritonservers.",
        "would run: 0011 tokens: personal tokens of the control API, and the claimed actor beside the authenticated "
        "one.",
        "would run: 0012 completed configs: the config Triton serves for a content its python model completes at "
        "load."]
    assert _files(state) == before
    document = json.loads(invoke(["db", "upgrade", "--dry-run", "--json", "--state-dir", str(state)]).stdout)
    assert (document["from"], document["to"], [m["revision"] for m in document["migrations"]],
            document["dry_run"]) == ("0007", "0012", ["0008", "0009", "0010", "0011", "0012"], True)

    result = invoke(["db", "upgrade", "--json", "--state-dir", str(state)])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["backup"] == str(state / "registry.db.before-0007")
    assert [m["revision"] for m in document["migrations"]] == ["0008", "0009", "0010", "0011", "0012"]
    result = invoke(["db", "upgrade", "--dry-run", "--state-dir", str(state)])
    assert result.stdout.splitlines() == ["from: 0012", "to: 0012", "migrations: none, the schema is current"]

    fresh = tmp_path / "fresh"
    result = invoke(["db", "upgrade", "--dry-run", "--json", "--state-dir", str(fresh)])
    assert json.loads(result.stdout)["from"] is None
    assert len(json.loads(result.stdout)["migrations"]) == len(migrate.pending(None))
    assert not fresh.exists()  # a dry run creates nothing


def test_db_upgrade_failure_is_one_line_and_exit_2(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    fx.build(f"sqlite:///{state / 'registry.db'}", "0006")
    fx.break_migration_0008(f"sqlite:///{state / 'registry.db'}")
    result = invoke(["db", "upgrade", "--state-dir", str(state)])
    assert_one_line_error(result, 2, "migration 0008_footprints failed", str(state / "registry.db.before-0006"))


@pytest.mark.triton  # it starts a daemon (which stops at the migration, before tritonserver)
def test_the_daemon_refuses_to_start_on_a_failed_migration(tmp_path: Path) -> None:
    """The daemon migrates before it reaches tritonserver: a failed migration stops it there, one line,
    exit 2, the registry as it was (its copy beside it)."""
    state, repo = tmp_path / "state", tmp_path / "repo"
    state.mkdir()
    repo.mkdir()
    url = f"sqlite:///{state / 'registry.db'}"
    fx.build(url, "0006")
    fx.break_migration_0008(url)
    before = (state / "registry.db").read_bytes()
    proc = subprocess.run(
        [sys.executable, "-m", "cli.main", "daemon", "--repository", str(repo), "--state-dir", str(state),
         "--triton-url", "127.0.0.1:9"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert errors == [f"error: registry: migration 0008_footprints failed: (sqlite3.OperationalError) table "
                      f"footprints already exists; the registry is unchanged at 0006; its copy from before the "
                      f"upgrade is {state / 'registry.db.before-0006'}"], proc.stderr
    assert "Traceback" not in proc.stderr
    assert "copied the registry to" in proc.stderr  # the daemon says it took the copy
    assert (state / "registry.db").read_bytes() == before



def test_a_registry_from_a_newer_release_is_refused_in_one_line(tmp_path: Path) -> None:
    """A schema revision this tritonctl does not know (a newer release upgraded it): one line, nothing done."""
    state = tmp_path / "state"
    state.mkdir()
    url = f"sqlite:///{state / 'registry.db'}"
    fx.build(url, migrate.HEAD_REVISION)
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = '9999'"))
    engine.dispose()
    for args in (["db", "upgrade"], ["db", "upgrade", "--dry-run"]):
        assert_one_line_error(invoke([*args, "--state-dir", str(state)]), 1,
                              "registry schema is at 9999, which this tritonctl does not know")
    assert sorted(p.name for p in state.iterdir()) == ["registry.db"]


def test_the_leftovers_of_an_earlier_releases_failed_upgrade_are_taken_back(db_url: str) -> None:
    """The release before this one could fail in 0007 (on SQLite) and leave 0006's tables behind with the
    registry still at 0005; every later start then failed on `table webhook_outbox already exists`. Those
    empty tables are taken back and the upgrade goes through with every row."""
    written = fx.build(db_url, "0005")
    engine = sa.create_engine(db_url)
    with engine.begin() as conn:  # 0006's DDL, as the interrupted upgrade committed it
        conn.execute(sa.text("CREATE TABLE webhook_outbox (id INTEGER NOT NULL PRIMARY KEY, audit_id INTEGER NOT NULL, "
                             "created_at TIMESTAMP NOT NULL)"))
        conn.execute(sa.text("CREATE TABLE webhook_deliveries (id VARCHAR(32) NOT NULL PRIMARY KEY)"))
        conn.execute(sa.text("CREATE INDEX ix_webhook_deliveries_created ON webhook_deliveries (id)"))
    engine.dispose()
    registry = Registry(db_url)
    try:
        assert migrate.upgrade(registry) == ("0005", migrate.HEAD_REVISION)
        counts = fx.table_counts(db_url)
        assert {table: counts[table] for table in written} == written
        assert _answers(registry, True) == _expected("0005")
    finally:
        registry.close()
