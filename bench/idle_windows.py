"""The daemon's idle CPU with every model serving, in windows after the start-up's one-time work.

bench/scale.py's (d) samples one window right after every model serves, which also holds the first
reconcile's reads of every newly READY model's config (once per start). This script waits for every
model to serve, lets the daemon settle, then measures several windows of its process CPU time
(utime + stime from /proc), which the machine's load inflates much less than wall times.

    python bench/idle_windows.py                     # 1,000 models (1 python + ensembles), 3 × 30 s
    python bench/idle_windows.py --models 200 --windows 2 --window-s 20
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


def run(args: argparse.Namespace, console: Any) -> dict[str, Any]:
    report = c.base_report("idle_windows", args.argv, False, c.machine_info())
    with c.workspace("idle-windows") as base:
        scale.make_repository(base / "repo", args.models)
        daemon = c.daemon_process(base / "repo", base / "state", 1.0, policy="auto")
        daemon.start()
        try:
            started = time.monotonic()
            ok = c.wait_until(scale._all_ready(daemon.triton_url(), args.models, daemon.state_dir), 1200, 0.5)
            serving_s = round(time.monotonic() - started, 1) if ok is not None else None
            time.sleep(args.settle_s)
            pid = daemon.proc.pid
            windows = []
            for _ in range(args.windows):
                cpu0, t0 = c.cpu_seconds(pid), time.monotonic()
                time.sleep(args.window_s)
                windows.append(round(100 * (c.cpu_seconds(pid) - cpu0) / (time.monotonic() - t0), 2))
        finally:
            daemon.stop()
            shutil.rmtree(base / "repo", ignore_errors=True)
    report.update(models=args.models, all_serving_s=serving_s, settle_s=args.settle_s, window_s=args.window_s,
                  idle_cpu_pct=windows, idle_cpu_pct_median=statistics.median(windows) if windows else None)
    report["rows"] = [row.to_json() for row in rows(report)]
    return report


def rows(report: dict[str, Any]) -> list[Any]:
    return [c.Row(f"{report['models']:,} models: daemon idle CPU, median of {len(report['idle_cpu_pct'])} "
                  f"× {report['window_s']:g} s windows ({report['settle_s']:g} s after every model served)",
                  "tritonctl auto", f"{report['idle_cpu_pct_median']:.2f} %", "≤ 1 % (issue 26, at 10,000)",
                  note="windows: " + ", ".join(f"{w:.2f} %" for w in report["idle_cpu_pct"])
                       + f"; every model serving {report['all_serving_s']} s after the start",
                  value=report["idle_cpu_pct_median"])]


def render(report: dict[str, Any], console: Any) -> None:
    c.render_rows("Idle CPU with every model serving", rows(report), console, c.machine_line(report["machine"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=int, default=1000)
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--window-s", type=float, default=30.0)
    parser.add_argument("--settle-s", type=float, default=40.0)
    return c.bench_main("idle_windows", parser, argv, run, render=render, check=False, exit_code=lambda *_: 0)


if __name__ == "__main__":
    sys.exit(main())
