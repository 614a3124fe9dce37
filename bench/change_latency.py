"""Change latency: from the writer's last close() to the first answer from the new content.

Part 1, side by side: tritonctl (`tritonctl daemon --launch-triton`, policy auto, settle 1.0 s) and
Triton poll mode (`--repository-poll-secs=1`) run at once on two identical repositories; each trial
writes a new generation (config.pbtxt + 1/model.py, whole files) into one system's repository, the
systems taking turns (who goes first alternates), while a fast probe asks that system until the new
generation answers. tritonctl's latency is shown whole and less its settle window (the time it
waits on purpose, to never catch a writer mid-edit), with its deploy time from the audit log.

Part 2, tritonctl's own overhead per deploy, in-process: the core (`controlplane.service.ControlPlane`
with its Deployer, content store, SQLite registry and serving repository) against a real tritonserver
in explicit mode. Each deploy of a new generation (`ControlPlane.load`) is timed step by step:
snapshot (ContentStore.capture), offline validation, registry records (snapshot, deployment intent,
steps, commit, audit), publish (fresh tree + atomic link swap), Triton's load, verify (READY + served
digest). Overhead = the deploy's wall time less Triton's load. Target: median <= 50 ms.

    python bench/change_latency.py            # 20 trials per system, 50 in-process deploys
    python bench/change_latency.py --quick    # 3 trials per system, 8 in-process deploys
"""

from __future__ import annotations

import argparse
import functools
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as c  # noqa: E402

NAME = "change_latency"
MODEL = "latency"
TARGET_OVERHEAD_MS = 50.0


# --- part 1: end to end --------------------------------------------------------------------------------


def _first_answer(probe: c.Probe, gen: int, since: float) -> Callable[[], float | None]:
    """When `probe` first got generation `gen` (config and code) after `since`; None before that."""
    def check() -> float | None:
        return next((s.t for s in probe.stats.since(since) if s.config_gen == gen and s.code_gen == gen), None)

    return check


def end_to_end(args: argparse.Namespace, base: Path, console: Any) -> dict[str, Any]:
    repo_ctl, repo_poll = base / "watched-by-tritonctl", base / "triton-poll-repo"
    for repo in (repo_ctl, repo_poll):
        repo.mkdir()
        c.write_pair_model(repo, MODEL, 0)
    daemon = c.daemon_process(repo_ctl, base / "state", args.settle)
    poll = c.triton_server(repo_poll, base / "poll-work", mode="poll")
    latencies: dict[str, list[float]] = {"tritonctl": [], "Triton poll": []}
    timeouts: dict[str, int] = {"tritonctl": 0, "Triton poll": 0}
    probes: dict[str, c.Probe] = {}
    try:
        poll.start()
        daemon.start()
        urls = {"tritonctl": daemon.triton_url(), "Triton poll": poll.grpc_url}
        repos = {"tritonctl": repo_ctl, "Triton poll": repo_poll}
        for system, url in urls.items():
            if c.serves(url, MODEL, 0, 60) is None:
                raise SystemExit(f"{system}: generation 0 not served within 60 s")
            probes[system] = c.Probe(url, MODEL, pause_s=0.002, active=False).start()
        gen = 0
        for trial in range(args.trials):
            order = list(urls) if trial % 2 == 0 else list(reversed(urls))
            gen += 1
            for system in order:
                probe = probes[system]
                probe.active.set()
                time.sleep(0.3 + (trial % 5) * 0.137)  # vary the phase against Triton's poll clock
                closed = c.write_now([repos[system] / MODEL], c.pair_files(MODEL, gen))
                first = c.wait_until(_first_answer(probe, gen, closed), args.timeout, 0.005)
                probe.active.clear()
                if first is None:
                    timeouts[system] += 1
                else:
                    latencies[system].append(first - closed)
                time.sleep(0.2)
            console.print(f"[dim]trial {trial + 1}/{args.trials}: " + ", ".join(
                f"{s} {latencies[s][-1]:.2f} s" if latencies[s] else s for s in urls) + "[/dim]")
        audit = c.audit_rows(base / "state", MODEL)
    finally:
        for p in probes.values():
            p.stop()
        daemon.stop()
        poll.stop()
    deploy_ms = [r["duration_ms"] for r in audit if r["action"] == "deploy" and r["outcome"] == "ok"
                 and r["duration_ms"] is not None][: args.trials]  # newest first: the trials' deploys
    out: dict[str, Any] = {}
    for system, values in latencies.items():
        out[system] = {"trials": len(values), "timeouts": timeouts[system],
                       "latencies_s": [round(v, 4) for v in values],
                       "median_s": round(c.median(values), 4) if values else None,
                       "p90_s": round(c.pct(values, 90), 4) if values else None,
                       "min_s": round(min(values), 4) if values else None,
                       "max_s": round(max(values), 4) if values else None}
    ctl = out["tritonctl"]
    if latencies["tritonctl"]:
        less = [v - args.settle for v in latencies["tritonctl"]]
        ctl["minus_settle_median_s"] = round(c.median(less), 4)
        ctl["minus_settle_p90_s"] = round(c.pct(less, 90), 4)
    ctl["deploy_ms_median"] = c.median(deploy_ms) if deploy_ms else None
    ctl["settle_s"] = args.settle
    return out


