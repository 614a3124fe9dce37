"""Bad deploys under live traffic: tritonctl with a bake, tritonctl without one, and Triton alone (poll mode).

Issue 38's benchmark. Three systems run at once, each on its own repository serving model `bake`, each
with `--clients` closed-loop client threads sending uniform random inputs throughout:

  * tritonctl, bake: `tritonctl daemon --launch-triton --bake BAKE_S` (failure limit 0.01 over at least 20
    requests, the defaults): a new version serves and bakes on Triton's own figures;
  * tritonctl, no bake: the same daemon without `--bake` (bake_s 0, the default);
  * Triton poll (`--repository-poll-secs=1`): Triton reloads the repository's edits itself and never
    rolls back.

The same script runs on all three at the same moments: ROUNDS bad deploys, each a version that raises in
`execute` on inputs above 0.8 (a fifth of the requests: what Triton counts as a failure) but passes its
smoke test (input 0). Each bad version is left WINDOW_S seconds (the time until someone would notice; in
production much longer), then a good version is written everywhere and awaited before the next round.
Measured per system: the failed requests clients saw in the bad versions' windows, and, where the bad
version was rolled back (clients get the previous generation's answers again), the time from the first
failed request to the rollback (the first answer of the previous generation after it).

    python bench/bake.py                # 3 bad deploys, 15 s windows (about 2 minutes)
    python bench/bake.py --quick        # 1 bad deploy, 8 s window
    python bench/bake.py --plot         # also draw docs/bake.png (failed requests over time)
    python bench/bake.py --replot bench/results/bake.json   # only the plot, from a results file
"""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as c  # noqa: E402

from tests.test_bake_e2e import clients, write_model  # noqa: E402 - the e2e test's model and clients

NAME = "bake"
MODEL = "bake"
SYSTEMS = ("tritonctl, bake", "tritonctl, no bake", "Triton poll")
PLOT = c.ROOT / "docs" / "bake.png"


def good_gen(round_index: int) -> int:
    """The good generation serving before bad round `round_index` (0-based): 1, 3, 5, ..."""
    return 2 * round_index + 1


def bad_gen(round_index: int) -> int:
    return 2 * round_index + 2


def serving_gen(seen: dict[str, Any], gen: int, since: float) -> bool:
    return any(t >= since and g == float(gen) for t, g in seen["ok"][-50:])


def round_figures(seen: dict[str, Any], start: float, end: float, previous: int, bad: int) -> dict[str, Any]:
    """What clients of one system saw in one bad deploy's window [start, end] (monotonic seconds)."""
    failed = [t for t, _ in seen["failed"] if start <= t <= end]
    ok = [(t, g) for t, g in seen["ok"] if start <= t <= end]
    first_failure = min(failed) if failed else None
    bad_answered = [t for t, g in ok if g == float(bad)]
    back = None
    if first_failure is not None:
        back = next((t for t, g in ok if t > first_failure and g == float(previous)), None)
        if back is not None and any(t > back for t in bad_answered + failed):
            back = None  # the bad version answered again after: not a rollback
    return {"requests": len(failed) + len(ok), "failed": len(failed),
            "bad_answered": len(bad_answered),
            "first_failure_s": round(first_failure - start, 3) if first_failure is not None else None,
            "rollback_s": round(back - first_failure, 3) if back is not None and first_failure is not None else None}


