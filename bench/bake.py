"""Bad deploys under live traffic, side by side: tritonctl's defaults (gateway, canary steps), tritonctl without
its gateway baking 30 s, and Triton alone (poll mode).

Issue 55's benchmark (issue 38's before it). Three systems run at once, each on its own repository serving model
`bake`, each with a client of `--rate` requests/s in all (`--threads` threads, uniform random inputs) throughout:

  * tritonctl, defaults: `tritonctl daemon --launch-triton` as installed: clients go through its gateway, a new
    digest first takes 10 % of the requests for 60 s (`canary_steps = [10, 100]`, `bake_s = 60`, failure ratio
    0.01 over at least 20 requests), judged on the gateway's figures of that digest alone;
  * tritonctl --no-gateway, bake 30 s: `--no-gateway --bake 30s`: Triton reloads the model in place, every
    request goes to the new version at once, which bakes on Triton's own figures;
  * Triton poll (`--repository-poll-secs=1`): Triton reloads the repository's edits itself, never rolls back.

The same script reaches all three at the same moments. `--rounds` failing deploys: a version that raises in
`execute` for a fifth of its inputs (0.6 < x < 0.8) but passes its smoke test, left `--window` seconds (the time
until someone would notice; in production much longer). Then one slow deploy: a version 50 ms slower per request,
whose config sets `tritonctl.bake_max_latency_ratio: 2` (the latency limit is off by default), left
`--slow-window` seconds. After each, a good version is written everywhere (its config switches it at once,
`tritonctl.canary_steps: [100]`, `tritonctl.bake_s: 0s`, so that the next round starts from a settled version;
the bad versions take each system's settings) and awaited.

Measured per system and bad deploy: the failed requests clients saw; whether the bad version was rolled back and
when (the last answer clients got from it, and the daemon's audited rollback, each counted from the first
failure, or for the slow version from the write); the canary step it was rolled back at. Targets (issue 55), for
the defaults: a failing deploy costs at most 20 failed requests and is rolled back within 10 s of its first
failure; the slow version is rolled back by the latency limit at its first step (10 %), failing no request.

    python bench/bake.py                # 3 failing deploys of 15 s and a slow one of 30 s (about 3 minutes)
    python bench/bake.py --quick        # 1 failing deploy of 10 s and a slow one of 20 s
    python bench/bake.py --plot         # also draw docs/bake.png (failed requests over time)
    python bench/bake.py --replot bench/results/bake.json   # only the plot, from a results file
"""

from __future__ import annotations

import argparse
import random
import re
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as c  # noqa: E402
import numpy as np  # noqa: E402
import tritonclient.grpc as grpcclient  # noqa: E402

from tests.harness import DaemonProcess  # noqa: E402
from tests.test_canary_e2e import write_model  # noqa: E402 - the canary e2e test's model

NAME = "bake"
MODEL = "bake"
DEFAULTS, NO_GATEWAY, POLL = "tritonctl, defaults", "tritonctl --no-gateway, bake 30 s", "Triton poll"
SYSTEMS = (DEFAULTS, NO_GATEWAY, POLL)
DAEMONS = (DEFAULTS, NO_GATEWAY)
PLOT = c.ROOT / "docs" / "bake.png"
SLOW_DELAY_S = 0.05
LATENCY_LIMIT = "2"
MAX_FAILED = 20  # issue 55's targets, with the defaults
MAX_ROLLBACK_S = 10.0


def good(repo: Path, gen: int) -> None:
    write_model(repo, MODEL, gen, steps="[100]", bake_s="0s")


