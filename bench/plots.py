"""The figures drawn from the benchmarks' results files (matplotlib, imported only when drawing):
bench/run_all.py --plots writes them next to docs/benchmarks.md, which shows them.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as c  # noqa: E402


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
