"""Restart with nothing changed → READY at 10,000 models (issue 26's target: ≤ 2 s), two trees side by
side: this checkout and another (`--other`, a worktree at an earlier commit with its own virtualenv).

One repository (bench/scale.py's: one python model and ensembles over it) is recorded once by a first
start (`--policy manual`, `--keep-triton`); then the two trees' daemons restart on that same state
directory in turns, A B A B ..., each adopting the kept tritonserver, each stopped 3 s after its READY
line. Per restart: the wall time from spawning `tritonctl daemon` to its READY line, and the daemon's
own CPU time (utime + stime) at that moment. Medians per tree; the machine's load is recorded.

    python bench/restart_ab.py --other /work/wt/engine              # 10,000 models, 5 rounds each
    python bench/restart_ab.py --other /work/wt/engine --models 1000 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as c  # noqa: E402
import scale  # noqa: E402

NAME = "restart_ab"
TARGET_S = 2.0
ROOT = Path(__file__).resolve().parent.parent


def _commit(tree: Path) -> str:
    out = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, check=False).stdout.strip()
    return out.stdout.strip() + ("-dirty" if dirty else "")


def _restart(tritonctl: Path, repo: Path, state: Path, log: Path) -> tuple[float, float]:
    """One restart: (seconds to the READY line, the daemon's CPU seconds then)."""
    from tests.harness import FREE_PORTS

    args = [str(tritonctl), "daemon", "--repository", str(repo), "--state-dir", str(state), "--settle", "1.0",
            "--launch-triton", *FREE_PORTS, "--policy", "manual", "--keep-triton"]
    env = dict(os.environ, TRITONCTL_RECONCILE_INTERVAL_S="10")
    env.pop("NOTIFY_SOCKET", None)
    with open(log, "w") as out:
        started = time.monotonic()
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        while "ready: control socket" not in log.read_text(errors="replace"):
            if proc.poll() is not None:
                raise SystemExit(f"daemon exited {proc.returncode}: {log.read_text()[-2000:]}")
            time.sleep(0.01)
        wall = time.monotonic() - started
        cpu = c.cpu_seconds(proc.pid)
        time.sleep(3.0)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    return round(wall, 3), round(cpu, 3)


def run(args: argparse.Namespace, console: Any) -> dict[str, Any]:
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # as an installed tritonctl: bytecode read (bench/scale.py)
    trees = {"this": ROOT, "other": Path(args.other).resolve()}
    report = c.base_report(NAME, args.argv, False, c.machine_info())
    report["trees"] = {k: {"path": str(v), "git_commit": _commit(v)} for k, v in trees.items()}
    with c.workspace(NAME) as base:
        repo, state = base / "repo", base / "state"
        scale.make_repository(repo, args.models)
        time.sleep(1.5)  # older than the racy-signature window: the first start vouches for every signature
        daemon = c.daemon_process(repo, state, 1.0, policy="manual", extra=["--keep-triton"])
        first = time.monotonic()
        daemon.start(wait=False)
        if c.wait_until(lambda: "ready: control socket" in daemon.log_tail(10**7), 1800, 0.2) is None:
            raise SystemExit("first start not READY")
        report["first_start_s"] = round(time.monotonic() - first, 1)
        daemon.stop()  # --keep-triton: the server stays for every restart to adopt
        runs: dict[str, list[dict[str, float]]] = {"this": [], "other": []}
        try:
            for _ in range(args.rounds):
                for key in ("other", "this"):
                    wall, cpu = _restart(trees[key] / ".venv" / "bin" / "tritonctl", repo, state,
                                         base / f"restart-{key}.log")
                    runs[key].append({"ready_s": wall, "ready_cpu_s": cpu})
                    console.print(f"[dim]{key}: READY {wall:.2f} s, CPU {cpu:.2f} s[/dim]")
        finally:
            scale._stop_kept_triton(daemon)
    return c.two_trees_report(report, args.models, runs, ("ready_s", "ready_cpu_s"), rows)


def rows(report: dict[str, Any]) -> list[c.Row]:
    out = []
    for key, commit in c.per_tree(report):
        wall = report[f"{key}_ready_s_median"]
        out.append(c.Row(f"{report['models']:,} models: restart, nothing changed -> READY, median of "
                         f"{len(report['runs'][key])} ({key}: {commit})", "tritonctl", f"{wall:.2f} s",
                         f"<= {TARGET_S:g} s", wall <= TARGET_S,
                         f"daemon CPU {report[f'{key}_ready_cpu_s_median']:.2f} s", value=wall))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = c.two_trees_parser(__doc__, models=10_000, rounds=5)
    return c.two_trees_main(NAME, parser, argv, run, "Restart with nothing changed, two trees in turns", rows)


if __name__ == "__main__":
    sys.exit(main())
