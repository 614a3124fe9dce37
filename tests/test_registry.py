"""Registry semantics: one row per content, atomic deployment ends, an append-only audit log, what
served when, and migrations that build exactly the ORM's schema.

One suite, run on both registry backends: a real SQLite file in a temp dir and a fresh database on the
session's real PostgreSQL server (tests/pg.py; that parameter skips, with the reason, only where
PostgreSQL or psycopg is not installed; CI installs both), migrated with the project's Alembic
migrations as the daemon does.
Time is a settable clock (tests/clock.py) passed to the registry, so "when" questions have exact answers.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from controlplane.errors import NotFoundError, StoreError, UsageError
from controlplane.runtime import garbage
from controlplane.snapshot import ContentStore
from controlplane.store import migrate
from controlplane.store.batches import DeploymentEnd, DeploymentIntent
from controlplane.store.records import DeploymentRecord, ServingRecord
from controlplane.store.registry import AuditEntry, AuditQuery, Registry
from controlplane.store.schema import Base
from tests.clock import Clock

T0 = datetime(2026, 11, 1, 12, 0, 0)
D1, D2, D3 = "a" * 64, "b" * 64, "c" * 64


@pytest.fixture
def clock() -> Clock:
    return Clock(T0)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty registry database: a SQLite file, or a fresh database on the real PostgreSQL server."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'registry.db'}"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def registry(db_url: str, clock: Clock) -> Iterator[Registry]:
    reg = Registry(db_url, host="h1", clock=clock)
    migrate.upgrade(reg)
    yield reg
    reg.close()


def record(reg: Registry, model: str, digest: str, valid: bool = True, manifest: str = "{}") -> tuple[object, bool]:
    return reg.record_snapshot(model, digest, manifest, config=None, versions=[1], served_versions=[1],
                               valid=valid, problems=[], total_bytes=10)


def deploy(reg: Registry, model: str, digest: str | None, *, kind: str = "deploy", outcome: str = "ok",
           serve: bool = True, actor: str = "alice", versions: list[int] | None = None) -> int:
    """A deployment from intent to end, as the deployer records it."""
    current = reg.find_model(model)
    dep = reg.begin_deployment(model, kind, digest, current.active_digest if current else None, actor)
    reg.advance(dep.id, "publish")
    serving = ServingRecord(model, digest, versions if versions is not None else [1]) if serve else None
    reg.finish_deployment(dep.id, outcome=outcome, error=None if outcome == "ok" else "boom",
                          audit=AuditEntry(actor, kind, model, digest, outcome, f"{kind} {outcome}"),
                          serving=serving, model_state="serving")
    return dep.id


def rows(reg: Registry, table: str) -> list[tuple[object, ...]]:
    with reg.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(f"SELECT * FROM {table} ORDER BY id"))]


# --- snapshots -------------------------------------------------------------------------------------


def test_a_page_of_models_is_cut_and_counted_in_sql(registry: Registry) -> None:
    """The web view's overview (ControlPlane.status_page): names by name, how many match, a part of the
    name matched literally (`_` is no wildcard), a state filter."""
    for name in ("gamma", "alpha", "alphax2", "alpha_2", "beta", "delta"):
        registry.ensure_model(name)
    registry.update_model("beta", state="unloaded")
    record(registry, "alpha", D1)
    deploy(registry, "alpha", D1)
    assert registry.model_page(limit=2) == (6, ["alpha", "alpha_2"])
    assert registry.model_page(offset=4, limit=2) == (6, ["delta", "gamma"])
    assert registry.model_page(offset=6, limit=2) == (6, [])
    assert registry.model_page(name_contains="ha_2") == (1, ["alpha_2"])
    assert registry.model_page(name_contains="ALPH") == (3, ["alpha", "alpha_2", "alphax2"])
    assert registry.model_page(state="unloaded") == (1, ["beta"])
    assert registry.model_states() == ["new", "serving", "unloaded"]
    assert registry.active_digests() == {"alpha": D1, "alpha_2": None, "alphax2": None, "beta": None,
                                         "gamma": None, "delta": None}
    assert [m.name for m in registry.list_models(names=["gamma", "beta", "nope"])] == ["beta", "gamma"]


def test_same_content_twice_is_one_snapshot_and_updates_last_seen(registry: Registry, clock: Clock) -> None:
    first, new = record(registry, "linear", D1)
    assert new is True
    clock.advance(hours=3)
    again, new_again = record(registry, "linear", D1)
    assert new_again is False
    assert len(registry.list_snapshots("linear")) == 1
    assert again.first_seen == T0 and again.last_seen == T0 + timedelta(hours=3)  # type: ignore[attr-defined]
    stored = registry.get_snapshot("linear", D1)
    assert (stored.first_seen, stored.last_seen) == (T0, T0 + timedelta(hours=3))


def test_same_digest_under_two_models_is_two_snapshots(registry: Registry) -> None:
    record(registry, "linear", D1)
    record(registry, "reshape", D1)
    assert [s.model for s in registry.list_snapshots("linear")] == ["linear"]
    assert [s.model for s in registry.list_snapshots("reshape")] == ["reshape"]


def test_content_seen_again_after_gc_is_no_longer_collected(registry: Registry) -> None:
    record(registry, "linear", D1)
    registry.mark_collected("linear", [D1])
    assert registry.get_snapshot("linear", D1).collected
    record(registry, "linear", D1)
    assert not registry.get_snapshot("linear", D1).collected


def test_snapshots_list_newest_first_and_resolve_by_unique_prefix(registry: Registry, clock: Clock) -> None:
    record(registry, "linear", D1)
    clock.advance(minutes=1)
    record(registry, "linear", "ab" + "0" * 62)
    clock.advance(minutes=1)
    record(registry, "linear", D2)
    assert [s.digest[:2] for s in registry.list_snapshots("linear")] == ["bb", "ab", "aa"]
    assert registry.get_snapshot("linear", "bbbbbb").digest == D2
    with pytest.raises(UsageError, match="ambiguous"):
        registry.get_snapshot("linear", "a")
    with pytest.raises(NotFoundError):
        registry.get_snapshot("linear", "dddddd")


# --- deployments -----------------------------------------------------------------------------------


def test_finish_deployment_writes_end_active_digest_serving_log_and_audit(registry: Registry, clock: Clock) -> None:
    record(registry, "linear", D1)
    dep = registry.begin_deployment("linear", "deploy", D1, None, "alice")
    assert [d.id for d in registry.open_deployments()] == [dep.id]
    assert registry.open_deployments()[0].step == "intent"
    end = clock.advance(seconds=5)
    done = registry.finish_deployment(
        dep.id, outcome="ok", error=None, audit=AuditEntry("alice", "deploy", "linear", D1, "ok", "deployed", 5000),
        serving=ServingRecord("linear", D1, [1, 2]), model_state="serving",
    )
    assert (done.step, done.outcome, done.finished_at) == ("done", "ok", end)
    assert registry.open_deployments() == []
    model = registry.get_model("linear")
    assert (model.active_digest, model.active_since, model.state, model.last_error) == (D1, end, "serving", None)
    [serving] = registry.serving_history("linear")
    assert (serving.digest, serving.versions, serving.since, serving.host) == (D1, [1, 2], end, "h1")
    [event] = registry.query_audit(AuditQuery(model="linear"))
    assert (event.time, event.actor, event.action, event.digest, event.outcome, event.duration_ms, event.host) == (
        end, "alice", "deploy", D1, "ok", 5000, "h1")


def test_finish_deployment_is_all_or_nothing(registry: Registry, clock: Clock) -> None:
    """If any write of the end fails (here: the audit row violates NOT NULL), none of them lands."""
    record(registry, "linear", D1)
    deploy(registry, "linear", D1)
    record(registry, "linear", D2)
    dep = registry.begin_deployment("linear", "deploy", D2, D1, "alice")
    before = {t: rows(registry, t) for t in ("models", "serving_log", "audit_events")}
    clock.advance(minutes=1)
    broken_audit = AuditEntry("alice", "deploy", "linear", D2, None, "x")  # type: ignore[arg-type]
    with pytest.raises(StoreError, match="NOT NULL|null value"):  # SQLite's words, PostgreSQL's
        registry.finish_deployment(dep.id, outcome="ok", error=None, audit=broken_audit,
                                   serving=ServingRecord("linear", D2, [1]), model_state="serving")
    assert {t: rows(registry, t) for t in before} == before
    assert [d.id for d in registry.open_deployments()] == [dep.id]
    assert registry.get_model("linear").active_digest == D1


def test_failed_deployment_keeps_what_serves(registry: Registry, clock: Clock) -> None:
    record(registry, "linear", D1)
    deploy(registry, "linear", D1)
    since = registry.get_model("linear").active_since
    clock.advance(minutes=5)
    deploy(registry, "linear", D2, outcome="rolled_back", serve=False)
    model = registry.get_model("linear")
    assert (model.active_digest, model.active_since, model.last_error) == (D1, since, "boom")
    assert len(registry.serving_history("linear")) == 1
    assert registry.last_deployment("linear").outcome == "rolled_back"  # type: ignore[union-attr]


def test_redeploying_the_active_digest_keeps_its_since(registry: Registry, clock: Clock) -> None:
    deploy(registry, "linear", D1)
    since = registry.get_model("linear").active_since
    clock.advance(hours=1)
    deploy(registry, "linear", D1)
    assert registry.get_model("linear").active_since == since
    assert len(registry.serving_history("linear")) == 2  # the reload is still logged


def test_deployments_begun_advanced_and_ended_in_batches_are_recorded_as_one_by_one(registry: Registry,
                                                                                    clock: Clock) -> None:
    """A first start's deploys (controlplane/deploy/staged.py) write their rows many to a transaction: each
    deployment still gets its own intent, steps, end, serving-log row and audit event, as the one-at-a-time
    methods write them; a model's active digest keeps its `since` when the same digest is deployed again."""
    for model in ("a", "b", "c"):
        record(registry, model, D1)
    deploy(registry, "c", D1)
    since_c = registry.get_model("c").active_since
    clock.advance(minutes=1)
    begun = registry.begin_deployments([DeploymentIntent("a", "deploy", D1, None, "watcher"),
                                        DeploymentIntent("b", "deploy", D1, None, "watcher"),
                                        DeploymentIntent("c", "deploy", D1, D1, "watcher"),
                                        DeploymentIntent("fresh", "deploy", D2, None, "watcher")])
    assert [(d.model, d.step, d.previous_digest, d.started_at) for d in begun] == [
        ("a", "intent", None, T0 + timedelta(minutes=1)), ("b", "intent", None, T0 + timedelta(minutes=1)),
        ("c", "intent", D1, T0 + timedelta(minutes=1)), ("fresh", "intent", None, T0 + timedelta(minutes=1))]
    assert registry.get_model("fresh").state == "new"  # its model row made, as begin_deployment makes it
    registry.advance_all([d.id for d in begun[:3]], "loaded")
    assert {d.model: d.step for d in registry.open_deployments()} == {"a": "loaded", "b": "loaded", "c": "loaded",
                                                                      "fresh": "intent"}
    end = clock.advance(seconds=5)

    def ended(d: DeploymentRecord, outcome: str, serving: ServingRecord | None, state: str) -> DeploymentEnd:
        error = None if outcome == "ok" else "boom"
        return DeploymentEnd(d.id, outcome, error, AuditEntry("watcher", "deploy", d.model, d.digest, outcome,
                                                              f"{d.model} {outcome}", 5), serving, state)

    registry.finish_deployments([ended(begun[0], "ok", ServingRecord("a", D1, [1]), "serving"),
                                 ended(begun[1], "failed", None, "failed"),
                                 ended(begun[2], "ok", ServingRecord("c", D1, [1, 2]), "serving"),
                                 ended(begun[3], "ok", ServingRecord("fresh", D2, [3]), "serving")])
    assert registry.open_deployments() == []
    models = {m: registry.get_model(m) for m in ("a", "b", "c", "fresh")}
    assert {m: (r.state, r.active_digest, r.active_since, r.last_error) for m, r in models.items()} == {
        "a": ("serving", D1, end, None), "b": ("failed", None, None, "boom"), "c": ("serving", D1, since_c, None),
        "fresh": ("serving", D2, end, None)}
    last = registry.last_deployments(["a", "b"])
    assert {m: (d.step, d.outcome, d.finished_at, d.error) for m, d in last.items()} == {
        "a": ("done", "ok", end, None), "b": ("done", "failed", end, "boom")}
    assert [(s.digest, s.versions, s.since) for s in registry.serving_history("c")][0] == (D1, [1, 2], end)
    assert registry.serving_history("b") == []
    events = registry.query_audit(AuditQuery(action="deploy", since=end))
    assert sorted((e.model, e.outcome, e.message, e.host) for e in events) == [
        ("a", "ok", "a ok", "h1"), ("b", "failed", "b failed", "h1"), ("c", "ok", "c ok", "h1"),
        ("fresh", "ok", "fresh ok", "h1")]
    with pytest.raises(NotFoundError):
        registry.finish_deployments([ended(replace(begun[0], id=99999), "ok", None, "serving")])


