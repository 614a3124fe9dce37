"""docs/benchmarks.md is rendered from the results files (bench/render_docs.py): the committed page is
what renders, every measured figure in its template is a placeholder naming its results file, and
every results file is cited. So no figure is quoted without the run behind it, and a rerun that
writes new results shows up as a page to re-render (and reread), not as docs that quietly disagree.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import render_docs  # noqa: E402


def test_the_committed_page_is_what_the_results_render() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "render_docs.py"), "--check"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, (proc.stdout[-4000:] + proc.stderr
                                  + "\nrun `python bench/render_docs.py` and commit docs/benchmarks.md")


def test_no_page_types_a_measured_figure() -> None:
    """A figure typed into a template's text, or into a page that is not rendered, is a number nobody can
    trace to a run: decimals, percentages, whole numbers with a unit and counts with thousands separators.
    Every page is checked, README.md and each docs/*.md (a rendered one by its template), so a new page is
    too: it quotes its measurements from docs/benchmarks.md, or becomes a template itself."""
    checked = render_docs.checked_docs()
    rendered = set(render_docs.PAGES.values())
    assert set(render_docs.PAGES) <= set(checked) and ROOT / "README.md" in checked
    assert {p for p in (ROOT / "docs").glob("*.md") if p not in rendered} <= set(checked)
    assert not rendered & set(checked), "a rendered page is checked by its template, not as typed"
    found = [f for page in checked for f in render_docs.typed_figures(page.read_text(), str(page.relative_to(ROOT)))]
    assert found == [], "measured figures typed by hand (make each a placeholder in a template, or point to " \
                        "docs/benchmarks.md):\n" + "\n".join(found)


def test_what_the_typed_figure_check_finds_and_leaves() -> None:
    found = render_docs.typed_figures(
        "took 3.15 ms, 0.4 % of a core, 17 ms of `status`, 145 s; 236 MB over, in 16 of about 600\n"
        "with 7,437 of the models, 1,224 MB against 1,160, 17 ms and 7,438 of them\n"
        "≤ 0.3 s, target 1 %, every 10 s, within 50 ms, a 5 s window, at 10,000 models,\n"
        "2,000 and 5,000 models, at 200 and 1,000\n"
        "| 1,000 | Triton 2.51 `--idle 60 s` {{=40 s}} {{audit_query:results.0.median_ms|.2f}} ms\n"
        "```\n1.5 s\n```\n", "doc.md")
    assert [f.split(": ", 1)[1].split(" in ")[0] for f in found] == [
        "'3.15'", "'0.4'", "'17'", "'145'", "'236'", "'16'", "'7,437'", "'1,224'", "'1,160'", "'17'",
        "'7,438'"]
    assert found[0].startswith("doc.md:1: ")
    # what the docs outside the templates said, measured by tests or runs with no results file behind them
    measured = render_docs.typed_figures(
        "Measured: 0.13 s after the session closed, max 66 ms, in about 2 s, outage 15.0 s;\n"
        "answers about 3 s after start, costs about 45 ms for `status`, (6.5–8.5 s over six runs)\n"
        "a round over 10,000 models: 245 ms, the host's step: 0.20–0.35 s median\n", "doc.md")
    assert [f.split(": ", 1)[1].split(" in ")[0] for f in measured] == [
        "'0.13'", "'66'", "'2'", "'15.0'", "'3'", "'45'", "'6.5'", "'8.5'", "'245'", "'0.20'", "'0.35'"]
    # settings, bounds, examples and versions, as the pages write them
    assert render_docs.typed_figures(
        "retried after 1 s, 2 s, 4 s, default 2 s, `liveness_s` (10 s), (min 0.05), a 10 s timeout, like 30s,\n"
        "a 64 MiB file in 8 MiB parts, 25.07 or later, the 1.27 schema, ±20 %, 2 hours + 9 × 75 s,\n"
        "at most 1 s + the 0.1 s loop tick, `huge needs 5000 MB but no host has room: a\n38 MB (pinned)`\n"
        "lasts **8 hours** from login at most, load deadline + 60 s, the 5 s and 2 s bounds,\n"
        "with 3 of 10,000 serving\n", "doc.md") == []
    assert render_docs.render("{{=40 s}}") == "40 s"  # typed on purpose: rendered as written


def test_every_results_file_is_cited_by_the_page() -> None:
    template = render_docs.TEMPLATE.read_text()
    cited = {spec.split(":", 1)[0].strip() for spec in render_docs.PLACEHOLDER.findall(template)}
    page = render_docs.DOCS.read_text()
    for path in sorted((ROOT / "bench" / "results").glob("*.json")):
        assert path.stem in cited or f"`{path.relative_to(ROOT)}`" in page or f"bench/results/{path.name}" in page, (
            f"{path.name} is not cited by docs/benchmarks.md: quote it (bench/benchmarks.md.in) or remove it")


def test_a_placeholder_names_a_file_and_a_value_that_exist() -> None:
    with pytest.raises(render_docs.RenderError, match=r"bench/results/no_such_bench\.json: no such results file"):
        render_docs.render("{{no_such_bench:results.0.median_ms}}")
    with pytest.raises(render_docs.RenderError, match=r"audit_query\.json has no results\.999\.median_ms"):
        render_docs.render("{{audit_query:results.999.median_ms|.1f}}")
    value = render_docs.lookup("audit_query", "results.0.median_ms")
    assert render_docs.render("{{audit_query:results.0.median_ms*1000|,.0f}} µs") == f"{value * 1000:,.0f} µs"
    assert re.fullmatch(r"\d+", render_docs.render("{{changeset:summary.Triton poll.failed_per_edit|max}}"))
    # a ratio of two values of one file, as measured side by side
    top, bottom = (render_docs.lookup("audit_query", f"results.{i}.median_ms") for i in (0, 1))
    assert render_docs.render("{{audit_query:results.0.median_ms/@results.1.median_ms|.3f}}") == f"{top / bottom:.3f}"
    with pytest.raises(render_docs.RenderError, match="not a ratio of two numbers"):
        render_docs.render("{{audit_query:results.0.median_ms/@results.0}}")


def recorded_commits(value: object) -> list[str]:
    """Every `git_commit` a results file records (a comparison records one per run, per tree)."""
    if isinstance(value, dict):
        return [c for k, v in value.items()
                for c in ([str(v)] if k == "git_commit" and isinstance(v, str) else recorded_commits(v))]
    if isinstance(value, list):
        return [c for v in value for c in recorded_commits(v)]
    return []


# results files whose commits are not in the repository yet, each with who reruns it; the test fails
# once one names a commit that exists, so the entry cannot outlive its rerun
RERUN_PENDING: dict[str, str] = {}  # results files whose commit is missing, each awaiting its rerun


def test_every_results_file_names_a_commit_in_the_repository() -> None:
    """A results file names the commit it ran at, and that commit is in the repository's history: a run
    from a commit later rebased away cannot be checked out again, so nobody can reproduce it."""
    missing: dict[str, list[str]] = {}
    for path in sorted((ROOT / "bench" / "results").glob("*.json")):
        commits = recorded_commits(json.loads(path.read_text()))
        assert commits, f"{path.name} records no git_commit"
        for commit in commits:
            head = re.match(r"[0-9a-f]{7,40}", commit)
            assert head, f"{path.name}: git_commit {commit!r} names no commit"
            if subprocess.run(["git", "cat-file", "-e", f"{head.group(0)}^{{commit}}"], cwd=ROOT,
                              capture_output=True).returncode != 0:
                missing.setdefault(path.name, []).append(commit)
    assert {name: commits for name, commits in missing.items() if name not in RERUN_PENDING} == {}, (
        "results files name commits that are not in the repository: rerun them at a commit that is, or remove them")
    assert set(RERUN_PENDING) <= set(missing), "a pending rerun landed: drop it from RERUN_PENDING"


def test_a_dirty_commit_reads_as_dirty_in_the_docs() -> None:
    """A run from a tree with uncommitted changes keeps its `-dirty` mark when the page cuts the hash."""
    dirty = render_docs.lookup("scale", "runs.1.git_commit")
    assert dirty.endswith("-dirty")
    assert render_docs.render("{{scale:runs.1.git_commit|.8}}") == dirty[:8] + "-dirty"
    page = render_docs.DOCS.read_text()
    commits = {c for path in (ROOT / "bench" / "results").glob("*.json")
               for c in recorded_commits(json.loads(path.read_text()))}
    for commit in sorted(c for c in commits if c.endswith("-dirty") and c.removesuffix("-dirty") not in commits):
        short = commit[:7]  # a run only from a dirty tree at that commit: quoted anywhere, it says so
        found = re.search(rf"(?<![-\w]){short}[0-9a-f]*\b(?!-dirty)", page)
        assert not found, f"{commit} is quoted in docs/benchmarks.md without its -dirty: {found.group(0)}"
