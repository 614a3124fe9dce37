"""A registry that stops answering, in the small (docs/fleet.md "When the database is down"): what the
registry's health says and logs, and the fleet journal written once when the registry answers again.
The whole fleet through a crashed PostgreSQL is tests/test_fleet_outage_e2e.py.

Against real PostgreSQL servers (tests/pg.py): the crash is `pg_ctl stop -m immediate` of a server of
this module's own (the session's server is shared with other tests).
"""

from __future__ import annotations

import logging
import threading
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from controlplane.errors import StoreError
from controlplane.fleet.journal import Journal
from controlplane.fleet.rollouts import RolloutMachine
from controlplane.fleet.settings import FleetSettings
from controlplane.store import migrate
from controlplane.store.batches import DeploymentEnd, DeploymentIntent
from controlplane.store.fleet import FleetStore, Step, audit_event
from controlplane.store.health import RegistryHealth
from controlplane.store.journaled import JOURNAL_NAME, JournaledRegistry
from controlplane.store.records import AuditEntry, ServingRecord
from controlplane.store.registry import AuditQuery, Registry, utcnow
from tests.harness import wait_for
from tests.pg import PostgresServer, own_postgres  # noqa: F401 - the fixture
from tests.test_storage_faults import small_fs  # noqa: F401 - the fixture


def fill_up(fs: Path) -> Path:
    """A file taking every block the filesystem `fs` has left (unlink it to free them)."""
    filler = fs / "filler"
    with filler.open("wb") as f:
        try:
            while True:
                f.write(b"\0" * (1 << 20))
                f.flush()
        except OSError:
            pass
    return filler


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_an_outage_is_one_warning_a_line_a_minute_at_most_and_one_info(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    health = RegistryHealth("postgresql+psycopg://db/fleet", clock=clock)
    health.on_return.append(lambda length: f"{length:.0f} s handed to the journal")
    caplog.set_level(logging.INFO, logger="tritonctl.store")
    assert health.reachable and not health.quiet() and not health.in_grace(10)
    for _ in range(150):  # 150 s of four threads failing every second
        for _ in range(4):
            health.failed("connection refused")
        clock.now += 1.0
    assert not health.reachable and health.since is not None and health.reason == "connection refused"
    assert health.told(StoreError("registry x: connection refused")) and not health.told(ValueError())
    health.answered()
    health.answered()
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in lines] == ["WARNING", "WARNING", "WARNING", "INFO"], lines
    assert "unreachable: connection refused" in lines[0][1] and "still unreachable after 60 s" in lines[1][1]
    assert lines[-1][1].endswith("reachable again after 150.0 s; 150 s handed to the journal")
    assert health.reachable and health.since is None and health.in_grace(10)
    clock.now += 10.5
    assert not health.in_grace(10)


def test_a_full_disk_that_takes_one_small_write_is_still_an_outage(caplog: pytest.LogCaptureFixture) -> None:
    """A full disk under SQLite takes a small write now and then (WAL space reused): the outage ends only
    when the journal's records are written too, so the log says it once, not once per small write."""
    health = RegistryHealth("sqlite:////full/registry.db", clock=Clock())
    left = [1]

    def replay(_length: float) -> str:
        if left[0]:
            raise StoreError("registry sqlite:////full/registry.db: 1 journal entries not written yet")
        return "1 journal entry written"

    health.on_return.append(replay)
    caplog.set_level(logging.INFO, logger="tritonctl.store")
    health.failed("database or disk is full", reads_end_it=False)
    health.answered(wrote=False)  # it reads
    health.answered()  # a small write committed; the journal's did not
    assert not health.reachable
    left[0] = 0
    health.answered()
    assert health.reachable
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in lines] == ["WARNING", "INFO"], lines
    assert lines[1][1].endswith("; 1 journal entry written"), lines


