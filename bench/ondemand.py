"""On-demand models under a memory budget, side by side with Triton explicit loading every model.

Issue 29's benchmark. A catalogue of N python models that each hold MB once initialized (default 40 ×
100 MB), a host budget (default 1 GB: about 10 loaded), and clients that for DURATION pick models from a
Zipf distribution (s = 1), `ensure` (a lease), infer, release.

tritonctl (`tritonctl daemon --launch-triton --policy ondemand --memory-budget-mb B`) measures:
failed inferences after an ensure returned (target 0); budget overshoot, sampled every 0.5 s from the
processes' memory (the stubs' RSS plus the server's growth since it started; target: never more than
one model's footprint); a cold ensure's time beyond Triton's own load (target ≤ 0.3 s): cold ensures one
at a time after the run, back to back and then SPACED_S apart, against Triton explicit's own load_model of
the same models in the same run (medians), and each against the load call it made itself, with where its
time went (the phases of the daemon's JSON log); hit ratio; evictions; a protected model (tag `stable`)
never unloaded.

Against it, Triton explicit started with `--load-model=*` on the same models: its memory with all N
loaded, and what fails when a memory cgroup (v1 `memory.limit_in_bytes`, which this machine lets us
create; the server enters it before exec) caps the server and its stubs below what they need
(`--caps-mb`, default the budget and 3584 MB: below the catalogue's 4 GB).

    python bench/ondemand.py                   # full: 40 × 100 MB, 1 GB, 5 minutes (≈ 10 min here)
    python bench/ondemand.py --quick           # 12 × 100 MB, 400 MB, 60 s
    python bench/ondemand.py --plot            # also draw docs/ondemand.png from the run
    python bench/ondemand.py --replot bench/results/ondemand.json   # only the plot, from a results file
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from common import (  # type: ignore[import-not-found]
    Row,
    base_report,
    bench_main,
    machine_info,
    machine_line,
    make_console,
    render_rows,
    status_kb,
    workspace,
)

from controlplane.api.client import ControlClient
from controlplane.memory.footprint import stub_pids
from controlplane.triton.launcher import TritonServer
from tests.harness import DaemonProcess, gen_config, infer_gen, python_model, python_stubs

CGROUP_ROOT = Path("/sys/fs/cgroup/memory")
SPACED_S = 2.0  # the pause before each spaced cold ensure
PLOT = Path(__file__).resolve().parent.parent / "docs" / "ondemand.png"
PHASES = ("before_s", "admit_s", "publish_s", "load_s", "verify_commit_s", "answer_s")


def write_catalogue(repo: Path, n: int, mb: int) -> list[str]:
    names = [f"m{i:02d}" for i in range(n)]
    for i, name in enumerate(names):
        (repo / name / "1").mkdir(parents=True, exist_ok=True)
        (repo / name / "config.pbtxt").write_text(gen_config(name, i + 1))
        init = f"self.hold = np.ones({mb} * 1024 * 1024 // 8)"
        (repo / name / "1" / "model.py").write_text(
            python_model("np.full_like(x, GEN, dtype=np.float32)", init=init, prelude=f"\nGEN = {i + 1}\n"))
    return names


def held_mb(server_pid: int, server_base_kb: int) -> tuple[float, int]:
    """(the stubs' RSS + the server's growth since start, in MB; how many stubs) of one tritonserver."""
    stubs = python_stubs(server_pid)
    total = sum(_rss_kb(p) for p in stubs) + max(0, _rss_kb(server_pid) - server_base_kb)
    return total / 1024, len(stubs)


def stub_models(server_pid: int) -> list[str]:
    """The model of each python stub of one tritonserver (its argv names `.../<model>/<version>/model.py`)."""
    names = []
    for p in python_stubs(server_pid):
        try:
            argv = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if len(argv) > 1:
            names.append(Path(argv[1].decode(errors="replace")).parent.parent.name)
    return sorted(names)


def _rss_kb(pid: int) -> int:
    try:
        return status_kb(pid, "VmRSS")
    except OSError:
        return 0


def run_tritonctl(base: Path, names: list[str], args: argparse.Namespace) -> dict[str, Any]:
    repo = base / "repo"
    daemon = DaemonProcess(repo, base / "state", settle_s=0.2, auto_complete=True,
                           env={"TRITONCTL_RECONCILE_INTERVAL_S": "10", "TRITONCTL_IDLE_UNLOAD_S": "300"},
                           extra_args=["--policy", "ondemand", "--memory-budget-mb", str(args.budget_mb),
                                       "--log-format", "json"]).start()
    samples: list[tuple[float, float, int]] = []
    crowded: list[tuple[float, float, float, list[str]]] = []  # samples over the budget, with the stubs' models
    ensures: list[dict[str, Any]] = []
    failures: list[str] = []
    try:
        deadline = time.monotonic() + 120
        while len(daemon.status()["models"]) < len(names) and time.monotonic() < deadline:
            time.sleep(0.5)
        pid = int(daemon.triton_pid() or 0)
        base_kb = _rss_kb(pid)
        client = ControlClient(socket=daemon.state_dir / "tritonctl.sock")
        protected = names[0]
        first = client.ensure(protected, 3600)
        daemon.run("tag", protected, "stable")
        url = daemon.triton_url()
        stop = threading.Event()
        started = time.monotonic()

        def sampler() -> None:
            while not stop.wait(0.5):
                mb, stubs = held_mb(pid, base_kb)
                samples.append((time.monotonic() - started, mb, stubs))
                if mb > args.budget_mb and len(crowded) < 2000:  # over the budget: whose stubs run then
                    crowded.append((time.monotonic() - started, time.time(), round(mb, 1), stub_models(pid)))

        def worker(seed: int) -> None:
            import tritonclient.grpc as grpcclient

            rng = random.Random(seed)
            own = ControlClient(socket=daemon.state_dir / "tritonctl.sock")
            grpc = grpcclient.InferenceServerClient(url)
            weights = [1 / (k + 1) for k in range(len(names))]
            try:
                while time.monotonic() - started < args.duration_s:
                    name = rng.choices(names, weights)[0]
                    t0 = time.monotonic()
                    try:
                        lease = own.ensure(name, 120)
                    except Exception as exc:  # noqa: BLE001 - reported, not hidden
                        failures.append(f"ensure {name}: {exc}")
                        continue
                    ensures.append({"model": name, "loaded": lease["loaded"], "s": time.monotonic() - t0})
                    try:
                        if infer_gen(grpc, name) != names.index(name) + 1:
                            failures.append(f"{name}: wrong answer")
                    except Exception as exc:  # noqa: BLE001 - a failed inference after ensure: the finding
                        failures.append(f"infer {name}: {exc}")
                    finally:
                        own.release_lease(name, str(lease["lease"]))
            finally:
                grpc.close()

        threads = [threading.Thread(target=sampler)] + [threading.Thread(target=worker, args=(s,))
                                                         for s in range(args.clients)]
        for t in threads:
            t.start()
        for t in threads[1:]:
            t.join()
        stop.set()
        threads[0].join()
        # cold ensures one at a time (no other client waiting for room), each evicting one model: what an
        # ensure adds to Triton's load. First back to back, then each SPACED_S after the last (the model
        # evicted before it has exited by then: TRITON_NOTES, a stub exits ~1.1 s after its unload).
        cold: list[float] = []
        cold_models: list[str] = []
        spaced: list[float] = []
        spaced_models: list[str] = []
        walls: list[tuple[str, float, float]] = []  # (model, sent, answered) of each cold ensure, wall clock
        for name in names[::-1]:
            if len(spaced) >= args.cold:
                break
            if daemon.model_status(name).get("ondemand", {}).get("state") != "standby":
                continue
            apart = len(cold) >= args.cold
            if apart:
                time.sleep(SPACED_S)
            t0, sent = time.monotonic(), time.time()
            lease = client.ensure(name, 60)
            (spaced if apart else cold).append(time.monotonic() - t0)
            walls.append((name, sent, time.time()))
            (spaced_models if apart else cold_models).append(name)
            client.release_lease(name, str(lease["lease"]))
        client.release_lease(protected, str(first["lease"]))
        audit = daemon.audit("--limit", "100000")
        footprints = [v["footprint"]["memory_mb"] for n in names for v in daemon.json("versions", n)
                      if v.get("footprint")]
    finally:
        daemon.stop()
    breakdown = [phases(daemon.log_path, *wall) for wall in walls]
    evictions = [e for e in audit if e["action"] == "evict"]
    events = [{k: e.get(k) for k in ("time", "actor", "action", "model", "outcome", "message", "duration_ms")}
              for e in audit if e["action"] in ("evict", "ondemand", "restore")]
    loads = [e for e in audit if e["action"] == "ondemand" and e["outcome"] == "ok"]
    # a reconcile that reloads an evicted model holds memory the budget does not count (fixed in 2026-12)
    restores = [e for e in audit if e["action"] == "restore" and e["outcome"] == "ok"]
    return {"samples": samples, "ensures": ensures, "failures": failures, "evictions": len(evictions),
            "restores": len(restores),
            "protected_evicted": sum(1 for e in evictions if e["model"] == protected),
            "deploy_ms": [e["duration_ms"] for e in loads], "footprints_mb": footprints, "cold_s": cold,
            "cold_models": cold_models, "spaced_s": spaced, "spaced_models": spaced_models,
            "cold_breakdown": breakdown,
            "crowded": crowded, "events": events}


@dataclass
class CappedServer(TritonServer):
    """A tritonserver started inside a memory cgroup (it enters the cgroup itself, before exec)."""

    cgroup: Path | None = None

    def command(self, server: Path, backend_dir: Path) -> list[str]:
        args = super().command(server, backend_dir)
        if self.cgroup is None:
            return args
        return ["sh", "-c", f'echo $$ > {self.cgroup / "cgroup.procs"} && exec "$@"', "sh", *args]


def phases(log: Path, model: str, sent: float, answered: float) -> dict[str, Any]:
    """Where one cold ensure's time went, from the daemon's JSON log: before the deploy began (the API,
    the lease, the target), admission (room made: evictions, the wait for an evicted model's stubs to
    exit), publish, Triton's load, verify + smoke + commit + the footprint's measurement, the answer."""
    marks: dict[str, float] = {}
    for line in log.read_text(errors="replace").splitlines():
        if not line.startswith("{"):
            continue
        entry = json.loads(line)
        when = datetime.fromisoformat(entry["time"].replace("Z", "+00:00")).timestamp()
        if not sent <= when <= answered + 0.5 or not entry["message"].startswith(f"{model} "):
            continue
        for key in ("validate start", "publish start", "load start", "load ok", "commit ok"):
            if entry["message"].startswith(f"{model} {key}") and key not in marks:
                marks[key] = when
    if len(marks) < 5:
        return {"model": model, "total_s": round(answered - sent, 3)}
    return {"model": model, "total_s": round(answered - sent, 3),
            "before_s": round(marks["validate start"] - sent, 3),
            "admit_s": round(marks["publish start"] - marks["validate start"], 3),
            "publish_s": round(marks["load start"] - marks["publish start"], 3),
            "load_s": round(marks["load ok"] - marks["load start"], 3),
            "verify_commit_s": round(marks["commit ok"] - marks["load ok"], 3),
            "answer_s": round(answered - marks["commit ok"], 3)}


def run_triton(base: Path, names: list[str], limit_mb: int | None, timed: list[str]) -> dict[str, Any]:
    """Triton explicit with `--load-model=*` (every model loaded at start), optionally inside a memory
    cgroup (v1 `memory.limit_in_bytes`); then, uncapped, Triton's own cold load of the models in `timed`
    (unloaded, their stubs gone, loaded again): what a cold ensure is compared with."""
    import tritonclient.grpc as grpcclient

    work = base / f"triton-{limit_mb or 'free'}"
    cgroup = None
    if limit_mb is not None:
        cgroup = CGROUP_ROOT / f"tritonctl-bench-{os.getpid()}-{limit_mb}"
        cgroup.mkdir()
        (cgroup / "memory.limit_in_bytes").write_text(str(limit_mb * 1024 * 1024))
    server = CappedServer(model_repository=base / "repo", workdir=work, extra_args=["--load-model=*"],
                          cgroup=cgroup)
    started = time.monotonic()
    out: dict[str, Any] = {"limit_mb": limit_mb, "load_s": [], "load_models": [], "failed": [], "held_mb": 0.0,
                           "stubs": 0, "answering": 0, "server_alive": False, "start_error": None}
    try:
        try:
            server.start(live_timeout_s=600)
        except Exception as exc:  # noqa: BLE001 - a server that does not start is the finding
            tail = [line for line in server.log_tail().splitlines()
                    if "error" in line.lower() or "fail" in line.lower()]
            out["start_error"] = f"{str(exc).splitlines()[0][:160]}; " + " | ".join(tail[-3:])[:400]
            out["start_s"] = round(time.monotonic() - started, 1)
            return out
        out["start_s"] = round(time.monotonic() - started, 1)
        assert server.pid is not None
        client = grpcclient.InferenceServerClient(server.grpc_url)
        index = {m["name"]: m.get("state", "") for m in
                 client.get_model_repository_index(as_json=True).get("models", [])}
        out["failed"] = [f"{n}: {index.get(n) or 'absent'}" for n in names if index.get(n) != "READY"]
        out["held_mb"], out["stubs"] = held_mb(server.pid, 0)
        out["server_rss_mb"] = _rss_kb(server.pid) / 1024
        for name in names:
            try:
                infer_gen(client, name)
                out["answering"] += 1
            except Exception:  # noqa: BLE001 - counted
                pass
        for name in timed:  # Triton's own cold load of the models the cold ensures loaded
            client.unload_model(name)
            deadline = time.monotonic() + 30
            while stub_pids(name, server.pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            t0 = time.monotonic()
            client.load_model(name)
            out["load_s"].append(time.monotonic() - t0)
            out["load_models"].append(name)
        out["server_alive"] = server.is_running()
        client.close()
        return out
    finally:
        server.stop()
        if cgroup is not None:
            try:
                cgroup.rmdir()
            except OSError:
                pass


def plot(samples: list[list[float]], budget_mb: float, footprint_mb: float, path: Path) -> None:
    """Memory held against the budget (top) and models loaded (bottom), sampled every 0.5 s."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s[0] for s in samples]
    fig, (mem, count) = plt.subplots(2, 1, figsize=(9, 5.5), sharex=True, height_ratios=[3, 2])
    mem.plot(t, [s[1] for s in samples], linewidth=0.8, label="memory held: the stubs' RSS + the server's growth")
    mem.axhline(budget_mb, color="red", linestyle="--", label=f"budget {budget_mb:.0f} MB")
    mem.axhline(budget_mb + footprint_mb, color="orange", linestyle=":",
                label=f"budget + one footprint ({footprint_mb:.0f} MB): the target's bound")
    mem.set_ylabel("MB")
    mem.legend(loc="lower right", fontsize=8)
    count.step(t, [s[2] for s in samples], color="green", where="post", linewidth=0.8)
    count.set_ylabel("models loaded (stub processes)")
    count.set_xlabel("seconds into the Zipf phase")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


