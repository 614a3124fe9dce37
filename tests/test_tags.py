"""Tags (issue 18): the name rule, where each tag points now and at any past time, on SQLite (through the
Registry and through the CLI's sqlite3 reader) and PostgreSQL, and the `tags --json` contract."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from controlplane.errors import NotFoundError, TagError, UsageError
from controlplane.intake import tags
from controlplane.store import migrate
from controlplane.store.registry import AuditQuery, Registry
from controlplane.store.sqlite_reader import SqliteReader

T0 = datetime(2026, 11, 1, 12, 0, 0)
D1, D2, D3 = "a1" * 32, "b2" * 32, "c3" * 32


@pytest.mark.parametrize("name", ["stable", "canary", "v1.2", "prod_eu-1", "x" * 63, "abc", "beef", "release-3f2a9c"])
def test_good_tag_names(name: str) -> None:
    assert tags.validate_tag_name(name) == name


@pytest.mark.parametrize("name", ["", "Stable", "a b", "-x", ".x", "a/b", "a:b", "a" * 64, "3f2a9c", "deadbeef",
                                  "0123456789", "é"])
def test_bad_tag_names_are_a_one_line_usage_error(name: str) -> None:
    with pytest.raises(TagError) as caught:
        tags.validate_tag_name(name)
    assert isinstance(caught.value, UsageError)  # exit 2
    assert "\n" not in str(caught.value)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr("controlplane.store.registry.utcnow", fake)
    return fake


def _migrated(url: str) -> Registry:
    registry = Registry(url)
    migrate.upgrade(registry)
    for digest in (D1, D2, D3):
        registry.record_snapshot("linear", digest, "[]", config=None, versions=[1], served_versions=[1], valid=True,
                                 problems=[], total_bytes=1)
    return registry


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def registry(request: pytest.FixtureRequest, tmp_path: Path, clock: Clock) -> Iterator[Registry]:
    url = f"sqlite:///{tmp_path / 'registry.db'}" if request.param == "sqlite" else request.getfixturevalue("pg_url")
    reg = _migrated(url)
    yield reg
    reg.close()


def test_moves_are_recorded_with_history_and_audit(registry: Registry, clock: Clock) -> None:
    assert registry.move_tag("linear", "stable", D1, actor="ann", message="m1") is None
    clock.now = T0 + timedelta(minutes=10)
    assert registry.move_tag("linear", "stable", D2, actor="bob", message="m2") == D1
    registry.move_tag("linear", "canary", D3, actor="bob")
    clock.now = T0 + timedelta(minutes=20)
    registry.move_tag("linear", "stable", D2, actor="ci", outcome="failed", attempted=D3, message="failed")
    registry.move_tag("linear", "canary", None, actor="ann", message="deleted")

    now = registry.list_tags("linear")
    assert [(t.name, t.digest) for t in now] == [("stable", D2)]
    assert now[0].moved_by == "bob"  # a failed move that leaves the tag where it is does not re-stamp it
    at = {t.name: t.digest for t in registry.tags_at(T0 + timedelta(minutes=5), "linear")}
    assert at == {"stable": D1}
    at = {t.name: t.digest for t in registry.tags_at(T0 + timedelta(minutes=15))}
    assert at == {"stable": D2, "canary": D3}
    assert registry.tags_at(T0 - timedelta(seconds=1)) == []
    events = registry.query_audit(AuditQuery(model="linear", action="tag"))
    assert [(e.outcome, e.digest) for e in events] == [("ok", None), ("failed", D3), ("ok", D3), ("ok", D2),
                                                       ("ok", D1)]


def test_the_cli_reader_answers_like_the_registry(tmp_path: Path, clock: Clock) -> None:
    registry = _migrated(f"sqlite:///{tmp_path / 'registry.db'}")
    registry.move_tag("linear", "stable", D1, actor="ann")
    clock.now = T0 + timedelta(minutes=10)
    registry.move_tag("linear", "stable", D2, actor="ann")
    registry.set_track("linear", "stable", "ann")
    reader = SqliteReader(tmp_path / "registry.db")
    try:
        for when in (T0, T0 + timedelta(minutes=5), T0 + timedelta(minutes=10)):
            assert reader.tags_at(when, "linear") == registry.tags_at(when, "linear")
        assert reader.list_tags() == registry.list_tags()
        assert reader.tracks() == registry.tracks() == {"linear": "stable"}
        assert reader.find_model("linear").policy == "track"  # type: ignore[union-attr]
        assert tags.resolve_ref(reader, "linear", "stable") == D2
        assert tags.resolve_ref(reader, "linear", D1[:8]) == D1[:8]
        with pytest.raises(NotFoundError):
            tags.resolve_ref(reader, "linear", "canary")
        listing = tags.listing(reader, "linear", at=(T0 + timedelta(minutes=5)).isoformat())
        assert [(t.name, t.digest) for t in listing.tags] == [("stable", D1)]
    finally:
        reader.close()
        registry.close()


# -- the fleet: a tracked tag's move is a rollout (stand-in fleet: tests/test_tags_fleet_e2e.py runs real hosts) --


class StandInFleet:
    """The one entry point intake/tags.py calls on a fleet: `rollout(model, record, actor, force, progress)`."""

    def __init__(self, registry: Registry, outcome: str) -> None:
        self.registry = registry
        self.outcome = outcome
        self.calls: list[tuple[str, str]] = []

    def rollout(self, model: str, record: object, actor: str, *, force: bool, progress: object) -> object:
        from controlplane.deploy.engine import Outcome

        digest = record.digest  # type: ignore[attr-defined]
        self.calls.append((model, digest))
        active = digest if self.outcome == "ok" else self.registry.get_model(model).active_digest
        return Outcome(model, "rollout", self.outcome, digest, active, f"rollout 1: {self.outcome}")


class StandInPlane:
    """What intake/tags.py asks of the plane (controlplane.ports.TagTarget), as ControlPlane answers on a fleet:
    tags live in the shared registry and a tracked tag's digest goes out as a rollout."""

    def __init__(self, local: Registry, fleet: StandInFleet) -> None:
        self.registry = local
        self.fleet = fleet

    def tag_registry(self) -> Registry:
        return self.fleet.registry

    def deploy_tagged(self, model: str, digest: str, actor: str, progress: object) -> object:
        return self.fleet.rollout(model, self.fleet.registry.get_snapshot(model, digest), actor, force=False,
                                  progress=progress)

    def forget_retry(self, model: str) -> None:
        pass