# --- part 2: tritonctl's overhead per deploy, in-process -------------------------------------------------

STEP_LABELS = {
    "capture": "snapshot (ContentStore.capture)",
    "validate": "validate (offline, ModelConfig schema)",
    "record": "registry: record snapshot",
    "registry": "registry: intent, steps, commit, audit",
    "publish": "publish (fresh tree, precompile, link swap)",
    "verify": "verify (READY + served digest)",
    "prune": "prune old published trees",
    "load": "Triton load (excluded)",
}


class StepTimer:
    """Wraps methods so every call adds its wall time to a named step of the current deploy."""

    def __init__(self) -> None:
        self.current: dict[str, float] = defaultdict(float)
        self._depth = threading.local()

    def wrap(self, obj: Any, attr: str, step: str) -> None:
        original: Callable[..., Any] = getattr(obj, attr)

        @functools.wraps(original)
        def timed(*a: Any, **kw: Any) -> Any:
            depth = getattr(self._depth, "n", 0)
            self._depth.n = depth + 1
            t0 = time.perf_counter()
            try:
                return original(*a, **kw)
            finally:
                self._depth.n = depth
                if depth == 0:  # only the outermost timed call counts (no double counting)
                    self.current[step] += time.perf_counter() - t0

        setattr(obj, attr, timed)

    def take(self) -> dict[str, float]:
        out = dict(self.current)
        self.current = defaultdict(float)
        return out


def in_process(args: argparse.Namespace, base: Path, console: Any) -> dict[str, Any]:
    import controlplane.pipeline as service_module  # validation runs in the shared pipeline
    from controlplane.config import Settings
    from controlplane.publish import ServingRepository
    from controlplane.service import ControlPlane
    from controlplane.snapshot import ContentStore
    from controlplane.store import migrate
    from controlplane.store.registry import Registry
    from controlplane.triton.client import TritonClient

    state, source = base / "inproc-state", base / "inproc-source"
    source.mkdir()
    c.write_pair_model(source, MODEL, 0)
    server = c.triton_server(state / "serving", state / "triton", mode="explicit")
    server.start()
    registry = Registry(f"sqlite:///{state / 'registry.db'}")
    try:
        migrate.upgrade(registry)
        settings = Settings(repository=source, state_dir=state)
        triton = TritonClient(server.grpc_url)
        store = ContentStore(state / "store")  # as the daemon makes it (fsync on)
        plane = ControlPlane(settings, registry, store, ServingRepository(state / "serving", state / "published"),
                             triton)
        timer = StepTimer()
        timer.wrap(plane.store, "capture", "capture")
        original_validate = service_module.validate_model_dir
        timer.wrap(service_module, "validate_model_dir", "validate")
        timer.wrap(registry, "record_snapshot", "record")
        for method in ("ensure_model", "find_model", "get_model", "get_snapshot", "begin_deployment", "advance",
                       "finish_deployment", "audit", "set_quarantine", "update_model"):
            timer.wrap(registry, method, "registry")
        timer.wrap(plane.deployer, "_publish", "publish")
        timer.wrap(plane.deployer, "_verify", "verify")
        timer.wrap(plane.serving, "prune", "prune")
        timer.wrap(triton, "load", "load")
        deploys: list[dict[str, float]] = []
        failures: list[str] = []
        try:
            for i in range(args.deploys + 2):  # the first two warm up (first load, imports) and are dropped
                c.write_pair_model(source, MODEL, i + 1)
                timer.take()
                t0 = time.perf_counter()
                outcome = plane.load(MODEL, "bench")
                total = time.perf_counter() - t0
                steps = timer.take()
                if outcome.outcome != "ok":
                    failures.append(f"deploy {i + 1}: {outcome.outcome}: {outcome.message}")
                    continue
                if i >= 2:
                    steps["total"] = total
                    steps["overhead"] = total - steps.get("load", 0.0)
                    deploys.append(steps)
        finally:
            service_module.validate_model_dir = original_validate
            triton.close()
    finally:
        registry.close()
        server.stop()
    summary: dict[str, Any] = {"deploys": len(deploys), "failures": failures, "steps_ms": {}}
    for step in [*STEP_LABELS, "total", "overhead"]:
        values = [d.get(step, 0.0) * 1000 for d in deploys]
        if values:
            summary["steps_ms"][step] = {"median": round(c.median(values), 2), "p90": round(c.pct(values, 90), 2),
                                         "max": round(max(values), 2)}
    accounted = ("capture", "validate", "record", "registry", "publish", "verify", "prune")
    other = [(d["overhead"] - sum(d.get(s, 0.0) for s in accounted)) * 1000 for d in deploys]
    if other:
        summary["steps_ms"]["other"] = {"median": round(c.median(other), 2), "p90": round(c.pct(other, 90), 2),
                                        "max": round(max(other), 2)}
    return summary


