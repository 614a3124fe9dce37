"""Fleet building blocks: wave planning, the shared store's verified import, leader election on a real
PostgreSQL server, and the leader's rollout driver on real fleet tables, with the hosts' step results
written directly (the end-to-end test with real daemons and tritonservers is tests/test_fleet_e2e.py)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controlplane.errors import SnapshotError
from controlplane.fleet.election import LeaderElection
from controlplane.fleet.member import plan_waves
from controlplane.fleet.sharedcontent import SharedStore
from controlplane.snapshot import ContentStore
from controlplane.store import migrate
from controlplane.store.fleet import FleetStore
from controlplane.store.registry import Registry
from tests.harness import wait_for, write_gen_model


def test_waves_put_the_canaries_first_then_the_rest_in_order() -> None:
    hosts = ["h3", "h1", "h4", "h2", "h5"]
    assert plan_waves(hosts, (), 1, 2) == [["h1"], ["h2", "h3"], ["h4", "h5"]]
    assert plan_waves(hosts, ("h4",), 1, 3) == [["h4"], ["h1", "h2", "h3"], ["h5"]]
    assert plan_waves(hosts, ("gone", "h2"), 1, 10) == [["h2"], ["h1", "h3", "h4", "h5"]]
    assert plan_waves(hosts, (), 2, 2) == [["h1", "h2"], ["h3", "h4"], ["h5"]]
    assert plan_waves(["h1"], (), 1, 2) == [["h1"]]
    assert plan_waves([], (), 1, 2) == []


@pytest.fixture
def captured(tmp_path: Path) -> tuple[ContentStore, str]:
    repo = tmp_path / "repo"
    write_gen_model(repo, "m", 1)
    (repo / "m" / "1" / "weights.bin").write_bytes(os.urandom(300_000))
    leader = ContentStore(tmp_path / "leader-store")
    return leader, leader.capture(repo / "m", "m").digest


def test_shared_store_carries_a_snapshot_to_another_host(tmp_path: Path, captured: tuple[ContentStore, str]) -> None:
    leader, digest = captured
    shared = SharedStore(tmp_path / "shared")
    shared.export(leader, "m", digest)
    assert shared.has(digest)
    host = ContentStore(tmp_path / "host-store")
    snap = shared.import_into(host, "m", digest)
    assert snap.digest == digest
    tree = host.tree_path(digest)
    assert (tree / "1" / "weights.bin").read_bytes() == (leader.tree_path(digest) / "1" / "weights.bin").read_bytes()
    assert shared.import_into(host, "m", digest).digest == digest  # already there: a no-op


def test_a_corrupt_shared_object_is_refused_and_nothing_is_published(tmp_path: Path,
                                                                    captured: tuple[ContentStore, str]) -> None:
    leader, digest = captured
    shared = SharedStore(tmp_path / "shared")
    snap = shared.export(leader, "m", digest)
    weights = next(e for e in snap.entries if e.path.endswith("weights.bin"))
    victim = shared.object_path(weights.sha256)
    os.chmod(victim, 0o644)
    data = bytearray(victim.read_bytes())
    data[1000] ^= 0xFF  # one flipped bit in transit or at rest
    victim.write_bytes(bytes(data))
    host = ContentStore(tmp_path / "host-store")
    with pytest.raises(SnapshotError, match="corrupt"):
        shared.import_into(host, "m", digest)
    assert not host.object_path(weights.sha256).exists()
    assert not host.tree_path(digest).exists()
    with pytest.raises(SnapshotError, match="not in the shared store"):
        shared.import_into(host, "m", "f" * 64)


# --- leader election and the fleet tables on PostgreSQL ---------------------------------------------


@pytest.fixture
def shared(pg_url: str) -> Iterator[Registry]:
    reg = Registry(pg_url, host="h1")
    migrate.upgrade(reg)
    yield reg
    reg.close()


def test_exactly_one_leader_and_a_new_one_when_it_goes(shared: Registry) -> None:
    changes: list[tuple[str, bool]] = []
    elections = [LeaderElection(shared.url, f"h{i}", lambda lead, i=i: changes.append((f"h{i}", lead)),
                                interval_s=0.2) for i in (1, 2, 3)]
    store = FleetStore(shared)
    for election in elections:
        election.start()
    try:
        wait_for(lambda: sum(e.is_leader for e in elections) == 1, 10, what="a leader")
        time.sleep(0.6)
        assert sum(e.is_leader for e in elections) == 1
        first = next(e for e in elections if e.is_leader)
        assert store.leader() == first.host
        started = time.monotonic()
        first.stop()  # its session ends: PostgreSQL releases the lock
        wait_for(lambda: sum(e.is_leader for e in elections if e is not first) == 1, 10, what="a new leader")
        assert time.monotonic() - started < 3
        second = next(e for e in elections if e.is_leader and e is not first)
        assert wait_for(lambda: store.leader() == second.host, 5)
        assert (first.host, False) in changes and (second.host, True) in changes
    finally:
        for election in elections:
            election.stop()


def test_a_leader_whose_connection_is_killed_steps_down(shared: Registry) -> None:
    from sqlalchemy import text

    election = LeaderElection(shared.url, "h1", lambda lead: None, interval_s=0.2)
    election.start()
    try:
        wait_for(lambda: election.is_leader, 10, what="leader")
        with shared.engine.begin() as conn:  # an administrator (or a network cut) ends its session
            conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                              "WHERE application_name = 'tritonctl-leader:h1'"))
        wait_for(lambda: not election.is_leader, 5, 0.05, what="step down")
        wait_for(lambda: election.is_leader, 10, what="leads again after reconnecting")
    finally:
        election.stop()


class HostSessions:
    """The session each live daemon holds (its host lock), opened and closed by hand."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.conns: dict[str, object] = {}

    def open(self, *hosts: str) -> None:
        from controlplane.fleet.election import APPLICATION_PREFIX, connect, take_host_lock

        for host in hosts:
            conn = connect(self.url, APPLICATION_PREFIX + host)
            assert take_host_lock(conn, host)
            self.conns[host] = conn

    def close(self, host: str) -> None:
        self.conns.pop(host).close()  # type: ignore[attr-defined]

    def close_all(self) -> None:
        for host in list(self.conns):
            self.close(host)


