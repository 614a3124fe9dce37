"""The `tritonctl` command group and the CLI's single error boundary.

Every command parses its arguments, calls one core function and hands the result to `cli.render`.
Core errors (controlplane.errors) become one line on stderr and an exit code; `--debug` shows the
traceback instead.
"""

from __future__ import annotations

import os
import sys
from typing import Any, NoReturn

import click

from controlplane import errors
from controlplane.api import protocol

# Exit codes are a contract (docs/cli.md "Exit codes"): scripts and systemd units rely on them. The table
# lives with the control API's error document (controlplane/api/protocol.py), which carries the code.
EXIT_OK = 0
EXIT_FAILED = protocol.EXIT_FAILED
EXIT_USAGE = protocol.EXIT_USAGE
EXIT_DAEMON_UNREACHABLE = protocol.EXIT_DAEMON_UNREACHABLE
EXIT_TRITON_UNREACHABLE = protocol.EXIT_TRITON_UNREACHABLE
EXIT_FORBIDDEN = protocol.EXIT_FORBIDDEN
exit_code_for = protocol.exit_code_for


# Which module defines each command, so `tritonctl status` imports cli.operations only (not the registry
# code of `audit`, nor the daemon). A command missing here still works: `_all_commands` finds it in its
# module's COMMANDS list (tests/test_layers.py checks this table is complete).
LAZY_COMMANDS: dict[str, str] = {
    **{name: "cli.operations" for name in
       ("load", "unload", "rollback", "status", "policy", "pin", "unpin", "gc", "hosts", "rollouts",
        "promote", "abort")},
    **{name: "cli.history" for name in ("versions", "diff", "audit", "db")},
    "daemon": "cli.daemon_cmd",
    "tag": "cli.tags_cmd",
    "tags": "cli.tags_cmd",
    "webhooks": "cli.webhooks_cmd",
    "ensure": "cli.lease_cmd",
    "lease": "cli.lease_cmd",
    "token": "cli.token_cmd",
}
COMMAND_MODULES = ("cli.operations", "cli.history", "cli.daemon_cmd", "cli.tags_cmd", "cli.webhooks_cmd",
                   "cli.lease_cmd", "cli.token_cmd")


def _module_commands(module_name: str) -> dict[str, click.Command]:
    import importlib

    module = importlib.import_module(module_name)
    return {command.name: command for command in module.COMMANDS if command.name}


class TritonctlGroup(click.Group):
    """A click group whose `main` turns core errors into one line and an exit code, and which imports a
    command's module only when that command runs (or when help lists them all)."""

    def _all_commands(self) -> dict[str, click.Command]:
        found: dict[str, click.Command] = {}
        for module_name in COMMAND_MODULES:
            found.update(_module_commands(module_name))
        return found

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *self._all_commands()})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.commands:
            return self.commands[cmd_name]
        module_name = LAZY_COMMANDS.get(cmd_name)
        command = _module_commands(module_name).get(cmd_name) if module_name else None
        if command is None:
            command = self._all_commands().get(cmd_name)
        if command is not None:
            self.add_command(command)
        return command

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        try:  # --help, --version and usage errors print here
            return super().make_context(info_name, args, parent, **extra)
        except BrokenPipeError:
            _reader_went_away()

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError:
            _reader_went_away()
        except errors.TritonctlError as exc:
            if ctx.meta.get("tritonctl.debug"):
                raise
            from controlplane.text import clean  # a reason may carry Triton's or a model's text

            click.echo(f"error: {clean(str(exc))}", err=True)
            ctx.exit(exit_code_for(exc))


def _reader_went_away() -> NoReturn:
    """The reader of stdout closed it (`tritonctl status --watch | head`): the output is done, not failed.
    Exit 0 quietly, as `git log | head` does; stdout now points at /dev/null, so the interpreter's last
    flush of what is still buffered has nowhere to fail."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    raise click.exceptions.Exit(EXIT_OK)


@click.group(cls=TritonctlGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show tracebacks instead of one-line errors.")
@click.version_option(package_name="tritonctl")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """tritonctl: a control plane for NVIDIA Triton Inference Server.

    \b
    Examples:
      tritonctl validate examples/model_repository/*
      tritonctl daemon --repository examples/model_repository --launch-triton
      tritonctl load linear
    """
    ctx.meta["tritonctl.debug"] = debug


@cli.command("validate")
@click.argument("paths", nargs=-1, required=True, metavar="PATH...")
@click.option("--json", "as_json", is_flag=True, help="Print JSON (a stable contract, see README).")
@click.pass_context
def validate_cmd(ctx: click.Context, paths: tuple[str, ...], as_json: bool) -> None:
    """Check model directories offline, with Triton's own config schema.

    PATH is a model directory (config.pbtxt plus version directories), a repository of model
    directories, or a config.pbtxt. Each problem prints as one line, `severity file: field: reason`.
    Exits 1 if any model has an error; warnings alone exit 0.

    \b
    Examples:
      tritonctl validate examples/model_repository/*
      tritonctl validate examples/model_repository --json
    """
    from cli import render
    from controlplane.validation.modelconfig import validate_paths

    results = validate_paths(paths)
    render.render_validation(results, as_json=as_json)
    ctx.exit(EXIT_OK if results.ok else EXIT_FAILED)


def main(argv: list[str] | None = None) -> None:
    cli.main(args=argv, prog_name="tritonctl")


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])
