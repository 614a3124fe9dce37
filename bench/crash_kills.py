"""Random SIGKILLs of the daemon during deploys: answers served, failed and mixed, with a result file.

Why a benchmark as well as a test: tests/test_crash.py's `-m slow` variant asserts 0 mixed and 0
failed answers over 30 kills on every CI run, but the figures the docs quote (how many answers, how
many interrupted deploys were rolled forward or back, at which step each kill landed) need a result
file with the commit and the machine they came from. This script runs the very same rounds
(`tests.test_crash.random_kills`: an external tritonserver, a probe answering its code, weights and
config generations, loads of 7 s that outlast the daemon's restart, kills at random moments and at
chosen steps) and writes bench/results/crash_kills.json.

    python bench/crash_kills.py              # 30 kills (the slow test's seed)
    python bench/crash_kills.py --quick      # 4 kills
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as c  # noqa: E402

from tests.test_crash import random_kills  # noqa: E402

NAME = "crash_kills"


def rows(result: dict[str, Any]) -> list[c.Row]:
    system = "tritonctl (external tritonserver)"
    steps = ", ".join(f"{n} at {step}" for step, n in sorted(result["steps"].items()))
    return [
        c.Row("failed requests", system, f"{result['failed']} of {result['ok'] + result['failed']}", "0",
              result["failed"] == 0, value=result["failed"]),
        c.Row("mixed answers (code, weights, config differ)", system, f"{result['mixed']} of {result['ok']}", "0",
              result["mixed"] == 0, value=result["mixed"]),
        c.Row("kills", system, str(result["kills"]), note=steps, value=result["kills"]),
        c.Row("interrupted deploys rolled forward / back", system,
              f"{result['rolled_forward']} / {result['rolled_back']}", value=result["rolled_forward"]),
        c.Row("daemon restart to ready", system, f"median {c.median(result['restart_s']):.1f} s, "
              f"max {max(result['restart_s']):.1f} s", value=c.median(result["restart_s"])),
    ]


def run(args: argparse.Namespace, console: Any) -> dict[str, Any]:
    machine = c.machine_info()
    machine["load_average_start"] = c.load_average()
    with c.workspace(NAME, keep=args.keep) as base:
        result = random_kills(base, kills=args.kills, seed=args.seed)
    report = c.base_report(NAME, args.argv, args.quick, machine)
    report.update({"settings": {"kills": args.kills, "seed": args.seed, "probe_clients": 2},
                   "result": {k: v for k, v in result.items() if k != "errors"}, "errors": result["errors"]})
    table = rows(result)
    report["rows"] = [r.to_json() for r in table]
    return report


def render(report: dict[str, Any], console: Any) -> None:
    c.render_rows(f"{report['settings']['kills']} random SIGKILLs of the daemon during deploys, two closed-loop "
                  "probe clients", [c.Row(**r) for r in report["rows"]], console, c.machine_line(report["machine"]))


def survived(args: argparse.Namespace, report: dict[str, Any]) -> int:
    """Exit 1 on any failed or mixed answer, with or without --check (as before the shared tail)."""
    return 0 if report["result"]["failed"] == 0 and report["result"]["mixed"] == 0 else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kills", type=int, default=30)
    parser.add_argument("--seed", type=int, default=1616, help="tests/test_crash.py's slow variant uses 1616")
    parser.add_argument("--quick", action="store_true", help="4 kills")
    parser.add_argument("--keep", action="store_true")

    def prepare(args: argparse.Namespace) -> None:
        if args.quick:
            args.kills = min(args.kills, 4)

    return c.bench_main(NAME, parser, argv, run, prepare=prepare, render=render, check=False, exit_code=survived)


if __name__ == "__main__":
    sys.exit(main())
