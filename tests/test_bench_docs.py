"""docs/benchmarks.md is rendered from the results files (bench/render_docs.py): the committed page is
what renders, every measured figure in its template is a placeholder naming its results file, and
every results file is cited. So no figure is quoted without the run behind it, and a rerun that
writes new results shows up as a page to re-render (and reread), not as docs that quietly disagree.
"""

from __future__ import annotations

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


def test_the_template_types_no_measured_figure() -> None:
    """A decimal figure or a percentage in the template's text is a number nobody can trace to a run."""
    assert render_docs.bare_figures(render_docs.TEMPLATE.read_text()) == []
    # what the check finds, and what it leaves (a target, a setting, a placeholder, a code block)
    found = render_docs.bare_figures("took 3.15 ms, 0.4 % of a core\n≤ 0.3 s, target 1 %, every 10 s "
                                     "{{audit_query:results.0.median_ms|.2f}}\n```\n1.5 s\n```\n")
    assert [f.split(": ", 1)[1].split(" in ")[0] for f in found] == ["'3.15'", "'0.4'"]


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