class Replotted(Exception):
    """--replot drew the plot from a results file: nothing runs, no results file is written."""


def run(args: argparse.Namespace, console: Any) -> dict[str, Any]:
    machine = machine_info()
    report = base_report("ondemand", args.argv, args.quick, machine)
    report["parameters"] = {"models": args.models, "mb": args.mb, "budget_mb": args.budget_mb,
                            "duration_s": args.duration_s, "clients": args.clients}
    with workspace("ondemand") as base:
        names = write_catalogue(base / "repo", args.models, args.mb)
        ours = run_tritonctl(base, names, args)
        shutil.rmtree(base / "state", ignore_errors=True)
        free = run_triton(base, names, None, ours["cold_models"] + ours["spaced_models"])
        caps = [int(c) for c in args.caps_mb.split(",") if c] if args.caps_mb else [args.budget_mb, 3584]
        capped = [run_triton(base, names, cap, []) for cap in caps] if os.access(CGROUP_ROOT, os.W_OK) else []
    footprint = statistics.median(ours["footprints_mb"]) if ours["footprints_mb"] else float("nan")
    overshoot = max((mb - args.budget_mb for _, mb, _ in ours["samples"]), default=0.0)
    cold, spaced = ours["cold_s"], ours["spaced_s"]
    own = dict(zip(free["load_models"], free["load_s"], strict=True))  # Triton's own load of each model
    triton_load = statistics.median(own[m] for m in ours["cold_models"]) if cold else float("nan")
    triton_spaced = statistics.median(own[m] for m in ours["spaced_models"]) if spaced else float("nan")
    beyond = statistics.median(cold) - triton_load if cold else float("nan")
    beyond_spaced = statistics.median(spaced) - triton_spaced if spaced else float("nan")
    loaded_during = [e["s"] for e in ours["ensures"] if e["loaded"]]

    own_overhead = [b["total_s"] - b["load_s"] for b in ours["cold_breakdown"] if "load_s" in b]
    beyond_own = statistics.median(own_overhead) if own_overhead else float("nan")

    def phase(key: str) -> float:
        values = [b[key] for b in ours["cold_breakdown"] if key in b]
        return statistics.median(values) if values else float("nan")
    hits = sum(1 for e in ours["ensures"] if not e["loaded"]) / max(1, len(ours["ensures"]))
    loaded = len(names) - len(free["failed"])
    rows = [
        Row("failed inferences after ensure", "tritonctl", str(len(ours["failures"])), "0",
            not ours["failures"], "; ".join(ours["failures"][:3]), len(ours["failures"])),
        Row("budget overshoot (max, 0.5 s samples)", "tritonctl", f"{max(0.0, overshoot):.0f} MB",
            f"≤ {footprint:.0f} MB (one footprint)", overshoot <= footprint, "", round(max(0.0, overshoot), 1)),
        Row("cold ensure beyond Triton's own load (medians), back to back", "tritonctl", f"{beyond:.2f} s",
            "≤ 0.3 s", beyond <= 0.3, f"cold ensure {statistics.median(cold) if cold else float('nan'):.2f} s "
            f"({len(cold)}, one at a time, each evicting one), Triton load_model of the same models "
            f"{triton_load:.2f} s", round(beyond, 3)),
        Row(f"cold ensure beyond Triton's own load (medians), {SPACED_S:.0f} s apart", "tritonctl",
            f"{beyond_spaced:.2f} s", "≤ 0.3 s", beyond_spaced <= 0.3,
            f"cold ensure {statistics.median(spaced) if spaced else float('nan'):.2f} s ({len(spaced)}, the "
            f"model evicted before each had exited), Triton load_model of the same models {triton_spaced:.2f} s",
            round(beyond_spaced, 3)),
        Row("cold ensure beyond its own Triton load (median of total − load phase)", "tritonctl",
            f"{beyond_own:.2f} s", "≤ 0.3 s", beyond_own <= 0.3,
            f"{len(own_overhead)} cold ensures, back to back and spaced: all but the load call it made",
            round(beyond_own, 3)),
        Row("cold ensure phases (medians, daemon log)", "tritonctl", f"load {phase('load_s'):.2f} s",
            note=", ".join(f"{k.removesuffix('_s').replace('_', '+')} {phase(k):.2f} s" for k in PHASES),
            value=round(phase("load_s"), 3)),
        Row("ensure that loaded, during the run (median)", "tritonctl",
            f"{statistics.median(loaded_during) if loaded_during else float('nan'):.2f} s",
            note=f"{len(loaded_during)} loads, {args.clients} clients competing for room",
            value=round(statistics.median(loaded_during), 3) if loaded_during else None),
        Row("hit ratio", "tritonctl", f"{hits:.0%}", note=f"{len(ours['ensures'])} ensures",
            value=round(hits, 3)),
        Row("evictions", "tritonctl", str(ours["evictions"]), value=ours["evictions"]),
        Row("protected model unloaded", "tritonctl", str(ours["protected_evicted"]), "0",
            ours["protected_evicted"] == 0, value=ours["protected_evicted"]),
        Row("models reloaded by reconcile (restores)", "tritonctl", str(ours.get("restores", 0)), "0",
            not ours.get("restores"), "nothing restarted: a restore here reloads a model the budget evicted",
            value=ours.get("restores", 0)),
        Row("memory with every model loaded (--load-model=*)", "Triton explicit", f"{free['held_mb']:.0f} MB",
            note=f"{loaded}/{len(names)} loaded, {free['answering']} answering; stubs + the whole server "
                 f"({free.get('server_rss_mb', 0):.0f} MB); start {free.get('start_s')} s",
            value=round(free["held_mb"], 1)),
    ]
    for run in capped:
        if run["start_error"]:
            note = f"did not start ({run.get('start_s')} s): {run['start_error']}"
        else:
            note = (f"server alive: {run['server_alive']}; not READY: {len(run['failed'])}; "
                    + "; ".join(run["failed"][:2]))
        rows.append(Row(f"--load-model=* in a {run['limit_mb']} MB cgroup", "Triton explicit",
                        f"{run['answering']}/{len(names)} answering", note=note, value=run["answering"]))
    report.update(rows=[r.to_json() for r in rows], tritonctl={k: v for k, v in ours.items() if k != "samples"},
                  samples=ours["samples"], triton_all=free, triton_capped=capped, footprint_median_mb=footprint)
    return report