@pytest.fixture
def sessions(shared: Registry) -> Iterator[HostSessions]:
    held = HostSessions(shared.url)
    yield held
    held.close_all()


def test_hosts_heartbeats_and_liveness(shared: Registry, sessions: HostSessions) -> None:
    from controlplane.store.registry import utcnow

    store = FleetStore(shared)
    sessions.open("h1", "h2", "h3")
    for host in ("h3", "h2", "h1"):
        store.heartbeat(host, f"127.0.0.1:{host[1]}", "1.0", utcnow())
    assert store.live_hosts(10) == ["h1", "h2", "h3"]
    rows = store.hosts()
    assert [(r["host"], r["alive"], r["session"], r["leader"]) for r in rows] == [
        ("h1", True, True, False), ("h2", True, True, False), ("h3", True, True, False)]
    # A daemon whose session ends (it died; the kernel closed its socket) is dead at once, its fresh
    # heartbeat notwithstanding; one that holds its session but stops heartbeating, after the window.
    sessions.close("h2")
    wait_for(lambda: store.live_hosts(10) == ["h1", "h3"], 2, 0.02, "h2 dead once its session closed")
    assert [r["alive"] for r in store.hosts()] == [True, False, True]
    time.sleep(0.3)
    assert store.live_hosts(0.1) == []


def test_a_host_name_is_held_by_one_live_daemon(shared: Registry, sessions: HostSessions) -> None:
    from controlplane.fleet.election import APPLICATION_PREFIX, connect, take_host_lock

    sessions.open("h1")
    second = connect(shared.url, APPLICATION_PREFIX + "h1")
    try:
        assert not take_host_lock(second, "h1")
        sessions.close("h1")
        wait_for(lambda: take_host_lock(second, "h1"), 2, 0.02, "the host lock free once its session ended")
    finally:
        second.close()


# --- the leader's rollout driver ---------------------------------------------------------------------

D1, D2 = "1" * 64, "2" * 64


