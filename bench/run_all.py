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
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as c  # noqa: E402
from rich.table import Table  # noqa: E402

BENCHMARKS = ("edit_torture", "swap_availability", "change_latency", "snapshot_cost", "scale", "cli_latency",
              "fleet_rollout", "bake")
TITLES = {
    "edit_torture": "Edit torture: slow randomized writers, tritonctl vs Triton poll",
    "swap_availability": "Swap availability: requests during swaps, tritonctl vs Triton explicit vs Triton poll",
    "change_latency": "Change latency: last close() to first new answer; tritonctl's own overhead per deploy",
    "snapshot_cost": "Snapshot cost: a big model against cp and sha256sum",
    "scale": "Scale: 200 to 10,000 models (start, restart, one edit, idle CPU, memory, CLI), tritonctl vs Triton",
    "cli_latency": "CLI latency: each command as a new process, beside `python -c pass`",
    "fleet_rollout": "Fleet rollout: edit → every host serving, by fleet size (daemons and tritonservers on loopback)",
    "bake": "Bad deploys under live traffic: tritonctl with a bake, without one, Triton poll (docs/bake.md)",
    "audit_query": "Audit query (bench/audit_query.py, run with --with-audit; latest results)",
}
DOCS = c.ROOT / "docs" / "benchmarks.md"


def markers(quick: bool) -> tuple[str, str]:
    tag = "quick" if quick else "full"
    return f"<!-- bench/run_all.py:{tag}:start -->", f"<!-- bench/run_all.py:{tag}:end -->"


def result_file(name: str, quick: bool, results_dir: Path | None) -> Path:
    default = c.results_path(name, quick)
    return results_dir / default.name if results_dir else default


def load(name: str, quick: bool, results_dir: Path | None = None) -> dict[str, Any] | None:
    path = result_file(name, quick, results_dir)
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return None


def audit_rows(report: dict[str, Any]) -> list[dict[str, Any]]:
    """bench/audit_query.py's results in this script's row shape."""
    out = []
    for r in report.get("results", []):
        target = r.get("target_median_ms")
        out.append({"measurement": r["name"], "system": "tritonctl",
                    "target": "-" if target is None else f"median <= {target:g} ms",
                    "measured": f"{r['median_ms']:.1f} ms median, p95 {r['p95_ms']:.1f} ms", "met": r.get("met"),
                    "note": f"{r['repetitions']} repetitions"})
    return out