def test_snapshots_are_read_many_at_once_and_their_content_is_kept(registry: Registry) -> None:
    record(registry, "a", D1)
    record(registry, "b", D1)
    record(registry, "b", D2)
    found = registry.snapshots([("a", D1), ("b", D2), ("a", D2), ("nope", D1)])
    assert {k: (s.model, s.digest) for k, s in found.items()} == {("a", D1): ("a", D1), ("b", D2): ("b", D2)}
    assert ("content", "b", D2) in registry.contents._values  # the bake settings' read is no transaction
    assert set(registry.ensure_models(["a", "new1", "new1"])) == {"a", "new1"}
    assert registry.get_model("new1").state == "new"


def test_audit_query_filters_and_orders_newest_first(registry: Registry, clock: Clock) -> None:
    for i, (model, outcome) in enumerate([("a", "ok"), ("b", "failed"), ("a", "rolled_back"), ("b", "ok")]):
        clock.advance(minutes=1)
        registry.audit(AuditEntry("bob" if i % 2 else "alice", "deploy", model, D1, outcome, f"event {i}"))
    events = registry.query_audit(AuditQuery())
    assert [e.message for e in events] == ["event 3", "event 2", "event 1", "event 0"]
    assert [e.message for e in registry.query_audit(AuditQuery(model="a"))] == ["event 2", "event 0"]
    assert [e.outcome for e in registry.query_audit(AuditQuery(actor="bob"))] == ["ok", "failed"]
    window = registry.query_audit(AuditQuery(since=T0 + timedelta(minutes=2), until=T0 + timedelta(minutes=3)))
    assert [e.message for e in window] == ["event 2", "event 1"]
    assert len(registry.query_audit(AuditQuery(limit=1))) == 1


