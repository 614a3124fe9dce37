"""Every `--help` example is a command line that tritonctl accepts as written (no missing option, no
unknown flag), and `rollouts --open --watch`, the help's own example, runs on a fleet host whose
config file names the registry."""

from __future__ import annotations

import shlex
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from cli.main import cli
from controlplane.store import migrate
from controlplane.store.registry import Registry


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
    while isinstance(command, click.Group):
        name, args = args[0], args[1:]
        found = command.get_command(click.Context(command), name)
        assert found is not None, f"{line}: no command {name}"
        command = found
    command.make_context(command.name or "", args)  # raises on a missing or unknown option

def test_rollouts_open_watch_runs_with_the_config_files_registry(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    registry = Registry(url)
    migrate.upgrade(registry)
    registry.close()
    config = tmp_path / "tritonctl.toml"
    config.write_text(f'db_url = "{url}"\n')
    monkeypatch.setenv("TRITONCTL_CONFIG", str(config))
    monkeypatch.delenv("TRITONCTL_DB_URL", raising=False)
    result = CliRunner().invoke(cli, ["rollouts", "--open", "--watch"])
    assert result.exit_code == 0, result.output  # nothing open: one look, then it returns
    monkeypatch.setenv("TRITONCTL_CONFIG", str(tmp_path / "none.toml"))
    missing = CliRunner().invoke(cli, ["rollouts", "--open", "--watch"])
    assert missing.exit_code == 2 and "config file not found" in missing.stderr
