"""Rollout time against fleet size: how long from an edit in the source repository until every host
serves it (canary first, then waves), and how long a broken version takes to be stopped and rolled back.

For each fleet size (default 1, 2, 4): a throwaway PostgreSQL server, N real `tritonctl daemon --fleet`
processes on loopback, each with its own launched tritonserver and state directory, one shared store.
The model is the tests' generation-reporting python model; a host "serves" generation G when an
inference request to its tritonserver answers G.

    .venv/bin/python bench/fleet_rollout.py                 # sizes 1 2 4, 5 edits each
    .venv/bin/python bench/fleet_rollout.py --sizes 1 2 --edits 3 --wave-size 1

Prints a table and writes bench/results/fleet_rollout.json. Every host runs on this one machine, so
the numbers include N tritonservers sharing its cores: on a real fleet each host has its own.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(ROOT / "bench"))

import common as c  # noqa: E402
import tritonclient.grpc as grpcclient  # noqa: E402

from tests.harness import DaemonProcess, infer_gen, wait_for, write_gen_model  # noqa: E402
from tests.pg import PostgresServer, skip_reason  # noqa: E402

MODEL = "bench_fleet"


def serving(clients: list[grpcclient.InferenceServerClient], gen: int) -> bool:
    for client in clients:
        try:
            if infer_gen(client, MODEL) != gen:
                return False
        except Exception:  # noqa: BLE001 - not loaded yet
            return False
    return True


def run_size(pg: PostgresServer, size: int, edits: int, wave_size: int, base: Path) -> dict[str, Any]:
    url = pg.new_database(f"bench{size}")
    repo = base / f"repo-{size}"
    repo.mkdir()
    shared = base / f"shared-{size}"
    daemons = [DaemonProcess(repo, base / f"state-{size}-h{i}", settle_s=0.2,
                             extra_args=["--fleet", "--db-url", url, "--host", f"h{i}", "--shared-store", str(shared),
                                         "--wave-size", str(wave_size)])
               for i in range(1, size + 1)]
    clients: list[grpcclient.InferenceServerClient] = []
    try:
        started = time.monotonic()
        for d in daemons:
            d.start(wait=False)
        for d in daemons:
            d.wait_ready(120)
        startup_s = time.monotonic() - started
        clients = [grpcclient.InferenceServerClient(d.triton_url()) for d in daemons]
        write_gen_model(repo, MODEL, 1)
        wait_for(lambda: serving(clients, 1), 120, 0.05, "first version everywhere")
        times = []
        for gen in range(2, edits + 2):
            time.sleep(0.5)
            t0 = time.monotonic()
            write_gen_model(repo, MODEL, gen)
            wait_for(lambda g=gen: serving(clients, g), 120, 0.02, f"generation {gen} everywhere")
            times.append(time.monotonic() - t0)
        # A broken version: from the edit until the fleet's rollout is recorded as rolled back.
        t0 = time.monotonic()
        write_gen_model(repo, MODEL, 999, init="raise RuntimeError('broken')")

        def rolled_back() -> bool:
            out = daemons[0].cli("rollouts", "--db-url", url, "--json")
            return any(r["state"] == "rolled_back" for r in json.loads(out.stdout))

        wait_for(rolled_back, 120, 0.1, "rolled back")
        rollback_s = time.monotonic() - t0
        assert serving(clients, edits + 1), "the fleet must still serve the last good version"
        return {"hosts": size, "edits": edits, "startup_s": round(startup_s, 2),
                "rollout_median_s": round(statistics.median(times), 3), "rollout_max_s": round(max(times), 3),
                "rollout_all_s": [round(t, 3) for t in times], "broken_stopped_s": round(rollback_s, 3)}
    finally:
        for client in clients:
            client.close()
        for d in daemons:
            d.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--edits", type=int, default=5)
    parser.add_argument("--wave-size", type=int, default=2)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "fleet_rollout.json")
    args = parser.parse_args()
    reason = skip_reason()
    if reason:
        print(f"cannot run: {reason}")
        return 2
    machine = c.machine_info()  # commit, uname, load average at the start, tritonserver and Python versions
    pg = PostgresServer().start()
    results = []
    try:
        with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp:
            for size in args.sizes:
                print(f"fleet of {size} ...", flush=True)
                results.append(run_size(pg, size, args.edits, args.wave_size, Path(tmp)))
    finally:
        pg.stop()
    print(f"\n{'hosts':>5} {'waves':>5} {'rollout median s':>17} {'max s':>7} {'broken stopped s':>17}")
    for r in results:
        waves = 1 + -(-(r["hosts"] - 1) // args.wave_size)
        print(f"{r['hosts']:>5} {waves:>5} {r['rollout_median_s']:>17.2f} {r['rollout_max_s']:>7.2f} "
              f"{r['broken_stopped_s']:>17.2f}")
    report = {"benchmark": "fleet_rollout", "command": "python bench/fleet_rollout.py " + " ".join(sys.argv[1:]),
              "when": c.now_iso(), "machine": machine,
              "wave_size": args.wave_size, "canary_count": 1, "results": results}
    c.write_report(args.out, report, c.make_console())  # adds the commit and the load average at the end
    return 0


if __name__ == "__main__":
    sys.exit(main())
