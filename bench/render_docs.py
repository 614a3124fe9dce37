"""Render docs/benchmarks.md from bench/results/*.json: every figure in it comes from a results file.

    python bench/render_docs.py            # write docs/benchmarks.md
    python bench/render_docs.py --check    # exit 1, with the diff, when docs/benchmarks.md is not what renders

Why: figures typed by hand drift from the runs behind them (an audit figure of an old run stayed in
the docs after the results file moved on). The text lives in bench/benchmarks.md.in; a measured
figure in it is a placeholder naming the results file and the value in it, and the blocks of
bench/run_all.py (the summary and per-benchmark tables) are rendered from the same files:

- `{{FILE:PATH}}` or `{{FILE:PATH|FORMAT}}`: the value at PATH in bench/results/FILE.json, formatted
  with Python's FORMAT (`.2f`, `,`, `,.0f`); PATH is keys and list indexes separated by dots
  (`rows.3.value`, `systems.tritonctl.failed_requests`), and may end in `*1000` or `/1000` to change
  units (seconds to milliseconds); FORMAT `min`, `max`, `len` or `sum` reduces a list. A missing file
  or path stops the rendering with its name.
- `{{run_all:full}}` / `{{run_all:quick}}`: bench/run_all.py's generated block (`quick` from the
  `*-quick.json` files only; without them the block says there are none).

tests/test_bench_docs.py fails when the committed docs differ from what this renders, and when the
template holds a decimal figure or a percentage outside a placeholder (a target written `≤ 20 ms`, a
setting like `every 10 s`, is text, not a measurement).
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as c  # noqa: E402
import run_all  # noqa: E402

TEMPLATE = c.ROOT / "bench" / "benchmarks.md.in"
DOCS = c.ROOT / "docs" / "benchmarks.md"
PLACEHOLDER = re.compile(r"\{\{([^{}]+)\}\}")
# FORMAT for a list: `failed_per_edit|max`
AGGREGATES: dict[str, Callable[[list[Any]], Any]] = {"min": min, "max": max, "len": len, "sum": sum}
# Outside placeholders and code blocks the template holds no decimal figure and no percentage: a
# measured number is a placeholder. Targets (`≤ 20 ms`) and settings (`every 10 s`) are whole numbers.
TARGET = re.compile(r"(≤|<=|≥|>=|target|budget of)\s*$")  # a target is text: `≤ 0.3 s`, `target 1 %`
BARE_FIGURE = re.compile(r"(?<![\w.:/-])\d+\.\d+(?![\w.:/-]|\.\d)|\d\s?%")


class RenderError(Exception):
    """A placeholder names a results file or a value that is not there."""


@cache
def results(name: str, directory: Path = c.RESULTS) -> Any:
    path = directory / f"{name}.json"
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise RenderError(f"{path.relative_to(c.ROOT)}: no such results file") from exc


def lookup(name: str, path: str, directory: Path = c.RESULTS) -> Any:
    value = results(name, directory)
    scale = 1.0
    if m := re.fullmatch(r"(.*?)([*/])(\d+(?:\.\d+)?)", path):
        path, op, factor = m.group(1), m.group(2), float(m.group(3))
        scale = factor if op == "*" else 1 / factor
    for key in path.split("."):
        try:
            value = value[int(key)] if isinstance(value, list) else value[key]
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            raise RenderError(f"bench/results/{name}.json has no {path} (at {key!r})") from exc
    if scale != 1.0:
        if not isinstance(value, (int, float)):
            raise RenderError(f"bench/results/{name}.json {path} is not a number")
        value = value * scale
    return value


def placeholder(spec: str, blocks: Path = c.RESULTS) -> str:
    spec = spec.strip()
    if spec in ("run_all:full", "run_all:quick"):
        block = generated_block(spec.endswith("quick"), blocks).rstrip("\n")
        return "\n\n" + block if block and spec.endswith("quick") else block
    where, _, fmt = spec.partition("|")
    name, sep, path = where.partition(":")
    if not sep:
        raise RenderError(f"{{{{{spec}}}}}: a placeholder is FILE:PATH or FILE:PATH|FORMAT")
    value = lookup(name.strip(), path.strip(), blocks)
    fmt = fmt.strip()
    if isinstance(value, str) and value.endswith(c.DIRTY) and re.fullmatch(r"\.\d+", fmt):
        return c.short_commit(value, int(fmt[1:]))  # a commit cut short keeps its `-dirty`
    if fmt in AGGREGATES:
        if not isinstance(value, list) or not value:
            raise RenderError(f"bench/results/{name.strip()}.json {path.strip()} is not a list of numbers")
        return str(AGGREGATES[fmt](value))
    try:
        return format(value, fmt) if fmt else str(value)
    except (TypeError, ValueError) as exc:
        raise RenderError(f"{{{{{spec}}}}}: {value!r} does not format as {fmt!r}") from exc


def generated_block(quick: bool, directory: Path = c.RESULTS) -> str:
    """bench/run_all.py's block from the results files alone (no runtimes but those they record); the
    quick block only from `*-quick.json` files, and empty without them."""
    reports: dict[str, dict[str, Any]] = {}
    for name in run_all.BENCHMARKS:
        report = run_all.load(name, quick, directory)
        if report is not None:
            reports[name] = report
    audit = run_all.load("audit_query", quick, directory)
    if audit is not None:
        reports["audit_query"] = audit
    if quick and not reports:
        return ""
    runtimes = {n: float(r["runtime_s"]) for n, r in reports.items() if isinstance(r.get("runtime_s"), (int, float))}
    for name, report in reports.items():
        png = DOCS.parent / (f"{name}-quick.png" if quick else f"{name}.png")
        if name in run_all.PLOTS and png.exists():
            report["plot"] = png.name
    return run_all.markdown(quick, reports, runtimes)


def bare_figures(template: str) -> list[str]:
    """Decimal figures and percentages typed into the template's text (not in a placeholder, not in a
    code block): each should be a placeholder naming its results file."""
    found, fenced = [], False
    for number, line in enumerate(template.splitlines(), 1):
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        text = PLACEHOLDER.sub("", line)
        found += [f"bench/benchmarks.md.in:{number}: {m.group(0)!r} in {line.strip()[:80]!r}"
                  for m in BARE_FIGURE.finditer(text) if not TARGET.search(text[:m.start()])]
    return found


def render(template: str, blocks: Path = c.RESULTS) -> str:
    """The template with every placeholder filled from bench/results (run_all's blocks from `blocks`)."""
    return PLACEHOLDER.sub(lambda m: placeholder(m.group(1), blocks), template)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with docs/benchmarks.md, write nothing")
    parser.add_argument("--docs", type=Path, default=DOCS)
    parser.add_argument("--results", type=Path, default=c.RESULTS,
                        help="where bench/run_all.py's blocks come from (placeholders: bench/results)")
    args = parser.parse_args(argv)
    try:
        text = render(TEMPLATE.read_text(), args.results)
    except RenderError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.check:
        current = args.docs.read_text() if args.docs.exists() else ""
        if current == text:
            return 0
        sys.stdout.writelines(difflib.unified_diff(current.splitlines(True), text.splitlines(True),
                                                   str(args.docs), "rendered"))
        print(f"{args.docs} is not what bench/render_docs.py renders from bench/results: run it", file=sys.stderr)
        return 1
    args.docs.write_text(text)
    print(f"wrote {args.docs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
