"""The README opens with exactly two commands (the main job, the tests) and CI runs the second verbatim."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _opening_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)```", text, flags=re.S)
    return [b.strip() for b in blocks[:2]]


def test_readme_opens_with_the_main_job_and_the_tests() -> None:
    text = (ROOT / "README.md").read_text()
    first_heading = text.index("\n## ")
    assert text[:first_heading].count("```sh") == 2, "exactly two commands before the first section"
    main_job, tests = _opening_commands()
    assert "\n" not in main_job and "\n" not in tests, "each is one command line"
    assert "tritonctl daemon" in main_job and "--launch-triton" in main_job
    assert "examples/model_repository" in main_job
    assert tests.endswith(".venv/bin/python -m tests.tiers"), "the tests command runs every tier, slow included"


def test_ci_runs_the_readme_test_command_verbatim() -> None:
    _, tests = _opening_commands()
    ci = (ROOT / ".ci" / "run").read_text()
    assert tests in ci.splitlines(), ".ci/run must run README command (b) as written"


def test_the_main_job_serves_the_web_view_and_says_where() -> None:
    """The daemon logs `web view: http://HOST:PORT/ui/` (tests/test_web_e2e.py reads that line)."""
    main_job, _ = _opening_commands()
    match = re.search(r"--web-address (127\.0\.0\.1:\d+)", main_job)
    assert match, "the main job serves the web view on a loopback address"
    assert f"web view: http://{match.group(1)}/ui/" in (ROOT / "README.md").read_text()
