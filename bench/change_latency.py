"""Change latency: from the writer's last close() to the first answer from the new content.

Part 1, side by side: tritonctl (`tritonctl daemon --launch-triton`, policy auto, settle 1.0 s) and
Triton poll mode (`--repository-poll-secs=1`) run at once on two identical repositories; each trial
writes a new generation (config.pbtxt + 1/model.py, whole files) into one system's repository, the
systems taking turns (who goes first alternates), while a fast probe asks that system until the new
generation answers. tritonctl's latency is shown whole and less its settle window (the time it
waits on purpose, to never catch a writer mid-edit), with its deploy time from the audit log.

Part 1b, "taken at once" (issue 15, item 3): a second daemon with `--commit-marker DONE` and a long
settle window (5 s); each trial (a) renames a finished model directory (with its marker) into the
repository, (b) writes a model in place, then creates its marker. Latency: rename / marker -> first
answer; Triton's own load of that model is read from its log ("loading: m:1" -> "successfully loaded
'm'"), and the latency less that load is what tritonctl adds (target <= 0.3 s, no settle window).

Part 2, tritonctl's own overhead per change, in-process: the core (`controlplane.control_plane.ControlPlane`
with its Deployer, content store, SQLite registry and serving repository) against a real tritonserver
in explicit mode, driven by its real RepositoryWatcher (inotify) with a commit marker and a 5 s settle
window: each change removes the marker, writes a new generation in place and creates the marker; the
time runs from the marker's creation (the inotify event) until the deploy is committed (the
watcher's callback returns), step by step: the watcher's hand-off (inotify delivery, debounce
thread), snapshot (ContentStore.capture), offline validation, registry records (snapshot, deployment
intent, steps, commit, audit), publish (fresh tree + atomic link swap), Triton's load, verify (READY +
served digest). Overhead = that wall time less Triton's load. Target: median <= 50 ms.

    python bench/change_latency.py            # 20 trials per system, 50 in-process deploys
    python bench/change_latency.py --quick    # 3 trials per system, 8 in-process deploys
"""

from __future__ import annotations

import argparse
import functools
import os
import re
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
TARGET_AT_ONCE_S = 0.3
MARKER = "DONE"
AT_ONCE_SETTLE_S = 5.0


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


# --- part 1b: renamed in / commit marker, captured at once -------------------------------------------

_TRITON_LOG_TIME = re.compile(r"^[IWE]\d{4} (\d\d):(\d\d):(\d\d\.\d+) ")


def triton_load_s(log_text: str, model: str) -> float | None:
    """Triton's own load of `model` from its log: the first "loading: model:" line to the
    "successfully loaded 'model'" line (timestamps of Triton's default log format)."""
    start = end = None
    served = c.served_as(model)
    for line in log_text.splitlines():
        m = _TRITON_LOG_TIME.match(line)
        if m is None:
            continue
        t = int(m.group(1)) * 3600 + int(m.group(2)) * 60 + float(m.group(3))
        if start is None and re.search(rf"loading: {served}:", line):
            start = t
        elif start is not None and re.search(rf"successfully loaded '{served}'", line):
            end = t
            break
    if start is None or end is None:
        return None
    return (end - start) % 86400


