"""Rollout time against fleet size: how long from an edit in the source repository until every host
serves it (canary first, then waves), how the time splits into waves, and how long a broken version
takes to be stopped and rolled back.

For each fleet size (default 1, 2, 4, 8): a throwaway PostgreSQL server, N real `tritonctl daemon
--fleet` processes on loopback, each with its own launched tritonserver and state directory, one shared
store. The model is the tests' generation-reporting python model; a host "serves" generation G when an
inference request to its tritonserver answers G. Per edit it records, from the client side, the time
from writing the edit until every host answers the new generation, and, from the rollout's rows in the
shared registry (`rollouts` / `rollout_hosts`: created_at, each step's wave, started_at, finished_at):

- waves: the canary wave plus the waves of `--wave-size` the leader planned (recorded, not computed);
- per-wave time: from the previous wave's last `ok` (the canary: from the rollout's creation) to this
  wave's last `ok`, so the waves add up to the rollout; split into the leader's hand-off (until the
  wave's first host claims its step) and the hosts' steps (load, verify, smoke);
- edit → rollout: writing the edit until the leader created the rollout (settle, capture, validation,
  export to the shared store).

    python bench/fleet_rollout.py                          # sizes 1 2 4 8, 5 edits each (~5 min, 2 cores)
    python bench/fleet_rollout.py --quick                  # CI: 2 hosts, 2 edits (~25 s)
    python bench/fleet_rollout.py --sizes 1 2 --edits 3 --wave-size 1

Prints a table and writes bench/results/fleet_rollout.json (fleet_rollout-quick.json with --quick) with
its provenance (bench/common.py: commit, machine, load average at the start and end, tritonserver and
Python versions; plus the load average at the start of each fleet size). Every host runs on this one
machine, so the numbers include N daemons and N tritonservers sharing its cores: on a real fleet each
host has its own, and the per-wave time, not the total, is what carries over.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

sys.path.insert(0, str(ROOT / "bench"))

import common as c  # noqa: E402
import tritonclient.grpc as grpcclient  # noqa: E402
from rich.table import Table  # noqa: E402

from controlplane.store.fleet import OPEN_ROLLOUT, FleetStore, Rollout  # noqa: E402
from controlplane.store.registry import Registry  # noqa: E402
from tests.harness import DaemonProcess, infer_gen, wait_for, write_gen_model  # noqa: E402
from tests.pg import PostgresServer, skip_reason  # noqa: E402

NAME = "fleet_rollout"
MODEL = "bench_fleet"
BROKEN_GEN = 999


def serving(clients: list[grpcclient.InferenceServerClient], gen: int) -> bool:
    for client in clients:
        try:
            if infer_gen(client, MODEL) != gen:
                return False
        except Exception:  # noqa: BLE001 - not loaded yet
            return False
    return True


def epoch(value: datetime) -> float:
    """A registry time (naive UTC) as seconds since the epoch, comparable with time.time()."""
    return value.replace(tzinfo=timezone.utc).timestamp()


def last_rollout_id(store: FleetStore) -> int:
    rows = store.rollouts(OPEN_ROLLOUT + ("done", "rolled_back"), limit=1)
    return int(rows[0].id) if rows else 0


def rollouts_since(store: FleetStore, after_id: int) -> list[Rollout]:
    rows = store.rollouts(OPEN_ROLLOUT + ("done", "rolled_back"), limit=20)
    return sorted((r for r in rows if r.id > after_id and r.model == MODEL), key=lambda r: r.id)


def wait_closed(store: FleetStore, after_id: int, state: str, timeout_s: float) -> list[Rollout]:
    """The rollouts of MODEL created after `after_id`, once the last of them ended in `state`."""
    def closed() -> list[Rollout] | None:
        rows = rollouts_since(store, after_id)
        return rows if rows and rows[-1].state == state else None

    return list(wait_for(closed, timeout_s, 0.05, f"a rollout {state}"))


def wave_times(rollout: Rollout, edit_wall: float) -> dict[str, Any]:
    """Split one finished rollout into its waves from the step timestamps in the shared registry."""
    deploys = [s for s in rollout.steps if s.action == "deploy"]
    waves = sorted({s.wave for s in deploys})
    begin = epoch(rollout.created_at)
    out: dict[str, Any] = {"rollout_id": rollout.id, "hosts": len(deploys), "waves": len(waves),
                           "edit_to_rollout_s": round(begin - edit_wall, 3), "wave_s": [], "handoff_s": [],
                           "step_s": [], "step_states": sorted({s.state for s in deploys})}
    for wave in waves:
        steps = [s for s in deploys if s.wave == wave]
        ends = [epoch(s.finished_at) for s in steps if s.finished_at is not None]
        starts = [epoch(s.started_at) for s in steps if s.started_at is not None]
        if not ends:
            break
        end = max(ends)
        out["wave_s"].append(round(end - begin, 3))
        out["handoff_s"].append(round(min(starts) - begin, 3) if starts else None)
        out["step_s"] += [round(epoch(s.finished_at) - epoch(s.started_at), 3) for s in steps
                          if s.started_at is not None and s.finished_at is not None]
        begin = end
    return out


def med(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 3) if values else None


def run_size(pg: PostgresServer, size: int, edits: int, wave_size: int, canary_count: int, settle_s: float,
             base: Path, broken: bool) -> dict[str, Any]:
    load_start = c.load_average()
    url = pg.new_database(f"bench{size}")
    repo = base / f"repo-{size}"
    repo.mkdir()
    shared = base / f"shared-{size}"
    daemons = [DaemonProcess(repo, base / f"state-{size}-h{i:02d}", settle_s=settle_s, auto_complete=True,
                             env={"TRITONCTL_RECONCILE_INTERVAL_S": "10"},  # the daemon's default, not the tests' 1 s
                             extra_args=["--fleet", "--db-url", url, "--host", f"h{i:02d}", "--shared-store",
                                         str(shared), "--wave-size", str(wave_size),
                                         "--canary-count", str(canary_count)])
               for i in range(1, size + 1)]
    clients: list[grpcclient.InferenceServerClient] = []
    registry = Registry(url)
    store = FleetStore(registry)
    try:
        started = time.monotonic()
        for d in daemons:
            d.start(wait=False)
        for d in daemons:
            d.wait_ready(60 + 30 * size)
        startup_s = time.monotonic() - started
        clients = [grpcclient.InferenceServerClient(d.triton_url()) for d in daemons]
        write_gen_model(repo, MODEL, 1)
        wait_for(lambda: serving(clients, 1), 60 + 30 * size, 0.05, "first version everywhere")
        wait_for(lambda: store.open_rollout(MODEL) is None, 120, 0.05, "the first rollout closed")
        per_edit = []
        for gen in range(2, edits + 2):
            time.sleep(0.5)
            before = last_rollout_id(store)
            edit_wall, t0 = time.time(), time.monotonic()
            write_gen_model(repo, MODEL, gen)
            wait_for(lambda g=gen: serving(clients, g), 120, 0.02, f"generation {gen} everywhere")
            total = time.monotonic() - t0
            rows = wait_closed(store, before, "done", 120)
            per_edit.append({"gen": gen, "total_s": round(total, 3), "rollouts": len(rows),
                             **wave_times(rows[-1], edit_wall)})
        result: dict[str, Any] = {"hosts": size, "edits": edits, "startup_s": round(startup_s, 2),
                                  "load_average_start": load_start}
        totals = [e["total_s"] for e in per_edit]
        waves_seen = sorted({e["waves"] for e in per_edit})
        result.update({
            "waves": waves_seen[-1], "waves_seen": waves_seen,
            "rollout_median_s": med(totals), "rollout_max_s": max(totals), "rollout_all_s": totals,
            "wave_median_s": med([w for e in per_edit for w in e["wave_s"]]),
            "canary_wave_median_s": med([e["wave_s"][0] for e in per_edit if e["wave_s"]]),
            "later_wave_median_s": med([w for e in per_edit for w in e["wave_s"][1:]]),
            "handoff_median_s": med([h for e in per_edit for h in e["handoff_s"][1:]]),
            "step_median_s": med([s for e in per_edit for s in e["step_s"]]),
            "edit_to_rollout_median_s": med([e["edit_to_rollout_s"] for e in per_edit]),
            "per_edit": per_edit,
        })
        if broken:
            # A broken version: from the edit until the fleet's rollout is recorded as rolled back.
            before = last_rollout_id(store)
            t0 = time.monotonic()
            write_gen_model(repo, MODEL, BROKEN_GEN, init="raise RuntimeError('broken')")
            rows = wait_closed(store, before, "rolled_back", 120)
            stopped_s = time.monotonic() - t0
            took = sorted(s.host for s in rows[-1].steps if s.action == "deploy" and s.state in ("ok", "failed"))
            result.update({"broken_stopped_s": round(stopped_s, 3), "broken_hosts_tried": took,
                           "broken_last_good_everywhere": serving(clients, edits + 1)})
        result["load_average_end"] = c.load_average()
        return result
    except Exception:
        for d in daemons:
            print(f"--- {d.state_dir.name} log tail ---\n{d.log_tail(1500)}", file=sys.stderr)
        raise
    finally:
        registry.close()
        for client in clients:
            client.close()
        for d in daemons:
            d.stop()


def fmt(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds:.2f} s"


def rows_for(results: list[dict[str, Any]], wave_size: int, canary_count: int) -> list[c.Row]:
    rows = []
    for r in results:
        n, waves = r["hosts"], r["waves"]
        rows.append(c.Row(
            f"edit → every host serving, {n} host{'s' if n > 1 else ''}", "tritonctl fleet",
            f"{r['rollout_median_s']:.2f} s", value=r["rollout_median_s"],
            note=(f"median of {r['edits']} edits (max {r['rollout_max_s']:.2f} s); {waves} wave"
                  f"{'s' if waves > 1 else ''} (canary + {waves - 1} of ≤{wave_size}), per wave "
                  f"{fmt(r['wave_median_s'])} (canary {fmt(r['canary_wave_median_s'])}); edit → rollout "
                  f"{fmt(r['edit_to_rollout_median_s'])}; load at start {r['load_average_start'][0]}")))
        if "broken_stopped_s" in r:
            ok = r["broken_last_good_everywhere"] and len(r["broken_hosts_tried"]) <= canary_count
            rows.append(c.Row(
                f"broken version → rolled back, {n} host{'s' if n > 1 else ''}", "tritonctl fleet",
                f"{r['broken_stopped_s']:.2f} s", value=r["broken_stopped_s"],
                target="stopped at the canary; last good everywhere", met=bool(ok),
                note=f"tried on {', '.join(r['broken_hosts_tried']) or 'no host'}"))
    return rows


def wave_table(results: list[dict[str, Any]], edits: int) -> Table:
    table = Table(title=f"Fleet rollout by fleet size (median of {edits} edits)", title_justify="left")
    for column in ("Hosts", "Waves", "Edit → every host serving", "Max", "Per wave", "Canary wave",
                   "Later waves", "Host step", "Leader hand-off", "Edit → rollout", "Broken → rolled back",
                   "Load at start"):
        table.add_column(column, justify="right")
    for r in results:
        table.add_row(str(r["hosts"]), str(r["waves"]), fmt(r["rollout_median_s"]), fmt(r["rollout_max_s"]),
                      fmt(r["wave_median_s"]), fmt(r["canary_wave_median_s"]), fmt(r["later_wave_median_s"]),
                      fmt(r["step_median_s"]), fmt(r["handoff_median_s"]), fmt(r["edit_to_rollout_median_s"]),
                      fmt(r.get("broken_stopped_s")), str(r["load_average_start"][0]))
    return table


class CannotRun(Exception):
    """No PostgreSQL to run the shared registry on (tests/pg.py's skip reason): exit 2, no results file."""


def run(args: argparse.Namespace, console: Any) -> dict[str, Any]:
    sizes, edits = args.sizes, args.edits
    machine = c.machine_info()  # commit, uname, load average at the start, tritonserver and Python versions
    report = c.base_report(NAME, args.argv, args.quick, machine)
    pg = PostgresServer().start()
    results = []
    try:
        with tempfile.TemporaryDirectory(prefix="tritonctl-bench-fleet-") as tmp:
            for size in sizes:
                console.print(f"fleet of {size} ...")
                results.append(run_size(pg, size, edits, args.wave_size, args.canary_count, args.settle,
                                        Path(tmp), not args.no_broken))
    finally:
        pg.stop()
    rows = rows_for(results, args.wave_size, args.canary_count)
    report.update({
        "settings": {"sizes": sizes, "edits": edits, "wave_size": args.wave_size,
                     "canary_count": args.canary_count, "settle_s": args.settle, "model": "python (generation)",
                     "reconcile_interval_s": 10, "cpus": os.cpu_count()},
        "results": results, "rows": [r.to_json() for r in rows],
    })
    return report


def render(report: dict[str, Any], console: Any) -> None:
    console.print(wave_table(report["results"], report["settings"]["edits"]))
    c.render_rows("Fleet rollout (all hosts on this machine, sharing its cores)", [c.Row(**r) for r in report["rows"]],
                  console, footer="Per wave: previous wave's last ok (canary: the rollout's creation) → this wave's "
                                  "last ok, from the shared registry's step times.")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="CI sizes: 2 hosts, 2 edits")
    parser.add_argument("--sizes", type=int, nargs="+", help="fleet sizes (default 1 2 4 8; 2 with --quick)")
    parser.add_argument("--edits", type=int, help="edits per fleet size (default 5; 2 with --quick)")
    parser.add_argument("--wave-size", type=int, default=2)
    parser.add_argument("--canary-count", type=int, default=1)
    parser.add_argument("--settle", type=float, default=0.2, help="the daemons' --settle")
    parser.add_argument("--no-broken", action="store_true", help="skip the broken-version rollback")

    def prepare(args: argparse.Namespace) -> None:
        args.sizes = args.sizes or ([2] if args.quick else [1, 2, 4, 8])
        args.edits = args.edits or (2 if args.quick else 5)
        reason = skip_reason()
        if reason:
            raise CannotRun(reason)

    try:
        return c.bench_main(NAME, parser, argv, run, prepare=prepare, render=render, timed=True, check=False,
                            exit_code=lambda args, report: 0)
    except CannotRun as exc:
        c.make_console().print(f"cannot run: {exc}")
        return 2


if __name__ == "__main__":
    sys.exit(main())