@pytest.mark.postgres
def test_a_crashed_database_is_an_outage_and_nobody_is_judged_dead_for_it(
        own_postgres: PostgresServer) -> None:  # noqa: F811
    registry = Registry(own_postgres.new_database("outage"), host="h1")
    migrate.upgrade_shared(registry)
    clock = Clock()
    registry.health.clock = clock
    try:
        store = FleetStore(registry)
        machine = RolloutMachine(store, registry, FleetSettings("", host_timeout_s=10.0), "h1")
        store.heartbeat("h1", "grpc://127.0.0.1:1", "dev", utcnow())
        [rid] = store.create_rollouts([("m", "ab" * 32, None)], "test", [["h2"]])  # h2: silent all along
        assert [s.state for s in store.rollout(rid).steps] == ["pending"]  # running, the canary's step pending
        assert registry.health.reachable
        # tests/pg.py's server commits asynchronously: what was committed is on disk before the crash (else
        # the crash loses the newest commits, the rollout among them, depending on how much WAL came before)
        with registry.engine.begin() as conn:
            conn.execute(text("CHECKPOINT"))
        own_postgres.crash()
        try:
            with pytest.raises(StoreError, match="registry postgresql"):
                store.heartbeat("h1", "grpc://127.0.0.1:1", "dev", utcnow())
            assert not registry.health.reachable and registry.health.since is not None
        finally:
            own_postgres.start_again()
        clock.now += 15.0
        store.heartbeat("h1", "grpc://127.0.0.1:1", "dev", utcnow())
        assert registry.health.reachable
        # liveness_s of grace after the leader reaches the registry again: nobody's step is skipped, and
        # a new rollout's waves count the hosts by heartbeat (no daemon's session is back yet: here none)
        machine.drive(store.rollout(rid))
        assert [s.state for s in store.rollout(rid).steps] == ["pending"]
        assert machine.waves() == [["h1"]]
        clock.now += 10.5  # past it, a host still silent is dead as ever
        machine.drive(store.rollout(rid))
        assert [s.state for s in store.rollout(rid).steps] == ["skipped"]
        assert machine.waves() == []  # and a host without its session too
    finally:
        registry.close()


@pytest.mark.postgres
def test_the_journal_writes_each_record_once(pg_url: str, tmp_path: Path) -> None:
    """What a host did while the registry was away is written once, at the time it happened: replaying
    again (a crash between the write and the journal's rewrite) writes nothing twice."""
    registry = Registry(pg_url, host="h1")
    migrate.upgrade_shared(registry)
    try:
        store = FleetStore(registry)
        journal = Journal(tmp_path / "fleet-journal.jsonl")
        at = utcnow() - timedelta(seconds=30)
        step = Step(0, 0, "h1", 0, "deploy", "ab" * 32, "", "", "m")
        audit = audit_event("fleet-converge", "deploy", "m", "ab" * 32, "deployed", "converge: deployed", 2304)
        journal.append(step, "ok", "deployed", "h1", "ab" * 32, audit, at)
        kept = journal.path.read_text()
        assert len(journal) == 1
        assert journal.replay(store) == 1 and not journal.path.exists()
        journal.path.write_text(kept)  # as if the daemon died before the rewrite
        assert journal.replay(store) == 0 and not journal.path.exists()
        events = [e for e in registry.query_audit(AuditQuery(model="m", limit=100)) if e.action == "deploy"]
        assert [(e.host, e.time, e.duration_ms) for e in events] == [("h1", at, 2304)]
        served = [(r.host, r.digest) for r in registry.serving_at(at + timedelta(seconds=1), ["m"])]
        assert served == [("h1", "ab" * 32)]  # `audit --at` during the outage is right
    finally:
        registry.close()


def test_a_full_disk_under_sqlite_is_an_outage_until_a_write_commits(small_fs: Path) -> None:  # noqa: F811
    """A SQLite registry on a filesystem that fills and frees (the storage-fault fixture): it still reads,
    so only a write that commits ends the outage."""
    registry = Registry(f"sqlite:///{small_fs / 'registry.db'}")
    migrate.upgrade(registry)
    try:
        registry.ensure_model("m")
        filler = fill_up(small_fs)
        with pytest.raises(StoreError):
            for i in range(200):  # until the database's own pages run out too
                registry.ensure_model(f"model{i}-" + "x" * 100)
        assert not registry.health.reachable and "full" in registry.health.reason
        assert registry.find_model("m") is not None  # it reads
        assert not registry.health.reachable
        filler.unlink()
        registry.ensure_model("after")
        assert registry.health.reachable
    finally:
        registry.close()


