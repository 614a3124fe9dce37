"""What the CLI test suites share: running `tritonctl` in process and the one-line-error contract."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result

from cli.main import cli

ROOT = Path(__file__).resolve().parent.parent
NOW = datetime(2026, 11, 29, 12, 0, 0)  # the fixed "now" of the CLI tests


def invoke(args: list[str], **kwargs: Any) -> Result:
    # A wide terminal so table rows do not fold (the CLI's own width comes from the terminal).
    return CliRunner(env={"COLUMNS": "240"}).invoke(cli, args, **kwargs)


def assert_one_line_error(result: Result, code: int, *fragments: str) -> None:
    assert result.exit_code == code, result.output
    assert result.stderr.startswith("error: "), result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in result.stderr