class Leader:
    """The leader side of a FleetMember, driven by hand: no threads, no tritonserver, always leading."""

    def __init__(self, shared: Registry, tmp: Path) -> None:
        from types import SimpleNamespace

        from controlplane.fleet.member import FleetMember
        from controlplane.fleet.settings import FleetSettings
        from controlplane.settings.config import Settings

        settings = Settings(db_url=shared.url, host="h1", state_dir=tmp)
        from controlplane.source.protocol import NoSource

        plane = SimpleNamespace(triton=SimpleNamespace(url="127.0.0.1:1"), source=NoSource())  # no source scanned
        self.member = FleetMember(settings, FleetSettings(shared_store=tmp / "shared", wave_size=2), plane, shared)
        self.member.election._leader.set()
        self.store = self.member.store

    def drive(self) -> dict[str, object]:
        for rollout in self.store.rollouts():
            self.member._drive(rollout)
        return {}

    def states(self, rid: int) -> list[tuple[str, int, str, str]]:
        return [(s.host, s.wave, s.action, s.state) for s in self.store.rollout(rid).steps]

    def report(self, rid: int, host: str, state: str, message: str = "") -> None:
        from controlplane.store.fleet import audit_event

        [step] = [s for s in self.store.rollout(rid).steps if s.host == host and s.state in ("pending", "running")]
        self.store.finish_step(step, state, message, host=host, serving=step.digest if state == "ok" else D1,
                               audit=audit_event("fleet", step.action, step.model, step.digest, state, message))


@pytest.fixture
def leader(shared: Registry, tmp_path: Path, sessions: HostSessions) -> Leader:
    from controlplane.store.registry import utcnow

    lead = Leader(shared, tmp_path)
    lead.sessions = sessions  # type: ignore[attr-defined]
    sessions.open("h1", "h2", "h3", "h4")
    for host in ("h1", "h2", "h3", "h4"):
        lead.store.heartbeat(host, "", "t", utcnow())
    for digest in (D1, D2):
        shared.record_snapshot("m", digest, "{}", config=None, versions=[1], served_versions=[1], valid=True,
                               problems=[], total_bytes=1)
    return lead


def test_waves_advance_only_when_every_host_of_the_previous_one_is_ok(leader: Leader, shared: Registry) -> None:
    rid = leader.member.propose("m", shared.get_snapshot("m", D2))
    assert rid is not None
    assert leader.states(rid) == [("h1", 0, "deploy", "pending"), ("h2", 1, "deploy", "waiting"),
                                  ("h3", 1, "deploy", "waiting"), ("h4", 2, "deploy", "waiting")]
    assert leader.member.propose("m", shared.get_snapshot("m", D2)) is None  # already on its way
    leader.drive()
    assert [s[3] for s in leader.states(rid)] == ["pending", "waiting", "waiting", "waiting"]
    leader.report(rid, "h1", "ok")
    leader.drive()
    assert [s[3] for s in leader.states(rid)] == ["ok", "pending", "pending", "waiting"]
    leader.report(rid, "h2", "ok")
    leader.drive()
    assert [s[3] for s in leader.states(rid)] == ["ok", "ok", "pending", "waiting"]
    leader.report(rid, "h3", "ok")
    leader.drive()
    leader.report(rid, "h4", "ok")
    leader.drive()
    assert leader.store.rollout(rid).state == "done"
    assert leader.store.targets() == {"m": D2}
    assert leader.member.propose("m", shared.get_snapshot("m", D2)) is None  # the fleet serves it


