"""The registry on a real PostgreSQL server: migrations, the registry's semantics, and the daemon end
to end with `--db-url postgresql+psycopg://...`.

The server is the session's throwaway cluster (tests/pg.py); every test gets a database of its own.
Where PostgreSQL is not installed these tests skip with the reason; CI (.ci/run) installs it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from controlplane.errors import StoreError
from controlplane.store import migrate
from controlplane.store.records import ServingRecord
from controlplane.store.registry import AuditEntry, AuditQuery, Registry
from controlplane.store.schema import Base
from tests.harness import DaemonProcess, infer_gen, wait_for, write_gen_model

T0 = datetime(2026, 11, 1, 12, 0, 0)
D1, D2, D3 = "a" * 64, "b" * 64, "c" * 64


class Clock:
    def __init__(self, start: datetime) -> None:
        self.now = start

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **delta: float) -> datetime:
        self.now += timedelta(**delta)
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock(T0)
    monkeypatch.setattr("controlplane.store.registry.utcnow", fake)
    return fake


@pytest.fixture
def registry(pg_url: str, clock: Clock) -> Iterator[Registry]:
    reg = Registry(pg_url, host="h1")
    migrate.upgrade(reg)
    yield reg
    reg.close()


def record(reg: Registry, model: str, digest: str, total_bytes: int = 10) -> tuple[object, bool]:
    return reg.record_snapshot(model, digest, "{}", config=None, versions=[1], served_versions=[1], valid=True,
                               problems=[], total_bytes=total_bytes)


def deploy(reg: Registry, model: str, digest: str, outcome: str = "ok", serve: bool = True) -> int:
    current = reg.find_model(model)
    dep = reg.begin_deployment(model, "deploy", digest, current.active_digest if current else None, "alice")
    reg.advance(dep.id, "publish")
    reg.finish_deployment(dep.id, outcome=outcome, error=None if outcome == "ok" else "boom",
                          audit=AuditEntry("alice", "deploy", model, digest, outcome, "deployed"),
                          serving=ServingRecord(model, digest, [1]) if serve else None, model_state="serving")
    return dep.id


def rows(reg: Registry, table: str) -> list[tuple[object, ...]]:
    with reg.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(f"SELECT * FROM {table} ORDER BY id"))]


# --- migrations ------------------------------------------------------------------------------------


def test_upgrade_creates_the_orm_schema_exactly_and_is_idempotent(pg_url: str) -> None:
    reg = Registry(pg_url)
    try:
        assert migrate.current_revision(reg) is None
        assert migrate.upgrade(reg) == (None, migrate.head_revision())
        assert set(sa.inspect(reg.engine).get_table_names()) == set(Base.metadata.tables) | {"alembic_version"}
        with reg.engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            assert compare_metadata(context, Base.metadata) == []
        assert migrate.upgrade(reg) == (migrate.head_revision(), migrate.head_revision())
    finally:
        reg.close()


def test_upgrade_from_0001_keeps_rows_and_widens_sizes(pg_url: str) -> None:
    """A registry created at 0001 (32-bit sizes) upgrades in place; a > 2 GiB model then fits."""
    reg = Registry(pg_url)
    try:
        migrate.upgrade(reg, "0001")
        record(reg, "linear", D1, total_bytes=2**31 - 1)
        with pytest.raises(StoreError, match="out of range"):
            record(reg, "big", D2, total_bytes=5 * 2**30)
        migrate.upgrade(reg)
        record(reg, "big", D2, total_bytes=5 * 2**30)
        assert reg.get_snapshot("big", D2).total_bytes == 5 * 2**30
        assert reg.get_snapshot("linear", D1).total_bytes == 2**31 - 1
    finally:
        reg.close()


def test_downgrade_to_base_and_back(pg_url: str) -> None:
    from alembic import command

    reg = Registry(pg_url)
    try:
        migrate.upgrade(reg)
        config = migrate._config()
        with reg.engine.begin() as conn:
            config.attributes["connection"] = conn
            command.downgrade(config, "base")
        assert set(sa.inspect(reg.engine).get_table_names()) <= {"alembic_version"}
        migrate.upgrade(reg)
        assert migrate.current_revision(reg) == migrate.head_revision()
    finally:
        reg.close()


def test_open_existing_refuses_an_unmigrated_database(pg_url: str) -> None:
    with pytest.raises(StoreError, match="no schema"):
        migrate.open_existing(pg_url)


# --- registry semantics ----------------------------------------------------------------------------


def test_same_content_twice_is_one_snapshot(registry: Registry, clock: Clock) -> None:
    first, new = record(registry, "linear", D1)
    assert new
    clock.advance(minutes=5)
    again, new_again = record(registry, "linear", D1)
    assert not new_again
    assert again.first_seen == T0 and again.last_seen == clock.now  # type: ignore[attr-defined]
    assert len(registry.list_snapshots("linear")) == 1
    assert registry.get_snapshot("linear", D1[:8]).digest == D1


def test_concurrent_first_sight_of_a_model_creates_it_once(registry: Registry) -> None:
    """Several hosts (here threads) meeting a new model at once: one row, no error."""
    errors: list[Exception] = []

    def ensure() -> None:
        try:
            registry.ensure_model("raced")
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=ensure) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert [m.name for m in registry.list_models()] == ["raced"]


def test_finish_deployment_writes_everything_in_one_transaction(registry: Registry, clock: Clock) -> None:
    record(registry, "linear", D1)
    dep = registry.begin_deployment("linear", "deploy", D1, None, "alice")
    end = clock.advance(seconds=5)
    done = registry.finish_deployment(
        dep.id, outcome="ok", error=None, audit=AuditEntry("alice", "deploy", "linear", D1, "ok", "x", 5000),
        serving=ServingRecord("linear", D1, [1, 2]), model_state="serving")
    assert (done.outcome, done.finished_at) == ("ok", end)
    model = registry.get_model("linear")
    assert (model.active_digest, model.active_since, model.state) == (D1, end, "serving")
    [serving] = registry.serving_history("linear")
    assert (serving.digest, serving.versions, serving.host) == (D1, [1, 2], "h1")
    [event] = registry.query_audit(AuditQuery(model="linear"))
    assert (event.time, event.host, event.duration_ms) == (end, "h1", 5000)


def test_finish_deployment_is_all_or_nothing(registry: Registry, clock: Clock) -> None:
    record(registry, "linear", D1)
    deploy(registry, "linear", D1)
    record(registry, "linear", D2)
    dep = registry.begin_deployment("linear", "deploy", D2, D1, "alice")
    before = {t: rows(registry, t) for t in ("models", "serving_log", "audit_events")}
    clock.advance(minutes=1)
    broken = AuditEntry("alice", "deploy", "linear", D2, None, "x")  # type: ignore[arg-type]
    with pytest.raises(StoreError, match="null value"):
        registry.finish_deployment(dep.id, outcome="ok", error=None, audit=broken,
                                   serving=ServingRecord("linear", D2, [1]), model_state="serving")
    assert {t: rows(registry, t) for t in before} == before
    assert [d.id for d in registry.open_deployments()] == [dep.id]
    assert registry.get_model("linear").active_digest == D1


def test_audit_query_filters_and_orders_newest_first(registry: Registry, clock: Clock) -> None:
    for i, (model, outcome) in enumerate([("a", "ok"), ("b", "failed"), ("a", "rolled_back"), ("b", "ok")]):
        clock.advance(minutes=1)
        registry.audit(AuditEntry("bob" if i % 2 else "alice", "deploy", model, D1, outcome, f"event {i}\nline"))
    events = registry.query_audit(AuditQuery())
    assert [e.message for e in events] == ["event 3 line", "event 2 line", "event 1 line", "event 0 line"]
    assert [e.message for e in registry.query_audit(AuditQuery(model="a"))] == ["event 2 line", "event 0 line"]
    assert [e.outcome for e in registry.query_audit(AuditQuery(actor="bob"))] == ["ok", "failed"]
    window = registry.query_audit(AuditQuery(since=T0 + timedelta(minutes=2), until=T0 + timedelta(minutes=3)))
    assert [e.message for e in window] == ["event 2 line", "event 1 line"]
    assert len(registry.query_audit(AuditQuery(limit=1))) == 1


def test_serving_at_answers_each_moment(registry: Registry, clock: Clock) -> None:
    for digest in (D1, D2, D3):
        record(registry, "linear", digest)
    record(registry, "other", D1)
    deploy(registry, "linear", D1)
    t1 = clock.advance(minutes=10)
    deploy(registry, "linear", D2)
    deploy(registry, "other", D1)
    t2 = clock.advance(minutes=10)
    deploy(registry, "linear", D3)

    def at(when: datetime, models: list[str] | None = None) -> dict[str, str]:
        return {s.model: s.digest for s in registry.serving_at(when, models)}

    assert at(T0 - timedelta(seconds=1)) == {}
    assert at(T0) == {"linear": D1}
    assert at(t1) == {"linear": D2, "other": D1}
    assert at(t2) == {"linear": D3, "other": D1}
    assert at(t2, ["other"]) == {"other": D1}


def test_quarantine_and_gc_marks(registry: Registry) -> None:
    record(registry, "linear", D1)
    registry.set_quarantine("linear", D1, "weights missing")
    assert registry.count_quarantined() == 1
    assert registry.get_snapshot("linear", D1).quarantine_reason == "weights missing"
    registry.mark_collected("linear", [D1])
    assert registry.get_snapshot("linear", D1).collected


# --- the daemon end to end -------------------------------------------------------------------------


def test_daemon_deploys_and_rolls_back_with_the_registry_on_postgres(tmp_path: Path, pg_url: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITONCTL_DB_URL", pg_url)  # the harness's in-process CLI reads PostgreSQL too
    repo = tmp_path / "repo"
    write_gen_model(repo, "pgmodel", 1)
    daemon = DaemonProcess(repo, tmp_path / "state", extra_args=["--db-url", pg_url, "--host", "pg-host"]).start()
    try:
        import tritonclient.grpc as grpcclient

        client = grpcclient.InferenceServerClient(daemon.triton_url())

        def serving(gen: int) -> bool:
            try:
                return infer_gen(client, "pgmodel") == gen
            except Exception:  # noqa: BLE001 - not loaded yet
                return False

        wait_for(lambda: serving(1), 60, 0.1, "generation 1")
        first = daemon.model_status("pgmodel")["digest"]
        write_gen_model(repo, "pgmodel", 2)
        wait_for(lambda: serving(2), 30, 0.1, "generation 2")
        # A broken version is rolled back, quarantined and never answers.
        write_gen_model(repo, "pgmodel", 3, init="raise RuntimeError('weights missing')")
        wait_for(lambda: daemon.audit("--model", "pgmodel", "--outcome", "rolled_back"), 30, what="rollback")
        assert serving(2)
        # An operator rollback to the first version.
        back = daemon.json("rollback", "pgmodel", "--to", first[:12])
        assert back["outcome"] == "ok" and back["digest"] == first
        assert serving(1)
        client.close()
        # No registry file was created: everything went to PostgreSQL.
        assert not (tmp_path / "state" / "registry.db").exists()
    finally:
        assert daemon.stop() == 0, daemon.log_tail()
    # Read back with the daemon stopped, through the CLI, from PostgreSQL only.
    nowhere = str(tmp_path / "no-state")
    audit = daemon.cli("audit", "--db-url", pg_url, "--model", "pgmodel", "--json", "--state-dir", nowhere)
    events = json.loads(audit.stdout)
    outcomes = [(e["action"], e["outcome"]) for e in events]
    assert ("rollback", "ok") in outcomes and ("deploy", "rolled_back") in outcomes
    assert outcomes.count(("deploy", "ok")) == 2
    assert {e["host"] for e in events} == {"pg-host"}
    versions = json.loads(daemon.cli("versions", "pgmodel", "--db-url", pg_url, "--json",
                                     "--state-dir", nowhere).stdout)
    assert len(versions) == 3 and sum(v["quarantined"] for v in versions) == 1
    assert [v["digest"] for v in versions if v["active"]] == [first]
    at = json.loads(daemon.cli("audit", "--db-url", pg_url, "--at", "0m", "--json", "--state-dir", nowhere).stdout)
    assert [(m["model"], m["digest"]) for m in at["models"]] == [("pgmodel", first)]