@pytest.mark.parametrize("outcome", ["ok", "rolled_back"])
def test_a_tracked_tag_on_a_fleet_moves_by_rollout_in_the_shared_registry(tmp_path: Path, clock: Clock,
                                                                          outcome: str) -> None:
    shared = _migrated(f"sqlite:///{tmp_path / 'shared.db'}")
    local = Registry(f"sqlite:///{tmp_path / 'local.db'}")  # a host's own registry: never holds the tags
    migrate.upgrade(local)
    fleet = StandInFleet(shared, outcome)
    plane = StandInPlane(local, fleet)
    try:
        shared.move_tag("linear", "stable", D1, actor="ann")
        assert tags.move(plane, "linear", "canary", D2[:8], "ann").deployed is False  # not tracked: no rollout
        shared.set_track("linear", "stable", "ann")
        result = tags.move(plane, "linear", "stable", "canary", "ci")
        assert fleet.calls == [("linear", D2)]
        assert result.outcome == outcome
        expected = D2 if outcome == "ok" else D1
        assert {t.name: t.digest for t in shared.list_tags("linear")} == {"stable": expected, "canary": D2}
        assert local.list_tags() == []
        event = shared.query_audit(AuditQuery(model="linear", action="tag", limit=1))[0]
        assert (event.outcome, event.digest) == ("ok" if outcome == "ok" else "failed", D2)
    finally:
        shared.close()
        local.close()