def test_status_during_an_outage_says_so_first(capsys: pytest.CaptureFixture[str]) -> None:
    """`tritonctl status` while the registry is down: a first line naming the outage and since when, then
    the table of what this host knows (the document comes from the daemon: tests/test_fleet_outage_e2e.py)."""
    from cli import render
    from controlplane.documents.results import StatusResult

    down = StatusResult(True, "127.0.0.1:8001", None, {"mode": None, "reason": ""}, [], registry_reachable=False,
                        registry_unreachable_since="2026-12-03T07:12:02Z",
                        registry_reason="registry postgresql://db/fleet: connection refused")
    render.status(down.to_json(), False)
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("registry unreachable since 2026-12-03T07:12:02Z (registry postgresql://db/fleet: "
                            "connection refused); showing what this host knows"), first
    render.status(StatusResult(True, "u", None, {"mode": None, "reason": ""}, []).to_json(), False)
    assert "unreachable" not in capsys.readouterr().out


def test_a_single_hosts_records_wait_in_its_journal_through_a_full_disk(small_fs: Path,  # noqa: F811
                                                                          tmp_path: Path) -> None:
    """A single host's registry on a filesystem that fills and frees: a deploy that ends and a rollback that
    begins and ends meanwhile go to the journal (the host reads them back over the registry's rows: no
    reconcile undoes them, none is open), and are written once, at the times they happened, when a write
    commits again; a replay of the same journal again writes nothing."""
    registry = JournaledRegistry(f"sqlite:///{small_fs / 'registry.db'}", tmp_path / JOURNAL_NAME, host="h1")
    migrate.upgrade(registry)
    a, b = "aa" * 32, "bb" * 32
    try:
        assert registry.replay_journal() == 0
        registry.ensure_model("m")
        first = registry.begin_deployment("m", "deploy", a, None, "test")  # before the outage
        filler = fill_up(small_fs)
        registry.advance(first.id, "loaded")
        assert not registry.health.reachable
        ended = utcnow()
        registry.finish_deployment(first.id, outcome="ok", error=None, serving=ServingRecord("m", a, [1]),
                                   audit=AuditEntry("test", "deploy", "m", a, "ok", "serving aa"),
                                   model_state="serving")
        back = registry.begin_deployment("m", "rollback", b, a, "test")
        assert back.id < 0  # the journal's own
        registry.finish_deployment(back.id, outcome="ok", error=None, serving=ServingRecord("m", b, [1]),
                                   audit=AuditEntry("test", "rollback", "m", b, "ok", "serving bb"),
                                   model_state="serving")
        registry.audit(AuditEntry("tritonctl", "daemon_stop", None, None, "ok", "clean shutdown"))  # no model
        assert (registry.get_model("m").active_digest, registry.get_model("m").state) == (b, "serving")
        assert [m.name for m in registry.serving_models()] == ["m"] and registry.open_deployments() == []
        assert len(registry.journal) == 5
        kept = registry.journal.path.read_text()
        filler.unlink()
        registry._last_probe = 0.0  # the next committed read probes at once
        registry.list_models()
        assert registry.health.reachable and not registry.journal.path.exists()
        events = registry.query_audit(AuditQuery(model="m", limit=100))
        assert [(e.action, e.digest) for e in reversed(events)] == [("deploy", a), ("rollback", b)]
        assert events[1].time >= ended and events[1].time <= events[0].time
        assert [r.digest for r in registry.serving_at(events[1].time, ["m"])] == [a]  # `audit --at` meanwhile
        assert registry.get_model("m").active_digest == b and registry.open_deployments() == []
        registry.journal.path.write_text(kept)  # as if the daemon died before the journal's rewrite
        assert registry.replay_journal() == 0
        assert len(registry.query_audit(AuditQuery(model="m", limit=100))) == 2
        assert len(registry.query_audit(AuditQuery(action="daemon_stop", limit=100))) == 1
        assert len(registry.last_deployments(["m"])) == 1 and registry.open_deployments() == []
    finally:
        registry.close()


