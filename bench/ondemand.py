"""On-demand models under a memory budget, side by side with Triton explicit loading every model.

Issue 29's benchmark. A catalogue of N python models that each hold MB once initialized (default 40 ×
100 MB), a host budget (default 1 GB: about 10 loaded), and clients that for DURATION pick models from a
Zipf distribution (s = 1), `ensure` (a lease), infer, release.

tritonctl (`tritonctl daemon --launch-triton --policy ondemand --memory-budget-mb B`) measures:
failed inferences after an ensure returned (target 0); budget overshoot, sampled every 0.5 s from the
processes' memory (the stubs' RSS plus the server's growth since it started; target: never more than
one model's footprint); a cold ensure's time beyond Triton's own load of the same model (target ≤
0.3 s, medians side by side); hit ratio; evictions; a protected model (tag `stable`) never unloaded.

Against it, Triton explicit with every model loaded (what `--load-model=*` does at start, done here by
one load_model per model so that the server can first be put in a memory cgroup): its memory with all
N loaded, and what fails when a cgroup (v1 `memory.limit_in_bytes`, where this machine lets us create
one) caps the server and its stubs at the budget.

    python bench/ondemand.py                   # full: 40 × 100 MB, 1 GB, 5 minutes (≈ 12 min here)
    python bench/ondemand.py --quick           # 12 × 100 MB, 400 MB, 60 s
    python bench/ondemand.py --plot            # also draw docs/ondemand.png from the run
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from common import (  # type: ignore[import-not-found]
    Row,
    base_report,
    descendants,
    machine_info,
    machine_line,
    make_console,
    render_rows,
    results_path,
    status_kb,
    workspace,
    write_report,
)

from controlplane.api.client import ControlClient
from controlplane.triton.launcher import TritonServer
from tests.harness import DaemonProcess, gen_config, infer_gen, python_model

CGROUP_ROOT = Path("/sys/fs/cgroup/memory")


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
    stubs = [p for p in descendants(server_pid) if _argv0(p).endswith("triton_python_backend_stub")]
    total = sum(_rss_kb(p) for p in stubs) + max(0, _rss_kb(server_pid) - server_base_kb)
    return total / 1024, len(stubs)


def _argv0(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
    except OSError:
        return ""


def _rss_kb(pid: int) -> int:
    try:
        return status_kb(pid, "VmRSS")
    except OSError:
        return 0


def run_tritonctl(base: Path, names: list[str], args: argparse.Namespace) -> dict[str, Any]:
    repo = base / "repo"
    daemon = DaemonProcess(repo, base / "state", settle_s=0.2,
                           env={"TRITONCTL_RECONCILE_INTERVAL_S": "10", "TRITONCTL_IDLE_UNLOAD_S": "300"},
                           extra_args=["--policy", "ondemand", "--memory-budget-mb", str(args.budget_mb)]).start()
    samples: list[tuple[float, float, int]] = []
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
        # cold ensures one at a time (no other client waiting for room): what an ensure adds to Triton's load
        cold: list[float] = []
        for name in names[::-1]:
            if len(cold) >= args.cold:
                break
            if daemon.model_status(name).get("ondemand", {}).get("state") != "standby":
                continue
            t0 = time.monotonic()
            lease = client.ensure(name, 60)
            cold.append(time.monotonic() - t0)
            client.release_lease(name, str(lease["lease"]))
        client.release_lease(protected, str(first["lease"]))
        audit = daemon.audit("--limit", "100000")
        footprints = [v["footprint"]["memory_mb"] for n in names for v in daemon.json("versions", n)
                      if v.get("footprint")]
    finally:
        daemon.stop()
    evictions = [e for e in audit if e["action"] == "evict"]
    loads = [e for e in audit if e["action"] == "ondemand" and e["outcome"] == "ok"]
    return {"samples": samples, "ensures": ensures, "failures": failures, "evictions": len(evictions),
            "protected_evicted": sum(1 for e in evictions if e["model"] == protected),
            "deploy_ms": [e["duration_ms"] for e in loads], "footprints_mb": footprints, "cold_s": cold}


def run_triton(base: Path, names: list[str], args: argparse.Namespace, limit_mb: int | None) -> dict[str, Any]:
    """Triton explicit loading every model (as --load-model=* does), optionally inside a memory cgroup."""
    import tritonclient.grpc as grpcclient

    work = base / f"triton-{limit_mb or 'free'}"
    server = TritonServer(model_repository=base / "repo", workdir=work)
    server.start()
    cgroup = None
    try:
        assert server.pid is not None
        if limit_mb is not None:
            cgroup = CGROUP_ROOT / f"tritonctl-bench-{os.getpid()}"
            cgroup.mkdir()
            (cgroup / "memory.limit_in_bytes").write_text(str(limit_mb * 1024 * 1024))
            (cgroup / "cgroup.procs").write_text(str(server.pid))
        base_kb = _rss_kb(server.pid)
        client = grpcclient.InferenceServerClient(server.grpc_url)
        load_s, failed = [], []
        for name in names:
            t0 = time.monotonic()
            try:
                client.load_model(name, client_timeout=120)
                load_s.append(time.monotonic() - t0)
            except Exception as exc:  # noqa: BLE001 - what fails is the finding
                failed.append(f"{name}: {str(exc)[:160]}")
            if not server.is_running():
                failed.append("tritonserver died")
                break
        mb, stubs = held_mb(server.pid, base_kb) if server.is_running() else (0.0, 0)
        answering = 0
        if server.is_running():
            for name in names:
                try:
                    infer_gen(client, name)
                    answering += 1
                except Exception:  # noqa: BLE001 - counted
                    pass
        client.close()
        return {"limit_mb": limit_mb, "load_s": load_s, "failed": failed, "held_mb": mb, "stubs": stubs,
                "answering": answering, "server_alive": server.is_running()}
    finally:
        server.stop()
        if cgroup is not None:
            try:
                cgroup.rmdir()
            except OSError:
                pass


def plot(result: dict[str, Any], budget_mb: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [s[0] for s in result["samples"]]
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.plot(t, [s[1] for s in result["samples"]], label="memory held (stubs + server growth), MB")
    ax.axhline(budget_mb, color="red", linestyle="--", label=f"budget {budget_mb} MB")
    ax.set_xlabel("seconds")
    ax.set_ylabel("MB")
    ax2 = ax.twinx()
    ax2.step(t, [s[2] for s in result["samples"]], color="green", where="post", label="models loaded")
    ax2.set_ylabel("models loaded")
    fig.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--models", type=int)
    parser.add_argument("--mb", type=int, default=100)
    parser.add_argument("--budget-mb", type=int)
    parser.add_argument("--duration-s", type=float)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--cold", type=int, default=5, help="cold ensures timed one at a time after the run")
    parser.add_argument("--plot", action="store_true")
    args = parser.parse_args()
    args.models = args.models or (12 if args.quick else 40)
    args.budget_mb = args.budget_mb or (400 if args.quick else 1024)
    args.duration_s = args.duration_s or (60.0 if args.quick else 300.0)
    console = make_console()
    machine = machine_info()
    report = base_report("ondemand", [a for a in os.sys.argv[1:]], args.quick, machine)
    report["parameters"] = {"models": args.models, "mb": args.mb, "budget_mb": args.budget_mb,
                            "duration_s": args.duration_s, "clients": args.clients}
    with workspace("ondemand") as base:
        names = write_catalogue(base / "repo", args.models, args.mb)
        ours = run_tritonctl(base, names, args)
        shutil.rmtree(base / "state", ignore_errors=True)
        free = run_triton(base, names, args, None)
        capped = run_triton(base, names, args, args.budget_mb) if os.access(CGROUP_ROOT, os.W_OK) else None
    footprint = statistics.median(ours["footprints_mb"]) if ours["footprints_mb"] else float("nan")
    overshoot = max((mb - args.budget_mb for _, mb, _ in ours["samples"]), default=0.0)
    cold = ours["cold_s"]
    triton_load = statistics.median(free["load_s"]) if free["load_s"] else float("nan")
    beyond = statistics.median(cold) - triton_load if cold else float("nan")
    hits = sum(1 for e in ours["ensures"] if not e["loaded"]) / max(1, len(ours["ensures"]))
    rows = [
        Row("failed inferences after ensure", "tritonctl", str(len(ours["failures"])), "0",
            not ours["failures"], "; ".join(ours["failures"][:3]), len(ours["failures"])),
        Row("budget overshoot (max, 0.5 s samples)", "tritonctl", f"{max(0.0, overshoot):.0f} MB",
            f"≤ {footprint:.0f} MB (one footprint)", overshoot <= footprint, "", round(max(0.0, overshoot), 1)),
        Row("cold ensure beyond Triton's own load (medians)", "tritonctl", f"{beyond:.2f} s", "≤ 0.3 s",
            beyond <= 0.3, f"cold ensure {statistics.median(cold) if cold else float('nan'):.2f} s "
            f"({len(cold)}, one at a time), Triton load_model {triton_load:.2f} s", round(beyond, 3)),
        Row("hit ratio", "tritonctl", f"{hits:.0%}", note=f"{len(ours['ensures'])} ensures",
            value=round(hits, 3)),
        Row("evictions", "tritonctl", str(ours["evictions"]), value=ours["evictions"]),
        Row("protected model unloaded", "tritonctl", str(ours["protected_evicted"]), "0",
            ours["protected_evicted"] == 0, value=ours["protected_evicted"]),
        Row("memory with every model loaded", "Triton explicit", f"{free['held_mb']:.0f} MB",
            note=f"{len(free['load_s'])}/{len(names)} loaded, {free['answering']} answering",
            value=round(free["held_mb"], 1)),
    ]
    if capped is not None:
        rows.append(Row(f"every model loaded in a {args.budget_mb} MB cgroup", "Triton explicit",
                        f"{capped['answering']}/{len(names)} answering",
                        note=f"server alive: {capped['server_alive']}; failures: {len(capped['failed'])}; "
                             + "; ".join(capped["failed"][:2]), value=capped["answering"]))
    render_rows(f"On-demand models: {args.models} × {args.mb} MB, budget {args.budget_mb} MB, "
                f"{args.duration_s:.0f} s, {args.clients} clients", rows, console, machine_line(machine))
    report.update(rows=[r.to_json() for r in rows], tritonctl={k: v for k, v in ours.items() if k != "samples"},
                  samples=ours["samples"], triton_all=free, triton_capped=capped, footprint_median_mb=footprint)
    write_report(results_path("ondemand", args.quick), report, console)
    if args.plot:
        path = Path(__file__).resolve().parent.parent / "docs" / "ondemand.png"
        plot(ours, args.budget_mb, path)
        console.print(f"plot: {path}")


if __name__ == "__main__":
    main()
