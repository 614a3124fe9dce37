"""Every `--help` example is a command line that tritonctl accepts as written (no missing option, no
unknown flag), and runs as written: against one daemon started by the help's own `daemon` example
in a directory holding `examples/model_repository` (the CLI finds it in `./.state`, as the README's
second terminal does), in an order that gives each example something to act on. Where an example
names something that cannot exist here, the test replaces only that word and says so (REPLACED);
what cannot run here at all is parse-only, with the reason (PARSE_ONLY). `rollouts --open --watch`
runs against a fleet member's control API."""

from __future__ import annotations

import functools
import glob
import json
import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import click
import pytest
from click.testing import CliRunner, Result

from cli.main import cli
from controlplane.store import migrate
from controlplane.store.registry import Registry
from tests.harness import SWITCH_AT_ONCE_ENV, TRITONCTL, DaemonProcess, wait_for

ROOT = Path(__file__).resolve().parent.parent


def _examples() -> list[str]:
    lines: list[str] = []

    def walk(group: click.Group, path: tuple[str, ...]) -> None:
        context = click.Context(group)
        for name in sorted(group.list_commands(context)):  # commands load lazily (cli/main.py)
            command = group.get_command(context, name)
            assert command is not None, name
            help_text = CliRunner().invoke(cli, [*path, name, "--help"]).output
            for line in help_text.split("Example", 1)[-1].splitlines():
                text = line.split("#", 1)[0].strip()
                if text.startswith("tritonctl "):
                    lines.append(text)
            if isinstance(command, click.Group):
                walk(command, (*path, name))

    walk(cli, ())
    return sorted(set(lines))


EXAMPLES = _examples()


def test_there_are_examples() -> None:
    assert len(EXAMPLES) > 20 and "tritonctl rollouts --open --watch" in EXAMPLES


@pytest.mark.parametrize("line", EXAMPLES)
def test_help_example_parses_as_written(line: str) -> None:
    args = shlex.split(line)[1:]
    command: click.Command = cli
    while isinstance(command, click.Group) and args and not args[0].startswith("-"):  # `webhooks` lists too
        name, args = args[0], args[1:]
        found = command.get_command(click.Context(command), name)
        assert found is not None, f"{line}: no command {name}"
        command = found
    command.make_context(command.name or "", args)  # raises on a missing or unknown option