# --- report ---------------------------------------------------------------------------------------------


def run(args: argparse.Namespace, console: Any) -> dict[str, Any]:
    machine = c.machine_info()
    with c.workspace(NAME, keep=args.keep) as base:
        e2e = end_to_end(args, base, console)
        console.print("[dim]in-process deploys[/dim]")
        inproc = in_process(args, base, console)
    report = c.base_report(NAME, args.argv, args.quick, machine)
    report.update({"settings": {"trials": args.trials, "deploys": args.deploys, "settle_s": args.settle,
                                "poll_secs": 1},
                   "end_to_end": e2e, "in_process": inproc})
    report["rows"] = [r.to_json() for r in rows(report)]
    return report


def rows(report: dict[str, Any]) -> list[c.Row]:
    out: list[c.Row] = []
    e2e = report["end_to_end"]
    for system in ("tritonctl", "Triton poll"):
        s = e2e[system]
        note = f"{s['trials']} trials" + (f", {s['timeouts']} timed out" if s["timeouts"] else "")
        if system == "tritonctl":
            note += f"; includes the {s['settle_s']:g} s settle window"
        else:
            note += "; includes up to 1 s waiting for the next poll"
        out.append(c.Row("last close -> first new answer, median / p90", system,
                         "-" if s["median_s"] is None else f"{s['median_s']:.2f} s / {s['p90_s']:.2f} s",
                         value=s["median_s"], note=note))
    s = e2e["tritonctl"]
    if s.get("minus_settle_median_s") is not None:
        deploy = s.get("deploy_ms_median")
        out.append(c.Row("  ... less the settle window, median / p90", "tritonctl",
                         f"{s['minus_settle_median_s']:.2f} s / {s['minus_settle_p90_s']:.2f} s",
                         value=s["minus_settle_median_s"],
                         note="" if deploy is None else f"of which the deploy (audit duration) {deploy:.0f} ms median"))
    steps = report["in_process"]["steps_ms"]
    for step, label in STEP_LABELS.items():
        if step in steps:
            out.append(c.Row(f"  {label}", "tritonctl (in-process)",
                             f"{steps[step]['median']:.1f} ms", value=steps[step]["median"],
                             note=f"p90 {steps[step]['p90']:.1f} ms"))
    if "other" in steps:
        out.append(c.Row("  other (gRPC progress, locks, Python)", "tritonctl (in-process)",
                         f"{steps['other']['median']:.1f} ms", value=steps["other"]["median"]))
    if "overhead" in steps:
        o = steps["overhead"]
        out.append(c.Row("overhead per deploy, excluding Triton's load (median)", "tritonctl (in-process)",
                         f"{o['median']:.1f} ms", f"<= {TARGET_OVERHEAD_MS:g} ms", o["median"] <= TARGET_OVERHEAD_MS,
                         f"p90 {o['p90']:.1f} ms, max {o['max']:.0f} ms over {report['in_process']['deploys']} "
                         "deploys", value=o["median"]))
    if report["in_process"]["failures"]:
        out.append(c.Row("in-process deploys that failed", "tritonctl (in-process)",
                         str(len(report["in_process"]["failures"])), "0", False,
                         report["in_process"]["failures"][0][:120]))
    return out


def render(report: dict[str, Any], console: Any) -> None:
    s = report["settings"]
    c.render_rows(f"change latency: {s['trials']} trials per system (alternating), tritonctl settle "
                  f"{s['settle_s']:g} s, Triton poll every {s['poll_secs']} s; {s['deploys']} in-process deploys",
                  [c.Row(**r) for r in report["rows"]], console, c.machine_line(report["machine"]))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="3 trials per system, 8 in-process deploys")
    parser.add_argument("--trials", type=int, help="end-to-end trials per system (default 20; 3 with --quick)")
    parser.add_argument("--deploys", type=int, help="timed in-process deploys (default 50; 8 with --quick)")
    parser.add_argument("--settle", type=float, default=1.0, help="tritonctl's settle window (s)")
    parser.add_argument("--timeout", type=float, default=30.0, help="per trial (s)")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    args = parser.parse_args(argv)
    args.argv = argv
    args.trials = args.trials or (3 if args.quick else 20)
    args.deploys = args.deploys or (8 if args.quick else 50)
    console = c.make_console()
    started = time.monotonic()
    report = run(args, console)
    report["runtime_s"] = round(time.monotonic() - started, 1)
    render(report, console)
    console.print(f"runtime {report['runtime_s']:.0f} s")
    c.write_report(c.results_path(NAME, args.quick, args.out), report, console)
    return 1 if args.check and any(r["met"] is False for r in report["rows"]) else 0


if __name__ == "__main__":
    sys.exit(main())