def test_quarantine_is_recorded_and_counted(registry: Registry) -> None:
    record(registry, "linear", D1)
    registry.set_quarantine("linear", D1, "weights missing")
    assert registry.count_quarantined() == 1
    assert registry.get_snapshot("linear", D1).quarantine_reason == "weights missing"


def test_audit_messages_are_stored_on_one_line(registry: Registry) -> None:
    registry.audit(AuditEntry("bob", "policy", "linear", None, "ok", "policy\nmanual\t now"))
    assert registry.query_audit(AuditQuery())[0].message == "policy manual now"


# --- append-only audit and serving log -------------------------------------------------------------


def test_no_operation_updates_or_deletes_audit_or_serving_rows(registry: Registry, clock: Clock,
                                                               tmp_path: Path) -> None:
    """Every statement the registry sends during a full life cycle, gc included, is watched: audit_events
    and serving_log only ever see INSERTs, and rows written early are unchanged at the end."""
    statements: list[str] = []
    sa.event.listen(registry.engine, "before_cursor_execute",
                    lambda conn, cursor, stmt, params, context, executemany: statements.append(stmt))
    record(registry, "linear", D1)
    registry.audit(AuditEntry("watcher", "snapshot", "linear", D1, "ok", "recorded"))
    deploy(registry, "linear", D1)
    early_audit, early_serving = rows(registry, "audit_events"), rows(registry, "serving_log")
    for digest in (D2, D3):
        clock.advance(minutes=10)
        record(registry, "linear", digest)
        deploy(registry, "linear", digest)
    registry.update_model("linear", policy="manual", pinned=True, last_error="x")
    registry.set_quarantine("linear", D2, "smoke failed")
    deploy(registry, "linear", None, kind="unload", versions=[])
    store = ContentStore(tmp_path / "store", fsync=False)
    result = garbage.collect_garbage(registry, store, keep=0)
    assert result.snapshots_removed == 3

    for table in ("audit_events", "serving_log"):
        touching = [s for s in statements if table in s and not s.lstrip().upper().startswith(("SELECT", "INSERT"))]
        assert touching == [], f"{table} must be append-only"
    assert rows(registry, "audit_events")[: len(early_audit)] == early_audit
    assert rows(registry, "serving_log")[: len(early_serving)] == early_serving
    assert len(rows(registry, "audit_events")) == 5
    assert all(s.collected for s in registry.list_snapshots("linear"))
    assert len(registry.list_snapshots("linear")) == 3  # gc drops content, never the history rows


