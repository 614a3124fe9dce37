"""SIGKILLs around the gateway: the daemon killed at random moments of a switch, and the gateway itself killed,
with clients sending through the gateway throughout; a result file for the figures docs/gateway.md quotes.

Why a benchmark as well as the tests: tests/test_gateway_kills.py asserts 0 failed and 0 mixed answers over
the daemon's kills and tests/test_gateway_daemon_e2e.py bounds what a killed gateway costs, on every CI run; the
figures a reader wants (how many answers, how many interrupted switches went forward or back, how long clients
of each protocol lost the gateway when it died) need a file with the commit and machine they came from. The
rounds are the tests' own (`tests.test_gateway_kills.kill_rounds`, `tests.gateway_traffic.kill_gateway`).

  * daemon kills: `--kills` rounds (default the test's ten: three at the gateway's switch, the others at
    publish, the load, the smoke test, the drain and random moments), a gRPC and an HTTP client every 5 ms;
  * gateway kills: `--gateway-kills` SIGKILLs of a daemon's gateway, a gRPC and an HTTP client every 20 ms;
    the daemon's supervision (every second) starts it again on its ports with its routes file.

    python bench/gateway_kills.py             # 10 daemon kills, 5 gateway kills (about 4 minutes)
    python bench/gateway_kills.py --quick     # 3 daemon kills, 2 gateway kills
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as c  # noqa: E402

from tests.gateway_traffic import kill_gateway, write_probe  # noqa: E402
from tests.harness import DaemonProcess, wait_for  # noqa: E402
from tests.test_gateway_kills import DEFAULT_PLAN, converged, kill_rounds  # noqa: E402

NAME = "gateway_kills"
PERIOD_S = 0.02


def gateway_kills(base: Path, kills: int) -> list[dict[str, Any]]:
    repo = base / "repo"
    repo.mkdir()
    write_probe(repo, "probe", 1)
    daemon = DaemonProcess(repo, base / "state", auto_complete=True)
    out = []
    try:
        daemon.start()
        wait_for(lambda: converged(daemon, 1), 90, 0.2, "probe serving")
        for _ in range(kills):
            out.append(kill_gateway(daemon.state_dir, "probe", PERIOD_S))
            time.sleep(2.0)  # each client's channel settled before the next kill
    finally:
        daemon.stop()
    return out


def run(args: argparse.Namespace, console: Any) -> dict[str, Any]:
    machine = c.machine_info()
    plan = DEFAULT_PLAN[: args.kills] if args.kills <= len(DEFAULT_PLAN) else \
        [DEFAULT_PLAN[i % len(DEFAULT_PLAN)] for i in range(args.kills)]
    with c.workspace(NAME, keep=args.keep) as base:
        (base / "kills").mkdir()
        daemon = kill_rounds(base / "kills", plan, seed=args.seed)
        console.print(f"[dim]daemon kills: {daemon['requests']} requests, {daemon['failed']} failed[/dim]")
        (base / "gateway").mkdir()
        gateway = gateway_kills(base / "gateway", args.gateway_kills)
    report = c.base_report(NAME, args.argv, args.quick, machine)
    restarts = [g["restart_s"] for g in gateway if g["restart_s"] is not None]
    report.update({
        "settings": {"kills": len(plan), "plan": plan, "seed": args.seed, "gateway_kills": args.gateway_kills,
                     "gateway_period_s": PERIOD_S},
        "daemon_kills": daemon,
        "gateway_kills": gateway,
        "gateway_summary": {
            "restart_median_s": round(c.median(restarts), 2) if restarts else None,
            "restart_max_s": max(restarts) if restarts else None,
            **{f"{p}_outage_median_s": round(c.median([g["outage_s"][p] for g in gateway]), 2)
               for p in ("grpc", "http")},
            **{f"{p}_outage_max_s": max(g["outage_s"][p] for g in gateway) for p in ("grpc", "http")},
            **{f"{p}_failed_median": c.median([g["failed"][p] for g in gateway]) for p in ("grpc", "http")},
            "same_ports": all(g["same_ports"] for g in gateway),
            "failed_not_refused": sum(len(g["failed_not_refused"]) for g in gateway),
        },
    })
    report["rows"] = [r.to_json() for r in rows(report)]
    return report


def rows(report: dict[str, Any]) -> list[c.Row]:
    d, g = report["daemon_kills"], report["gateway_summary"]
    system = "tritonctl (gateway, launched tritonserver)"
    kills = ", ".join(f"{n} at {phase}" for phase, n in sorted(d["killed_at"].items()))
    return [
        c.Row("daemon killed mid-switch: failed requests", system, f"{d['failed']} of {d['requests']}", "0",
              d["failed"] == 0, kills, value=d["failed"]),
        c.Row("daemon killed mid-switch: mixed answers, answers behind the route", system,
              f"{d['mixed']}, {len(d['behind_the_route'])}", "0, 0",
              d["mixed"] == 0 and not d["behind_the_route"], value=d["mixed"]),
        c.Row("interrupted switches rolled forward / back", system,
              f"{d['rolled forward']} / {d['rolled back']}", note="the restarted daemon adopted the same gateway "
              "every time", value=d["rolled forward"]),
        c.Row("gateway killed: started again by the daemon (median / max)", system,
              f"{g['restart_median_s']:.2f} s / {g['restart_max_s']:.2f} s",
              note=f"same ports every time: {g['same_ports']}", value=g["restart_median_s"]),
        c.Row("gateway killed: outage a client saw (median / max)", "gRPC client",
              f"{g['grpc_outage_median_s']:.2f} s / {g['grpc_outage_max_s']:.2f} s",
              note=f"median {g['grpc_failed_median']:g} failed requests at one every "
                   f"{report['settings']['gateway_period_s'] * 1000:.0f} ms; its channel reconnects by its own "
                   "backoff", value=g["grpc_outage_median_s"]),
        c.Row("gateway killed: outage a client saw (median / max)", "HTTP client",
              f"{g['http_outage_median_s']:.2f} s / {g['http_outage_max_s']:.2f} s",
              note=f"median {g['http_failed_median']:g} failed requests (connection refused)",
              value=g["http_outage_median_s"]),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="3 daemon kills, 2 gateway kills")
    parser.add_argument("--kills", type=int, help="daemon kills (default 10; 3 with --quick)")
    parser.add_argument("--gateway-kills", type=int, help="gateway kills (default 5; 2 with --quick)")
    parser.add_argument("--seed", type=int, default=5454)
    parser.add_argument("--keep", action="store_true")

    def prepare(args: argparse.Namespace) -> None:
        args.kills = args.kills or (3 if args.quick else 10)
        args.gateway_kills = args.gateway_kills or (2 if args.quick else 5)

    def render(report: dict[str, Any], console: Any) -> None:
        s = report["settings"]
        c.render_report(f"SIGKILLs around the gateway: {s['kills']} daemon kills mid-switch, {s['gateway_kills']} "
                        "gateway kills, clients through the gateway throughout", report, console)

    return c.bench_main(NAME, parser, argv, run, prepare=prepare, render=render, timed=True)


if __name__ == "__main__":
    sys.exit(main())