def render(report: dict[str, Any], console: Any) -> None:
    p = report["parameters"]
    render_rows(f"On-demand models: {p['models']} × {p['mb']} MB, budget {p['budget_mb']} MB, "
                f"{p['duration_s']:.0f} s, {p['clients']} clients", [Row(**r) for r in report["rows"]], console,
                machine_line(report["machine"]))


def plot_after(args: argparse.Namespace, report: dict[str, Any]) -> int:
    """After the results file is written: the plot with --plot; the exit code is always 0."""
    if args.plot:
        plot(report["samples"], args.budget_mb, report["footprint_median_mb"], PLOT)
        make_console().print(f"plot: {PLOT}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--models", type=int)
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--budget-mb", type=int)
    parser.add_argument("--duration-s", type=float)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--cold", type=int, default=5, help="cold ensures timed one at a time after the run")
    parser.add_argument("--caps-mb", help="memory cgroup limits for Triton explicit (default: the budget,3584)")
    parser.add_argument("--plot", action="store_true")
    parser.add_argument("--replot", type=Path, metavar="RESULTS", help="only draw the plot again from a results file")

    def prepare(args: argparse.Namespace) -> None:
        if args.replot:
            done = json.loads(args.replot.read_text())
            plot(done["samples"], done["parameters"]["budget_mb"], done["footprint_median_mb"], PLOT)
            raise Replotted
        args.models = args.models or (12 if args.quick else 40)
        args.budget_mb = args.budget_mb or (400 if args.quick else 1024)
        args.duration_s = args.duration_s or (60.0 if args.quick else 300.0)

    try:
        return bench_main("ondemand", parser, argv, run, prepare=prepare, render=render, check=False,
                          exit_code=plot_after)
    except Replotted:
        return 0


if __name__ == "__main__":
    sys.exit(main())