def test_registry_offers_no_way_to_change_audit_rows() -> None:
    public = {name for name in dir(Registry) if not name.startswith("_")}
    assert not {n for n in public if any(w in n for w in ("delete", "remove", "purge", "truncate"))}
    assert not {n for n in public if "audit" in n and n not in ("audit", "query_audit")}


def test_gc_keeps_the_active_and_newest_snapshots(registry: Registry, clock: Clock, tmp_path: Path) -> None:
    for digest in (D1, D2, D3):
        clock.advance(minutes=1)
        record(registry, "linear", digest)
    deploy(registry, "linear", D1)  # the oldest one serves
    store = ContentStore(tmp_path / "store", fsync=False)
    result = garbage.collect_garbage(registry, store, keep=1)
    assert (result.snapshots_removed, result.snapshots_kept) == (1, 2)
    collected = {s.digest: s.collected for s in registry.list_snapshots("linear")}
    assert collected == {D3: False, D2: True, D1: False}
    with pytest.raises(UsageError):
        garbage.collect_garbage(registry, store, keep=-1)


# --- what served when --------------------------------------------------------------------------------


def test_serving_at_picks_each_models_digest_at_each_time(registry: Registry, clock: Clock) -> None:
    t1 = clock.at(T0 + timedelta(hours=1)).now
    deploy(registry, "linear", D1, versions=[1])
    t2 = clock.at(T0 + timedelta(hours=2)).now
    deploy(registry, "reshape", D3)
    t3 = clock.at(T0 + timedelta(hours=3)).now
    deploy(registry, "linear", D2, versions=[1, 2])
    clock.at(T0 + timedelta(hours=4))
    deploy(registry, "linear", D2, outcome="rolled_back", serve=False)  # no serving change
    t5 = clock.at(T0 + timedelta(hours=5)).now
    deploy(registry, "reshape", None, kind="unload", versions=[])

    def served(when: datetime, models: list[str] | None = None) -> dict[str, str | None]:
        return {r.model: r.digest for r in registry.serving_at(when, models)}

    assert served(T0) == {}
    assert served(t1 - timedelta(microseconds=1)) == {}
    assert served(t1) == {"linear": D1}  # a change counts from its own instant
    assert served(t2 + timedelta(minutes=30)) == {"linear": D1, "reshape": D3}
    assert served(t3) == {"linear": D2, "reshape": D3}
    assert served(t5 - timedelta(seconds=1)) == {"linear": D2, "reshape": D3}
    assert served(t5) == {"linear": D2}  # unloaded: nothing served from then on
    assert served(t5, ["reshape"]) == {}
    assert served(t3, ["reshape", "unknown"]) == {"reshape": D3}
    [linear] = registry.serving_at(t3 + timedelta(hours=10), ["linear"])
    assert (linear.versions, linear.since) == ([1, 2], t3)


