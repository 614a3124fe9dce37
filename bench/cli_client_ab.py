"""The CLI's client path before and after the HTTP control API, side by side in the same rounds.

bench/cli_latency.py times every command against a live daemon, but a checkout from before the HTTP API
cannot talk to today's daemon (it speaks gRPC). What the client path costs can still be compared as
new processes in interleaved rounds: `python -c pass`; importing the API client; and `status --json` and
`load M` with no daemon listening (the same error path in both: parse, import the client, connect,
fail, print one line), each from this checkout and from another one on PYTHONPATH (e.g. the commit
before the HTTP API). Reports wall and CPU medians; CPU (user + system of the process) is what a busy
machine does not inflate by making the process wait for a core.

    git worktree add /tmp/old 6b886a1
    python bench/cli_client_ab.py --compare /tmp/old --compare-label 6b886a1
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as c  # noqa: E402

NAME = "cli_client_ab"


def timed(argv: list[str], root: Path) -> tuple[float, float]:
    before = c.waited_children_cpu_ms()
    t0 = time.perf_counter()
    subprocess.run(argv, cwd=root, env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True, check=False)
    wall = (time.perf_counter() - t0) * 1000.0
    return wall, c.waited_children_cpu_ms() - before


def run(args: argparse.Namespace, console: Any) -> dict[str, Any]:
    machine = c.machine_info(with_triton=False)
    report = c.base_report(NAME, args.argv, False, machine)
    py = sys.executable
    nowhere = tempfile.mkdtemp(prefix="tctl-ab-")  # a state dir without a daemon
    probes = [
        ("python -c pass", [py, "-c", "pass"]),
        ("import the API client", [py, "-c", "import controlplane.api.client"]),
        ("status --json (no daemon)", [py, "-m", "cli.main", "status", "--json", "--state-dir", nowhere]),
        ("load M (no daemon)", [py, "-m", "cli.main", "load", "m", "--state-dir", nowhere]),
    ]
    systems = {"after": c.ROOT, f"before ({args.compare_label})": args.compare}
    wall: dict[str, list[float]] = {}
    cpu: dict[str, list[float]] = {}
    for _ in range(args.runs):
        for name, argv in probes:
            for system, root in systems.items():
                if name == "python -c pass" and system != "after":
                    continue
                w, t = timed(argv, root)
                wall.setdefault(f"{name} | {system}", []).append(w)
                cpu.setdefault(f"{name} | {system}", []).append(t)
    rows: list[c.Row] = []
    results: dict[str, Any] = {}
    for key in wall:
        name, system = key.split(" | ")
        w, t = statistics.median(wall[key]), statistics.median(cpu[key])
        # results[probe][system]: "after" or "before" (its label is settings.compare_label)
        results.setdefault(name, {})["after" if system == "after" else "before"] = {
            "wall_median_ms": round(w, 1), "cpu_median_ms": round(t, 1),
            "wall_ms": [round(x, 1) for x in wall[key]], "cpu_ms": [round(x, 1) for x in cpu[key]]}
        rows.append(c.Row(name, system, f"{w:.0f} ms wall", note=f"CPU {t:.0f} ms", value=round(t, 1)))
    report.update({"settings": {"runs": args.runs, "compare": str(args.compare), "compare_label": args.compare_label},
                   "results": results, "rows": [r.to_json() for r in rows]})
    c.render_rows(f"CLI client path, before and after, median of {args.runs} interleaved runs", rows, console,
                  footer=c.machine_line(machine))
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compare", type=Path, required=True, help="the other checkout (PYTHONPATH)")
    parser.add_argument("--compare-label", default="before")
    parser.add_argument("--runs", type=int, default=15)
    return c.bench_main(NAME, parser, argv, run, check=False, exit_code=lambda args, report: 0)


if __name__ == "__main__":
    sys.exit(main())
