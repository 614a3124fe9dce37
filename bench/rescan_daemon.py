"""Rescan CPU on a running daemon: the share of one core the watcher's safety net takes at 10,000 models.

bench/rescan_cost.py times rounds of the rescan's code in a loop and computes the share from the
interval the daemon would keep; this script measures it instead, from the outside, on the real
`tritonctl daemon --launch-triton` with N models in its repository (`--policy manual`: the models are
captured and recorded, nothing loads, so the daemon idles once its start-up scan is done). Two
daemons run at once on the same repository, each with its own state directory and tritonserver, so
the machine's load falls on both alike:

- *rescan on*: the defaults (`rescan_interval_s` 30 s, paced to `RESCAN_CPU_BUDGET` of a core);
- *rescan off*: `TRITONCTL_RESCAN_INTERVAL_S=1000000000` (no round in the sampling window).

Once both listed N models in `status` and went quiet, every second for `--sample-s` seconds it reads
from /proc the process CPU time (utime + stime) of each daemon and of the rescan-on daemon's poll
thread (named `tritonctl-poll` in the kernel, controlplane/source/poller.py). Reported: the poll thread's
CPU over the window as a share of one core (the rescan's own cost, target <= 0.4 %), the rounds seen
(bursts of that thread's CPU) with their CPU and spacing, and both daemons' whole-process shares and
their difference (what the rescan costs the process, GC and locks included, within the noise of a
shared machine).

    python bench/rescan_daemon.py                       # 10,000 models, 5 minutes of sampling
    python bench/rescan_daemon.py --quick               # 1,000 models, 1 minute
    python bench/rescan_daemon.py --models 10000 --sample-s 180
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as c  # noqa: E402
from rescan_cost import make_repository  # noqa: E402

from controlplane.source.inotify import RESCAN_CPU_BUDGET  # noqa: E402

NAME = "rescan_daemon"
POLL_THREAD = "tritonctl-poll"
TARGET_PCT = RESCAN_CPU_BUDGET * 100
RESCAN_OFF_S = "1000000000"


def thread_cpu_seconds(pid: int, comm: str) -> float | None:
    """utime + stime of `pid`'s thread named `comm` (None: no such thread)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            if (task / "comm").read_text().strip() != comm:
                continue
            text = (task / "stat").read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / c.CLK_TCK
    return None


def model_count(daemon: Any) -> int:
    result = daemon.run("status", "--json")
    if result.exit_code != 0:
        return -1
    return len(json.loads(result.stdout)["models"])


def wait_scanned(daemons: list[Any], count: int, timeout_s: float, console: Any) -> float:
    """Until every daemon lists `count` models, then until both went quiet (< 5 % of a core over 10 s)."""
    started = time.monotonic()
    for daemon in daemons:
        daemon.wait_ready(timeout_s)
        if not c.wait_until(lambda: model_count(daemon) >= count, timeout_s, 15.0):  # noqa: B023 - called here
            raise TimeoutError(f"{daemon.state_dir.name}: {count:,} models not listed within {timeout_s:.0f} s")
        console.print(f"{daemon.state_dir.name}: {count:,} models listed after {time.monotonic() - started:.0f} s")
    while time.monotonic() - started < timeout_s:
        before = [c.cpu_seconds(d.proc.pid) for d in daemons]
        time.sleep(10)
        shares = [(c.cpu_seconds(d.proc.pid) - b) / 10 for d, b in zip(daemons, before, strict=True)]
        if max(shares) < 0.05:
            return time.monotonic() - started
    raise TimeoutError(f"the daemons did not go quiet within {timeout_s:.0f} s")