@contextmanager
def clients(url: str, rate: float, threads: int) -> Iterator[dict[str, Any]]:
    """`threads` clients sending about `rate` requests/s in all; each result with the wall time it came back."""
    seen: dict[str, Any] = {"ok": [], "failed": []}  # (time.time(), generation or error)
    stop = threading.Event()
    lock = threading.Lock()

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        client = grpcclient.InferenceServerClient(url)
        started, sent = time.monotonic(), 0
        try:
            while not stop.is_set():
                x = grpcclient.InferInput("x", [1, 1], "FP32")
                x.set_data_from_numpy(np.array([[rng.random()]], dtype=np.float32))
                try:
                    gen = float(client.infer(MODEL, [x], client_timeout=10).as_numpy("gen")[0][0])
                    with lock:
                        seen["ok"].append((time.time(), gen))
                except Exception as exc:  # noqa: BLE001 - counted and reported
                    with lock:
                        seen["failed"].append((time.time(), " ".join(str(exc).split())[:200]))
                sent += 1
                stop.wait(max(0.0, started + sent * threads / rate - time.monotonic()))
        finally:
            client.close()

    workers = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(threads)]
    for w in workers:
        w.start()
    try:
        yield seen
    finally:
        stop.set()
        for w in workers:
            w.join(15)


def answered(seen: dict[str, Any], gen: int, since: float) -> bool:
    return any(t >= since and g == float(gen) for t, g in seen["ok"][-100:])


def rollback_audit(state: Path, since: float) -> dict[str, Any] | None:
    """The daemon's rollback of the bad version (outcome rolled_back) audited after `since` (wall time)."""
    for row in reversed(c.audit_rows(state, MODEL)):
        if row["action"] == "rollback" and row["outcome"] == "rolled_back" and epoch(row["time"]) >= since:
            return row
    return None