def test_rollouts_open_watch_runs_against_a_fleet_members_daemon(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A fleet member's control API (the real ApiServer; its plane a stand-in whose fleet registry is a real,
    migrated one): nothing open, so one look, then it returns. No daemon: exit 3 naming --db-url."""
    from concurrent import futures
    from types import SimpleNamespace

    from controlplane.api.server import ApiServer
    from controlplane.settings.config import Settings
    from tests.test_cli_daemon_commands import StandInPlane

    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    registry = Registry(url)
    migrate.upgrade(registry)
    plane = StandInPlane()
    plane.fleet = SimpleNamespace(registry=registry)  # type: ignore[attr-defined]
    server = ApiServer(plane, futures.ThreadPoolExecutor(max_workers=1),  # type: ignore[arg-type]
                       Settings(state_dir=tmp_path / "state"))
    server.start()
    monkeypatch.delenv("TRITONCTL_DB_URL", raising=False)
    monkeypatch.setenv("TRITONCTL_STATE_DIR", str(tmp_path / "state"))
    try:
        result = CliRunner().invoke(cli, ["rollouts", "--open", "--watch"])
        assert result.exit_code == 0, result.output  # nothing open: one look, then it returns
    finally:
        server.stop(0.1)
        registry.close()
    missing = CliRunner().invoke(cli, ["rollouts", "--open", "--watch"])
    assert missing.exit_code == 3 and "--db-url" in missing.stderr


# Run as written, in this order (each leaves what the next one acts on). Words in REPLACED are
# swapped for what exists here; everything else on the line is run verbatim.
SCRIPT = [
    "tritonctl status",
    "tritonctl status -o wide",
    "tritonctl status linear sentiment --json",
    "tritonctl versions linear --json",
    "tritonctl validate examples/model_repository --json",
    "tritonctl validate examples/model_repository/*",
    "tritonctl pin linear",
    "tritonctl unpin linear",
    # -- here the test edits linear's source: two recorded digests, A (old) and B (new, serving) --
    "tritonctl diff linear 3f2a9c1b 9e01d4aa",
    "tritonctl tags linear --at 2026-11-29T03:00:00Z",
    "tritonctl tag linear stable",
    "tritonctl tag linear canary 3f2a9c1b",
    "tritonctl tags",
    "tritonctl tags linear --json",
    "tritonctl diff linear stable canary",
    "tritonctl rollback linear",
    "tritonctl load linear --bake 5m",
    "tritonctl abort linear",
    "tritonctl load linear --steps 5,pause,100 --bake 10m",
    "tritonctl promote linear",
    "tritonctl load linear",
    "tritonctl load linear --digest 3f2a9c1b",
    "tritonctl load linear --force",
    "tritonctl rollback linear --to 3f2a9c1b",
    "tritonctl rollback linear --to-tag stable",
    "tritonctl load linear --tag stable",
    "tritonctl policy linear track:stable",
    "tritonctl tag linear stable canary",
    "tritonctl tag linear canary --delete",
    "tritonctl policy linear manual",
    "tritonctl load --failed",
    "tritonctl unload sentiment_tokenizer --force",
    "tritonctl unload sentiment_pipeline --dependents",
    "tritonctl gc --keep 5",
    "tritonctl audit --model linear --since 2h",
    "tritonctl audit --outcome rolled_back --since 7d --json",
    "tritonctl audit --at 2026-11-29T03:00:00Z",
    "tritonctl db upgrade --dry-run --state-dir /var/lib/tritonctl",
    "tritonctl db upgrade --state-dir /var/lib/tritonctl",
    "tritonctl db upgrade --db-url postgresql+psycopg://tritonctl@db/tritonctl",
    "tritonctl hosts --db-url postgresql+psycopg://tritonctl@db/tritonctl",
    "tritonctl rollouts --db-url postgresql+psycopg://tritonctl@db/tritonctl",
    "tritonctl status --fleet --db-url postgresql+psycopg://tritonctl@db/tritonctl",
    "tritonctl webhooks",
    "tritonctl webhooks --state failed --json",
    "tritonctl ensure linear",
    "tritonctl ensure linear --for 1h --json",
    "tritonctl lease renew linear 3f2a9c1b2c3d4e5f --for 30m",
    "tritonctl lease release linear 3f2a9c1b2c3d4e5f",
    "tritonctl token create alice --role deployer --expires 90d",
    "tritonctl token create ci --role deployer --json",
    "tritonctl token list",
    "tritonctl token revoke alice",
]
# Run by other means in this module, as written.
RUN_APART = {
    "tritonctl daemon --repository examples/model_repository --state-dir .state --launch-triton":
        "the `served` fixture's daemon (ports 0 by environment, so a busy 8001 cannot fail it)",
    "tritonctl status --watch": "test_status_watch_example_prints_blocks (it runs until stopped)",
    "tritonctl audit --follow --model linear": "test_audit_follow_example_prints_new_events (runs until stopped)",
    "tritonctl rollouts --open --watch": "test_rollouts_open_watch_runs_against_a_fleet_members_daemon",
}
PARSE_ONLY = {
    **{line: "asks a fleet member's daemon (`daemon --fleet`, PostgreSQL); tests/test_json_contract.py runs "
             "it against a member's control API, and as written with --db-url here"
       for line in ("tritonctl hosts", "tritonctl rollouts", "tritonctl status --fleet")},
    "tritonctl webhooks redeliver 3f2a9c1b":
        "this daemon has no [[webhook]], so no delivery to send again; tests/test_webhooks_e2e.py runs "
        "`webhooks redeliver ID` against a daemon with one",
    "tritonctl load linear --shadow 5m":
        "a shadow runs for minutes and is judged on clients' requests through the gateway; "
        "tests/test_shadow_e2e.py runs `load --shadow` (then promote, abort) against a daemon with clients",
    "tritonctl daemon --config /etc/tritonctl/tritonctl.toml --triton-url 127.0.0.1:8001":
        "needs a config file in /etc and an external tritonserver on 8001; `--config` and `--triton-url` "
        "run in tests/test_config.py and tests/test_supervision.py",
}
MODELS = ("linear", "sentiment", "sentiment_tokenizer", "sentiment_classifier", "sentiment_pipeline")


def test_every_example_is_run_or_says_why_not() -> None:
    listed = [*SCRIPT, *RUN_APART, *PARSE_ONLY]
    assert sorted(listed) == EXAMPLES, "a help example is neither run nor parse-only with a reason"


@dataclass
class Served:
    clone: Path
    daemon: DaemonProcess
    replaced: dict[str, str]

    def run(self, line: str) -> Result:
        """`line` as a user types it in `clone`: no --state-dir, no TRITONCTL_* in the environment;
        shell globs expanded as bash does; only the REPLACED words swapped."""
        unset = {k: None for k in os.environ if k.startswith("TRITONCTL_")}
        here = os.getcwd()
        os.chdir(self.clone)
        try:
            args: list[str] = []
            for word in shlex.split(line)[1:]:
                word = self.replaced.get(word, word)
                args.extend(sorted(glob.glob(word)) if "*" in word else [word])
            return CliRunner(env=unset).invoke(cli, args)
        finally:
            os.chdir(here)


def _user_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("TRITONCTL_")}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    clone = tmp_path_factory.mktemp("help-examples")
    repo = clone / "examples" / "model_repository"
    repo.mkdir(parents=True)
    for name in MODELS:
        shutil.copytree(ROOT / "examples" / "model_repository" / name, repo / name)
    daemon = DaemonProcess(repo, clone / ".state", launch=False)
    env = {**_user_env(), **SWITCH_AT_ONCE_ENV, "TRITONCTL_TRITON_GRPC_PORT": "0", "TRITONCTL_TRITON_HTTP_PORT": "0",
           "TRITONCTL_TRITON_METRICS_PORT": "0", "TRITONCTL_SETTLE_S": "0.2", "TRITONCTL_RECONCILE_INTERVAL_S": "1"}
    line = next(iter(RUN_APART))
    log = open(daemon.log_path, "ab")  # noqa: SIM115 - owned by the process
    daemon.proc = subprocess.Popen([TRITONCTL, *shlex.split(line)[1:]], cwd=clone, env=env, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    try:
        daemon.wait_ready()
        wait_for(lambda: all(r.get("state") == "serving" for r in daemon.status()["models"])
                 and len(daemon.status()["models"]) == len(MODELS), 120, 0.3, "the examples serving")
        yield Served(clone, daemon, {})
    finally:
        assert daemon.stop() == 0, daemon.log_tail()


def test_help_examples_run_as_written(served: Served, tmp_path: Path) -> None:
    daemon = served.daemon
    fleet_url = f"sqlite:///{tmp_path / 'fleet.db'}"
    fleet = Registry(fleet_url)
    migrate.upgrade(fleet)
    fleet.close()
    # REPLACED: help texts name digests that cannot exist here and the production paths and URLs.
    served.replaced.update({"/var/lib/tritonctl": ".state",
                            "postgresql+psycopg://tritonctl@db/tritonctl": fleet_url})
    started = time.monotonic()
    for line in SCRIPT:
        if line == "tritonctl diff linear 3f2a9c1b 9e01d4aa":
            a = str(daemon.model_status("linear")["digest"])
            config = served.clone / "examples" / "model_repository" / "linear" / "config.pbtxt"
            config.write_text(config.read_text() + "\n# edited by tests/test_help_examples.py\n")
            b = str(wait_for(functools.partial(_new_digest, daemon, a), 90, 0.2, "linear's edit serving"))
            served.replaced.update({"3f2a9c1b": a[:8], "9e01d4aa": b[:8]})
        result = served.run(line)
        assert result.exit_code == 0, f"{line}: exit {result.exit_code}: {result.output}"
        _check(served, line, result)
    print(f"{len(SCRIPT)} examples in {time.monotonic() - started:.1f} s")


def _new_digest(daemon: DaemonProcess, old: str) -> str | None:
    row = daemon.model_status("linear")
    return str(row["digest"]) if row["digest"] != old and row["state"] == "serving" else None


def _check(served: Served, line: str, result: Result) -> None:
    """What each example promises, beyond exit 0."""
    row = served.daemon.model_status
    a, b = served.replaced.get("3f2a9c1b"), served.replaced.get("9e01d4aa")
    if line == "tritonctl status linear sentiment --json":
        assert [m["model"] for m in json.loads(result.stdout)["models"]] == ["linear", "sentiment"]
    elif line == "tritonctl pin linear":
        assert row("linear")["pinned"]
    elif line == "tritonctl unpin linear":
        assert not row("linear")["pinned"]
    elif line == "tritonctl rollback linear":
        assert a is not None and str(row("linear")["digest"]).startswith(a)
    elif line == "tritonctl load linear --bake 5m":
        bake = row("linear")["bake"]
        assert bake["state"] == "baking" and b is not None and bake["digest"].startswith(b), bake
        assert "baking" in row("linear")["sync_reason"] and "s left" in row("linear")["sync_reason"]
    elif line == "tritonctl abort linear":  # the gateway switched back to the previous digest, by the operator
        assert a is not None and str(row("linear")["digest"]).startswith(a), row("linear")
        assert row("linear")["bake"]["state"] == "failed" and "aborted by" in row("linear")["bake"]["reason"]
    elif line == "tritonctl load linear --steps 5,pause,100 --bake 10m":  # the daemon's gateway splits: a canary
        canary = row("linear")["canary"]
        assert row("linear")["bake"]["state"] == "baking" and b is not None
        assert str(row("linear")["digest"]).startswith(b), row("linear")
        assert canary is not None and canary["steps"] == [5, "pause", 100], canary
        assert (canary["step"], canary["weight"], canary["state"]) == (0, 5, "running"), canary
    elif line == "tritonctl promote linear":  # the next step now: the pause, at the weight before it
        canary = row("linear")["canary"]
        assert (canary["step"], canary["weight"], canary["state"]) == (1, 5, "paused"), canary
        assert row("linear")["bake"]["state"] == "baking" and "canary" in result.output, result.output
        # past the last step the bake ends passed (what the next examples start from): promoted on, as written
        for _ in range(2):
            again = served.run(line)
            assert again.exit_code == 0, again.output
        assert row("linear")["bake"]["state"] == "passed" and "passed" in again.output, again.output
        assert row("linear")["canary"]["weight"] == 100, row("linear")["canary"]
    elif line in ("tritonctl load linear", "tritonctl load linear --force"):
        assert b is not None and str(row("linear")["digest"]).startswith(b)
    elif line in ("tritonctl load linear --digest 3f2a9c1b", "tritonctl rollback linear --to 3f2a9c1b"):
        assert a is not None and str(row("linear")["digest"]).startswith(a)
    elif line in ("tritonctl rollback linear --to-tag stable", "tritonctl load linear --tag stable"):
        assert b is not None and str(row("linear")["digest"]).startswith(b)
    elif line == "tritonctl tags linear --json":
        assert {t["name"]: t["digest"][:8] for t in json.loads(result.stdout)["tags"]} == {"stable": b, "canary": a}
    elif line == "tritonctl diff linear stable canary":
        assert "linear: " + str(b) in result.stdout and "-> " + str(a) in result.stdout
    elif line == "tritonctl policy linear track:stable":
        assert (row("linear")["policy"], row("linear")["sync"]) == ("track:stable", "synced")
    elif line == "tritonctl tag linear stable canary":  # linear tracks stable: the move deployed A
        assert a is not None and str(row("linear")["digest"]).startswith(a)
        assert row("linear")["tags"] == ["canary", "stable"]
    elif line == "tritonctl webhooks --state failed --json":
        assert json.loads(result.stdout) == []  # no [[webhook]] here: nothing failed
    elif line == "tritonctl policy linear manual":
        assert row("linear")["policy"] == "manual"
    elif line == "tritonctl ensure linear --for 1h --json":  # REPLACED: the lease id the help names
        served.replaced["3f2a9c1b2c3d4e5f"] = json.loads(result.stdout)["lease"]
        assert row("linear")["state"] == "serving"
    elif line == "tritonctl lease release linear 3f2a9c1b2c3d4e5f":
        assert "released" in result.stdout
    elif line == "tritonctl unload sentiment_tokenizer --force":
        assert row("sentiment_tokenizer")["state"] == "unloaded"
    elif line == "tritonctl unload sentiment_pipeline --dependents":
        assert {row(n)["state"] for n in ("sentiment_pipeline", "sentiment_classifier")} == {"unloaded"}
        assert row("sentiment")["state"] == "serving"


def test_status_watch_example_prints_blocks(served: Served) -> None:
    proc = subprocess.Popen([TRITONCTL, "status", "--watch"], cwd=served.clone, env=_user_env(),
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        while line and "MODEL" not in line:
            line = proc.stdout.readline()
        assert "MODEL" in line, "status --watch printed no block"
    finally:
        proc.terminate()
        proc.wait(10)


def test_audit_follow_example_prints_new_events(served: Served) -> None:
    proc = subprocess.Popen(shlex.split("tritonctl audit --follow --model linear"), cwd=served.clone,
                            env={**_user_env(), "PATH": f"{Path(TRITONCTL).parent}:{os.environ['PATH']}"},
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        time.sleep(2.0)  # connected to the event stream
        assert served.run("tritonctl pin linear").exit_code == 0
        assert served.run("tritonctl unpin linear").exit_code == 0
        line = proc.stdout.readline()
        assert line.split()[2:4] == ["pin", "linear"], line
    finally:
        proc.terminate()
        proc.wait(10)
