"""Change sets: an ensemble and its steps edited together, against Triton's poll and explicit modes.

The pipeline `pipe` (ensemble) over python steps `a` → `b` (tests/test_changesets.py's models). Each
edit renames the intermediate tensor across all three (a's output, b's input, pipe's mapping) and
changes b's factor, so the new pipeline's answer differs from the old one. The same edits run on
three systems, each with its own plain repository:

  * tritonctl: the daemon (`--launch-triton`, policy auto) watching its repository; the edit is
    writing the files there (controlplane/intake/changeset.py deploys the three as one change set).
  * Triton explicit: write the files in Triton's repository, then `load_model` in dependency order
    (a, b, then pipe): what a careful deploy script does.
  * Triton poll (`--repository-poll-secs=1`): write the files in its repository.

During each edit one client sends a request to `pipe` every 20 ms, until the edit is over: for
tritonctl, until the set's `changeset` audit event (written once the whole set is done, public steps
deployed and the ensemble pointed back at them), then one more request; for Triton, 0.5 s after the
new pipeline's first answer (its loads have returned by then). Reported per system and edit: failed
requests, and the time from the edit to the first answer of the new pipeline (None: it never
answered within --timeout; the system is then repaired by reloading pipe so the next edit starts
from a serving pipeline, and that edit counts as not served).

    python bench/changeset.py            # 10 edits per system
    python bench/changeset.py --quick    # 3
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as c  # noqa: E402
import tritonclient.grpc as grpcclient  # noqa: E402

from tests.test_changesets import pipe_answer, request_every, write_pipe  # noqa: E402

NAME = "changeset"
SYSTEMS = ("tritonctl", "Triton explicit (load a, b, pipe)", "Triton poll")


def edit(system: str, repo: Path, url: str, tensor: str, gen: int) -> None:
    write_pipe(repo, tensor, gen)
    if system == SYSTEMS[1]:
        client = grpcclient.InferenceServerClient(url)
        try:
            for name in ("a", "b", "pipe"):
                try:
                    client.load_model(name)
                except Exception as exc:  # noqa: BLE001 - a failed load is what is measured
                    print(f"  explicit: load {name}: {str(exc)[:160]}")
        finally:
            client.close()


def serves_value(url: str, want: float, timeout_s: float) -> bool:
    """Whether `pipe` answers `want` within `timeout_s`."""
    client = grpcclient.InferenceServerClient(url)

    def answers() -> bool:
        try:
            return pipe_answer(client) == want
        except Exception:  # noqa: BLE001 - not serving yet
            return False

    try:
        return bool(c.wait_until(answers, timeout_s, 0.2))
    finally:
        client.close()


def repair(url: str) -> None:
    """After an edit the pipeline never recovered from: load every model again (explicit) so the next
    edit starts from a serving pipeline."""
    client = grpcclient.InferenceServerClient(url)
    try:
        for name in ("a", "b", "pipe"):
            try:
                client.load_model(name)
            except Exception:  # noqa: BLE001 - poll mode refuses loads; it repairs itself or not
                pass
    finally:
        client.close()


def change_sets(state: Path) -> int:
    return sum(1 for r in c.audit_rows(state) if r["action"] == "changeset" and r["outcome"] != "skipped")


def one_edit(system: str, repo: Path, url: str, tensor: str, gen: int, timeout_s: float,
             state: Path | None = None) -> dict[str, Any]:
    """`state`: tritonctl's state dir; the loop then runs until the edit's change set is audited."""
    want = 2.0 * gen
    sets_before = change_sets(state) if state is not None else 0
    with request_every(url, pipe_answer) as stats:
        time.sleep(0.5)
        t0 = time.monotonic()
        edit(system, repo, url, tensor, gen)
        served = c.wait_until(lambda: bool(stats["answers"]) and stats["answers"][-1] == want, timeout_s, 0.01)
        switch_s = time.monotonic() - t0 if served else None
        audited = None
        if state is not None:  # the set's tail (public steps, the switch back) under load too
            audited = bool(c.wait_until(lambda: change_sets(state) > sets_before, timeout_s, 0.05))
            answered = stats["ok"] + stats["failed"]
            c.wait_until(lambda: stats["ok"] + stats["failed"] > answered, 10, 0.01)
        else:
            time.sleep(0.5)
    return {"tensor": tensor, "gen": gen, "failed": stats["failed"], "requests": stats["ok"] + stats["failed"],
            "switch_s": round(switch_s, 3) if switch_s is not None else None, "set_audited": audited,
            "errors": stats["errors"][:2]}


def run(args: argparse.Namespace, console: Any) -> dict[str, Any]:
    machine = c.machine_info()
    machine["load_average_start"] = c.load_average()
    results: dict[str, list[dict[str, Any]]] = {s: [] for s in SYSTEMS}
    with c.workspace(NAME, keep=args.keep) as base:
        repos = {s: base / f"repo{i}" for i, s in enumerate(SYSTEMS)}
        for repo in repos.values():
            repo.mkdir()
            write_pipe(repo, "t0", 1)
        daemon = c.daemon_process(repos[SYSTEMS[0]], base / "state", args.settle)
        explicit = c.triton_server(repos[SYSTEMS[1]], base / "explicit-work", mode="explicit")
        poll = c.triton_server(repos[SYSTEMS[2]], base / "poll-work", mode="poll")
        try:
            daemon.start()
            explicit.start()
            poll.start()
            repair(explicit.grpc_url)
            urls = {SYSTEMS[0]: daemon.triton_url(), SYSTEMS[1]: explicit.grpc_url, SYSTEMS[2]: poll.grpc_url}
            for system, url in urls.items():
                if not serves_value(url, 2.0, 120):
                    raise RuntimeError(f"{system}: pipe does not serve at start")
            for i in range(args.edits):
                for k in range(len(SYSTEMS)):  # rotate who goes first
                    system = SYSTEMS[(i + k) % len(SYSTEMS)]
                    gen = i + 2
                    result = one_edit(system, repos[system], urls[system], f"t{gen}", gen, args.timeout,
                                      base / "state" if system == SYSTEMS[0] else None)
                    results[system].append(result)
                    console.print(f"[dim]edit {i + 1}/{args.edits} {system}: {result['failed']} failed of "
                                  f"{result['requests']}, new pipeline after {result['switch_s']} s[/dim]")
                    if result["switch_s"] is None:
                        repair(urls[system])
                        serves_value(urls[system], 2.0 * gen, 60)
            audit = c.audit_rows(base / "state")
        finally:
            for server in (daemon, explicit, poll):
                try:
                    server.stop()
                except Exception:  # noqa: BLE001 - stopping is best effort here
                    pass
    report = c.base_report(NAME, args.argv, args.quick, machine)
    sets = [r for r in audit if r["action"] == "changeset"]
    report.update({
        "settings": {"edits": args.edits, "request_period_ms": 20, "settle_s": args.settle, "poll_secs": 1,
                     "timeout_s": args.timeout},
        "runs": results,
        "tritonctl_change_sets": {o: sum(1 for r in sets if r["outcome"] == o) for o in {r["outcome"] for r in sets}},
        "summary": {s: summarise(results[s]) for s in SYSTEMS},
    })
    report["rows"] = [r.to_json() for r in rows(report)]
    return report


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    times = [r["switch_s"] for r in runs if r["switch_s"] is not None]
    return {"edits": len(runs), "failed_requests": sum(r["failed"] for r in runs),
            "requests": sum(r["requests"] for r in runs),
            "edits_with_failures": sum(1 for r in runs if r["failed"]),
            "failed_per_edit": [r["failed"] for r in runs],
            "not_served": sum(1 for r in runs if r["switch_s"] is None),
            "switch_median_s": round(c.median(times), 3) if times else None,
            "switch_max_s": round(max(times), 3) if times else None}


def rows(report: dict[str, Any]) -> list[c.Row]:
    out = []
    for system in SYSTEMS:
        s = report["summary"][system]
        ctl = system == SYSTEMS[0]
        out.append(c.Row("failed requests", system, f"{s['failed_requests']} of {s['requests']}",
                         "0" if ctl else "-", (s["failed_requests"] == 0) if ctl else None,
                         f"per edit: {s['failed_per_edit']}", value=s["failed_requests"]))
    for system in SYSTEMS:
        s = report["summary"][system]
        med, mx = s["switch_median_s"], s["switch_max_s"]
        out.append(c.Row("time to the new pipeline", system,
                         "-" if med is None else f"median {med:.2f} s, max {mx:.2f} s", value=med,
                         note=f"{s['not_served']} of {s['edits']} edits never served the new pipeline"
                         if s["not_served"] else ""))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--edits", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="3 edits per system")
    parser.add_argument("--settle", type=float, default=0.3, help="tritonctl's settle window")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the new pipeline")
    parser.add_argument("--keep", action="store_true")

    def prepare(args: argparse.Namespace) -> None:
        if args.quick:
            args.edits = min(args.edits, 3)

    def render(report: dict[str, Any], console: Any) -> None:
        c.render_rows("Change sets: pipe = a → b, intermediate tensor renamed in one edit, a request every 20 ms",
                      [c.Row(**{k: v for k, v in r.items()}) for r in report["rows"]], console,
                      c.machine_line(report["machine"]))

    def exit_code(args: argparse.Namespace, report: dict[str, Any]) -> int:
        return 0 if report["summary"][SYSTEMS[0]]["failed_requests"] == 0 else 1

    return c.bench_main(NAME, parser, argv, run, prepare=prepare, render=render, check=False, exit_code=exit_code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