def summary_rows(name: str, report: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows with a target, each followed by the other systems' rows of the same measurement."""
    rows = audit_rows(report) if name == "audit_query" else report.get("rows", [])
    out: list[dict[str, Any]] = []
    for r in rows:
        if r.get("met") is None:
            continue
        out.append(r)
        out += [o for o in rows if o["measurement"] == r["measurement"] and o is not r and o.get("met") is None]
    return out


def cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def result_word(met: bool | None) -> str:
    return {True: "met", False: "**MISSED**", None: "info"}[met]


def markdown(quick: bool, reports: dict[str, dict[str, Any]], runtimes: dict[str, float]) -> str:
    start, end = markers(quick)
    lines = [start, ""]
    mode = "quick (CI sizes)" if quick else "full"
    lines.append(f"## Side-by-side benchmarks: latest {mode} run")
    lines.append("")
    lines.append("Generated by `python bench/run_all.py" + (" --quick" if quick else "") + "` from `bench/results/"
                 + ("*-quick.json" if quick else "*.json") + "`; edit the text outside these markers, not inside.")
    lines.append("")
    machine = next((r["machine"] for r in reports.values() if "machine" in r), None)
    if machine:
        lines.append(f"**Machine.** {machine.get('cpu_model')}, {machine.get('nproc')} CPUs available, "
                     f"{machine.get('memory_gib', '?')} GiB RAM, {machine.get('platform')}; Python "
                     f"{machine.get('python')}; tritonserver {machine.get('tritonserver', '?')} from the "
                     f"nvidia-pytriton {machine.get('nvidia_pytriton', '?')} wheel (CPU only, python backend); "
                     f"fs.inotify.max_user_watches {machine.get('inotify_max_user_watches', '?')}. A shared machine: "
                     "other engineers' tests ran on the same two cores, so absolute numbers are noisy; each "
                     "benchmark runs its systems side by side (at once, or alternating) so the noise falls on all "
                     "alike, and reports medians and ratios.")
        lines.append("")
    lines.append("**Commands.**")
    lines.append("")
    lines.append("```")
    for name in BENCHMARKS:
        lines.append(f"python bench/{name}.py" + (" --quick" if quick else "")
                     + (f"    # {runtimes[name]:.0f} s" if name in runtimes else ""))
    lines.append("python bench/run_all.py" + (" --quick" if quick else "")
                 + "    # all of the above, then this section")
    lines.append("```")
    lines.append("")
    lines.append("### Summary: every target, and the other systems on the same measurement")
    lines.append("")
    lines.append("| Benchmark | Measurement | System | Target | Measured | Result |")
    lines.append("|---|---|---|---|---|---|")
    for name, report in reports.items():
        for r in summary_rows(name, report):
            lines.append(f"| {name} | {cell(r['measurement'].strip())} | {cell(r['system'])} | {cell(r['target'])} | "
                         f"{cell(r['measured'])} | {result_word(r['met'])} |")
    missing = [n for n in (*BENCHMARKS, "audit_query") if n not in reports]
    if missing:
        lines.append("")
        lines.append(f"No results for: {', '.join(missing)}.")
    for name, report in reports.items():
        lines.append("")
        when = report.get("when", "?")
        runtime = report.get("runtime_s")
        lines.append(f"### {TITLES.get(name, name)}")
        lines.append("")
        m = report.get("machine", {})
        load_start = m.get("load_average_start") or [m.get("load_average_1m", "?")]
        load_end = m.get("load_average_end") or ["?"]
        commit = c.short_commit(report.get("git_commit") or m.get("git_commit") or "not recorded", 12)
        lines.append(f"`{report.get('command', name)}` — {when}"
                     + (f", {runtime:.0f} s" if isinstance(runtime, (int, float)) else "")
                     + f"; commit {commit}"
                     + f"; load average (1 min) at start {load_start[0]}, at end {load_end[0]}.")
        if report.get("plot"):
            lines += ["", f"![{PLOT_ALT.get(name, name)}]({report['plot']})"]
        if name == "fleet_rollout":
            lines += fleet_waves(report)
        lines.append("")
        lines.append("| Measurement | System | Target | Measured | Result | Note |")
        lines.append("|---|---|---|---:|---|---|")
        rows = audit_rows(report) if name == "audit_query" else report.get("rows", [])
        for r in rows:
            lines.append(f"| {cell(r['measurement'].strip())} | {cell(r['system'])} | {cell(r['target'])} | "
                         f"{cell(r['measured'])} | {result_word(r.get('met'))} | {cell(r.get('note', ''))} |")
    lines += ["", end]
    return "\n".join(lines) + "\n"


def fleet_waves(report: dict[str, Any]) -> list[str]:
    """bench/fleet_rollout.py's waves per fleet size: the hosts share this machine's cores, so the
    per-wave time is what carries over to a real fleet, not the total."""
    results = [r for r in report.get("results", []) if "waves" in r]
    if not results:
        return []

    def s(value: Any) -> str:
        return "-" if value is None else f"{value:.2f} s"

    lines = ["", "| Hosts | Waves | Edit → every host serving, median (max) | Per wave | Canary wave | Later waves "
             "| Edit → rollout | Broken → rolled back | Load (1 min) at start |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r['hosts']} | {r['waves']} | {s(r['rollout_median_s'])} ({s(r['rollout_max_s'])}) | "
                     f"{s(r['wave_median_s'])} | {s(r['canary_wave_median_s'])} | {s(r['later_wave_median_s'])} | "
                     f"{s(r['edit_to_rollout_median_s'])} | {s(r.get('broken_stopped_s'))} | "
                     f"{(r.get('load_average_start') or ['?'])[0]} |")
    return lines


def plot_cli_latency(report: dict[str, Any], path: Path) -> None:
    """Median wall and CPU time per command (bars), `python -c pass`, the import floor and the target as lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    commands = report["commands"]
    systems = [s for s in ("before", "tritonctl") if s in commands[0]]
    labels = {"before": f"before ({report['settings'].get('compare_label') or 'before'})", "tritonctl": "tritonctl"}
    series = [(system, "median_ms", labels[system] + " wall") for system in systems]
    series += [("tritonctl", "cpu_median_ms", "tritonctl CPU (user + system)")]
    colours = {("before", "median_ms"): "#bbbbbb", ("tritonctl", "median_ms"): "#1f77b4",
               ("tritonctl", "cpu_median_ms"): "#ff7f0e"}
    fig, ax = plt.subplots(figsize=(10, 4.8), dpi=100)
    width = 0.8 / len(series)
    for i, (system, key, label) in enumerate(series):
        xs = [k + (i - (len(series) - 1) / 2) * width for k in range(len(commands))]
        values = [cmd[system][key] for cmd in commands]
        bars = ax.bar(xs, values, width, label=label, color=colours[(system, key)])
        ax.bar_label(bars, fmt="%.0f", fontsize=7)
    floor = report["python_c_pass"]["median_ms"]
    ax.axhline(floor, color="#2ca02c", linestyle=":", label=f"python -c pass wall ({floor:.0f} ms)")
    imports = report.get("import_costs", {}).get("floor", {})
    if imports.get("cpu_median_ms") is not None:  # import click, http.client: the floor of the choices
        ax.axhline(imports["cpu_median_ms"], color="#ff7f0e", linestyle=":",
                   label=f"import click, http.client CPU ({imports['cpu_median_ms']:.0f} ms)")
    target = report["settings"]["target_ms"]
    ax.axhline(target, color="#d62728", linestyle="--", label=f"target {target:.0f} ms")
    ax.set_xticks(range(len(commands)), [cmd["command"] for cmd in commands], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("median ms per new process")
    m = report.get("machine", {})
    ax.set_title(f"tritonctl CLI latency, median of {report['settings']['runs']} runs; {m.get('nproc')} CPUs, "
                 f"load {(m.get('load_average_start') or ['?'])[0]} at start; "
                 f"commit {c.short_commit(report.get('git_commit', '?'))}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def plot_edit_timeline(report: dict[str, Any], path: Path) -> None:
    """Per system, the generation each probed model answered over time (config and code apart),
    mixed answers (config != code) marked, errors shaded, and when each edit's last write closed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = list(report["systems"])
    model = next(iter(report["systems"][systems[0]].get("timeline") or {}), None)
    if model is None:
        return
    fig, axes = plt.subplots(len(systems), 1, figsize=(11, 2.6 * len(systems)), dpi=100, sharex=True)
    for ax, system in zip(axes, systems, strict=True):
        changes = report["systems"][system]["timeline"].get(model, [])
        end = changes[-1][0] + 1 if changes else 1
        for i, (t, cfg, code) in enumerate(changes):
            t_next = changes[i + 1][0] if i + 1 < len(changes) else end
            if cfg is None:
                ax.axvspan(t, t_next, color="#ffcccc", lw=0)
            elif cfg != code:
                ax.axvspan(t, t_next, color="#d62728", alpha=0.5, lw=0)
        pts = [(t, cfg, code) for t, cfg, code in changes if cfg is not None]
        if pts:
            ax.step([p[0] for p in pts], [p[1] for p in pts], where="post", color="#1f77b4", label="config generation")
            ax.step([p[0] for p in pts], [p[2] for p in pts], where="post", color="#ff7f0e", linestyle="--",
                     label="code generation")
        mixed = [(t, cfg) for t, cfg, code in changes if cfg is not None and cfg != code]
        if mixed:
            ax.scatter([m[0] for m in mixed], [m[1] for m in mixed], marker="x", color="#d62728", zorder=3,
                       label="mixed answer (config != code)")
        for t, _gen in report.get("edits_closed", {}).get(model, []):
            ax.axvline(t, color="#999999", lw=0.5, alpha=0.6)
        st = report["systems"][system]
        ax.set_title(f"{system}: {st.get('mixed_states_distinct', '?')} distinct mixed states, "
                     f"{st['mixed_answers']:,} mixed answers, {st['failed_requests']:,} failed requests "
                     "(all models)", fontsize=9)
        ax.set_ylabel(f"{model}\ngeneration", fontsize=8)
        ax.legend(fontsize=7, loc="upper left")
    axes[-1].set_xlabel("seconds since the writers started (grey lines: an edit's last write closed; "
                        "red: mixed; pink: errors)")
    m = report.get("machine", {})
    fig.suptitle(f"Edit torture timeline, {report['settings']['edits']} edits; commit "
                 f"{c.short_commit(report.get('git_commit', '?'))}, load {(m.get('load_average_start') or ['?'])[0]} "
                 "at start", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def plot_scale(report: dict[str, Any], path: Path) -> None:
    """Each figure of the scale benchmark against N (log scale), one line per system: (a) first start,
    (b) restart with nothing changed, (c) one edit's overhead, (d) idle CPU and RSS, (e) CLI times."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = sorted(report["results"], key=lambda r: r["models"])
    xs = [r["models"] for r in results]

    def get(r: dict[str, Any], *keys: str) -> Any:
        for key in keys:
            r = r.get(key) if isinstance(r, dict) else None
        return r

    panels: list[tuple[str, str, dict[str, list[Any]], float | None]] = [
        ("(a) first start", "seconds", {
            "tritonctl manual: READY": [get(r, "tritonctl_manual", "first_ready_s") for r in results],
            "tritonctl auto: every model serving": [get(r, "tritonctl", "all_serving_s") for r in results],
            "Triton explicit: every model READY": [get(r, "triton_explicit", "all_ready_s") for r in results],
            "Triton poll: live": [get(r, "triton_poll", "live_s") for r in results]}, 20.0),
        ("(b) restart, nothing changed", "seconds to READY", {
            "tritonctl manual": [get(r, "tritonctl_manual", "restart_ready_s") for r in results],
            "tritonctl auto (tritonserver kept)": [get(r, "tritonctl", "restart_ready_s") for r in results]}, 2.0),
        ("(c) one edit beyond Triton's load", "seconds (median)", {
            "tritonctl: renamed in": [get(r, "tritonctl", "edit_added_median_s") for r in results]}, None),
        ("(d) idle CPU", "% of one core", {
            "tritonctl daemon": [get(r, "tritonctl", "idle_cpu_pct") for r in results],
            "its tritonserver": [get(r, "tritonctl", "idle_cpu_pct_triton") for r in results],
            "Triton explicit": [get(r, "triton_explicit", "idle_cpu_pct") for r in results]}, 1.0),
        ("(d) memory", "MB", {
            "tritonctl daemon (auto), peak RSS": [get(r, "tritonctl", "peak_rss_mb") for r in results],
            "tritonctl daemon (manual), peak RSS": [get(r, "tritonctl_manual", "peak_rss_mb") for r in results],
            "Triton explicit, RSS": [get(r, "triton_explicit", "rss_mb") for r in results]}, 300.0),
        ("(e) CLI", "seconds (median of 3)", {
            "status --json": [get(r, "tritonctl", "status_json_s") for r in results],
            "versions M": [get(r, "tritonctl", "versions_s") for r in results]}, 1.0),
    ]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8), dpi=90)
    for ax, (title, unit, series, target) in zip(axes.flat, panels, strict=True):
        for label, ys in series.items():
            pts = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        if target is not None:
            ax.axhline(target, color="#d62728", linestyle="--", lw=0.8, label=f"target {target:g}")
        ax.set_xscale("log")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("models")
        ax.set_ylabel(unit)
        ax.legend(fontsize=7)
    save_plot(fig, plt, path, report, "Scale: 1 python model + ensembles over it")


def save_plot(fig: Any, plt: Any, path: Path, report: dict[str, Any], what: str) -> None:
    """Title a figure with what it shows and its run's provenance (commit, load), and write it."""
    m = report.get("machine", {})
    fig.suptitle(f"{what}; commit {c.short_commit(report.get('git_commit', '?'))}, "
                 f"load {(m.get('load_average_start') or ['?'])[0]} at start", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


PLOTS = {"cli_latency": plot_cli_latency, "edit_torture": plot_edit_timeline, "scale": plot_scale}
PLOT_ALT = {"cli_latency": "CLI latency per command", "edit_torture": "Edit torture timeline",
            "scale": "Scale: each figure against the number of models",
            "bake": "Failed requests over time: with a bake, without one, Triton poll"}


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