def bursts(series: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """(start time, CPU seconds) of each run of consecutive samples in which the thread used CPU."""
    found: list[tuple[float, float]] = []
    current: tuple[float, float] | None = None
    for (_, cpu0), (t1, cpu1) in zip(series, series[1:], strict=False):
        used = cpu1 - cpu0
        if used > 0:
            current = (current[0], current[1] + used) if current else (t1, used)
        elif current:
            found.append(current)
            current = None
    if current:
        found.append(current)
    return found


def sample(on: Any, off: Any, seconds: float) -> dict[str, Any]:
    pid_on, pid_off = on.proc.pid, off.proc.pid
    t0 = time.monotonic()
    thread, process_on, process_off = [], [], []
    while True:
        now = time.monotonic() - t0
        thread.append((now, thread_cpu_seconds(pid_on, POLL_THREAD) or 0.0))
        process_on.append((now, c.cpu_seconds(pid_on)))
        process_off.append((now, c.cpu_seconds(pid_off)))
        if now >= seconds:
            break
        time.sleep(1.0)
    wall = thread[-1][0] - thread[0][0]

    def share(series: list[tuple[float, float]]) -> float:
        return (series[-1][1] - series[0][1]) / wall * 100

    rounds = bursts(thread)
    spacing = [b[0] - a[0] for a, b in zip(rounds, rounds[1:], strict=False)]
    return {"wall_s": round(wall, 1), "rescan_thread_pct": share(thread), "daemon_rescan_on_pct": share(process_on),
            "daemon_rescan_off_pct": share(process_off), "rounds": len(rounds),
            "round_cpu_s": [round(cpu, 3) for _, cpu in rounds],
            "round_cpu_s_median": statistics.median([cpu for _, cpu in rounds]) if rounds else None,
            "round_spacing_s": [round(s, 1) for s in spacing],
            "round_spacing_s_median": statistics.median(spacing) if spacing else None,
            "thread_found": thread_cpu_seconds(pid_on, POLL_THREAD) is not None}


def paced_log_line(daemon: Any) -> str:
    """The daemon's own note when it stretches the rescan interval (controlplane/source/inotify.py)."""
    for line in daemon.log_tail(2_000_000).splitlines():
        if "rescanning every" in line:
            return line.split("] ", 1)[-1].strip()
    return ""


def rows_for(m: dict[str, Any]) -> list[c.Row]:
    n = f"{m['models']:,} models"
    window = f"over {m['wall_s']:.0f} s"
    spacing = m["round_spacing_s_median"]
    return [
        c.Row(f"{n}: rescan thread CPU {window} (% of one core)", "tritonctl daemon", f"{m['rescan_thread_pct']:.2f} %",
              target=f"<= {TARGET_PCT:g} %", met=m["thread_found"] and m["rescan_thread_pct"] <= TARGET_PCT,
              value=m["rescan_thread_pct"],
              note=f"{m['rounds']} rounds, CPU per round median "
                   f"{'-' if m['round_cpu_s_median'] is None else c.fmt_ms(m['round_cpu_s_median'])}, "
                   f"every {'-' if spacing is None else f'{spacing:.0f} s'} (median)"),
        c.Row(f"{n}: daemon process CPU {window}, rescan on (% of one core)", "tritonctl daemon",
              f"{m['daemon_rescan_on_pct']:.2f} %", value=m["daemon_rescan_on_pct"], note="policy manual, idle"),
        c.Row(f"{n}: daemon process CPU {window}, rescan off (% of one core)", "tritonctl daemon",
              f"{m['daemon_rescan_off_pct']:.2f} %", value=m["daemon_rescan_off_pct"],
              note="same repository, same window"),
        c.Row(f"{n}: difference, rescan on - off (% of one core)", "tritonctl daemon",
              f"{m['daemon_rescan_on_pct'] - m['daemon_rescan_off_pct']:.2f} %",
              value=m["daemon_rescan_on_pct"] - m["daemon_rescan_off_pct"], note="the whole process, side by side"),
    ]


def run(args: argparse.Namespace, console: Any) -> dict[str, Any]:
    count, seconds = args.models, args.sample_s
    machine = c.machine_info()
    report = c.base_report(NAME, args.argv, args.quick, machine)
    with c.workspace(NAME) as base:
        repo = base / "repo"
        make_repository(repo, count)
        on = c.daemon_process(repo, base / "state-on", 1.0, policy="manual")
        off = c.daemon_process(repo, base / "state-off", 1.0, policy="manual")
        off.env["TRITONCTL_RESCAN_INTERVAL_S"] = RESCAN_OFF_S
        try:
            on.start(wait=False)
            off.start(wait=False)
            settled_s = wait_scanned([on, off], count, args.start_timeout_s, console)
            console.print(f"both daemons quiet after {settled_s:.0f} s; sampling {seconds:.0f} s")
            m = {"models": count, "start_to_quiet_s": round(settled_s, 1), **sample(on, off, seconds),
                 "paced_log": paced_log_line(on), "budget_pct": TARGET_PCT}
        finally:
            for daemon in (on, off):
                daemon.stop()
    rows = rows_for(m)
    report["results"] = [m]
    report["rows"] = [r.to_json() for r in rows]
    return report


def render(report: dict[str, Any], console: Any) -> None:
    c.render_rows("Rescan CPU on a running daemon (from /proc, side by side with the rescan off)",
                  [c.Row(**r) for r in report["rows"]], console, footer=c.machine_line(report["machine"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="1,000 models, 60 s of sampling")
    parser.add_argument("--models", type=int, default=None)
    parser.add_argument("--sample-s", type=float, default=None)
    parser.add_argument("--start-timeout-s", type=float, default=3600.0)

    def prepare(args: argparse.Namespace) -> None:
        args.models = args.models or (1_000 if args.quick else 10_000)
        args.sample_s = args.sample_s or (60.0 if args.quick else 300.0)

    # exit 1 on any missed target, with or without --check (as before the shared tail)
    return c.bench_main(NAME, parser, argv, run, prepare=prepare, render=render, check=False,
                        exit_code=lambda args, report: 1 if any(r["met"] is False for r in report["rows"]) else 0)


if __name__ == "__main__":
    sys.exit(main())
