"""Render docs/benchmarks.md from bench/results/*.json: every figure in it comes from a results file.

    python bench/render_docs.py            # write docs/benchmarks.md, docs/ondemand.md and docs/bake.md
    python bench/render_docs.py --check    # exit 1, with the diff, when a page is not what renders

Why: figures typed by hand drift from the runs behind them (an audit figure of an old run stayed in
the docs after the results file moved on). The text lives in bench/benchmarks.md.in (and
bench/ondemand.md.in for docs/ondemand.md, bench/bake.md.in for docs/bake.md: `PAGES`); a measured
figure in it is a placeholder naming the results file and the value in it, and the blocks of
bench/run_all.py (the summary and per-benchmark tables) are rendered from the same files:

- `{{FILE:PATH}}` or `{{FILE:PATH|FORMAT}}`: the value at PATH in bench/results/FILE.json, formatted
  with Python's FORMAT (`.2f`, `,`, `,.0f`); PATH is keys and list indexes separated by dots
  (`rows.3.value`, `systems.tritonctl.failed_requests`), and may end in `*1000` or `/1000` to change
  units (seconds to milliseconds), or in `/@PATH2` for its ratio to the value at PATH2 of the same
  file; FORMAT `min`, `max`, `len` or `sum` reduces a list. A missing file
  or path stops the rendering with its name.
- `{{=TEXT}}`: TEXT as typed, a figure that is no measurement (a setting of a test or a run, a constant)
  where the sentence cannot show it as one (`typed_figures` lets targets, settings and run sizes pass).
- `{{run_all:full}}` / `{{run_all:quick}}`: bench/run_all.py's generated block (`quick` from the
  `*-quick.json` files only; without them the block says there are none).

tests/test_bench_docs.py fails when the committed docs differ from what this renders, and when a
template, README.md or any other docs/*.md (`checked_docs`) types a measured figure outside a
placeholder: a decimal, a percentage, a whole number with a unit (`17 ms`, `236 MB`), a count with
thousands separators (`7,437`) or a share counted (`16 of about 600`); a target written `≤ 20 ms`, a
setting like `every 10 s` or `` `liveness_s` (10 s) ``, a run's size `at 10,000 models`, is text, not a
measurement. A page that is not rendered quotes no measured figure: it points to docs/benchmarks.md.
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
import report as results_report  # noqa: E402
from plots import PLOTS  # noqa: E402

TEMPLATE = c.ROOT / "bench" / "benchmarks.md.in"
DOCS = c.ROOT / "docs" / "benchmarks.md"
# every page rendered from bench/results, by its template: the same placeholders in each
PAGES = {TEMPLATE: DOCS, c.ROOT / "bench" / "ondemand.md.in": c.ROOT / "docs" / "ondemand.md",
         c.ROOT / "bench" / "bake.md.in": c.ROOT / "docs" / "bake.md",
         c.ROOT / "bench" / "gateway.md.in": c.ROOT / "docs" / "gateway.md"}
PLACEHOLDER = re.compile(r"\{\{([^{}]+)\}\}")
# FORMAT for a list: `failed_per_edit|max`
AGGREGATES: dict[str, Callable[[list[Any]], Any]] = {"min": min, "max": max, "len": len, "sum": sum}
# Outside placeholders and code a doc types no measured figure: a measured number is a placeholder. A
# typed figure is a decimal, a percentage, a whole number with a unit of time, size or memory (`17 ms`,
# `145 s`, `236 MB`), a count with thousands separators (`7,437`) or a share counted (`16 of about 600`,
# not a run's make-up `3 of 10,000 serving`). Not figures, by what the sentence
# says around them: a target or a threshold (`≤ 20 ms`, `within 50 ms`, `more than 2 minutes`, `at most
# 300 s`), a setting (`every 10 s`, `a 5 s window`, `default 2 s`, `` `liveness_s` (10 s) ``, `(min 0.05)`,
# `a 10 s timeout`, a retry schedule `retried after 1 s, 2 s, 4 s`, an example `like 30s`), the size of a
# run (`at 10,000`, `10,000 models`, a table's first column, `a 64 MiB file`), a version (`Triton 2.51`,
# `25.07 or later`), and what `{{=TEXT}}` marks as typed on purpose (in a template: a setting the sentence
# cannot show as one). A figure in a list after one of these (`after 5 s, 10 s, 20 s`) is one too.
NUMBER = r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?"
UNIT = r"(?:ms|µs|s|sec|seconds?|min|minutes?|h|hours?|B|kB|KB|KiB|MB|MiB|GB|GiB)(?![\w])|%"
OF = r"\s+(?:out\s+)?of\s+(?:about\s+|the\s+|its\s+)?"  # a share counted: `16 of about 600`
TYPED_FIGURE = re.compile(rf"(?<![\w.:/,#-])(?:(?:{NUMBER})(?=\s?(?:{UNIT}))"
                          rf"|\d{{1,3}}(?:,\d{{3}})+(?!\d|,\d)|\d+\.\d+(?![\w.:/-]|\.\d)|\d+(?={OF}\d))")
# what a code span reads as: `` `liveness_s` (10 s) ``, `` `shutdown_timeout_s`, 30 s `` is a setting's
# value, `` `kubernetes-client` 1.20 `` a version; a span named like a setting (`_`, UPPER_CASE, `--flag`)
# reads as SETTING, any other as CODE (`` 17 ms of `status`, 145 s `` is a measurement)
SETTING, CODE = "\x00", "\x01"
SETTING_NAME = re.compile(r"`(?:[\w.-]*_[\w.]*|[A-Z][A-Z0-9_]+|--[\w-]+|\d+)`")
# figures before this one in the same list, `5 s, 10 s, ` or `5 + 3×`: what comes before the list decides
LIST_BEFORE = re.compile(rf"(?:(?:{NUMBER})\s?(?:{UNIT})?\s*(?:,|\+|/|×|–|\.\.\.|\bto\b|\band\b|\bor\b)\s*)+$")
NOT_MEASURED_BEFORE = re.compile("(" + "|".join((
    # a target, a threshold, a bound
    r"≤|<=|≥|>=|<|>|\btarget|\btargets?:|\bbudget of|\bbound of|\bwithin|\bunder|\babove|\bbelow|\bover",
    r"\bbefore|\bup to|\bat most|\bat least|\bcapped at|\btarget's|\btarget \(|\bmore than|\bless than",
    r"\blonger than|\bpaced to|\bkeeps to",
    # a setting: a default, a limit, an interval, a retry schedule, an example
    r"\bevery|\bwindow|\bdefaults?(?:\s+(?:is|are|of))?:?|(?:\(|;)\s*(?:min|max)(?:imum)?|\bsettle|\bpoll",
    r"\b(?:again|retr\w*|left|up) after|\b(?:deadline|timeout)\s*\+|\b(?:pauses|loads) of|\bslowed to|\bper",
    r"\bretry in|\bwaits|\bdouble from|\blasts|\bpast|\b(?:retr\w*|tries)(?:\s+with backoff)?,?\s+for",
    r"\bnot(?:\s+\w+)?\s+for|\blike|\be\.g\.|\bsuch as|\bkeepalives?(?: time,)?|\bload average \(",
    "[" + SETTING + CODE + r"]\s*[(=]?|" + SETTING + r"\s*[,/:]|[\[=·×±$]",
    # a version; a table's first column
    r"\bTriton|\btritonserver|\bPython|\bpytriton|\bPostgreSQL|\bKubernetes|\bOpenAPI|\bkustomize|^\s*\|",
)) + r")(?:\s+(?:the|about|its))?\s*\**\s*$", re.IGNORECASE)
# after the figure: what the figure is (a setting, a bound), a list of figures before it
NOT_MEASURED_AFTER = re.compile(
    rf"\s?(?:{UNIT})(?:\s*(?:,|/|\band\b|\bor\b|\bto\b)\s*(?:{NUMBER})\s?(?:{UNIT}))*\s*\**\s*"
    r"(?:(?:\w+\s+)?(?:windows?|bounds?|clock|budgets?|timeout|deadline|cap|limit|target|outage|down|tick|interval)\b"
    r"|doubling|at most|at least|or later|or lower|or less|by default|(?:\w+\s+)?(?:file|body|parts|upload|chunks)\b)"
    r"|\s?-model\b|\s+(?:build|release|schema)\b|\s+or later\b")
RUN_SIZE = re.compile(r"(?:\bat(?:\s+[\d,]+\s+and)?|^\s*\|)\s*$")  # `at 10,000`, `at 200 and 1,000`, a table's
SIZE_NOUN = re.compile(r"\s?(?:models?|ensembles|serving|hosts?|events|changes|watches|-model)\b"
                       r"|\s+and\s+\d{1,3}(?:,\d{3})+\s+models")


def checked_docs() -> list[Path]:
    """Every doc a reader takes figures from, as typed: README.md and each docs/*.md, a rendered page by
    its template (`PAGES`). A new page is checked as soon as it exists; tests/test_bench_docs.py fails
    on a measured figure typed into any of them (`typed_figures`)."""
    rendered = {page.resolve() for page in PAGES.values()}
    pages = [c.ROOT / "README.md", *sorted((c.ROOT / "docs").glob("*.md"))]
    return [*PAGES, *(page for page in pages if page.resolve() not in rendered)]


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
    if m := re.fullmatch(r"(.+?)/@(.+)", path):  # a ratio of two values of the same file
        top, bottom = lookup(name, m.group(1), directory), lookup(name, m.group(2), directory)
        if not isinstance(top, (int, float)) or not isinstance(bottom, (int, float)) or not bottom:
            raise RenderError(f"bench/results/{name}.json {path}: not a ratio of two numbers")
        return top / bottom
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
    if spec.startswith("="):  # typed on purpose: a setting or a constant, not a measurement
        return spec[1:].strip()
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
    for name in results_report.BENCHMARKS:
        report = results_report.load(name, quick, directory)
        if report is not None:
            reports[name] = report
    audit = results_report.load("audit_query", quick, directory)
    if audit is not None:
        reports["audit_query"] = audit
    if quick and not reports:
        return ""
    runtimes = {n: float(r["runtime_s"]) for n, r in reports.items() if isinstance(r.get("runtime_s"), (int, float))}
    for name, report in reports.items():
        png = DOCS.parent / (f"{name}-quick.png" if quick else f"{name}.png")
        if name in PLOTS and png.exists():
            report["plot"] = png.name
    return results_report.markdown(quick, reports, runtimes)


def typed_figures(text: str, source: str) -> list[str]:
    """Measured figures typed into a doc's text (not a placeholder, not in a code block or a code span),
    one `source:line: 'figure' in 'the line'` each: each should be a placeholder naming its results file.
    Point it at any doc: a template, or a page that is not rendered (which then may quote none)."""
    lines, fenced, in_span = text.splitlines(), False, False
    plain: list[str | None] = []  # each line's text without placeholders and code; None: in a code block
    for line in lines:
        if line.lstrip().startswith("```") and not in_span:
            fenced = not fenced
            plain.append(None)
            continue
        if fenced:
            plain.append(None)
            continue
        line = PLACEHOLDER.sub("", line)
        if in_span:  # a code span that began on a line above
            if "`" not in line:
                plain.append(CODE)
                continue
            line, in_span = CODE + line[line.index("`") + 1:], False
        line = re.sub(r"`[^`]*`", CODE, SETTING_NAME.sub(SETTING, line))
        if "`" in line:  # a code span going on to the next line
            line, in_span = line[: line.index("`")] + CODE, True
        plain.append(line)
    found = []
    for number, text_line in enumerate(plain, 1):
        if text_line is None:
            continue
        previous = plain[number - 2] if number > 1 else None
        following = plain[number] if number < len(plain) else None
        for m in TYPED_FIGURE.finditer(text_line):
            figure = m.group(0)
            # a sentence goes on across lines: what it says before and after the figure
            before = text_line[: m.start()] if text_line[: m.start()].strip() or previous is None \
                else previous.rstrip() + " "
            after = text_line[m.end():] + ("" if following is None else " " + following.lstrip())
            if NOT_MEASURED_BEFORE.search(LIST_BEFORE.sub("", before)) or NOT_MEASURED_AFTER.match(after):
                continue
            if "," in figure and "." not in figure and not re.match(rf"\s?(?:{UNIT})", after) and (
                    RUN_SIZE.search(before) or SIZE_NOUN.match(after)):
                continue  # the size of a run, a setting of the benchmark
            if (share := re.match(rf"{OF}[\d,]+", after)) and SIZE_NOUN.match(after[share.end():]):
                continue  # a run's make-up, `3 of 10,000 serving`
            found.append(f"{source}:{number}: {figure!r} in {lines[number - 1].strip()[:80]!r}")
    return found


def bare_figures(template: str) -> list[str]:
    """The template's typed figures (`typed_figures` on bench/benchmarks.md.in)."""
    return typed_figures(template, "bench/benchmarks.md.in")


def render(template: str, blocks: Path = c.RESULTS) -> str:
    """The template with every placeholder filled from bench/results (run_all's blocks from `blocks`)."""
    return PLACEHOLDER.sub(lambda m: placeholder(m.group(1), blocks), template)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="compare with the rendered pages, write nothing")
    parser.add_argument("--docs", type=Path, help=f"render {TEMPLATE.name} to this file only (default: every page)")
    parser.add_argument("--results", type=Path, default=c.RESULTS,
                        help="where bench/run_all.py's blocks come from (placeholders: bench/results)")
    args = parser.parse_args(argv)
    pages = {TEMPLATE: args.docs} if args.docs else PAGES
    stale = 0
    for template, docs in pages.items():
        try:
            text = render(template.read_text(), args.results)
        except RenderError as exc:
            print(f"error: {template.name}: {exc}", file=sys.stderr)
            return 2
        if args.check:
            current = docs.read_text() if docs.exists() else ""
            if current != text:
                stale += 1
                sys.stdout.writelines(difflib.unified_diff(current.splitlines(True), text.splitlines(True),
                                                           str(docs), "rendered"))
                print(f"{docs} is not what bench/render_docs.py renders from bench/results: run it", file=sys.stderr)
            continue
        docs.write_text(text)
        print(f"wrote {docs}")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
