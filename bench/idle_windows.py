"""The daemon's idle CPU with every model serving, in windows after the start-up's one-time work.

bench/scale.py's (d) samples one window right after every model serves, which also holds the first
reconcile's reads of every newly READY model's config (once per start). This script waits for every
model to serve, lets the daemon settle, then measures several windows of its process CPU time
(utime + stime from /proc), which the machine's load inflates much less than wall times.

    python bench/idle_windows.py                     # 1,000 models (1 python + ensembles), 3 × 30 s
    python bench/idle_windows.py --models 200 --windows 2 --window-s 20
    python bench/idle_windows.py --models 2000 --other /tmp/before/tritonctl   # side by side with another tree

`--other` names another tree's `tritonctl` executable: its daemon runs at the same time on a repository of
its own (the same models), and each window measures both, so the machine's load weighs on both alike.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from typing import Any

import common as c  # type: ignore[import-not-found]
import scale  # type: ignore[import-not-found]


def _start(base: Any, args: argparse.Namespace, daemons: dict[str, Any]) -> None:
    """This tree's daemon and, with --other, the other tree's, into `daemons` as each is spawned (the caller
    stops them whatever happens), then each waited for."""
    import tests.harness as harness

    for label, exe in (("this", None), ("other", args.other)):
        if label == "other" and exe is None:
            continue
        scale.make_repository(base / label / "repo", args.models)
        daemons[label] = c.daemon_process(base / label / "repo", base / label / "state", 1.0, policy="auto")
        own, harness.TRITONCTL = harness.TRITONCTL, exe or harness.TRITONCTL  # read by start()
        try:
            daemons[label].start(wait=False)
        finally:
            harness.TRITONCTL = own
    for daemon in daemons.values():
        daemon.wait_ready(timeout_s=1200)


def run(args: argparse.Namespace, console: Any) -> dict[str, Any]:
    report = c.base_report("idle_windows", args.argv, False, c.machine_info())
    with c.workspace("idle-windows") as base:
        daemons: dict[str, Any] = {}
        serving_s: dict[str, float | None] = {}
        windows: dict[str, list[float]] = {"this": [], "other": []}
        try:
            started = time.monotonic()
            _start(base, args, daemons)
            for label, daemon in daemons.items():
                ok = c.wait_until(scale._all_ready(daemon.triton_url(), args.models, daemon.state_dir), 1200, 0.5)
                serving_s[label] = round(time.monotonic() - started, 1) if ok is not None else None
            time.sleep(args.settle_s)
            pids = {label: daemon.proc.pid for label, daemon in daemons.items()}
            for _ in range(args.windows):
                cpu0, t0 = {label: c.cpu_seconds(pid) for label, pid in pids.items()}, time.monotonic()
                time.sleep(args.window_s)
                elapsed = time.monotonic() - t0
                for label, pid in pids.items():
                    windows[label].append(round(100 * (c.cpu_seconds(pid) - cpu0[label]) / elapsed, 3))
        finally:
            for daemon in daemons.values():
                daemon.stop()
            for label in daemons:
                shutil.rmtree(base / label / "repo", ignore_errors=True)
    ours = windows["this"]
    report.update(models=args.models, all_serving_s=serving_s["this"], settle_s=args.settle_s,
                  window_s=args.window_s, idle_cpu_pct=ours,
                  idle_cpu_pct_median=statistics.median(ours) if ours else None)
    if args.other:
        theirs = windows["other"]
        report["other"] = {"tritonctl": args.other, "all_serving_s": serving_s["other"], "idle_cpu_pct": theirs,
                           "idle_cpu_pct_median": statistics.median(theirs) if theirs else None}
    report["rows"] = [row.to_json() for row in rows(report)]
    return report


def rows(report: dict[str, Any]) -> list[Any]:
    def row(system: str, part: dict[str, Any]) -> Any:
        median = part["idle_cpu_pct_median"]
        return c.Row(f"{report['models']:,} models: daemon idle CPU, median of {len(part['idle_cpu_pct'])} "
                     f"× {report['window_s']:g} s windows ({report['settle_s']:g} s after every model served)",
                     system, f"{median:.2f} %", "≤ 1 % (issue 26, at 10,000)",
                     note="windows: " + ", ".join(f"{w:.2f} %" for w in part["idle_cpu_pct"])
                          + f"; every model serving {part['all_serving_s']} s after the start",
                     value=median)

    out = [row("tritonctl auto", report)]
    if "other" in report:
        out.append(row(f"tritonctl auto, other tree ({report['other']['tritonctl']})", report["other"]))
    return out


def render(report: dict[str, Any], console: Any) -> None:
    c.render_rows("Idle CPU with every model serving", rows(report), console, c.machine_line(report["machine"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=int, default=1000)
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--window-s", type=float, default=30.0)
    parser.add_argument("--settle-s", type=float, default=40.0)
    parser.add_argument("--other", help="another tree's tritonctl executable, measured side by side")
    return c.bench_main("idle_windows", parser, argv, run, render=render, check=False, exit_code=lambda *_: 0)


if __name__ == "__main__":
    sys.exit(main())