def run(args: argparse.Namespace, console: Any) -> dict[str, Any]:
    machine = c.machine_info()
    rounds: dict[str, list[dict[str, Any]]] = {s: [] for s in SYSTEMS}
    timeline: dict[str, list[float]] = {}  # each system's failed requests, seconds since the first bad deploy
    marks: list[float] = []
    bake_audit: list[dict[str, Any]] = []
    with c.workspace(NAME, keep=args.keep) as base:
        repos = {s: base / f"repo-{i}" for i, s in enumerate(SYSTEMS)}
        for repo in repos.values():
            repo.mkdir()
            write_model(repo, MODEL, good_gen(0))
        baked = c.daemon_process(repos[SYSTEMS[0]], base / "state-bake", args.settle, extra=["--bake", f"{args.bake}s"])
        plain = c.daemon_process(repos[SYSTEMS[1]], base / "state-plain", args.settle)
        poll = c.triton_server(repos[SYSTEMS[2]], base / "poll-work", mode="poll", poll_secs=1)
        with ExitStack() as stack:
            poll.start()
            stack.callback(poll.stop)
            for daemon in (baked, plain):
                daemon.start()
                stack.callback(daemon.stop)
            urls = {SYSTEMS[0]: baked.triton_url(), SYSTEMS[1]: plain.triton_url(), SYSTEMS[2]: poll.grpc_url}
            seen = {s: stack.enter_context(clients(urls[s], MODEL, args.clients)) for s in SYSTEMS}
            for system in SYSTEMS:
                if not c.wait_until(lambda s=system: serving_gen(seen[s], good_gen(0), 0.0), 90, 0.1):
                    raise SystemExit(f"{system}: generation {good_gen(0)} not served within 90 s")
            time.sleep(1.0)  # the previous version's latency and traffic before the first bad deploy
            origin = time.monotonic()
            for k in range(args.rounds):
                start = time.monotonic()
                marks.append(round(start - origin, 3))
                for repo in repos.values():
                    write_model(repo, MODEL, bad_gen(k), failing=True)
                time.sleep(args.window)
                end = time.monotonic()
                for system in SYSTEMS:
                    rounds[system].append(round_figures(seen[system], start, end, good_gen(k), bad_gen(k)))
                after = time.monotonic()
                for repo in repos.values():
                    write_model(repo, MODEL, good_gen(k + 1))
                for system in SYSTEMS:
                    good = good_gen(k + 1)
                    if not c.wait_until(lambda s=system, g=good, t=after: serving_gen(seen[s], g, t), 90, 0.1):
                        raise SystemExit(f"{system}: generation {good} not served within 90 s")
                console.print(f"[dim]bad deploy {k + 1}/{args.rounds}: "
                              + ", ".join(f"{s} {rounds[s][-1]['failed']} failed" for s in SYSTEMS) + "[/dim]")
            for system in SYSTEMS:
                timeline[system] = [round(t - origin, 3) for t, _ in seen[system]["failed"] if t >= origin]
            bake_audit = [{k: r[k] for k in ("action", "outcome", "digest", "message")}
                          for r in c.audit_rows(base / "state-bake", MODEL) if r["action"] in ("bake", "rollback")]
    report = c.base_report(NAME, args.argv, args.quick, machine)
    report.update({
        "settings": {"rounds": args.rounds, "window_s": args.window, "bake_s": args.bake, "clients": args.clients,
                     "failing_inputs": "x > 0.8 (a fifth of uniform inputs), raising in execute",
                     "bake_max_failure_ratio": 0.01, "bake_min_requests": 20, "settle_s": args.settle,
                     "poll_secs": 1},
        "systems": {s: summarise(rounds[s]) for s in SYSTEMS},
        "timeline": {"bad_deploys_s": marks, "failed_s": timeline},
        "bake_audit": list(reversed(bake_audit)),
    })
    report["rows"] = [r.to_json() for r in rows(report)]
    return report


def summarise(per_round: list[dict[str, Any]]) -> dict[str, Any]:
    rollbacks = [r["rollback_s"] for r in per_round if r["rollback_s"] is not None]
    return {
        "rounds": per_round,
        "failed_requests": sum(r["failed"] for r in per_round),
        "requests": sum(r["requests"] for r in per_round),
        "failed_per_round": [r["failed"] for r in per_round],
        "rolled_back": len(rollbacks),
        "failure_to_rollback_s": rollbacks,
        "failure_to_rollback_median_s": round(c.median(rollbacks), 3) if rollbacks else None,
        "failure_to_rollback_max_s": max(rollbacks) if rollbacks else None,
    }