def test_serving_at_breaks_same_instant_ties_by_insertion_order(registry: Registry) -> None:
    deploy(registry, "linear", D1)
    deploy(registry, "linear", D2)  # same clock reading
    assert [r.digest for r in registry.serving_at(T0)] == [D2]


def test_serving_at_agrees_with_a_plain_reading_of_the_log(registry: Registry, clock: Clock) -> None:
    """Random deploys and unloads of three models (some at the same instant); at many moments the
    registry's answer equals the last logged change at or before that moment, per model."""
    import random

    rng = random.Random(7)
    log: list[tuple[datetime, int, str, str | None]] = []
    for i in range(120):
        if rng.random() < 0.7:
            clock.advance(seconds=rng.choice([1, 1, 30, 600]))
        model = rng.choice(["a", "b", "c"])
        digest = None if rng.random() < 0.15 else rng.choice([D1, D2, D3])
        deploy(registry, model, digest, kind="unload" if digest is None else "deploy")
        log.append((clock.now, i, model, digest))
    for _ in range(60):
        when = T0 + timedelta(seconds=rng.uniform(-60, (clock.now - T0).total_seconds() + 60))
        expected: dict[str, str | None] = {}
        for at, _, model, digest in sorted(log):
            if at <= when:
                expected[model] = digest
        wanted = {m: d for m, d in expected.items() if d is not None}
        assert {r.model: r.digest for r in registry.serving_at(when)} == wanted
        assert {r.model: r.digest for r in registry.serving_at(when, ["b", "zz"])} == {
            m: d for m, d in wanted.items() if m == "b"}