def epoch(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def round_figures(seen: dict[str, Any], start: float, end: float, bad: int, audit: dict[str, Any] | None,
                  slow: bool) -> dict[str, Any]:
    """What one system's clients saw of one bad deploy written at `start` (wall time) and replaced at `end`."""
    failed = sorted(t for t, _ in seen["failed"] if start <= t <= end)
    ok = [(t, g) for t, g in seen["ok"] if start <= t <= end]
    bad_answers = sorted(t for t, g in ok if g == float(bad))
    first = failed[0] if failed and not slow else (bad_answers[0] if slow and bad_answers else None)
    last_bad = max(failed[-1:] + bad_answers[-1:], default=None)
    audited = epoch(audit["time"]) if audit is not None else None
    rolled_back = audited is not None
    message = str(audit["message"]) if audit is not None else ""
    at_step = re.search(r"at (\d+% \(step \d+/\d+\))", message)
    step = at_step.group(1) if at_step else None
    return {
        "requests": len(failed) + len(ok), "failed": len(failed), "bad_answered": len(bad_answers),
        "first_failure_s": round(failed[0] - start, 3) if failed else None,
        "rolled_back": rolled_back, "cause": message.split(": ", 1)[1][:160] if ": " in message else message[:160],
        "step": step,
        # from the first failure (the failing version) or the write (the slow one): the daemon's rollback, and
        # the last answer clients got from the bad version (a failure or its generation)
        "rollback_s": round(audited - (first if not slow and first is not None else start), 3)
        if audited is not None and (slow or first is not None) else None,
        "last_bad_answer_s": round(last_bad - (first if not slow and first is not None else start), 3)
        if last_bad is not None and rolled_back else None,
    }


def run(args: argparse.Namespace, console: Any) -> dict[str, Any]:
    machine = c.machine_info()
    rounds: dict[str, list[dict[str, Any]]] = {s: [] for s in SYSTEMS}
    timeline: dict[str, list[float]] = {}
    marks: list[dict[str, Any]] = []
    audits: dict[str, list[dict[str, Any]]] = {}
    with c.workspace(NAME, keep=args.keep) as base:
        repos = {s: base / f"repo-{i}" for i, s in enumerate(SYSTEMS)}
        for repo in repos.values():
            repo.mkdir()
            good(repo, 1)
        states = {DEFAULTS: base / "state-defaults", NO_GATEWAY: base / "state-no-gateway"}
        daemons = {
            DEFAULTS: DaemonProcess(repos[DEFAULTS], states[DEFAULTS], settle_s=args.settle, switch_at_once=False,
                                    auto_complete=True, extra_args=["--policy", "auto"],
                                    env={"TRITONCTL_RECONCILE_INTERVAL_S": "10"}),
            NO_GATEWAY: c.daemon_process(repos[NO_GATEWAY], states[NO_GATEWAY], args.settle,
                                         extra=["--no-gateway", "--bake", f"{args.bake:g}s"]),
        }
        poll = c.triton_server(repos[POLL], base / "poll-work", mode="poll", poll_secs=1)
        with ExitStack() as stack:
            poll.start()
            stack.callback(poll.stop)
            for daemon in daemons.values():
                daemon.start()
                stack.callback(daemon.stop)
            urls = {**{s: c.inference_url(d) for s, d in daemons.items()}, POLL: poll.grpc_url}
            seen = {s: stack.enter_context(clients(urls[s], args.rate, args.threads)) for s in SYSTEMS}
            for system in SYSTEMS:
                if not c.wait_until(lambda s=system: answered(seen[s], 1, 0.0), 90, 0.1):
                    raise SystemExit(f"{system}: generation 1 not served within 90 s")
            time.sleep(2.0)  # the previous version's latency and traffic before the first bad deploy
            origin = time.time()
            gen = 1
            plan = ["failing"] * args.rounds + ["slow"] * args.slow_rounds
            for kind in plan:
                slow = kind == "slow"
                bad, gen = gen + 1, gen + 2
                start = time.time()
                marks.append({"kind": kind, "at_s": round(start - origin, 3)})
                for repo in repos.values():
                    write_model(repo, MODEL, bad, failing=not slow, delay_s=SLOW_DELAY_S if slow else 0.0,
                                latency_ratio=LATENCY_LIMIT if slow else "")
                time.sleep(args.slow_window if slow else args.window)
                end = time.time()
                for system in SYSTEMS:
                    audit = rollback_audit(states[system], start) if system in states else None
                    rounds[system].append({"kind": kind, **round_figures(seen[system], start, end, bad, audit, slow)})
                after = time.time()
                for repo in repos.values():
                    good(repo, gen)
                for system in SYSTEMS:
                    if not c.wait_until(lambda s=system, g=gen, t=after: answered(seen[s], g, t), 90, 0.1):
                        raise SystemExit(f"{system}: generation {gen} not served within 90 s")
                console.print(f"[dim]{kind} deploy {len(rounds[DEFAULTS])}/{len(plan)}: "
                              + ", ".join(f"{s} {rounds[s][-1]['failed']} failed" for s in SYSTEMS) + "[/dim]")
            for system in SYSTEMS:
                timeline[system] = [round(t - origin, 3) for t, _ in seen[system]["failed"] if t >= origin]
            for system, state in states.items():
                audits[system] = [{k: r[k] for k in ("time", "actor", "action", "outcome", "digest", "message")}
                                  for r in c.audit_rows(state, MODEL) if r["action"] in ("bake", "rollback", "canary")]
    report = c.base_report(NAME, args.argv, args.quick, machine)
    report.update({
        "settings": {"rounds": args.rounds, "slow_rounds": args.slow_rounds, "window_s": args.window,
                     "slow_window_s": args.slow_window, "rate": args.rate, "threads": args.threads,
                     "no_gateway_bake_s": args.bake, "defaults": {"canary_steps": [10, 100], "bake_s": 60,
                                                                  "bake_max_failure_ratio": 0.01,
                                                                  "bake_min_requests": 20},
                     "failing_inputs": "0.6 < x < 0.8 (a fifth of uniform inputs), raising in execute",
                     "slow_delay_s": SLOW_DELAY_S, "slow_latency_limit": float(LATENCY_LIMIT), "settle_s": args.settle,
                     "poll_secs": 1},
        "systems": {s: summarise(rounds[s]) for s in SYSTEMS},
        "timeline": {"bad_deploys": marks, "bad_deploys_s": [m["at_s"] for m in marks], "failed_s": timeline},
        "audit": audits,
    })
    report["rows"] = [r.to_json() for r in rows(report)]
    return report


def summarise(per_round: list[dict[str, Any]]) -> dict[str, Any]:
    failing = [r for r in per_round if r["kind"] == "failing"]
    slow = [r for r in per_round if r["kind"] == "slow"]
    back = [r["rollback_s"] for r in failing if r["rollback_s"] is not None]
    seen_back = [r["last_bad_answer_s"] for r in failing if r["last_bad_answer_s"] is not None]
    return {
        "rounds": per_round,
        "failing": {
            "deploys": len(failing), "failed_requests": sum(r["failed"] for r in failing),
            "requests": sum(r["requests"] for r in failing), "failed_per_deploy": [r["failed"] for r in failing],
            "max_failed_per_deploy": max((r["failed"] for r in failing), default=None),
            "rolled_back": sum(1 for r in failing if r["rolled_back"]),
            "rollback_s": back, "rollback_max_s": max(back) if back else None,
            "rollback_median_s": round(c.median(back), 3) if back else None,
            "last_bad_answer_max_s": max(seen_back) if seen_back else None,
            "steps": [r["step"] for r in failing],
        },
        "slow": {
            "deploys": len(slow), "failed_requests": sum(r["failed"] for r in slow),
            "rolled_back": sum(1 for r in slow if r["rolled_back"]),
            "by_latency": sum(1 for r in slow if r["rolled_back"] and "latency" in r["cause"]),
            "steps": [r["step"] for r in slow], "rollback_s": [r["rollback_s"] for r in slow],
            "bad_answered": [r["bad_answered"] for r in slow],
        },
    }


def rows(report: dict[str, Any]) -> list[c.Row]:
    out: list[c.Row] = []
    n = report["settings"]["rounds"]
    for system in SYSTEMS:
        f = report["systems"][system]["failing"]
        target = system == DEFAULTS
        worst = f["max_failed_per_deploy"]
        out.append(c.Row("failing deploy: failed requests clients saw (most in one deploy)", system,
                         f"{f['failed_requests']} of {f['requests']} (most {worst})",
                         f"≤ {MAX_FAILED} per deploy" if target else "-",
                         (worst is not None and worst <= MAX_FAILED) if target else None,
                         "per deploy: " + ", ".join(map(str, f["failed_per_deploy"])), value=f["failed_requests"]))
    for system in SYSTEMS:
        f = report["systems"][system]["failing"]
        target = system == DEFAULTS
        med, mx = f["rollback_median_s"], f["rollback_max_s"]
        measured = f"{f['rolled_back']} of {n}" + (f", median {med:.2f} s, max {mx:.2f} s" if med is not None else "")
        steps = sorted({s for s in f["steps"] if s})
        note = ("never rolls back" if system == POLL else
                f"at {', '.join(steps)}; " if steps else "") + (
            f"last answer from it {f['last_bad_answer_max_s']:.2f} s after the first failure at most"
            if f["last_bad_answer_max_s"] is not None else "")
        out.append(c.Row("failing deploy: rolled back, first failed request → rollback", system, measured,
                         f"{n} of {n}, ≤ {MAX_ROLLBACK_S:g} s" if target else "-",
                         (f["rolled_back"] == n and mx is not None and mx <= MAX_ROLLBACK_S) if target else None,
                         note, value=mx))
    for system in SYSTEMS:
        s = report["systems"][system]["slow"]
        target = system == DEFAULTS
        steps = [x for x in s["steps"] if x]
        at_first = bool(steps) and all(x.startswith("10%") for x in steps)
        measured = (f"{s['by_latency']} of {s['deploys']} by the latency limit"
                    + (f", at {', '.join(steps)}" if steps else "") + f"; {s['failed_requests']} failed")
        out.append(c.Row(f"version {SLOW_DELAY_S * 1000:.0f} ms slower: rolled back", system, measured,
                         "by the latency limit at its first step, 0 failed" if target else "-",
                         (s["by_latency"] == s["deploys"] and at_first and s["failed_requests"] == 0)
                         if target else None,
                         "never rolls back" if system == POLL else
                         "answers from it: " + ", ".join(map(str, s["bad_answered"])), value=s["by_latency"]))
    return out


def render(report: dict[str, Any], console: Any) -> None:
    s = report["settings"]
    c.render_report(f"bad deploys: {s['rounds']} failing a fifth of requests ({s['window_s']:g} s each), "
                    f"{s['slow_rounds']} {SLOW_DELAY_S * 1000:.0f} ms slower ({s['slow_window_s']:g} s); "
                    f"{s['rate']:g} requests/s per system", report, console)


def plot(report: dict[str, Any], path: Path) -> None:
    """Each system's failed requests, cumulative over time, the bad deploys marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.5), dpi=100)
    failed = report["timeline"]["failed_s"]
    marks = report["timeline"]["bad_deploys"]
    end = max([t for times in failed.values() for t in times] + [marks[-1]["at_s"] + report["settings"]["window_s"]])
    for system, times in failed.items():
        ax.step([0.0, *times, end], [*range(len(times) + 1), len(times)], where="post", label=system)
    for mark in marks:
        style = ":" if mark["kind"] == "failing" else "--"
        label = {"failing": "a version failing a fifth of requests written",
                 "slow": f"a version {SLOW_DELAY_S * 1000:.0f} ms slower written"}[mark["kind"]]
        first = next(m for m in marks if m["kind"] == mark["kind"]) is mark
        ax.axvline(mark["at_s"], color="grey", linestyle=style, label=label if first else None)
    s = report["settings"]
    ax.set_xlabel("seconds since the first bad version was written")
    ax.set_ylabel("failed requests (cumulative)")
    ax.set_yscale("symlog", linthresh=20)
    ax.set_ylim(bottom=0)
    commit = c.short_commit(report.get("git_commit") or c.git_commit())
    ax.set_title(f"bad deploys, {s['rate']:g} requests/s per system; commit {commit}", fontsize=10)
    ax.legend(loc="upper left", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 failing deploy of 10 s, a slow one of 20 s (CI)")
    parser.add_argument("--rounds", type=int, help="failing deploys (default 3; 1 with --quick)")
    parser.add_argument("--slow-rounds", type=int, default=1, help="slow deploys (default 1)")
    parser.add_argument("--window", type=float, help="seconds each failing version is left (default 15; 10 quick)")
    parser.add_argument("--slow-window", type=float, help="seconds the slow version is left (default 30; 20 quick)")
    parser.add_argument("--bake", type=float, default=30.0, help="the --no-gateway daemon's bake_s")
    parser.add_argument("--rate", type=float, default=50.0, help="requests/s per system (the issue's client: 50)")
    parser.add_argument("--threads", type=int, default=2, help="client threads per system")
    parser.add_argument("--settle", type=float, default=0.5, help="tritonctl's settle window (s)")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--plot", action="store_true", help=f"also draw {PLOT.relative_to(c.ROOT)}")
    parser.add_argument("--replot", type=Path, metavar="RESULTS", help="only draw the plot from a results file")
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--replot" in argv:
        import json

        plot(json.loads(Path(argv[argv.index("--replot") + 1]).read_text()), PLOT)
        print(f"plot: {PLOT}")
        return 0

    def prepare(args: argparse.Namespace) -> None:
        args.rounds = args.rounds if args.rounds is not None else (1 if args.quick else 3)
        args.window = args.window or (10.0 if args.quick else 15.0)
        args.slow_window = args.slow_window or (20.0 if args.quick else 30.0)

    def render_and_plot(report: dict[str, Any], console: Any) -> None:
        render(report, console)
        if "--plot" in argv:
            plot(report, PLOT)
            report["plot"] = PLOT.name
            console.print(f"plot: {PLOT}")

    return c.bench_main(NAME, parser, argv, run, prepare=prepare, render=render_and_plot, timed=True)


if __name__ == "__main__":
    sys.exit(main())
