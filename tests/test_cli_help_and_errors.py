"""The CLI's help (every command shows an example) and its error boundary: exit codes (0 ok,
1 failed/rolled back, 2 usage, 3 daemon unreachable, 4 Triton unreachable) and one-line errors, in
process and in a real `tritonctl` process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from cli.main import EXIT_DAEMON_UNREACHABLE, EXIT_USAGE, cli, exit_code_for
from controlplane import errors
from tests.cli_helpers import ROOT, assert_one_line_error, invoke

# --- help ------------------------------------------------------------------------------------------


def _all_commands(group: click.Group = cli, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    ctx = click.Context(group)  # list_commands/get_command: the group registers commands lazily
    for name in sorted(group.list_commands(ctx)):
        command = group.get_command(ctx, name)
        yield (*path, name)
        if isinstance(command, click.Group):
            yield from _all_commands(command, (*path, name))


ALL_COMMANDS = list(_all_commands())


def test_every_command_is_covered() -> None:
    names = {" ".join(c) for c in ALL_COMMANDS}
    assert {"load", "unload", "rollback", "status", "policy", "pin", "unpin", "gc", "versions", "diff", "audit",
            "db", "db upgrade", "validate", "daemon"} <= names


@pytest.mark.parametrize("command", [(), *ALL_COMMANDS], ids=lambda c: " ".join(c) or "tritonctl")
def test_help_shows_an_example(command: tuple[str, ...]) -> None:
    result = invoke([*command, "--help"])
    assert result.exit_code == 0
    assert "Example" in result.output
    assert "tritonctl " in result.output.split("Example", 1)[1]  # an actual command line follows


# --- exit codes and the error boundary -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (errors.DaemonUnavailableError, 3),
        (errors.TritonUnavailableError, 4),
        (errors.UsageError, 2),
        (errors.ConfigError, 2),
        (errors.NotFoundError, 2),
        (errors.DeployError, 1),
        (errors.StoreError, 1),
        (errors.PermissionDeniedError, 1),
        (errors.TritonError, 1),
        (errors.TritonctlError, 1),
    ],
)
def test_exit_code_for_each_error_class(error: type[errors.TritonctlError], code: int) -> None:
    assert exit_code_for(error("x")) == code


@pytest.mark.parametrize(("outcome", "cause"), [("rolled_back", "content"), ("failed", "environment"),
                                              ("failed", "")])
def test_a_failed_outcome_raises_deploy_error_with_its_cause(outcome: str, cause: str) -> None:
    from cli.operations import _finish

    result = {"model": "m", "outcome": outcome, "cause": cause, "digest": "ab" * 32, "message": "smoke failed"}
    with pytest.raises(errors.DeployError) as caught:
        _finish(result, True)
    assert (caught.value.outcome, caught.value.cause, str(caught.value)) == (outcome, cause, "smoke failed")
    assert exit_code_for(caught.value) == 1


def _run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli.main", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_errors_are_one_line_and_debug_shows_the_traceback(tmp_path: Path) -> None:
    """In a real process: one line and exit 2 normally; a traceback with --debug."""
    assert invoke(["db", "upgrade", "--state-dir", str(tmp_path)]).exit_code == 0
    plain = _run_cli("versions", "../x", "--state-dir", str(tmp_path))
    assert (plain.returncode, plain.stdout) == (EXIT_USAGE, "")
    assert plain.stderr == "error: model name '../x' contains a path separator\n"
    debug = _run_cli("--debug", "versions", "../x", "--state-dir", str(tmp_path))
    assert debug.returncode != 0
    assert "Traceback (most recent call last)" in debug.stderr
    assert "UsageError: model name '../x' contains a path separator" in debug.stderr


def test_debug_in_process_raises_the_core_error(tmp_path: Path) -> None:
    result = invoke(["--debug", "audit", "--since", "soon", "--db-url", f"sqlite:///{tmp_path / 'registry.db'}"])
    assert isinstance(result.exception, errors.NotFoundError)  # the missing registry, unformatted
    result = invoke(["--debug", "audit", "--state-dir", str(tmp_path)])
    assert isinstance(result.exception, errors.DaemonUnavailableError)  # no daemon (and no --db-url)


DAEMON_COMMANDS = [["load", "linear"], ["unload", "linear"], ["rollback", "linear"], ["status"],
                   ["policy", "linear", "manual"], ["pin", "linear"], ["unpin", "linear"], ["gc"]]


@pytest.mark.parametrize("args", DAEMON_COMMANDS, ids=lambda a: a[0])
def test_daemon_commands_without_a_daemon_exit_3(tmp_path: Path, args: list[str]) -> None:
    result = invoke([*args, "--state-dir", str(tmp_path)])
    assert_one_line_error(result, EXIT_DAEMON_UNREACHABLE, f"no daemon at {tmp_path / 'tritonctl.sock'}",
                          "start one", "TRITONCTL_STATE_DIR")


def test_address_without_token_is_a_usage_error(tmp_path: Path) -> None:
    assert_one_line_error(invoke(["status", "--address", "127.0.0.1:1"]), EXIT_USAGE, "--token-file")
    short = tmp_path / "token"
    short.write_text("short")
    assert_one_line_error(invoke(["status", "--address", "127.0.0.1:1", "--token-file", str(short)]), EXIT_USAGE,
                          "at least 16 characters")