def test_a_change_sets_rollouts_reach_a_hosts_claim_together(leader: Leader, shared: Registry,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The leader starts a set's rollouts (steps first, then the ensemble) in one transaction: a host
    that claims while they start gets its steps of the whole set or none, never a step it would deploy
    alone beside the old ensemble over it (tests/test_fleet_changesets.py: the canary deployed `a`
    alone and its `pipe` stopped answering). The audit call after each start is wrapped (a spy on the
    real registry) to claim at that moment."""
    seen: list[list[str]] = []
    audit = shared.audit

    def claim_then_audit(entry: Any) -> Any:
        seen.append(sorted(s.model for s in leader.store.claim("h1")))
        return audit(entry)

    for model in ("a", "b", "pipe"):
        shared.record_snapshot(model, D2, "{}", config=None, versions=[1], served_versions=[1], valid=True,
                               problems=[], total_bytes=1)
    monkeypatch.setattr(shared, "audit", claim_then_audit)
    ids = leader.member.leader.propose_set([(m, shared.get_snapshot(m, D2)) for m in ("a", "b", "pipe")])
    assert list(ids) == ["a", "b", "pipe"] and ids["a"] < ids["b"] < ids["pipe"]
    assert seen == [["a", "b", "pipe"], [], []]


def test_a_failure_stops_the_waves_and_rolls_back_every_host_that_took_it(leader: Leader, shared: Registry) -> None:
    with leader.store.session() as session:
        leader.store.set_target(session, "m", D1)
    rid = leader.member.propose("m", shared.get_snapshot("m", D2))
    assert rid is not None
    leader.report(rid, "h1", "ok")
    leader.drive()
    leader.report(rid, "h2", "ok")
    leader.report(rid, "h3", "failed", "weights missing")
    leader.drive()
    rollout = leader.store.rollout(rid)
    assert rollout.state == "rolling_back" and "h3" in rollout.error and "weights missing" in rollout.error
    assert leader.states(rid)[3] == ("h4", 2, "deploy", "skipped")  # never reached the last wave
    rollbacks = [s for s in rollout.steps if s.action == "rollback"]
    assert sorted(s.host for s in rollbacks) == ["h1", "h2"] and {s.digest for s in rollbacks} == {D1}
    assert shared.get_snapshot("m", D2).quarantined
    leader.report(rid, "h1", "ok")
    leader.drive()
    assert leader.store.rollout(rid).state == "rolling_back"
    leader.report(rid, "h2", "ok")
    leader.drive()
    assert leader.store.rollout(rid).state == "rolled_back"
    assert leader.store.targets() == {"m": D1}


def test_a_canary_waves_bake_pools_its_hosts_figures_and_a_failed_one_rolls_back_every_host(
        leader: Leader, shared: Registry, tmp_path: Path) -> None:
    """Two canaries bake (docs/bake.md "Sets and fleets"): each host writes its own tritonserver's figures on
    its bake step (here written by hand: the host side against a real tritonserver is
    tests/test_fleet_bake_e2e.py); neither alone has `bake_min_requests`, their sum has, and crosses the
    failure limit: the rollout stops before the next wave and rolls back both canaries, unquarantined."""
    from controlplane.fleet.settings import FleetSettings
    from controlplane.settings.config import Settings

    leader.member.machine.fleet = FleetSettings(shared_store=tmp_path / "shared", canary_count=2, wave_size=2,
                                                bake=Settings(bake_s=3600.0))
    with leader.store.session() as session:
        leader.store.set_target(session, "m", D1)
    rid = leader.member.propose("m", shared.get_snapshot("m", D2))
    assert rid is not None
    leader.report(rid, "h1", "ok")
    leader.report(rid, "h2", "ok")
    leader.drive()
    assert leader.states(rid)[2:] == [("h3", 1, "deploy", "waiting"), ("h4", 1, "deploy", "waiting"),
                                      ("h1", 0, "bake", "pending"), ("h2", 0, "bake", "pending")]
    assert leader.store.rollout(rid).bake["state"] == "baking"  # type: ignore[index]
    baking = {s.host: s for host in ("h1", "h2") for s in leader.store.claim(host)}
    assert leader.store.set_figures(baking["h1"].id, {"requests": 15, "failures": 0, "success": 15, "success_ns": 1})
    leader.drive()
    assert leader.store.rollout(rid).state == "running" and leader.states(rid)[2][3] == "waiting"  # 15 < 20
    assert leader.store.set_figures(baking["h2"].id, {"requests": 15, "failures": 1, "success": 14, "success_ns": 1})
    leader.drive()
    rollout = leader.store.rollout(rid)
    reason = "failure ratio 0.03 > 0.01 over 30 requests (1 failed)"
    assert (rollout.state, rollout.error) == ("rolling_back", f"bake failed: {reason}")
    assert rollout.bake is not None and (rollout.bake["state"], rollout.bake["hosts"], rollout.bake["requests"],
                                         rollout.bake["reason"]) == ("failed", ["h1", "h2"], 30, reason)
    states = {(h, a): st for h, _w, a, st in leader.states(rid)}
    assert states == {("h1", "deploy"): "ok", ("h2", "deploy"): "ok", ("h3", "deploy"): "skipped",
                      ("h4", "deploy"): "skipped", ("h1", "bake"): "failed", ("h2", "bake"): "failed",
                      ("h1", "rollback"): "pending", ("h2", "rollback"): "pending"}
    assert not leader.store.set_figures(baking["h1"].id, {"requests": 16, "failures": 0, "success": 16,
                                                          "success_ns": 1})  # ended: the host stops writing
    assert not shared.get_snapshot("m", D2).quarantined  # it failed on this traffic, not as content
    from controlplane.store.records import AuditQuery

    [audited] = shared.query_audit(AuditQuery(model="m", action="bake"))
    assert (audited.outcome, audited.digest) == ("failed", D2) and reason in audited.message
    leader.report(rid, "h1", "ok")  # the canaries' rollback steps
    leader.report(rid, "h2", "ok")
    leader.drive()
    assert leader.store.rollout(rid).state == "rolled_back"
    back = leader.member.propose("m", shared.get_snapshot("m", D2))  # not quarantined: it may go again, and bakes
    assert back is not None
    for host in ("h1", "h2"):
        leader.report(back, host, "ok")
    leader.drive()
    assert [s.action for s in leader.store.rollout(back).steps].count("bake") == 2


def test_a_canary_waves_steps_are_judged_on_pooled_windows_and_the_hosts_follow_each_weight(
        leader: Leader, shared: Registry, tmp_path: Path) -> None:
    """Issue 55 item 7 (docs/bake.md "Sets and fleets"): the canary wave goes through `canary_steps` on its hosts'
    gateways. The leader judges each step on the hosts' figures pooled over the step's window and sets the next
    weight in the bake document; each host's agent follows it on its own route (`HostBakes`, against a stand-in
    host plane here). A step failing on the window's pooled figures stops the rollout and rolls back every host
    that took the digest; the later waves take `wave_steps` ([100]: at once)."""
    from types import SimpleNamespace

    from controlplane.fleet.bake import HostBakes, first_weight, steps_of_wave
    from controlplane.fleet.settings import FleetSettings
    from controlplane.settings.config import Settings

    settings = Settings(bake_s=60.0, canary_steps=(10, "pause", 100), bake_min_requests=20)
    assert steps_of_wave(settings, {}, 0) == (10, 100)  # a pause is not honoured in a fleet
    assert steps_of_wave(settings, {"canary_steps": (25, 100)}, 0) == (25, 100)
    assert steps_of_wave(settings, {}, 1) == (100,)
    assert (first_weight(settings, {}, 0), first_weight(settings, {}, 1)) == (10, 100)
    assert first_weight(Settings(bake_s=0.0, canary_steps=(10, 100)), {}, 0) == 100  # a wave that does not bake
    leader.member.machine.fleet = FleetSettings(shared_store=tmp_path / "shared", canary_count=2, wave_size=2,
                                                bake=settings)
    now = [time.time()]
    leader.member.machine.bakes.clock = lambda: now[0]
    with leader.store.session() as session:
        leader.store.set_target(session, "m", D1)
    rid = leader.member.propose("m", shared.get_snapshot("m", D2))
    assert rid is not None
    leader.report(rid, "h1", "ok")
    leader.report(rid, "h2", "ok")
    leader.drive()
    canary = leader.store.rollout(rid).bake["canary"]  # type: ignore[index]
    assert (canary["steps"], canary["step"], canary["weight"]) == ([10, 100], 0, 10)
    # the hosts' side: each follows the document's weight on its route and writes its own figures
    routes: dict[str, list[int]] = {"h1": [], "h2": []}
    counted: dict[str, dict[tuple[str, str], Any]] = {"h1": {}, "h2": {}}

    def host(name: str) -> HostBakes:
        plane = SimpleNamespace(bake_counts=lambda model, digest: counted[name],
                                canary_weight=lambda model, digest, weight: routes[name].append(weight) or True,
                                canary_done=lambda model, digest: routes[name].append(-1))
        return HostBakes(plane, leader.store)  # type: ignore[arg-type]

    from controlplane.triton.client import RequestCounts

    hosts = {name: host(name) for name in ("h1", "h2")}
    for name, bakes in hosts.items():
        bakes.take(leader.store.claim(name))
    for name, bakes in hosts.items():
        counted[name] = {("gateway", D2): RequestCounts(15, 0, 15_000_000)}
        bakes.tick()
    assert routes == {"h1": [10], "h2": [10]}
    leader.drive()
    assert leader.store.rollout(rid).bake["canary"]["step"] == 0  # type: ignore[index]  # the window is not over
    now[0] += 61
    leader.drive()
    canary = leader.store.rollout(rid).bake["canary"]  # type: ignore[index]
    assert (canary["step"], canary["weight"]) == (1, 100) and canary["history"][0]["requests"] == 30
    assert [s[3] for s in leader.states(rid)][2:4] == ["waiting", "waiting"]  # wave 1 waits for the last step
    for bakes in hosts.values():
        bakes.tick()
    assert routes == {"h1": [10, 100], "h2": [10, 100]}
    # at 100 %, the step's window: 20 requests pooled, 3 failed (what came before the step is not its)
    counted["h1"] = {("gateway", D2): RequestCounts(27, 0, 27_000_000)}
    counted["h2"] = {("gateway", D2): RequestCounts(20, 3, 20_000_000)}
    for bakes in hosts.values():
        bakes.tick()
    leader.drive()
    rollout = leader.store.rollout(rid)
    assert rollout.state == "rolling_back", rollout.bake
    assert rollout.error == "bake failed: failure ratio 0.15 > 0.01 over 20 requests (3 failed) at 100% (step 2/2)"
    for bakes in hosts.values():
        bakes.tick()  # the leader ended the bake steps: the hosts release what they held
    assert routes == {"h1": [10, 100, -1], "h2": [10, 100, -1]}


def test_later_waves_bake_wave_bake_s_and_an_inconclusive_bake_lets_the_next_wave_start(
        leader: Leader, shared: Registry, tmp_path: Path) -> None:
    """`bake_s` 0: the canary wave does not bake; `wave_bake_s`: wave 1 bakes before wave 2 starts, and with
    no requests its bake ends inconclusive (kept: `bake_inconclusive = "keep"`) and the rollout goes on."""
    from controlplane.fleet.settings import FleetSettings
    from controlplane.settings.config import Settings

    leader.member.machine.fleet = FleetSettings(shared_store=tmp_path / "shared", wave_size=2, wave_bake_s=0.3,
                                                bake=Settings(bake_s=0.0))
    rid = leader.member.propose("m", shared.get_snapshot("m", D2))
    assert rid is not None
    leader.report(rid, "h1", "ok")
    leader.drive()
    assert [s[3] for s in leader.states(rid)] == ["ok", "pending", "pending", "waiting"]  # no canary bake
    leader.report(rid, "h2", "ok")
    leader.report(rid, "h3", "ok")
    leader.drive()
    assert leader.states(rid)[3:] == [("h4", 2, "deploy", "waiting"), ("h2", 1, "bake", "pending"),
                                      ("h3", 1, "bake", "pending")]
    wait_for(lambda: leader.drive() == {} and leader.states(rid)[3][3] == "pending", 10, 0.05, "wave 2 opened")
    bake = leader.store.rollout(rid).bake
    assert bake is not None and (bake["state"], bake["wave"], bake["hosts"]) == ("inconclusive", 1, ["h2", "h3"])
    assert [s[3] for s in leader.states(rid)][4:] == ["ok", "ok"]  # the bake steps ended with it


def test_a_silent_host_is_skipped_and_a_second_change_waits_its_turn(leader: Leader, shared: Registry) -> None:
    from datetime import timedelta

    from sqlalchemy import update

    from controlplane.store import schema
    from controlplane.store.registry import utcnow

    rid = leader.member.propose("m", shared.get_snapshot("m", D1))
    assert rid is not None
    queued = leader.store.create_rollout("m", D2, D1, "test", [["h1"]])
    assert leader.store.rollout(queued).state == "queued"
    with leader.store.session() as session:  # h1 stops heartbeating
        session.execute(update(schema.FleetHost).where(schema.FleetHost.name == "h1")
                        .values(last_heartbeat=utcnow() - timedelta(minutes=1)))
    leader.drive()
    assert leader.states(rid)[0] == ("h1", 0, "deploy", "skipped")
    leader.drive()
    for host in ("h2", "h3"):
        leader.report(rid, host, "ok")
    leader.drive()
    leader.report(rid, "h4", "ok")
    leader.drive()
    assert leader.store.rollout(rid).state == "done"
    assert leader.store.rollout(queued).state == "running"


def test_a_host_whose_session_ends_is_skipped_at_the_next_tick(leader: Leader, shared: Registry) -> None:
    """Its heartbeat is fresh, but its daemon's PostgreSQL session is gone: dead at once, even in a
    wave not yet started (it converges when it is back)."""
    rid = leader.member.propose("m", shared.get_snapshot("m", D1))
    assert rid is not None
    leader.sessions.close("h4")  # type: ignore[attr-defined]  # the daemon of the last wave dies
    started = time.monotonic()

    def skipped() -> bool:  # one leader tick each; PostgreSQL ends the backend a moment after the close
        leader.drive()
        return leader.states(rid)[3] == ("h4", 2, "deploy", "skipped")

    wait_for(skipped, 2, 0.05, "h4's step skipped")
    print(f"dead host skipped {time.monotonic() - started:.2f}s after its session closed")
    assert "h4" not in leader.store.live_hosts(10)
    leader.report(rid, "h1", "ok")
    leader.drive()
    for host in ("h2", "h3"):
        leader.report(rid, host, "ok")
    leader.drive()
    assert leader.store.rollout(rid).state == "done"


def test_fleet_flags_are_checked_in_one_line(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from cli.main import cli
    from controlplane.errors import ConfigError
    from controlplane.fleet.settings import fleet_settings

    pg = "postgresql+psycopg://u@127.0.0.1:1/db"
    settings = fleet_settings(pg, "h1", tmp_path, " h2, h3 ,", None, 3)
    assert (settings.canary_hosts, settings.canary_count, settings.wave_size) == (("h2", "h3"), 1, 3)
    for args, message in (((None, "h1", tmp_path), "--db-url postgresql"), ((f"sqlite:///{tmp_path}/r.db", "h1",
                          tmp_path), "--db-url postgresql"), ((pg, "", tmp_path), "--host"), ((pg, "h1", None),
                          "--shared-store")):
        with pytest.raises(ConfigError, match=message):
            fleet_settings(*args, None, None, None)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="wave-size"):
        fleet_settings(pg, "h1", tmp_path, None, None, 0)
    result = CliRunner().invoke(cli, ["daemon", "--fleet", "--host", "h1", "--db-url", pg,
                                      "--state-dir", str(tmp_path / "state")], env={"TRITONCTL_CONFIG": None})
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "error: fleet: --fleet needs --shared-store DIR (snapshot content for every host)"]
    assert not (tmp_path / "state").exists()


def test_fleet_settings_come_from_the_config_file_and_environment_like_any_other(tmp_path: Path) -> None:
    """Flag > TRITONCTL_* > config file > default, and SIGHUP's reload takes only what can change live."""
    from controlplane.errors import ConfigError
    from controlplane.fleet.settings import from_settings
    from controlplane.settings.config import load_settings

    config = tmp_path / "tritonctl.toml"
    config.write_text('fleet = true\nhost = "h7"\ndb_url = "postgresql+psycopg://u@db/t"\n'
                      f'shared_store = "{tmp_path / "shared"}"\ncanary_hosts = "h7,h8"\ncanary_count = 2\n'
                      'wave_size = 3\nliveness_s = 6.0\nheartbeat_s = 0.5\nconverge_s = 4.0\n')
    env = {"TRITONCTL_WAVE_SIZE": "5", "TRITONCTL_CONVERGE_S": "1.5"}
    settings = load_settings({"canary_count": 4}, env=env, config_file=config)
    fleet = from_settings(settings)
    assert settings.fleet and settings.host == "h7"
    assert (fleet.shared_store, fleet.canary_hosts, fleet.canary_count, fleet.wave_size) == \
           (tmp_path / "shared", ("h7", "h8"), 4, 5)
    assert (fleet.host_timeout_s, fleet.heartbeat_s, fleet.converge_s) == (6.0, 0.5, 1.5)
    reread = load_settings({}, env={"TRITONCTL_WAVE_SIZE": "1", "TRITONCTL_HEARTBEAT_S": "0.2",
                                    "TRITONCTL_SHARED_STORE": "/elsewhere"}, config_file=config)
    live = from_settings(settings.reloaded(reread))
    assert (live.wave_size, live.canary_count, live.converge_s) == (1, 2, 4.0)  # reloaded
    assert (live.heartbeat_s, live.shared_store) == (0.5, tmp_path / "shared")  # need a restart
    with pytest.raises(ConfigError, match="wave_size: invalid value '0'"):
        load_settings({}, env={"TRITONCTL_WAVE_SIZE": "0"}, config_file=config)
    with pytest.raises(ConfigError, match="liveness_s .* must be longer than heartbeat_s"):
        from_settings(load_settings({}, env={"TRITONCTL_LIVENESS_S": "0.5"}, config_file=config))


