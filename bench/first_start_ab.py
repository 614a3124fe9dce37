"""First start under auto policy → every model serving, two trees side by side (issue 26): this checkout
and another (`--other`, a worktree at an earlier commit with its own virtualenv).

One repository (bench/scale.py's: one python model and ensembles over it). Each tree's daemon starts on
a fresh state directory with its own freshly launched tritonserver, in turns, A B A B ..., and is
stopped once its log shows every model's `deploy ok`. Per start: the wall time from spawning `tritonctl
daemon` to the last `deploy ok`, and the CPU time (utime + stime) of the daemon and of its tritonserver
then: on 2 cores, the daemon's CPU per deploy is what a first start under auto policy costs beyond
Triton's own load requests (bench/scale.py, part `requests`). Medians per tree; the machine's load is
recorded.

    python bench/first_start_ab.py --other /work/wt/engine                 # 1,000 models, 3 rounds each
    python bench/first_start_ab.py --other /work/wt/engine --quick         # 50 models, 1 round each
    python bench/first_start_ab.py --other /work/wt/engine --models 20 --python --poll --rounds 5

`--python`: each model is a python model of its own (each loads its own stub process), not one python
model and ensembles over it. `--poll`: each turn also starts Triton in poll mode on a copy of the same
repository, from spawning `tritonserver` to every model READY in its index (issue 39, item 4: the
20-model start-up within 1.2x Triton poll's).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as c  # noqa: E402
import first_start_phases  # noqa: E402
import restart_ab  # noqa: E402
import scale  # noqa: E402

NAME = "first_start_ab"
# the daemon's CPU per phase of a first start through Triton's start-up (bench/first_start_phases.py)
PHASE_CPU = {"capture_validate_record_cpu_s": "capture", "stage_cpu_s": "stage", "end_deploys_cpu_s": "end"}
ROOT = Path(__file__).resolve().parent.parent


def _first_start(tritonctl: Path, repo: Path, state: Path, log: Path, models: int,
                 timeout_s: float) -> dict[str, float]:
    """One first start: seconds to every model's `deploy ok`, and the CPU seconds of the daemon and of
    its tritonserver then; with a deferred launch (controlplane/startup/bulk.py), the daemon's CPU seconds
    in each phase of bench/first_start_phases.py as well (sampled when its log line appears: a wave's
    line, the last wave's counts; the deploys' end runs to every `deploy ok`)."""
    from tests.harness import FREE_PORTS

    args = [str(tritonctl), "daemon", "--repository", str(repo), "--state-dir", str(state), "--settle", "1.0",
            "--launch-triton", *FREE_PORTS, "--policy", "auto"]
    env = dict(os.environ, TRITONCTL_RECONCILE_INTERVAL_S="10", TRITONCTL_READY_WAITS_FOR_DEPLOYS="false")
    env.pop("NOTIFY_SOCKET", None)
    with open(log, "w") as out:
        started = time.monotonic()
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    seen: dict[str, tuple[int, float]] = {}  # mark -> (lines seen, the daemon's CPU seconds at the last)
    try:
        while (text := log.read_text(errors="replace")).count(" deploy ok ") < models:
            for mark, pattern in first_start_phases.MARKS.items():
                if "live" in seen:  # launched: the marks before it are final, the end is measured at the last ok
                    break
                found = len(re.findall(pattern, text))
                if found and found != seen.get(mark, (0, 0.0))[0]:
                    seen[mark] = (found, c.cpu_seconds(proc.pid))
            if proc.poll() is not None:
                raise SystemExit(f"daemon exited {proc.returncode}: {log.read_text()[-2000:]}")
            if time.monotonic() - started > timeout_s:
                raise SystemExit(f"not every model deployed within {timeout_s:g} s")
            time.sleep(0.05)
        wall = time.monotonic() - started
        triton = [p for p in c.descendants(proc.pid) if "tritonserver" in _comm(p)]
        cpu = c.cpu_seconds(proc.pid)
        result = {"all_serving_s": round(wall, 2), "daemon_cpu_s": round(cpu, 2),
                  "triton_cpu_s": round(sum(c.cpu_seconds(p) for p in triton), 2)}
        at = {mark: value for mark, (_, value) in seen.items()}
        if {"scan", "recorded", "launch", "live"} <= set(at):
            result.update(capture_validate_record_cpu_s=round(at["recorded"] - at["scan"], 2),
                          stage_cpu_s=round(at["launch"] - at["recorded"], 2),
                          end_deploys_cpu_s=round(cpu - at["live"], 2))
        return result
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def _poll_start(repo: Path, work: Path, models: int, timeout_s: float) -> dict[str, float]:
    """Triton poll on `repo`: seconds from spawning it to every model READY in its index."""
    import tritonclient.grpc as grpcclient

    server = c.triton_server(repo, work, mode="poll")
    started = time.monotonic()
    try:
        server.start(live_timeout_s=timeout_s)
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            def all_ready() -> bool:
                index = client.get_model_repository_index(client_timeout=30)
                return sum(1 for m in index.models if m.state == "READY") >= models

            if c.wait_until(all_ready, timeout_s, 0.05) is None:
                raise SystemExit(f"Triton poll: not every model READY within {timeout_s:g} s")
        finally:
            client.close()
        return {"all_serving_s": round(time.monotonic() - started, 2)}
    finally:
        server.stop(timeout_s=30)


def _make_repository(repo: Path, models: int, python: bool) -> None:
    if not python:
        scale.make_repository(repo, models)
        return
    repo.mkdir(parents=True)
    for i in range(models):
        c.write_pair_model(repo, f"p{i:03d}", 1)


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def run(args: argparse.Namespace, console: Any) -> dict[str, Any]:
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # as an installed tritonctl: bytecode read (bench/scale.py)
    trees = {"this": ROOT, "other": Path(args.other).resolve()}
    if args.quick:
        args.models, args.rounds = 50, 1
    report = c.base_report(NAME, args.argv, args.quick, c.machine_info())
    report["trees"] = {k: {"path": str(v), "git_commit": restart_ab._commit(v)} for k, v in trees.items()}
    runs: dict[str, list[dict[str, float]]] = {"this": [], "other": [], **({"poll": []} if args.poll else {})}
    with c.workspace(NAME) as base:
        repo = base / "repo"
        _make_repository(repo, args.models, args.python)
        time.sleep(1.5)  # older than the racy-signature window (controlplane/source/poller.py)
        for turn in range(args.rounds):
            for key in ("other", "this", *(("poll",) if args.poll else ())):
                state = base / f"state-{key}-{turn}"
                if key == "poll":  # a copy: the python stub writes __pycache__ into the repository it loads
                    shutil.copytree(repo, base / "repo-poll", dirs_exist_ok=True)
                    result = _poll_start(base / "repo-poll", state, args.models, args.timeout)
                    shutil.rmtree(base / "repo-poll", ignore_errors=True)
                else:
                    result = _first_start(trees[key] / ".venv" / "bin" / "tritonctl", repo, state,
                                          base / f"start-{key}-{turn}.log", args.models, args.timeout)
                runs[key].append(result)
                console.print(f"[dim]{key}: every model serving {result['all_serving_s']:.2f} s"
                              + (f", daemon CPU {result['daemon_cpu_s']:.2f} s, tritonserver CPU "
                                 f"{result['triton_cpu_s']:.2f} s" if key != "poll" else "") + "[/dim]")
                shutil.rmtree(state, ignore_errors=True)
    if args.poll:
        report["poll_runs"] = runs.pop("poll")
        report["poll_all_serving_s_median"] = c.median([r["all_serving_s"] for r in report["poll_runs"]])
    report["python_models"] = args.python
    fields = [f for f in ("all_serving_s", "daemon_cpu_s", "triton_cpu_s", *PHASE_CPU)
              if all(f in r for items in runs.values() for r in items)]
    return c.two_trees_report(report, args.models, runs, fields, rows)


def rows(report: dict[str, Any]) -> list[c.Row]:
    out = []
    for key, commit in c.per_tree(report):
        wall = report[f"{key}_all_serving_s_median"]
        cpu = report[f"{key}_daemon_cpu_s_median"]
        out.append(c.Row(f"{report['models']:,} models: first start, policy auto -> every model serving, median of "
                         f"{len(report['runs'][key])} ({key}: {commit})", "tritonctl", f"{wall:.2f} s", "-", None,
                         f"daemon CPU {cpu:.2f} s ({1000 * cpu / report['models']:.1f} ms a model)"
                         f"{_phases(report, key)}; tritonserver CPU {report[f'{key}_triton_cpu_s_median']:.2f} s"
                         + (f"; {wall / poll:.2f}x Triton poll's" if (poll := report.get("poll_all_serving_s_median"))
                            else ""), value=wall))
    if report.get("poll_all_serving_s_median"):
        out.append(c.Row(f"{report['models']:,} models: Triton poll, spawn -> every model READY, median of "
                         f"{len(report['poll_runs'])}", "Triton poll", f"{report['poll_all_serving_s_median']:.2f} s",
                         "-", None, "runs: " + ", ".join(f"{r['all_serving_s']:.2f} s" for r in report["poll_runs"]),
                         value=report["poll_all_serving_s_median"]))
    return out


def _phases(report: dict[str, Any], key: str) -> str:
    """The daemon's CPU per phase (medians), where the runs measured it."""
    parts = [f"{label} {report[f'{key}_{field}_median']:.2f} s" for field, label in PHASE_CPU.items()
             if f"{key}_{field}_median" in report]
    return f" (capture+validation+records, staging, ending the deploys: {', '.join(parts)})" if parts else ""


def main(argv: list[str] | None = None) -> int:
    parser = c.two_trees_parser(__doc__, models=1000, rounds=3)
    parser.add_argument("--quick", action="store_true", help="50 models, 1 round")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds a first start may take")
    parser.add_argument("--python", action="store_true", help="each model a python model of its own")
    parser.add_argument("--poll", action="store_true", help="each turn also Triton poll on the same repository")
    return c.two_trees_main(NAME, parser, argv, run, "First start under auto policy, two trees in turns", rows)


if __name__ == "__main__":
    sys.exit(main())