def at_once(args: argparse.Namespace, base: Path, console: Any) -> dict[str, Any]:
    repo, staging = base / "at-once-repo", base / "at-once-staging"
    repo.mkdir()
    staging.mkdir()
    daemon = c.daemon_process(repo, base / "at-once-state", AT_ONCE_SETTLE_S, extra=["--commit-marker", MARKER])
    results: dict[str, list[dict[str, Any]]] = {"renamed in": [], "commit marker": []}
    timeouts = {k: 0 for k in results}
    try:
        daemon.start()
        url = daemon.triton_url()
        for trial in range(args.trials):
            for pattern in results:
                model = f"{'moved' if pattern == 'renamed in' else 'marked'}{trial}"
                if pattern == "renamed in":
                    staged = c.write_pair_model(staging, model, 1)
                    (staged / MARKER).touch()
                    t0 = time.monotonic()
                    os.rename(staged, repo / model)
                else:
                    c.write_pair_model(repo, model, 1)
                    time.sleep(0.3)
                    t0 = time.monotonic()
                    (repo / model / MARKER).touch()
                first = c.serves(url, model, 1, args.timeout)
                if first is None:
                    timeouts[pattern] += 1
                    continue
                results[pattern].append({"model": model, "latency_s": first - t0})
                time.sleep(0.2)
            console.print(f"[dim]at once {trial + 1}/{args.trials}: " + ", ".join(
                f"{p} {r[-1]['latency_s']:.2f} s" for p, r in results.items() if r) + "[/dim]")
    finally:
        daemon.stop()
    log_text = "\n".join(p.read_text(errors="replace") for p in (base / "at-once-state").rglob("tritonserver.log"))
    out: dict[str, Any] = {"settle_s": AT_ONCE_SETTLE_S, "commit_marker": MARKER}
    for pattern, trials in results.items():
        for t in trials:
            load = triton_load_s(log_text, t["model"])
            t["triton_load_s"] = load
            t["added_s"] = None if load is None else t["latency_s"] - load
        lat = [t["latency_s"] for t in trials]
        loads = [t["triton_load_s"] for t in trials if t["triton_load_s"] is not None]
        added = [t["added_s"] for t in trials if t["added_s"] is not None]
        out[pattern] = {
            "trials": [{k: (round(v, 4) if isinstance(v, float) else v) for k, v in t.items()} for t in trials],
            "timeouts": timeouts[pattern],
            "latency_median_s": round(c.median(lat), 4) if lat else None,
            "triton_load_median_s": round(c.median(loads), 4) if loads else None,
            "added_median_s": round(c.median(added), 4) if added else None,
            "added_p90_s": round(c.pct(added, 90), 4) if added else None,
        }
    return out


# --- part 2: tritonctl's overhead per deploy, in-process -------------------------------------------------