def test_tracking_on_a_fleet_is_a_fleet_policy_change_audited_with_actor_and_host(tmp_path: Path,
                                                                                  clock: Clock) -> None:
    from types import SimpleNamespace

    from controlplane.fleet.verbs import FleetVerbs

    shared = _migrated(f"sqlite:///{tmp_path / 'shared.db'}")
    local = Registry(f"sqlite:///{tmp_path / 'local.db'}")
    migrate.upgrade(local)
    fleet = StandInFleet(shared, "ok")
    member = SimpleNamespace(host="h2", registry=shared, plane=StandInPlane(local, fleet))
    verbs = FleetVerbs(member)  # type: ignore[arg-type]
    try:
        shared.move_tag("linear", "stable", D1, actor="ann")
        shared.update_model("linear", pinned=True)  # no deploy follows: this checks the record, not a rollout
        result = verbs.set_policy("linear", "track:stable", "bob", "")
        assert (result.policy, result.fleet, result.tag, result.digest) == ("track:stable", True, "stable", D1)
        assert shared.tracks() == {"linear": "stable"} and local.tracks() == {}
        event = shared.query_audit(AuditQuery(model="linear", action="policy", limit=1))[0]
        assert (event.actor, event.outcome) == ("bob", "ok")
        assert "track:stable on the fleet (through h2)" in event.message, event.message
        # One host cannot track a tag on its own: one line, exit 2 (a UsageError), nothing recorded.
        with pytest.raises(TagError) as caught:
            verbs.set_policy("linear", "track:canary", "bob", "h2")
        assert isinstance(caught.value, UsageError) and "\n" not in str(caught.value)
        assert "tracking is fleet-wide" in str(caught.value)
        assert shared.tracks() == {"linear": "stable"} and fleet.calls == []
    finally:
        shared.close()
        local.close()


def test_policy_track_with_host_is_refused_in_one_line_before_the_daemon_is_asked(tmp_path: Path) -> None:
    from tests.cli_helpers import assert_one_line_error, invoke

    # No daemon runs under this state dir: the refusal (exit 2) comes before the client connects (exit 3).
    result = invoke(["policy", "linear", "track:stable", "--host", "h1", "--state-dir", str(tmp_path)])
    assert_one_line_error(result, 2, "track:stable", "--host h1", "tracking is fleet-wide")


# -- the `tags --json` contract (docs/json.md, docs/schemas/tags.schema.json) -------------------------


def test_tags_json_is_this_registry_and_matches_its_schema(tmp_path: Path, clock: Clock) -> None:
    import json

    from click.testing import CliRunner

    from cli.main import cli
    from tests import jsonschemas
    from tests.cli_helpers import serving_registry

    registry = _migrated(f"sqlite:///{tmp_path / 'registry.db'}")
    registry.move_tag("linear", "stable", D1, actor="ann")
    clock.now = T0 + timedelta(minutes=10)
    registry.move_tag("linear", "stable", D2, actor="bob")
    registry.close()
    args = ["tags", "linear", "--json", "--state-dir", str(tmp_path)]
    with serving_registry(tmp_path):  # the daemon's control API over this registry: one HTTP call each
        at = CliRunner().invoke(cli, [*args, "--at", "2026-11-01T12:05:00Z"])
        now = CliRunner().invoke(cli, args)
    assert at.exit_code == 0, at.output
    assert json.loads(at.stdout) == {  # this registry at 12:05: ann's move, not yet bob's
        "at": "2026-11-01T12:05:00Z",
        "tags": [{"model": "linear", "name": "stable", "digest": D1, "moved_by": "ann",
                  "moved_at": "2026-11-01T12:00:00Z"}],
    }
    jsonschemas.assert_valid("tags", json.loads(at.stdout))
    assert now.exit_code == 0, now.output
    data = json.loads(now.stdout)
    jsonschemas.assert_valid("tags", data)
    assert data["at"] is None
    assert data["tags"][0]["digest"] == D2 and data["tags"][0]["moved_by"] == "bob"


def test_tags_at_seeks_the_moves_index(tmp_path: Path, clock: Clock) -> None:
    """`tags --at T` is one index seek per tag, not a scan of every move (SQLite's plan for the reader's SQL)."""
    import sqlite3

    from controlplane.store.sqlite_reader import TAGS_AT_SQL, to_db_time

    _migrated(f"sqlite:///{tmp_path / 'registry.db'}").close()
    conn = sqlite3.connect(tmp_path / "registry.db")
    try:
        plan = " | ".join(row[-1] for row in conn.execute("EXPLAIN QUERY PLAN " + TAGS_AT_SQL.format(where=""),
                                                          (to_db_time(T0),)))
    finally:
        conn.close()
    assert "SEARCH latest USING COVERING INDEX ix_tag_moves_model_name_time (model=? AND name=? AND time<?)" in plan
    assert "SCAN tag_moves USING COVERING INDEX ix_tag_moves_model_name_time" in plan, plan  # the distinct names