def rows(report: dict[str, Any]) -> list[c.Row]:
    out: list[c.Row] = []
    n = report["settings"]["rounds"]
    without = report["systems"][SYSTEMS[1]]["failed_requests"]
    for system in SYSTEMS:
        s = report["systems"][system]
        ctl = system == SYSTEMS[0]
        out.append(c.Row("failed requests in the bad versions' windows", system,
                         f"{s['failed_requests']} of {s['requests']}", "fewer than without a bake" if ctl else "-",
                         (s["failed_requests"] < without) if ctl else None,
                         "per bad deploy: " + ", ".join(map(str, s["failed_per_round"])), value=s["failed_requests"]))
    for system in SYSTEMS:
        s = report["systems"][system]
        ctl = system == SYSTEMS[0]
        med, mx = s["failure_to_rollback_median_s"], s["failure_to_rollback_max_s"]
        out.append(c.Row("rolled back by itself: first failed request → rollback", system,
                         f"{s['rolled_back']} of {n}" + (f", median {med:.2f} s, max {mx:.2f} s" if med is not None
                                                         else ""),
                         f"{n} of {n}" if ctl else "-", (s["rolled_back"] == n) if ctl else None,
                         "" if ctl else "never rolls back", value=med))
    return out


def render(report: dict[str, Any], console: Any) -> None:
    s = report["settings"]
    c.render_report(f"bad deploys: {s['rounds']} versions failing a fifth of requests, {s['window_s']} s each, "
                    f"{s['clients']} clients per system; bake {s['bake_s']} s", report, console)


def plot(report: dict[str, Any], path: Path) -> None:
    """Each system's failed requests, cumulative over time (all its clients saw: in the bad versions' windows
    and until the good version that followed served), the bad deploys marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 4.5), dpi=100)
    failed = report["timeline"]["failed_s"]
    end = max([t for times in failed.values() for t in times] + [report["timeline"]["bad_deploys_s"][-1]
                                                                 + report["settings"]["window_s"]])
    for system, times in failed.items():  # every failed request clients saw, the windows' and after them
        ax.step([0.0, *times, end], [*range(len(times) + 1), len(times)], where="post", label=system)
    for i, mark in enumerate(report["timeline"]["bad_deploys_s"]):
        ax.axvline(mark, color="grey", linestyle=":", label="bad version written" if i == 0 else None)
    s = report["settings"]
    ax.set_xlabel("seconds since the first bad version was written")
    ax.set_ylabel("failed requests (cumulative)")
    commit = c.short_commit(report.get("git_commit") or c.git_commit())
    ax.set_title(f"{s['rounds']} bad deploys (a fifth of requests fail), {s['window_s']:g} s each; "
                 f"{s['clients']} clients per system; commit {commit}")
    ax.legend(loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 bad deploy, 8 s window (CI smoke)")
    parser.add_argument("--rounds", type=int, help="bad deploys (default 3; 1 with --quick)")
    parser.add_argument("--window", type=float, help="seconds each bad version is left (default 15; 8 quick)")
    parser.add_argument("--bake", type=float, default=30.0, help="the baking daemon's bake_s")
    parser.add_argument("--clients", type=int, default=2, help="closed-loop client threads per system")
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
        args.rounds = args.rounds or (1 if args.quick else 3)
        args.window = args.window or (8.0 if args.quick else 15.0)

    def render_and_plot(report: dict[str, Any], console: Any) -> None:
        render(report, console)
        if "--plot" in argv:
            plot(report, PLOT)
            report["plot"] = PLOT.name
            console.print(f"plot: {PLOT}")

    return c.bench_main(NAME, parser, argv, run, prepare=prepare, render=render_and_plot, timed=True)


if __name__ == "__main__":
    sys.exit(main())
