"""Run every side-by-side benchmark and write the combined tables into docs/benchmarks.md.

    python bench/run_all.py                # full sizes (about 40 minutes on 2 shared cores)
    python bench/run_all.py --quick        # CI sizes (about 4.5 minutes)
    python bench/run_all.py --from-results # no run: rebuild the docs section from bench/results/*.json
    python bench/run_all.py --only scale,snapshot_cost
    python bench/run_all.py --from-results --plots   # also draw docs/*.png from the JSON (matplotlib)

Each benchmark runs as its own process (`python bench/<name>.py [--quick]`), one after the other (they
would disturb each other's numbers on a 2-core machine), and writes bench/results/<name>[-quick].json.
bench/fleet_rollout.py starts its own throwaway PostgreSQL server (tests/pg.py: needs the postgresql
server binaries and psycopg, as CI installs them). The audit benchmark (bench/audit_query.py, a
1,000,000-event registry) runs only with `--with-audit`; its latest results
(bench/results/audit_query.json) join the summary when present.

docs/benchmarks.md is rendered as a whole by bench/render_docs.py from bench/benchmarks.md.in and the
results files (this script's blocks included), so it never holds a figure without its results file.
Another file given with --docs keeps its other sections: only the text between this script's markers
(one block for full runs, one for quick runs) is replaced, or appended the first time.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as c  # noqa: E402
from plots import PLOTS  # noqa: E402
from report import BENCHMARKS, DOCS, load, markdown, markers, result_file, summary_rows  # noqa: E402
from rich.table import Table  # noqa: E402


def update_docs(path: Path, block: str, quick: bool) -> None:
    """Replace this script's block for the mode, or append it; everything else stays as it is."""
    start, end = markers(quick)
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if start in text and end in text:
        head, rest = text.split(start, 1)
        _, tail = rest.split(end, 1)
        text = head + block.rstrip("\n") + tail
    else:
        text = text.rstrip("\n") + "\n\n" + block
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="CI sizes")
    parser.add_argument("--only", help="comma-separated benchmark names")
    parser.add_argument("--from-results", action="store_true", help="run nothing; rebuild the docs from the JSON")
    parser.add_argument("--with-audit", action="store_true", help="also run bench/audit_query.py")
    parser.add_argument("--docs", type=Path, default=DOCS, help="markdown file to update (default docs/benchmarks.md)")
    parser.add_argument("--no-docs", action="store_true")
    parser.add_argument("--plots", action="store_true", help="draw PNGs next to the docs (needs matplotlib)")
    parser.add_argument("--results", type=Path, help="directory for the JSON results (default bench/results)")
    args = parser.parse_args(argv)
    names = [n for n in (args.only.split(",") if args.only else BENCHMARKS) if n]
    unknown = set(names) - set(BENCHMARKS)
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(sorted(unknown))}")
    console = c.make_console()
    runtimes: dict[str, float] = {}
    failed: list[str] = []
    if not args.from_results:
        todo = names + (["audit_query"] if args.with_audit else [])
        for name in todo:
            command = [sys.executable, str(c.ROOT / "bench" / f"{name}.py")] + (["--quick"] if args.quick else [])
            if args.results:
                command += ["--out", str(result_file(name, args.quick, args.results))]
            console.rule(f"{name}{' --quick' if args.quick else ''}")
            t0 = time.monotonic()
            code = subprocess.run(command, cwd=c.ROOT, check=False).returncode
            runtimes[name] = time.monotonic() - t0
            if code != 0:
                failed.append(f"{name} (exit {code})")
    reports: dict[str, dict[str, Any]] = {}
    for name in BENCHMARKS:
        report = load(name, args.quick, args.results)
        if report is not None:
            reports[name] = report
            if name not in runtimes and isinstance(report.get("runtime_s"), (int, float)):
                runtimes[name] = float(report["runtime_s"])
    audit = load("audit_query", False, args.results) or load("audit_query", True, args.results)
    if audit is None and args.results:
        audit = load("audit_query", False) or load("audit_query", True)
    if audit is not None:
        reports["audit_query"] = audit
    table = Table(title="All targets (and the other systems on the same measurement)", title_justify="left")
    if reports:
        for column in ("Benchmark", "Measurement", "System", "Target", "Measured", "Result"):
            table.add_column(column)
        for name, report in reports.items():
            for r in summary_rows(name, report):
                table.add_row(name, r["measurement"].strip(), r["system"], r["target"], r["measured"],
                              c.verdict(r["met"]))
        console.print(table)
    if runtimes:
        console.print("runtimes: " + ", ".join(f"{n} {s:.0f} s" for n, s in runtimes.items()))
    for name, draw in PLOTS.items() if args.plots else ():
        if name not in reports:
            continue
        png = args.docs.parent / (f"{name}-quick.png" if args.quick else f"{name}.png")
        draw(reports[name], png)
        if png.exists():
            reports[name]["plot"] = png.name
            console.print(f"plot: {png}")
    if not args.no_docs and args.docs.resolve() == DOCS.resolve():
        import render_docs  # the whole page, from bench/benchmarks.md.in and the results files

        if render_docs.main(["--results", str(args.results or c.RESULTS)]) != 0:
            failed.append("render_docs")
    elif not args.no_docs:
        update_docs(args.docs, markdown(args.quick, reports, runtimes), args.quick)
        console.print(f"updated {args.docs}")
    if failed:
        console.print(f"[bold red]failed: {', '.join(failed)}[/bold red]")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
