"""Every row of the Guarantees table (docs/guarantees.md, the README links it) names the tests that prove
it, and those tests exist and run.

A promise is only as good as the test behind it: a renamed test, a typo in the table, a `skip` mark
or an unconditional `pytest.skip()` would leave a row proving nothing while CI stays green. The
table's last column names tests as `test_file.py`, `test_file.py::test_name` or `::test_name` (in the
file named last before it). Each named test must be collected by pytest with every marker selected
(so it runs in one of the two tiers of `python -m tests.tiers`, CI's command), and neither it nor a
named file's tests may carry a skip or xfail mark or call `pytest.skip()` unconditionally.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NAME = re.compile(r"^(?P<file>test_\w+\.py)?(?:::(?P<test>test_\w+))?$")


@dataclass(frozen=True)
class Ref:
    row: str  # the row's first cell, for messages
    file: str
    test: str | None  # None: the whole file


def guarantee_rows(document: str) -> list[list[str]]:
    section = document[document.index("# Guarantees"):]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    cells = [[c.strip() for c in line.strip().strip("|").split(" | ")] for line in rows]
    assert cells and cells[0][-1] == "Proved by", "the Guarantees table's last column is 'Proved by'"
    return cells[1:]


def references(rows: list[list[str]]) -> list[Ref]:
    refs: list[Ref] = []
    for cells in rows:
        when, named, last_file = cells[0], 0, None
        for span in re.findall(r"`([^`]+)`", cells[-1]):
            match = NAME.match(span)
            if not match or not (match["file"] or match["test"]):
                continue  # `-m slow`, a model's name
            last_file = match["file"] or last_file
            assert last_file, f"row '{when[:60]}': {span} names no file before it"
            refs.append(Ref(when[:60], last_file, match["test"]))
            named += 1
        assert named, f"row '{when[:60]}' names no test"
    return refs


def collected(files: list[str]) -> set[str]:
    """Node ids pytest collects from `files` with no marker filter (both tiers)."""
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "", "-p", "no:cacheprovider",
                          *(f"tests/{f}" for f in files)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    return {line.strip() for line in out.stdout.splitlines() if "::" in line}


def skips(function: object) -> list[str]:
    """Why `function` would not run: skip/skipif/xfail marks, or a pytest.skip() call not under a condition."""
    why = [f"marked {m.name}" for m in getattr(function, "pytestmark", []) if would_skip(m)]
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))  # type: ignore[arg-type]
    body = tree.body[0]
    assert isinstance(body, ast.FunctionDef)
    for statement in body.body:  # top-level statements only: a skip under an if/try is conditional
        if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
            func = statement.value.func
            if isinstance(func, ast.Attribute) and func.attr == "skip":
                why.append(f"calls pytest.skip() on line {statement.lineno}")
    return why


def would_skip(mark: pytest.Mark) -> bool:
    """skip and xfail always; skipif when its condition holds here (a tool the README's test command
    installs, missing: then the test would not run; under `python -m tests.tiers` that fails anyway)."""
    if mark.name == "skipif":
        return any(bool(condition) for condition in mark.args) or bool(mark.kwargs.get("condition"))
    return mark.name in ("skip", "xfail")


def module_skips(module: object) -> list[str]:
    marks = getattr(module, "pytestmark", [])
    marks = marks if isinstance(marks, list) else [marks]
    return [f"module marked {m.name}" for m in marks if would_skip(m)]


def test_every_guarantee_names_tests_that_exist_and_are_not_skipped() -> None:
    refs = references(guarantee_rows((ROOT / "docs" / "guarantees.md").read_text()))
    files = sorted({r.file for r in refs})
    missing_files = [f for f in files if not (ROOT / "tests" / f).is_file()]
    assert not missing_files, f"the Guarantees table names files that do not exist: {missing_files}"
    ids = collected(files)
    problems: list[str] = []
    for ref in refs:
        prefix = f"tests/{ref.file}::" + (ref.test or "")
        tests = [i for i in ids if i == prefix or i.startswith(prefix if ref.test is None else (prefix + "["))]
        if not tests:
            problems.append(f"{ref.row}: {ref.file}::{ref.test or '*'} is not collected")
            continue
        module = importlib.import_module(f"tests.{ref.file.removesuffix('.py')}")
        problems += [f"{ref.row}: {ref.file}: {w}" for w in module_skips(module)]
        names = {t.split("::", 1)[1].split("[", 1)[0] for t in tests}
        for name in sorted(names):
            function = getattr(module, name, None)
            if function is None:  # a method of a test class: its id is Class::test
                continue
            problems += [f"{ref.row}: {ref.file}::{name} {w}" for w in skips(function)]
    assert not problems, "\n".join(problems)


def test_the_check_catches_a_missing_name_a_skip_mark_and_an_unconditional_skip() -> None:
    """The parser and the skip detection on made-up rows and functions (the check must be able to fail)."""
    rows = [["A", "x", "`test_a.py::test_one` (`-m slow`), `::test_two`, `test_b.py`"], ["B", "y", "nothing"]]
    with pytest.raises(AssertionError, match="row 'B' names no test"):
        references(rows)
    assert references(rows[:1]) == [Ref("A", "test_a.py", "test_one"), Ref("A", "test_a.py", "test_two"),
                                    Ref("A", "test_b.py", None)]

    @pytest.mark.skip(reason="later")
    def marked() -> None:
        pass

    def skipped() -> None:
        pytest.skip("no fuse")

    def conditional() -> None:
        if not Path("/nonexistent").exists():
            pytest.skip("knowingly")

    @pytest.mark.skipif(True, reason="no tool")
    def missing_tool() -> None:
        pass

    @pytest.mark.skipif(False, reason="no tool")
    def tool_present() -> None:
        pass

    assert skips(marked) == ["marked skip"] and skips(missing_tool) == ["marked skipif"]
    assert skips(tool_present) == []
    assert skips(skipped) == ["calls pytest.skip() on line 2"]
    assert skips(conditional) == []