# --- migrations --------------------------------------------------------------------------------------


def test_upgrade_on_an_empty_database_creates_every_table(db_url: str) -> None:
    reg = Registry(db_url)
    try:
        assert migrate.current_revision(reg) is None
        before, after = migrate.upgrade(reg)
        assert (before, after) == (None, migrate.head_revision())
        tables = set(sa.inspect(reg.engine).get_table_names())
        assert tables == set(Base.metadata.tables) | {"alembic_version"}
        assert migrate.upgrade(reg) == (after, after)  # idempotent
    finally:
        reg.close()


def test_migrated_schema_matches_the_orm_exactly(db_url: str) -> None:
    """Alembic's autogenerate comparison finds nothing to add, drop or alter: the migrations and
    `schema.py` describe the same tables, columns, types, nullability and indexes."""
    reg = Registry(db_url)
    try:
        migrate.upgrade(reg)
        with reg.engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            differences = compare_metadata(context, Base.metadata)
        assert differences == []
    finally:
        reg.close()


def test_downgrade_to_base_and_back(db_url: str) -> None:
    from alembic import command

    reg = Registry(db_url)
    try:
        migrate.upgrade(reg)
        config = migrate._config()
        with reg.engine.begin() as conn:
            config.attributes["connection"] = conn
            command.downgrade(config, "base")
        assert set(sa.inspect(reg.engine).get_table_names()) <= {"alembic_version"}
        migrate.upgrade(reg)
        assert set(sa.inspect(reg.engine).get_table_names()) == set(Base.metadata.tables) | {"alembic_version"}
    finally:
        reg.close()


def test_open_existing_refuses_a_missing_sqlite_file(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError, match="db upgrade"):
        migrate.open_existing(f"sqlite:///{tmp_path / 'missing.db'}")


def test_open_existing_refuses_an_unmigrated_registry(db_url: str) -> None:
    empty = Registry(db_url)
    empty.engine.connect().close()  # creates the SQLite file; the PostgreSQL database exists already
    empty.close()
    with pytest.raises(StoreError, match="no schema"):
        migrate.open_existing(db_url)