def test_a_reconcile_never_reads_a_deployment_the_replay_has_half_written(small_fs: Path,  # noqa: F811
                                                                           tmp_path: Path) -> None:
    """A rollback journaled through a full disk is written back intent first, end second. A reconcile
    reading the open deployments between the two took it for one a crash interrupted, "recovered" it,
    and the rollback was audited twice (seen in tests/test_host_outage_e2e.py). The read waits for the
    whole replay, and then nothing is open."""
    registry = JournaledRegistry(f"sqlite:///{small_fs / 'registry.db'}", tmp_path / JOURNAL_NAME, host="h1")
    migrate.upgrade(registry)
    b = "bb" * 32
    intent_written, go_on = threading.Event(), threading.Event()
    try:
        assert registry.replay_journal() == 0
        registry.ensure_model("m")
        filler = fill_up(small_fs)
        back = registry.begin_deployment("m", "rollback", b, None, "test")
        assert back.id < 0  # the journal's own
        registry.finish_deployment(back.id, outcome="ok", error=None, serving=ServingRecord("m", b, [1]),
                                   audit=AuditEntry("test", "rollback", "m", b, "ok", "serving bb"),
                                   model_state="serving")
        filler.unlink()
        write = registry._write_entry

        def paused_after_the_intent(entry: dict[str, Any]) -> bool:
            written = write(entry)
            if entry["op"] == "begin":
                intent_written.set()
                go_on.wait(30)
            return written

        registry._write_entry = paused_after_the_intent  # type: ignore[method-assign]
        replay = threading.Thread(target=registry.replay_journal)
        replay.start()
        assert intent_written.wait(30)
        seen: list[list[Any]] = []
        reader = threading.Thread(target=lambda: seen.append(registry.open_deployments()))
        reader.start()
        reader.join(0.5)
        assert reader.is_alive() and not seen  # the reconcile's read waits for the replay
        go_on.set()
        replay.join(30)
        reader.join(30)
        assert seen == [[]]
        assert [e.action for e in registry.query_audit(AuditQuery(model="m", limit=10))] == ["rollback"]
    finally:
        go_on.set()
        registry.close()


@pytest.mark.postgres
def test_a_single_hosts_postgresql_restart_answers_from_what_it_read_and_loses_no_end(
        own_postgres: PostgresServer, tmp_path: Path) -> None:  # noqa: F811
    """A single host on a PostgreSQL that restarts: the reads `status` makes answer what they last read, a
    deployment begun before the crash and ended during it is journaled, and the first read that answers
    again ends the outage and writes it (and its footprint, and the config Triton completed at its load) once."""
    registry = JournaledRegistry(own_postgres.new_database("single"), tmp_path / JOURNAL_NAME, host="h1")
    migrate.upgrade(registry)
    a = "cc" * 32
    try:
        registry.replay_journal()
        registry.ensure_model("m")
        begun = registry.begin_deployment("m", "deploy", a, None, "test")
        known = (registry.list_models(), registry.source_heads(), registry.last_deployments(), registry.footprints())
        assert [d.id for d in registry.open_deployments()] == [begun.id]
        with registry.session() as session:
            session.execute(text("CHECKPOINT"))  # the test server commits asynchronously: what began is kept
        own_postgres.crash()
        try:
            assert (registry.list_models(), registry.source_heads(), registry.last_deployments(),
                    registry.footprints()) == known
            assert not registry.health.reachable
            registry.record_footprint("m", a, 12.0, None, "measured")
            registry.record_completed_config("m", a, {"name": "m", "max_batch_size": 8})
            registry.finish_deployment(begun.id, outcome="ok", error=None, serving=ServingRecord("m", a, [1]),
                                       audit=AuditEntry("test", "deploy", "m", a, "ok", "serving cc"),
                                       model_state="serving")
            assert registry.get_model("m").active_digest == a and registry.open_deployments() == []
            with pytest.raises(StoreError):
                registry.list_snapshots("m")  # a read it never made: no answer to remember
        finally:
            own_postgres.start_again()
        wait_for(lambda: registry.health.reachable if _read(registry) else False, 30, what="registry back")
        assert not registry.journal.path.exists()
        assert [(e.action, e.model) for e in registry.query_audit(AuditQuery(model="m"))] == [("deploy", "m")]
        assert registry.footprints(["m"])[("m", a)].memory_mb == 12.0
        assert registry.completed_configs(["m"])[("m", a)].config == {"name": "m", "max_batch_size": 8}
        assert registry.get_model("m").active_digest == a
    finally:
        registry.close()