def test_the_leaders_start_up_scan_orders_ensembles_after_their_members(shared: Registry, tmp_path: Path) -> None:
    from types import SimpleNamespace

    from controlplane.fleet.member import FleetMember
    from controlplane.fleet.settings import FleetSettings
    from controlplane.settings.config import Settings
    from controlplane.source.local import LocalSource

    repo = tmp_path / "repo"
    for name in ("a_pipe", "b_step", "c_step"):
        (repo / name).mkdir(parents=True)
    (repo / "a_pipe" / "config.pbtxt").write_text('name: "a_pipe"\nplatform: "ensemble"\n')
    for name in ("b_step", "c_step"):
        (repo / name / "config.pbtxt").write_text(f'name: "{name}"\nbackend: "python"\n')
    settings = Settings(db_url=shared.url, host="h1", state_dir=tmp_path, repository=repo)
    plane = SimpleNamespace(triton=SimpleNamespace(url="127.0.0.1:1"), source=LocalSource(repo))
    member = FleetMember(settings, FleetSettings(shared_store=tmp_path / "shared"), plane, shared)
    member.leader._scan()
    assert member.leader._settled == ["b_step", "c_step", "a_pipe"]


def test_placements_are_decided_one_at_a_time_across_the_fleet(shared: Registry) -> None:
    """Ensures through several hosts at once (threads, each its own transaction on the real PostgreSQL):
    eight models of 150 MB into two hosts with room for one each place exactly two, one per host, and
    eight ensures of one (10 MB) model place it once (the transaction lock in controlplane/store/placements.py;
    without it every one of them reads the same free rooms)."""
    from concurrent.futures import ThreadPoolExecutor
    from datetime import timedelta

    from controlplane.errors import BudgetError
    from controlplane.fleet.ondemand import host_rooms
    from controlplane.fleet.placement import place
    from controlplane.store.placements import PlacementStore, Room
    from controlplane.store.registry import utcnow

    store, placements = FleetStore(shared), PlacementStore(shared)
    for host in ("h1", "h2"):
        store.heartbeat(host, "127.0.0.1:8001", "1.0", utcnow(), budgets=(200.0, None))
    need = {"memory_mb": 150.0, "gpu_memory_mb": 0.0}

    def ensure(model: str, lease: str, need: dict[str, float] = need) -> tuple[str, bool] | None:
        def decide(rooms: list[Room], has_it: list[str]) -> tuple[str, str]:
            time.sleep(0.05)  # a slow decision: the others wait on the lock, they do not decide beside it
            choice = place(model, need, host_rooms(rooms), has_it)
            return choice.host, choice.message

        try:
            row, asked = placements.place(model, "d" * 64, need, ["h1", "h2"], decide,
                                          (lease, utcnow() + timedelta(minutes=5), "tester"), "h1")
        except BudgetError:
            return None
        return row.host, asked

    with ThreadPoolExecutor(8) as pool:
        many = list(pool.map(lambda i: ensure(f"m{i}", f"lease-m{i}"), range(8)))
        one = list(pool.map(lambda i: ensure("same", f"lease-same{i}", {"memory_mb": 10.0}), range(8)))
    assert sorted(r[0] for r in many if r is not None) == ["h1", "h2"], many
    assert len({r[0] for r in one if r is not None}) == 1 and [r[1] for r in one if r].count(True) == 1, one
    assert placements.lease_ends(["same"])["same"][0] == 8  # every caller's lease, on the one placement
