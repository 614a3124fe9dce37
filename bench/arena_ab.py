"""The daemon's peak RSS in a first start under auto policy, with its malloc arenas capped and without (issue 57
item 6): the figure docs/benchmarks.md "Memory at 10,000 models" credits to the cap, measured side by side.

One repository (bench/scale.py's: one python model and ensembles over it). The same checkout's daemon starts on
a fresh state directory with its own freshly launched tritonserver, in turns: `capped` as it ships (two arenas,
controlplane/runtime/allocator.py) and `default` with `MALLOC_ARENA_MAX` set to glibc's own default (8 per
core), which the daemon leaves standing, so glibc makes the arenas it would without the cap. Each start is
stopped once its log shows every model's `deploy ok`; its peak RSS (VmHWM) and current RSS are read then.
Medians per variant; the machine's load is recorded.

    python bench/arena_ab.py                     # 10,000 models, 2 rounds each
    python bench/arena_ab.py --models 200 --rounds 1
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as c  # noqa: E402
import scale  # noqa: E402

from controlplane.runtime.allocator import secondary_arenas  # noqa: E402

NAME = "arena_ab"
ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ("capped", "default")


def _first_start(repo: Path, state: Path, log: Path, models: int, arena_max: str | None,
                 timeout_s: float) -> dict[str, float]:
    """One first start to every model's `deploy ok`: the daemon's peak and current RSS then, and the time."""
    from tests.harness import FREE_PORTS, TRITONCTL

    args = [TRITONCTL, "daemon", "--repository", str(repo), "--state-dir", str(state), "--settle", "1.0",
            "--launch-triton", *FREE_PORTS, "--policy", "auto"]
    env = dict(os.environ, TRITONCTL_RECONCILE_INTERVAL_S="10", TRITONCTL_READY_WAITS_FOR_DEPLOYS="false")
    env.pop("NOTIFY_SOCKET", None)
    env.pop("MALLOC_ARENA_MAX", None)
    if arena_max is not None:
        env["MALLOC_ARENA_MAX"] = arena_max
    with open(log, "w") as out:
        started = time.monotonic()
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        while log.read_text(errors="replace").count(" deploy ok ") < models:
            if proc.poll() is not None:
                raise SystemExit(f"daemon exited {proc.returncode}: {log.read_text()[-2000:]}")
            if time.monotonic() - started > timeout_s:
                raise SystemExit(f"not every model deployed within {timeout_s:g} s")
            time.sleep(0.2)
        return {"all_serving_s": round(time.monotonic() - started, 2),
                "peak_rss_mb": scale.rss_mb(proc.pid, "VmHWM"), "rss_mb": scale.rss_mb(proc.pid, "VmRSS"),
                "arenas": 1 + secondary_arenas(proc.pid)}  # the main one and those beside it, from outside
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)


def run(args: argparse.Namespace, console: Any) -> dict[str, Any]:
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # as an installed tritonctl: bytecode read (bench/scale.py)
    report = c.base_report(NAME, args.argv, False, c.machine_info())
    glibc_default = str(8 * (os.cpu_count() or 1))
    report["default_malloc_arena_max"] = int(glibc_default)
    runs: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
    with c.workspace(NAME) as base:
        repo = base / "repo"
        scale.make_repository(repo, args.models)
        time.sleep(1.5)  # older than the racy-signature window (controlplane/source/poller.py)
        for turn in range(args.rounds):
            for variant in VARIANTS:
                state = base / f"state-{variant}-{turn}"
                result = _first_start(repo, state, base / f"start-{variant}-{turn}.log", args.models,
                                      None if variant == "capped" else glibc_default, args.timeout)
                runs[variant].append(result)
                console.print(f"[dim]{variant}: every model serving {result['all_serving_s']:.1f} s, peak RSS "
                              f"{result['peak_rss_mb']:.0f} MB[/dim]")
                shutil.rmtree(state, ignore_errors=True)
    report["models"] = args.models
    report["runs"] = runs
    for variant, items in runs.items():
        for field in ("peak_rss_mb", "rss_mb", "all_serving_s"):
            report[f"{variant}_{field}_median"] = c.median([r[field] for r in items])
    report["peak_rss_saved_mb"] = round(report["default_peak_rss_mb_median"] - report["capped_peak_rss_mb_median"], 1)
    report["rows"] = [r.to_json() for r in rows(report)]
    return report


def rows(report: dict[str, Any]) -> list[c.Row]:
    out = []
    for variant in VARIANTS:
        how = ("arenas capped at two (as shipped)" if variant == "capped"
               else f"MALLOC_ARENA_MAX={report['default_malloc_arena_max']} (glibc's default: the cap off)")
        peak = report[f"{variant}_peak_rss_mb_median"]
        out.append(c.Row(f"{report['models']:,} models: first start, policy auto, daemon peak RSS, median of "
                         f"{len(report['runs'][variant])} ({how})", "tritonctl", f"{peak:.0f} MB", "-", None,
                         "runs: " + ", ".join(f"{r['peak_rss_mb']:.0f} MB ({r['arenas']} arenas)"
                                              for r in report["runs"][variant])
                         + f"; every model serving in {report[f'{variant}_all_serving_s_median']:.1f} s",
                         value=peak))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--models", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds a first start may take")

    def render(report: dict[str, Any], console: Any) -> None:
        c.render_rows("The daemon's peak RSS, malloc arenas capped or not", rows(report), console,
                      c.machine_line(report["machine"]))

    return c.bench_main(NAME, parser, argv, run, render=render, check=False, exit_code=lambda *_: 0, timed=True)


if __name__ == "__main__":
    sys.exit(main())