def _read(registry: Registry) -> bool:
    try:
        registry.count_models()
    except StoreError:
        return False
    return True


def test_an_intent_journaled_before_a_stop_is_an_open_deployment_at_the_next_start(
        small_fs: Path, tmp_path: Path) -> None:  # noqa: F811
    """A daemon that stopped (or died) mid-deploy during the outage left only the intent in its journal: the
    next start writes it as an open deployment, which crash recovery finishes from what Triton serves."""
    url, path = f"sqlite:///{small_fs / 'registry.db'}", tmp_path / JOURNAL_NAME
    registry = JournaledRegistry(url, path, host="h1")
    migrate.upgrade(registry)
    registry.replay_journal()
    registry.ensure_model("m")
    filler = fill_up(small_fs)
    begun = registry.begin_deployment("m", "deploy", "dd" * 32, None, "test")
    registry.advance(begun.id, "published")
    registry.close()
    filler.unlink()
    again = JournaledRegistry(url, path, host="h1")
    try:
        assert again.replay_journal() == 2 and not path.exists()
        [opened] = again.open_deployments()
        assert (opened.model, opened.kind, opened.digest, opened.step, opened.started_at) == \
            ("m", "deploy", "dd" * 32, "published", begun.started_at)
    finally:
        again.close()


def test_deployments_written_many_at_once_go_to_the_journal_one_by_one_in_an_outage(
        small_fs: Path, tmp_path: Path) -> None:  # noqa: F811
    """A first start's deploys write their records a wave at a time (controlplane/store/batches.py); through a
    full disk each one's records are journaled as a deploy alone would journal them, read back meanwhile, and
    written once when a write commits again."""
    registry = JournaledRegistry(f"sqlite:///{small_fs / 'registry.db'}", tmp_path / JOURNAL_NAME, host="h1")
    migrate.upgrade(registry)
    a, b = "aa" * 32, "bb" * 32
    try:
        registry.replay_journal()
        registry.ensure_models(["m1", "m2", "m3"])  # a wave's models are read (and made) before its intents
        before = registry.begin_deployments([DeploymentIntent("m1", "deploy", a, None, "test")])  # registry ids
        filler = fill_up(small_fs)
        registry.advance_all([before[0].id], "loaded")
        assert not registry.health.reachable
        during = registry.begin_deployments([DeploymentIntent("m2", "deploy", b, None, "test"),
                                             DeploymentIntent("m3", "deploy", b, None, "test")])
        assert all(d.id < 0 for d in during)  # the journal's own
        registry.advance_all([d.id for d in during], "published")
        registry.finish_deployments([
            DeploymentEnd(d.id, "ok", None, AuditEntry("test", "deploy", d.model, d.digest, "ok", f"{d.model} ok"),
                          ServingRecord(d.model, d.digest, [1]), "serving") for d in (*before, *during)])
        assert {m.name: m.active_digest for m in registry.serving_models()} == {"m1": a, "m2": b, "m3": b}
        assert registry.open_deployments() == []
        filler.unlink()
        registry._last_probe = 0.0  # the next committed read probes at once
        registry.list_models()
        assert registry.health.reachable and not registry.journal.path.exists()
        assert sorted(e.model or "" for e in registry.query_audit(AuditQuery(action="deploy"))) == ["m1", "m2", "m3"]
        assert registry.open_deployments() == [] and len(registry.last_deployments()) == 3
        assert registry.get_model("m3").active_digest == b
    finally:
        registry.close()
