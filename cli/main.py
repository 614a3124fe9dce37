"""The `tritonctl` command group and the CLI's single error boundary.

Every command parses its arguments, calls one core function and hands the result to `cli.render`.
Core errors (controlplane.errors) become one line on stderr and an exit code; `--debug` shows the
traceback instead.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from controlplane import errors

# Exit codes are a contract (README "Exit codes"): scripts and systemd units rely on them.
EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_DAEMON_UNREACHABLE = 3
EXIT_TRITON_UNREACHABLE = 4

_EXIT_CODES: list[tuple[type[errors.TritonctlError], int]] = [
    (errors.DaemonUnavailableError, EXIT_DAEMON_UNREACHABLE),
    (errors.TritonUnavailableError, EXIT_TRITON_UNREACHABLE),
    (errors.UsageError, EXIT_USAGE),
    (errors.ConfigError, EXIT_USAGE),
]


def exit_code_for(exc: errors.TritonctlError) -> int:
    for cls, code in _EXIT_CODES:
        if isinstance(exc, cls):
            return code
    return EXIT_FAILED


class TritonctlGroup(click.Group):
    """A click group whose `main` turns core errors into one line and an exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except errors.TritonctlError as exc:
            if ctx.meta.get("tritonctl.debug"):
                raise
            click.echo(f"error: {exc}", err=True)
            ctx.exit(exit_code_for(exc))


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


def main(argv: list[str] | None = None) -> None:
    cli.main(args=argv, prog_name="tritonctl")


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])