STEP_LABELS = {
    "handoff": "watcher hand-off (inotify, debounce thread)",
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
    import controlplane.intake.recording as service_module  # validation runs in the shared pipeline
    from controlplane.control_plane import ControlPlane
    from controlplane.deploy.publish import ServingRepository
    from controlplane.parts import build_parts
    from controlplane.settings.config import Settings
    from controlplane.snapshot import ContentStore
    from controlplane.source.inotify import RepositoryWatcher
    from controlplane.source.local import LocalSource
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
        settings = Settings(repository=source, state_dir=state, commit_marker=MARKER, settle_s=AT_ONCE_SETTLE_S)
        triton = TritonClient(server.grpc_url)
        store = ContentStore(state / "store")  # as the daemon makes it (fsync on)
        serving = ServingRepository(state / "serving", state / "published")
        plane = ControlPlane(build_parts(settings, registry, store, serving, triton,
                                         source=LocalSource(source, settle_s=AT_ONCE_SETTLE_S, commit_marker=MARKER)))
        timer = StepTimer()
        timer.wrap(plane.store, "capture", "capture")
        original_validate = service_module.validate_model_dir
        timer.wrap(service_module, "validate_model_dir", "validate")
        timer.wrap(registry, "record_snapshot", "record")
        for method in ("ensure_model", "find_model", "get_model", "get_snapshot", "begin_deployment", "advance",
                       "finish_deployment", "audit", "set_quarantine", "update_model"):
            timer.wrap(registry, method, "registry")
        timer.wrap(plane.deployer.steps, "publish", "publish")
        timer.wrap(plane.deployer.steps, "verify", "verify")
        timer.wrap(plane.serving, "prune", "prune")
        timer.wrap(triton, "load", "load")
        timer.wrap(registry, "last_deployment", "registry")
        deploys: list[dict[str, float]] = []
        failures: list[str] = []
        box: dict[str, Any] = {}
        done = threading.Event()

        def on_complete(model: str) -> None:
            first = "start" not in box
            if first:
                box["start"] = time.perf_counter()
            try:
                outcome = plane.handle_settled(model, complete=True)
            finally:
                if first:
                    box["end"], box["outcome"] = time.perf_counter(), outcome
                    done.set()

        watcher = RepositoryWatcher(source, lambda _m: None, AT_ONCE_SETTLE_S, commit_marker=MARKER,
                                    on_complete=on_complete)
        watcher.start()
        marker, staged_marker = source / MODEL / MARKER, base / "inproc-marker"
        try:
            for i in range(args.deploys + 2):  # the first two warm up (first load, imports) and are dropped
                marker.unlink(missing_ok=True)
                c.write_pair_model(source, MODEL, i + 1)  # in place: would wait the 5 s settle window
                staged_marker.touch()
                time.sleep(0.3)  # the last change's callback (if any) is over
                box.clear()
                done.clear()
                timer.take()
                t0 = time.perf_counter()
                os.rename(staged_marker, marker)  # one inotify event: the writer says "complete"
                if not done.wait(args.timeout):
                    failures.append(f"deploy {i + 1}: not committed within {args.timeout:g} s")
                    continue
                total = box["end"] - t0
                steps = timer.take()
                steps["handoff"] = box["start"] - t0
                outcome = box["outcome"]
                if outcome is None or outcome.outcome != "ok":
                    failures.append(f"deploy {i + 1}: {getattr(outcome, 'outcome', None)}: "
                                    f"{getattr(outcome, 'message', 'no deploy')}")
                    continue
                if i >= 2:
                    steps["total"] = total
                    steps["overhead"] = total - steps.get("load", 0.0)
                    deploys.append(steps)
        finally:
            watcher.stop()
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
    accounted = ("handoff", "capture", "validate", "record", "registry", "publish", "verify", "prune")
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
        console.print("[dim]renamed in / commit marker[/dim]")
        e2e["at_once"] = at_once(args, base, console)
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
    once = e2e.get("at_once") or {}
    for pattern in ("renamed in", "commit marker"):
        r = once.get(pattern)
        if not r or r["latency_median_s"] is None:
            continue
        out.append(c.Row(f"{pattern} -> first answer, median", "tritonctl", f"{r['latency_median_s']:.2f} s",
                         value=r["latency_median_s"],
                         note=f"{len(r['trials'])} trials, settle window {once['settle_s']:g} s not waited"
                         + (f", {r['timeouts']} timed out" if r["timeouts"] else "")))
        if r["added_median_s"] is not None:
            out.append(c.Row(f"  ... less Triton's own load ({pattern}), median", "tritonctl",
                             f"{r['added_median_s']:.2f} s", f"<= {TARGET_AT_ONCE_S:g} s",
                             r["added_median_s"] <= TARGET_AT_ONCE_S,
                             f"p90 {r['added_p90_s']:.2f} s; Triton's load {r['triton_load_median_s']:.2f} s median "
                             "(its log)", value=r["added_median_s"]))
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
        out.append(c.Row("inotify event -> committed, excluding Triton's load (median)", "tritonctl (in-process)",
                         f"{o['median']:.1f} ms", f"<= {TARGET_OVERHEAD_MS:g} ms", o["median"] <= TARGET_OVERHEAD_MS,
                         f"p90 {o['p90']:.1f} ms, max {o['max']:.0f} ms over {report['in_process']['deploys']} "
                         "changes (commit marker, no settle window)", value=o["median"]))
    if report["in_process"]["failures"]:
        out.append(c.Row("in-process deploys that failed", "tritonctl (in-process)",
                         str(len(report["in_process"]["failures"])), "0", False,
                         report["in_process"]["failures"][0][:120]))
    return out


def render(report: dict[str, Any], console: Any) -> None:
    s = report["settings"]
    c.render_report(f"change latency: {s['trials']} trials per system (alternating), tritonctl settle "
                    f"{s['settle_s']:g} s, Triton poll every {s['poll_secs']} s; {s['deploys']} in-process deploys",
                    report, console)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="3 trials per system, 8 in-process deploys")
    parser.add_argument("--trials", type=int, help="end-to-end trials per system (default 20; 3 with --quick)")
    parser.add_argument("--deploys", type=int, help="timed in-process deploys (default 50; 8 with --quick)")
    parser.add_argument("--settle", type=float, default=1.0, help="tritonctl's settle window (s)")
    parser.add_argument("--timeout", type=float, default=30.0, help="per trial (s)")
    parser.add_argument("--keep", action="store_true")

    def prepare(args: argparse.Namespace) -> None:
        args.trials = args.trials or (3 if args.quick else 20)
        args.deploys = args.deploys or (8 if args.quick else 50)

    return c.bench_main(NAME, parser, argv, run, prepare=prepare, render=render, timed=True)


if __name__ == "__main__":
    sys.exit(main())
