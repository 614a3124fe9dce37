"""The read commands (versions, diff, audit, audit --at, tags, db upgrade) against a real registry.

They run against a real SQLite registry (migrated by the project's migrations) and a real content store
in a temp state directory, filled through the registry's own API with a fixed clock, served by the
daemon's control API (the real ApiServer over the real ControlPlane, tests/cli_helpers.py): each command
is one HTTP call, as against a running daemon. With --db-url the same commands read the registry
directly, without a daemon: test_db_url_reads_answer_as_the_daemon_does.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from cli.main import EXIT_DAEMON_UNREACHABLE, EXIT_FAILED, EXIT_USAGE
from controlplane.snapshot import ContentStore, Snapshot
from controlplane.store import migrate
from controlplane.store.records import ServingRecord, iso
from controlplane.store.registry import AuditEntry, Registry
from tests.cli_helpers import NOW, assert_one_line_error, invoke, serving_registry
from tests.clock import Clock

# --- a registry with history -----------------------------------------------------------------------


@dataclass
class Event:
    at: datetime
    actor: str
    action: str
    model: str | None
    digest: str | None
    outcome: str
    message: str

    def key(self) -> tuple[Any, ...]:
        return (iso(self.at), self.actor, self.action, self.model, self.outcome, self.message)


@dataclass
class History:
    state: Path
    digests: dict[str, str]
    events: list[Event] = field(default_factory=list)

    def expect(self, keep: Callable[[Event], bool] = lambda e: True, limit: int = 100) -> list[tuple[Any, ...]]:
        """The audit rows a query should return: newest first."""
        return [e.key() for e in sorted(self.events, key=lambda e: e.at, reverse=True) if keep(e)][:limit]


MODEL_V2 = "class TritonPythonModel:\n    GEN = 2\n"
NOTES = "first cut\n"


def config_text(gen: int) -> str:
    return f'name: "linear"\nbackend: "python"\nmax_batch_size: {8 * gen}\n'


def _write_linear(src: Path, gen: int) -> None:
    (src / "1").mkdir(parents=True, exist_ok=True)
    (src / "config.pbtxt").write_text(config_text(gen))
    (src / "1" / "model.py").write_text("class TritonPythonModel:\n    pass\n")
    if gen == 1:
        (src / "1" / "notes.txt").write_text(NOTES)
    else:
        (src / "1" / "notes.txt").unlink(missing_ok=True)
        (src / "2").mkdir(exist_ok=True)
        (src / "2" / "model.py").write_text(MODEL_V2)


def build_history(base: Path) -> History:
    """Two models over eight days: snapshots, deploys, a rollback, a policy change and an unload.

    Times are relative to NOW; every write goes through the registry's own methods with the clock set.
    """
    state = base / "state"
    state.mkdir()
    clock = Clock(NOW)
    registry = Registry(f"sqlite:///{state / 'registry.db'}", clock=clock)
    try:
        migrate.upgrade(registry)
        store = ContentStore(state / "store", fsync=False)
        src = base / "src"
        _write_linear(src / "linear", 1)
        linear1 = store.capture(src / "linear", "linear")
        _write_linear(src / "linear", 2)
        linear2 = store.capture(src / "linear", "linear")
        (src / "reshape" / "1").mkdir(parents=True)
        (src / "reshape" / "config.pbtxt").write_text('name: "reshape"\nbackend: "python"\n')
        reshape1 = store.capture(src / "reshape", "reshape")
        history = History(state, {"linear1": linear1.digest, "linear2": linear2.digest, "reshape1": reshape1.digest})

        def at(ago: timedelta) -> None:
            clock.now = NOW - ago

        def snapshot(snap: Snapshot, versions: list[int], valid: bool = True,
                     problems: Sequence[Any] = ()) -> None:
            registry.record_snapshot(snap.model, snap.digest, snap.manifest_json(), config=None, versions=versions,
                                     served_versions=versions, valid=valid, problems=list(problems),
                                     total_bytes=snap.total_bytes)
            event = Event(clock.now, "watcher", "snapshot", snap.model, snap.digest, "ok" if valid else "invalid",
                          "recorded" if valid else "invalid: bad config")
            registry.audit(AuditEntry(event.actor, event.action, event.model, event.digest, event.outcome,
                                      event.message))
            history.events.append(event)

        def deployment(model: str, digest: str | None, actor: str, outcome: str, serving: ServingRecord | None,
                       kind: str = "deploy", message: str = "") -> None:
            dep = registry.begin_deployment(model, kind, digest, None, actor)
            event = Event(clock.now, actor, kind, model, digest, outcome, message or f"{kind} {outcome}")
            registry.finish_deployment(
                dep.id, outcome=outcome, error=None if outcome == "ok" else event.message, serving=serving,
                audit=AuditEntry(actor, kind, model, digest, outcome, event.message, 1200),
                model_state="serving",
            )
            history.events.append(event)

        at(timedelta(days=8))
        snapshot(linear1, [1])
        at(timedelta(days=8) - timedelta(minutes=1))
        deployment("linear", linear1.digest, "alice", "ok", ServingRecord("linear", linear1.digest, [1]))
        at(timedelta(days=3))
        snapshot(reshape1, [1])
        at(timedelta(days=3) - timedelta(minutes=1))
        deployment("reshape", reshape1.digest, "watcher", "ok", ServingRecord("reshape", reshape1.digest, [1]))
        at(timedelta(minutes=90))
        snapshot(linear2, [1, 2])
        at(timedelta(minutes=89))
        deployment("linear", linear2.digest, "watcher", "rolled_back", None,
                   message="version 2 not READY: restored previous")
        at(timedelta(minutes=20))
        registry.update_model("linear", policy="manual")
        registry.audit(AuditEntry("bob", "policy", "linear", linear1.digest, "ok", "policy manual"))
        history.events.append(Event(clock.now, "bob", "policy", "linear", linear1.digest, "ok", "policy manual"))
        at(timedelta(minutes=10))
        deployment("linear", linear2.digest, "bob", "ok", ServingRecord("linear", linear2.digest, [1, 2]))
        at(timedelta(minutes=5))
        deployment("reshape", reshape1.digest, "carol", "ok", ServingRecord("reshape", None, []), kind="unload")
        # an invalid content of linear, seen but never deployed
        at(timedelta(minutes=2))
        (src / "linear" / "config.pbtxt").write_text('name: "linear"\nmax_batch_size: -1\n')
        broken = store.capture(src / "linear", "linear")
        history.digests["broken"] = broken.digest
        snapshot(broken, [1, 2], valid=False, problems=[
            {"file": "linear/config.pbtxt", "field": "max_batch_size", "message": "must be >= 0", "severity": "error"}
        ])
    finally:
        registry.close()
    return history


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[History]:
    history = build_history(tmp_path_factory.mktemp("cli-history"))
    with serving_registry(history.state):
        yield history


@pytest.fixture
def history(built: History, monkeypatch: pytest.MonkeyPatch) -> History:
    """The shared, read-only history, with "now" fixed for relative times (30m, 2h, 7d)."""
    monkeypatch.setattr("controlplane.base.clock.utcnow", lambda: NOW)
    return built


@pytest.fixture
def own_history(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[History]:
    """A private copy for tests that change the registry."""
    monkeypatch.setattr("controlplane.base.clock.utcnow", lambda: NOW)
    history = build_history(tmp_path)
    with serving_registry(history.state):
        yield history


def sd(history: History) -> list[str]:
    return ["--state-dir", str(history.state)]


# --- versions --------------------------------------------------------------------------------------


def test_versions_table_marks_the_active_one(history: History) -> None:
    result = invoke(["versions", "linear", *sd(history)])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == "linear: 3 versions"
    rows = {d: next(line for line in lines if history.digests[d][:12] in line)
            for d in ("linear1", "linear2", "broken")}
    assert rows["linear2"].lstrip("│ ").startswith("*")
    assert "*" not in rows["linear1"] and "*" not in rows["broken"]
    assert "linear/config.pbtxt: max_batch_size: must be >= 0" in rows["broken"]
    assert "no" in rows["broken"].split() and "yes" in rows["linear2"].split()
    assert "1, 2" in rows["linear2"]
    # newest first
    assert lines.index(rows["broken"]) < lines.index(rows["linear2"]) < lines.index(rows["linear1"])


def test_versions_json(history: History) -> None:
    result = invoke(["versions", "linear", "--json", *sd(history)])
    assert result.exit_code == 0
    data = json.loads(result.output)
    assert [row["digest"] for row in data] == [history.digests[d] for d in ("broken", "linear2", "linear1")]
    for row in data:
        assert {"digest", "first_seen", "last_seen", "valid", "active", "versions", "quarantined",
                "collected"} <= set(row)
        assert row["first_seen"].endswith("Z")
    assert [row["active"] for row in data] == [False, True, False]
    assert [row["valid"] for row in data] == [False, True, True]
    assert data[2]["first_seen"] == iso(NOW - timedelta(days=8))
    assert data[0]["first_error"] == "linear/config.pbtxt: max_batch_size: must be >= 0"


def test_versions_notes_quarantine_and_gc(own_history: History) -> None:
    registry = Registry(f"sqlite:///{own_history.state / 'registry.db'}")
    registry.set_quarantine("linear", own_history.digests["linear2"], "smoke failed")
    registry.mark_collected("linear", [own_history.digests["linear1"]])
    registry.close()
    result = invoke(["versions", "linear", *sd(own_history)])
    assert "quarantined: smoke failed" in result.output
    assert "content removed by gc" in result.output


def test_versions_of_unknown_or_bad_model(history: History) -> None:
    assert_one_line_error(invoke(["versions", "nobody", *sd(history)]), EXIT_USAGE, "'nobody' is unknown")
    assert_one_line_error(invoke(["versions", "../x", *sd(history)]), EXIT_USAGE, "path separator")


READS = (["versions", "linear"], ["audit"], ["audit", "--at", "1h"], ["diff", "linear", "aaaaaa", "bbbbbb"], ["tags"])


def test_read_commands_without_a_daemon_name_db_url(tmp_path: Path) -> None:
    """No daemon: exit 3, the message saying how to read the registry without one (no silent fallback)."""
    for args in READS:
        assert_one_line_error(invoke([*args, "--state-dir", str(tmp_path)]), EXIT_DAEMON_UNREACHABLE,
                              "no daemon at", f"--db-url sqlite:///{tmp_path / 'registry.db'}")


def test_read_commands_without_a_registry(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    for args in READS:
        assert_one_line_error(invoke([*args, "--db-url", url, "--state-dir", str(tmp_path)]), EXIT_USAGE,
                              "db upgrade")


@pytest.mark.parametrize("args", [
    ["versions", "linear"], ["diff", "linear", "LINEAR1", "LINEAR2"], ["audit", "--since", "2h"],
    ["audit", "--model", "linear", "--limit", "2"], ["audit", "--at", "7m"], ["tags"], ["tags", "--at", "1h"],
    ["versions", "nobody"], ["audit", "--since", "yesterday"],
], ids=" ".join)
def test_db_url_reads_answer_as_the_daemon_does(history: History, args: list[str]) -> None:
    """--db-url reads the registry in this process; without it the daemon answers: the same document and
    text, and the same one-line errors."""
    args = [history.digests[a.lower()] if a in ("LINEAR1", "LINEAR2") else a for a in args]
    db_url = ["--db-url", f"sqlite:///{history.state / 'registry.db'}"]
    for extra in ([], ["--json"]):
        daemon = invoke([*args, *extra, *sd(history)])
        direct = invoke([*args, *extra, *db_url, "--state-dir", str(history.state)])
        assert (direct.exit_code, direct.stdout, direct.stderr) == (daemon.exit_code, daemon.stdout, daemon.stderr)


# --- diff --------------------------------------------------------------------------------------------


def test_diff_text(history: History) -> None:
    a, b = history.digests["linear1"], history.digests["linear2"]
    result = invoke(["diff", "linear", a[:8], b[:8], *sd(history)])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[:4] == [
        f"linear: {a[:12]} -> {b[:12]}",
        f"  added    2/model.py ({len(MODEL_V2)} bytes)",
        f"  removed  1/notes.txt ({len(NOTES)} bytes)",
        f"  changed  config.pbtxt ({len(config_text(1))} -> {len(config_text(2))} bytes)",
    ]
    assert "-max_batch_size: 8\n+max_batch_size: 16" in result.output


def test_diff_json(history: History) -> None:
    a, b = history.digests["linear1"], history.digests["linear2"]
    data = json.loads(invoke(["diff", "linear", a, b, "--json", *sd(history)]).output)
    assert (data["model"], data["a"], data["b"]) == ("linear", a, b)
    assert data["added"] == [{"path": "2/model.py", "size": len(MODEL_V2)}]
    assert data["removed"] == [{"path": "1/notes.txt", "size": len(NOTES)}]
    assert [c["path"] for c in data["changed"]] == ["config.pbtxt"]
    assert data["changed"][0]["diff"].startswith(f"--- {a[:12]}/config.pbtxt")


def test_diff_same_snapshot_and_errors(history: History) -> None:
    a = history.digests["linear1"]
    assert "no differences" in invoke(["diff", "linear", a[:8], a, *sd(history)]).output
    assert_one_line_error(invoke(["diff", "linear", "deadbeef", a, *sd(history)]), EXIT_USAGE, "no snapshot")
    assert_one_line_error(invoke(["diff", "reshape", a, a, *sd(history)]), EXIT_USAGE)
    assert_one_line_error(invoke(["diff", "a/b", a, a, *sd(history)]), EXIT_USAGE)


# --- audit -----------------------------------------------------------------------------------------


def audit_json(history: History, *args: str) -> list[tuple[Any, ...]]:
    result = invoke(["audit", *args, "--json", *sd(history)])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    for row in rows:
        assert {"time", "actor", "action", "model", "digest", "outcome", "message", "duration_ms"} <= set(row)
    return [(r["time"], r["actor"], r["action"], r["model"], r["outcome"], r["message"]) for r in rows]


AGO = {"30m": timedelta(minutes=30), "2h": timedelta(hours=2), "7d": timedelta(days=7), "1h": timedelta(hours=1)}


@pytest.mark.parametrize(
    ("args", "keep"),
    [
        ([], lambda e: True),
        (["--model", "linear"], lambda e: e.model == "linear"),
        (["--action", "deploy"], lambda e: e.action == "deploy"),
        (["--outcome", "rolled_back"], lambda e: e.outcome == "rolled_back"),
        (["--outcome", "invalid"], lambda e: e.outcome == "invalid"),
        (["--actor", "bob"], lambda e: e.actor == "bob"),
        (["--since", "30m"], lambda e: e.at >= NOW - AGO["30m"]),
        (["--since", "2h"], lambda e: e.at >= NOW - AGO["2h"]),
        (["--since", "7d"], lambda e: e.at >= NOW - AGO["7d"]),
        (["--until", "1h"], lambda e: e.at <= NOW - AGO["1h"]),
        (["--since", "2026-11-26T00:00:00Z", "--until", "2026-11-29T12:00:00+01:00"],
         lambda e: datetime(2026, 11, 26) <= e.at <= datetime(2026, 11, 29, 11)),
        (["--since", "2026-11-21"], lambda e: e.at >= datetime(2026, 11, 21)),  # naive ISO is UTC
        (["--model", "linear", "--action", "deploy", "--since", "7d"],
         lambda e: e.model == "linear" and e.action == "deploy" and e.at >= NOW - AGO["7d"]),
        (["--actor", "watcher", "--outcome", "ok", "--model", "reshape"],
         lambda e: e.actor == "watcher" and e.outcome == "ok" and e.model == "reshape"),
        (["--model", "nobody"], lambda e: False),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else "",
)
def test_audit_filters_newest_first(history: History, args: list[str], keep: Callable[[Event], bool]) -> None:
    expected = history.expect(keep)
    assert audit_json(history, *args) == expected
    assert expected or args == ["--model", "nobody"]  # every filter selects something


def test_audit_limit_keeps_the_newest(history: History) -> None:
    assert audit_json(history, "--limit", "2") == history.expect(limit=2)
    assert audit_json(history, "--action", "snapshot", "--limit", "1") == history.expect(
        lambda e: e.action == "snapshot", limit=1)


def test_audit_json_values(history: History) -> None:
    rows = json.loads(invoke(["audit", "--actor", "bob", "--action", "deploy", "--json", *sd(history)]).output)
    assert rows == [{
        "id": rows[0]["id"], "time": iso(NOW - timedelta(minutes=10)), "actor": "bob", "action": "deploy",
        "model": "linear", "digest": history.digests["linear2"], "outcome": "ok", "duration_ms": 1200,
        "message": "deploy ok", "host": "", "claimed": None,
    }]


def test_audit_table(history: History) -> None:
    result = invoke(["audit", "--model", "linear", "--since", "2h", *sd(history)])
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert lines[0] == "5 events"
    assert all(h in lines[1] for h in ("Time", "Actor", "Action", "Model", "Digest", "Outcome", "Duration", "Message"))
    body = [line for line in lines if "linear" in line]
    assert [next(w for w in ("snapshot", "deploy", "policy") if w in line) for line in body] == [
        "snapshot", "deploy", "policy", "deploy", "snapshot"]  # newest first
    assert "version 2 not READY: restored previous" in result.output
    assert "1200 ms" in result.output and history.digests["linear2"][:12] in result.output


@pytest.mark.parametrize(
    ("args", "code", "fragment"),
    [
        (["--since", "yesterday"], EXIT_USAGE, "--since: 'yesterday' is neither ISO 8601 nor a relative time"),
        (["--until", "2h ago"], EXIT_USAGE, "--until"),
        (["--at", "noonish"], EXIT_USAGE, "--at"),
        (["--model", "../x"], EXIT_USAGE, "path separator"),
        (["--model", "../x", "--at", "1h"], EXIT_USAGE, "path separator"),
    ],
)
def test_audit_usage_errors(history: History, args: list[str], code: int, fragment: str) -> None:
    assert_one_line_error(invoke(["audit", *args, *sd(history)]), code, fragment)


@pytest.mark.parametrize("args", [["--outcome", "great"], ["--limit", "0"], ["--limit", "x"], ["--bogus"]])
def test_audit_click_usage_errors_exit_2_without_traceback(history: History, args: list[str]) -> None:
    result = invoke(["audit", *args, *sd(history)])
    assert result.exit_code == EXIT_USAGE
    assert isinstance(result.exception, SystemExit)  # click's own usage message, no traceback
    assert "Traceback" not in result.output


# --- audit --at --------------------------------------------------------------------------------------


def served_at(history: History, at: str, *args: str) -> dict[str, tuple[str, list[int]]]:
    result = invoke(["audit", "--at", at, "--json", *args, *sd(history)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert set(data) == {"at", "models"}
    return {row["model"]: (row["digest"], row["versions"]) for row in data["models"]}


def test_audit_at_answers_what_served_when(history: History) -> None:
    d = history.digests
    assert served_at(history, "9d") == {}
    assert served_at(history, iso(NOW - timedelta(days=5)) or "") == {"linear": (d["linear1"], [1])}
    both_old = {"linear": (d["linear1"], [1]), "reshape": (d["reshape1"], [1])}
    assert served_at(history, "2d") == both_old
    assert served_at(history, "60m") == both_old  # the rolled back deploy changed nothing
    assert served_at(history, "7m") == {"linear": (d["linear2"], [1, 2]), "reshape": (d["reshape1"], [1])}
    assert served_at(history, "0s") == {"linear": (d["linear2"], [1, 2])}  # reshape was unloaded 5m ago
    assert served_at(history, "7m", "--model", "reshape") == {"reshape": (d["reshape1"], [1])}
    assert served_at(history, "2026-11-29T11:00:00+00:00") == both_old


def test_audit_at_json_and_table(history: History) -> None:
    data = json.loads(invoke(["audit", "--at", "2026-11-29T11:55:00Z", "--json", *sd(history)]).output)
    assert data["at"] == "2026-11-29T11:55:00Z"
    assert data["models"][0] == {"model": "linear", "digest": history.digests["linear2"], "versions": [1, 2],
                                 "since": iso(NOW - timedelta(minutes=10)), "host": "", "tags": []}
    table = invoke(["audit", "--at", "2026-11-29T11:54:59Z", *sd(history)]).output
    assert table.splitlines()[0] == "serving at 2026-11-29T11:54:59Z"
    assert history.digests["linear2"][:12] in table and history.digests["reshape1"][:12] in table


# --- db upgrade ------------------------------------------------------------------------------------


def test_db_upgrade_creates_then_reports_nothing_to_do(tmp_path: Path) -> None:
    state = tmp_path / "new-state"
    head = migrate.head_revision()
    first = invoke(["db", "upgrade", "--state-dir", str(state)])
    assert first.exit_code == 0, first.output
    assert first.output.startswith(f"from: None\nto: {head}\nran: 0001 Initial registry")
    assert len(first.output.splitlines()) == 2 + len(migrate.pending(None))  # one line per migration run, no copy
    assert (state / "registry.db").exists()
    again = invoke(["db", "upgrade", "--state-dir", str(state), "--json"])
    assert json.loads(again.output) == {"from": head, "to": head, "migrations": [], "backup": None, "dry_run": False}
    url = ["--db-url", f"sqlite:///{state / 'registry.db'}"]
    assert_one_line_error(invoke(["versions", "linear", *url]), EXIT_USAGE, "unknown")
    assert invoke(["audit", "--json", *url]).output.strip() == "[]"


def test_db_upgrade_with_a_db_url(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    result = invoke(["db", "upgrade", "--db-url", url, "--json"])
    assert json.loads(result.output)["to"] == migrate.head_revision()
    assert invoke(["audit", "--db-url", url, "--state-dir", str(tmp_path / "unused"), "--json"]).output.strip() == "[]"


def test_read_commands_need_no_state_directory(tmp_path: Path) -> None:
    """With --db-url, audit and versions read only the registry: they create nothing (the content store's
    directories included) in a state directory that does not exist or that the user cannot write."""
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    assert invoke(["db", "upgrade", "--db-url", url]).exit_code == 0
    nowhere = tmp_path / "no-state"
    for args in (["audit"], ["audit", "--at", "1h"], ["audit", "--model", "linear", "--since", "7d"]):
        result = invoke([*args, "--json", "--db-url", url, "--state-dir", str(nowhere)])
        assert result.exit_code == 0, result.output
    assert_one_line_error(invoke(["versions", "linear", "--db-url", url, "--state-dir", str(nowhere)]),
                          EXIT_USAGE, "unknown")
    assert not nowhere.exists()


def test_read_commands_refuse_an_old_schema(tmp_path: Path) -> None:
    registry = Registry(f"sqlite:///{tmp_path / 'registry.db'}")
    migrate.upgrade(registry, "0001")
    registry.close()
    if migrate.head_revision() == "0001":
        pytest.skip("only one migration so far")
    assert_one_line_error(invoke(["audit", "--db-url", f"sqlite:///{tmp_path / 'registry.db'}"]), EXIT_FAILED,
                          "db upgrade")
