"""Event latency: from an audit record's time to a follower of /v1/events receiving it.

Target (issue 27, item 4): an event reaches a follower within 100 ms of its audit record. A real
`tritonctl daemon --launch-triton` serves one model; a follower (the API client's `events()`, what
`audit --follow` and `status --watch` use) is connected to the Unix socket; the benchmark then pins and
unpins the model N times through the API (each writes one audit record) and, for each event received,
takes the wall clock at receipt minus the record's `time` (the registry's clock, written just before the
commit that wakes the stream). Same machine, same clock. Reports median, p95 and max.

    python bench/event_latency.py            # 200 events
    python bench/event_latency.py --quick    # 40 events
"""

from __future__ import annotations

import argparse
import shutil
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as c  # noqa: E402

NAME = "event_latency"
TARGET_MS = 100.0
MODEL = "linear"


def run(args: argparse.Namespace, console: Any) -> dict[str, Any]:
    from controlplane.api.client import ControlClient

    machine = c.machine_info()
    report = c.base_report(NAME, args.argv, args.quick, machine)
    latencies_ms: list[float] = []
    with c.workspace("events", keep=False) as work:
        repo = work / "repo"
        repo.mkdir()
        shutil.copytree(c.ROOT / "examples" / "model_repository" / MODEL, repo / MODEL)
        daemon = c.daemon_process(repo, work / "state", 0.2).start()
        try:
            if not c.wait_until(lambda: daemon.model_status(MODEL).get("state") == "serving", 90, 0.2):
                raise SystemExit(f"{MODEL} did not serve: {daemon.log_tail()}")
            client = ControlClient(socket=daemon.state_dir / "tritonctl.sock")
            received: list[tuple[float, dict[str, Any]]] = []
            ready = threading.Event()

            def follow() -> None:
                follower = ControlClient(socket=daemon.state_dir / "tritonctl.sock")
                ready.set()
                for event in follower.events(reconnect=False):
                    if event.kind == "audit" and event.data.get("action") in ("pin", "unpin"):
                        received.append((time.time(), event.data))

            threading.Thread(target=follow, daemon=True).start()
            ready.wait(10)
            time.sleep(1.0)  # connected
            for i in range(args.events):
                client.set_pin(MODEL, i % 2 == 0)
                time.sleep(args.gap_s)
            c.wait_until(lambda: len(received) >= args.events, 30, 0.05)
            for at, data in received:
                written = datetime.fromisoformat(str(data["time"]).replace("Z", "+00:00")).timestamp()
                latencies_ms.append((at - written) * 1000.0)
        finally:
            daemon.stop()
    med, p95, worst = c.median(latencies_ms), c.pct(latencies_ms, 95), max(latencies_ms)
    rows = [
        c.Row("audit record -> follower, median", "tritonctl", f"{med:.1f} ms", f"<= {TARGET_MS:.0f} ms",
              med <= TARGET_MS, f"{len(latencies_ms)} events", round(med, 2)),
        c.Row("audit record -> follower, p95", "tritonctl", f"{p95:.1f} ms", note="", value=round(p95, 2)),
        c.Row("audit record -> follower, max", "tritonctl", f"{worst:.1f} ms", note="", value=round(worst, 2)),
    ]
    report.update({"settings": {"events": args.events, "gap_s": args.gap_s, "target_ms": TARGET_MS},
                   "latency_ms": {"median": round(med, 2), "p95": round(p95, 2), "max": round(worst, 2),
                                  "samples": [round(x, 2) for x in latencies_ms]},
                   "received": len(latencies_ms), "rows": [r.to_json() for r in rows]})
    c.render_rows("Event latency: audit record to /v1/events follower", rows, console,
                  footer=c.machine_line(machine))
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="40 events")
    parser.add_argument("--events", type=int)
    parser.add_argument("--gap-s", type=float, default=0.05, help="pause between two audited calls")

    def prepare(args: argparse.Namespace) -> None:
        args.events = args.events or (40 if args.quick else 200)

    return c.bench_main(NAME, parser, argv, run, prepare=prepare, check=False, exit_code=lambda args, report: 0)


if __name__ == "__main__":
    sys.exit(main())
