"""The daemon commands' rendering, error classes and exit codes, against the real control API server.

The server is `controlplane.api.server.ApiServer` (HTTP on a Unix socket) over a small stand-in control
plane returning canned outcomes and raising chosen errors. That tests the CLI's rendering, the
error-class propagation over HTTP and the exit codes; the end-to-end tests with the real daemon and a
real tritonserver are written separately (tests/test_daemon_e2e.py).
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from click.testing import Result

from cli import render
from cli.main import EXIT_FAILED, EXIT_TRITON_UNREACHABLE, EXIT_USAGE
from controlplane import errors
from controlplane.api.server import ApiServer
from controlplane.deploy.engine import Outcome, Progress
from controlplane.documents.results import GcResult, PinResult, PolicyResult, StatusResult, VersionState
from controlplane.names import validate_model_name
from controlplane.settings.config import Settings
from controlplane.store.records import ModelRecord, iso
from controlplane.views import queries
from tests.cli_helpers import NOW, assert_one_line_error, invoke

# --- daemon commands against the real control API server -------------------------------------------------


OFFLINE = "triton 127.0.0.1:8001 unreachable: connection refused"


class StandInPlane:
    """What the control API server calls: canned outcomes per model name, errors on request.

    `linear` succeeds, `flaky` is rolled back, `broken` fails, `ghost` is unknown (NotFoundError),
    `offline` meets an unreachable Triton; names are checked as the real plane checks them.
    """

    def __init__(self) -> None:
        self.triton = SimpleNamespace(url="127.0.0.1:8001")
        self.calls: list[tuple[Any, ...]] = []

    def _check(self, model: str) -> None:
        validate_model_name(model)
        if model == "ghost":
            raise errors.NotFoundError(f"model '{model}' is unknown to the registry")
        if model == "offline":
            raise errors.TritonUnavailableError(OFFLINE)

    def _operate(self, action: str, model: str, digest: str, progress: Callable[[Progress], None]) -> Outcome:
        self._check(model)
        steps = [("snapshot", "ok", "recorded"), ("publish", "ok", ""), ("load", "start", ""), ("load", "ok", "")]
        outcome, message = "ok", f"serving {digest[:12]}"
        if model == "flaky":
            steps[-1] = ("verify", "failed", "version 2 UNAVAILABLE: failed to load")
            steps.append(("restore", "ok", "restored previous"))
            outcome, message = "rolled_back", "version 2 UNAVAILABLE: failed to load; restored 111111111111"
        elif model == "broken":
            steps[-1] = ("load", "failed", "load timed out after 120 s")
            outcome, message = "failed", "load timed out after 120 s; nothing was serving before"
        for step, state, text in steps:
            progress(Progress(model, step, state, text, digest))
        return Outcome(model, action, outcome, digest, digest if outcome == "ok" else "1" * 64, message, 42)

    def load(self, model: str, actor: str, digest: str, force: bool, progress: Callable[[Progress], None],
             bake_s: float | None = None, steps: list[int | str] | None = None,
             shadow_s: float | None = None) -> Outcome:
        self.calls.append(("load", model, actor, digest, force))
        return self._operate("deploy", model, digest or "9" * 64, progress)

    def rollback(self, model: str, actor: str, to: str, progress: Callable[[Progress], None],
                 force: bool = False) -> Outcome:
        self.calls.append(("rollback", model, actor, to))
        return self._operate("rollback", model, to or "1" * 64, progress)

    def unload(self, model: str, actor: str, dependents: bool, progress: Callable[[Progress], None],
               force: bool = False) -> Outcome:
        self.calls.append(("unload", model, actor, dependents))
        self._check(model)
        progress(Progress(model, "unload", "ok", "", ""))
        return Outcome(model, "unload", "ok", None, None, "unloaded", 7)

    def status(self, models: list[str] | None) -> StatusResult:
        self.calls.append(("status", models))
        for name in models or []:
            self._check(name)
        since = NOW - timedelta(hours=1)
        linear = ModelRecord("linear", None, True, "9" * 64, "serving", None, since, since, None)
        broken = ModelRecord("broken", "manual", False, None, "failed", "load timed out", None, since, None)
        rows = [
            queries.status_row(linear, "auto", [VersionState("1", "READY", ""), VersionState("2", "READY", "")],
                               None, True),
            queries.status_row(broken, "manual", [VersionState("1", "UNAVAILABLE", "timeout")], None, True),
        ]
        rows = [r for r in rows if not models or r.model in models]
        return StatusResult(True, self.triton.url, None, {"mode": None, "reason": "stand-in"}, rows)

    def set_policy(self, model: str, policy: str, actor: str) -> PolicyResult:
        self.calls.append(("policy", model, policy, actor))
        self._check(model)
        return PolicyResult(model, "auto" if policy == "inherit" else policy, inherited=policy == "inherit")

    def set_pin(self, model: str, pinned: bool, actor: str) -> PinResult:
        self.calls.append(("pin", model, pinned, actor))
        self._check(model)
        return PinResult(model, pinned, "9" * 64)

    def gc(self, keep: int, actor: str) -> GcResult:
        self.calls.append(("gc", keep, actor))
        return GcResult(snapshots_removed=3, snapshots_kept=5, bytes_freed=123456)


@dataclass
class Daemon:
    state: Path
    plane: StandInPlane

    def run(self, *args: str) -> Result:
        self.plane.calls.clear()
        return invoke([*args, "--state-dir", str(self.state)])


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    # A short path: Unix socket paths are limited to ~107 bytes, pytest's tmp paths can be longer.
    state = Path(tempfile.mkdtemp(prefix="tctl-cli-"))
    plane = StandInPlane()
    executor = futures.ThreadPoolExecutor(max_workers=2)
    server = ApiServer(plane, executor, Settings(state_dir=state))  # type: ignore[arg-type]
    server.start()
    try:
        yield Daemon(state, plane)
    finally:
        server.stop(0.1)
        executor.shutdown(wait=False)
        shutil.rmtree(state, ignore_errors=True)


def test_socket_is_the_state_dirs(daemon: Daemon) -> None:
    assert (daemon.state / "tritonctl.sock").is_socket()
    assert oct((daemon.state / "tritonctl.sock").stat().st_mode & 0o777) == oct(0o660)


def test_load_ok_shows_each_step(daemon: Daemon) -> None:
    result = daemon.run("load", "linear", "--digest", "abcdef12")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert [line.split()[:2] for line in lines[:-1]] == [["ok", "snapshot"], ["ok", "publish"], ["ok", "load"]]
    assert "start" not in result.output  # only finished steps are shown
    assert lines[-1] == "ok  linear abcdef12  serving abcdef12"
    assert result.stderr == ""
    [(_, model, actor, digest, force)] = daemon.plane.calls
    assert (model, digest, force) == ("linear", "abcdef12", False)
    assert actor  # the caller's OS user travels as the actor


def test_load_force_and_json(daemon: Daemon) -> None:
    result = daemon.run("load", "linear", "--force", "--json")
    assert result.exit_code == 0
    data = json.loads(result.output)
    assert {k: data[k] for k in ("model", "action", "outcome", "digest", "message")} == {
        "model": "linear", "action": "deploy", "outcome": "ok", "digest": "9" * 64, "message": "serving 999999999999"}
    assert daemon.plane.calls[0][4] is True


def test_load_no_wait_is_accepted(daemon: Daemon) -> None:
    result = daemon.run("load", "linear", "--no-wait")
    assert result.exit_code == 0
    assert result.output.startswith("accepted  linear")


def test_load_rolled_back_exits_1_with_the_reason(daemon: Daemon) -> None:
    result = daemon.run("load", "flaky")
    assert_one_line_error(result, EXIT_FAILED, "version 2 UNAVAILABLE: failed to load; restored 111111111111")
    stdout = result.stdout
    assert "failed verify" in " ".join(stdout.split())
    assert "ok restore" in " ".join(stdout.split())
    assert stdout.splitlines()[-1].startswith("rolled_back  flaky")


def test_load_rolled_back_json_still_prints_the_outcome(daemon: Daemon) -> None:
    result = daemon.run("load", "flaky", "--json")
    assert result.exit_code == EXIT_FAILED
    assert json.loads(result.stdout)["outcome"] == "rolled_back"
    assert result.stderr.startswith("error: version 2 UNAVAILABLE")


def test_load_failed_exits_1(daemon: Daemon) -> None:
    result = daemon.run("load", "broken")
    assert_one_line_error(result, EXIT_FAILED, "load timed out after 120 s")
    assert result.stdout.splitlines()[-1].startswith("failed  broken")


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["load", "ghost"], EXIT_USAGE, "error: model 'ghost' is unknown to the registry\n"),
        (["rollback", "ghost"], EXIT_USAGE, "error: model 'ghost' is unknown to the registry\n"),
        (["unload", "ghost"], EXIT_USAGE, "error: model 'ghost' is unknown to the registry\n"),
        (["status", "ghost"], EXIT_USAGE, "error: model 'ghost' is unknown to the registry\n"),
        (["pin", "ghost"], EXIT_USAGE, "error: model 'ghost' is unknown to the registry\n"),
        (["load", "../x"], EXIT_USAGE, "error: model name '../x' contains a path separator\n"),
        (["policy", "a b", "auto"], EXIT_USAGE,
         "error: model name 'a b' contains a space: use only A-Z a-z 0-9 _ . -\n"),
        (["load", "offline"], EXIT_TRITON_UNREACHABLE, f"error: {OFFLINE}\n"),
        (["unpin", "offline"], EXIT_TRITON_UNREACHABLE, f"error: {OFFLINE}\n"),
    ],
)
def test_daemon_error_classes_become_exit_codes(daemon: Daemon, args: list[str], code: int, message: str) -> None:
    result = daemon.run(*args)
    assert_one_line_error(result, code)
    assert result.stderr == message


def test_unload(daemon: Daemon) -> None:
    result = daemon.run("unload", "linear", "--dependents")
    assert result.exit_code == 0
    assert result.output.splitlines()[-1].split() == ["ok", "linear", "-", "unloaded"]
    assert daemon.plane.calls[0][3] is True
    assert json.loads(daemon.run("unload", "linear", "--json").output)["outcome"] == "ok"


def test_rollback(daemon: Daemon) -> None:
    result = daemon.run("rollback", "linear", "--to", "111111")
    assert result.exit_code == 0
    assert daemon.plane.calls[0][1:4:2] == ("linear", "111111")
    assert result.output.splitlines()[-1] == "ok  linear 111111  serving 111111"
    failed = daemon.run("rollback", "flaky")
    assert failed.exit_code == EXIT_FAILED


def test_status_table(daemon: Daemon) -> None:
    result = daemon.run("status")
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert lines[0] == "triton grpc 127.0.0.1:8001"
    assert lines[1].split() == ["MODEL", "STATE", "SYNC", "DIGEST", "VERSIONS", "AGE"]
    assert max(len(line) for line in lines) <= 100  # readable at 100 columns by default
    linear = next(line for line in lines if line.startswith("linear"))
    assert linear.split()[:2] == ["linear", "serving"] and "999999999999" in linear and " 1,2 " in linear
    assert re.fullmatch(r"\d+[smhdy]|\d+h\d+m", linear.split()[-1]), linear  # kubectl-style age of `since`
    broken = next(line for line in lines if line.startswith("broken"))
    assert "1:UNAVAILABLE" in broken and broken.split()[1] == "failed"
    wide = daemon.run("status", "-o", "wide").output.splitlines()
    assert all(h in wide[1] for h in ("SINCE", "POLICY", "PINNED", "DRIFT", "SOURCE", "SYNC REASON", "LAST ERROR"))
    assert "load timed out" in next(line for line in wide if line.startswith("broken")) and "\x1b" not in "".join(wide)


def test_status_json_shape(daemon: Daemon) -> None:
    data = json.loads(daemon.run("status", "--json").output)
    assert (data["triton_reachable"], data["triton_url"]) == (True, "127.0.0.1:8001")
    for row in data["models"]:
        assert {"model", "state", "versions", "digest", "since", "policy", "pinned", "drift", "last_error"} <= set(row)
    linear = data["models"][0]
    assert (linear["model"], linear["state"], linear["digest"], linear["policy"], linear["drift"]) == (
        "linear", "serving", "9" * 64, "auto", None)
    assert linear["versions"] == [{"version": "1", "state": "READY", "reason": ""},
                                  {"version": "2", "state": "READY", "reason": ""}]
    assert linear["since"] == iso(NOW - timedelta(hours=1))
    only = json.loads(daemon.run("status", "broken", "--json").output)
    assert [r["model"] for r in only["models"]] == ["broken"]
    assert daemon.plane.calls == [("status", ["broken"])]


@pytest.mark.parametrize(
    ("args", "call", "lines"),
    [
        (["gc", "--keep", "2"], "gc", ["snapshots_removed: 3", "snapshots_kept: 5", "bytes_freed: 123456"]),
    ],
)
def test_small_mutations_print_key_values(daemon: Daemon, args: list[str], call: str, lines: list[str]) -> None:
    result = daemon.run(*args)
    assert result.exit_code == 0
    assert result.output.splitlines() == lines
    assert daemon.plane.calls[0][0] == call
    as_json = json.loads(daemon.run(*args, "--json").output)
    assert [f"{k}: {v}" for k, v in as_json.items()] == lines


@pytest.mark.parametrize(("args", "line", "document"), [
    (["policy", "linear", "manual"], "linear: policy manual",
     {"model": "linear", "policy": "manual", "inherited": False}),
    (["policy", "linear", "inherit"], "linear: policy auto (inherited: the daemon's default)",
     {"model": "linear", "policy": "auto", "inherited": True}),
])
def test_policy_prints_what_it_set_in_words(daemon: Daemon, args: list[str], line: str,
                                            document: dict[str, object]) -> None:
    """One line in words (issue 57: it printed Python's `inherited: False`); --json keeps the document."""
    result = daemon.run(*args)
    assert (result.exit_code, result.output.splitlines()) == (0, [line])
    assert "False" not in result.output and "True" not in result.output
    assert json.loads(daemon.run(*args, "--json").output) == document


@pytest.mark.parametrize(("args", "line", "pinned"), [(["pin", "linear"], f"linear pinned at {'9' * 12}", True),
                                                     (["unpin", "linear"], "linear unpinned", False)])
def test_pin_prints_what_it_did(daemon: Daemon, args: list[str], line: str, pinned: bool) -> None:
    """`pin` says `pinned` (issue 47), not `pinned: True`; --json keeps the document."""
    result = daemon.run(*args)
    assert (result.exit_code, result.output.splitlines()) == (0, [line])
    assert daemon.plane.calls[0][0] == "pin"
    assert json.loads(daemon.run(*args, "--json").output) == {"model": "linear", "pinned": pinned, "digest": "9" * 64}


def test_click_rejects_bad_policy_and_keep_with_exit_2(daemon: Daemon) -> None:
    assert daemon.run("policy", "linear", "sometimes").exit_code == EXIT_USAGE
    assert daemon.run("gc", "--keep", "-1").exit_code == EXIT_USAGE
    assert daemon.plane.calls == []  # refused before anything reached the daemon


@pytest.mark.parametrize(("seconds", "shown"), [(5, "5s"), (119, "119s"), (600, "10m"), (3 * 3600 + 300, "3h5m"),
                                                (20 * 3600, "20h"), (5 * 86400, "5d"), (800 * 86400, "2y")])
def test_ages_are_kubectl_style(seconds: int, shown: str) -> None:
    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    assert render.age(iso((now - timedelta(seconds=seconds)).replace(tzinfo=None)), now) == shown
