"""Swap availability: closed-loop clients while a model is swapped 100 times (and 10 swaps fail).

Three systems run at once on three identical repositories, each serving model `swap`:

  * tritonctl: the daemon (`--launch-triton`, policy auto) watching its repository; a swap is writing
    the new files there. A failing swap is rolled back by tritonctl.
  * Triton explicit, in place: rewrite the files in Triton's repository, then `load_model` (what a
    deploy script does). A failing load leaves the old version serving.
  * Triton poll (`--repository-poll-secs=1`): rewrite the files in its repository; Triton reloads.

The same shuffled script of 100 successful and 10 failing swaps (initialize() raises; --quick 10 + 2)
runs on every system, in blocks that alternate between the systems so drift in the machine's load
hits all three alike. During a system's block `--clients` threads (default 4) send requests in a
closed loop to it alone; a successful swap ends when the new generation answers, a failing one when
the system has given up on it (rolled back / load error / failure in Triton's log). Reported per
system: failed requests, p50 / p99 / max latency, swap time. Target: 0 failed requests for tritonctl.

    python bench/swap_availability.py            # 100 + 10 swaps per system (about 6 minutes)
    python bench/swap_availability.py --quick    # 10 + 2
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as c  # noqa: E402
import tritonclient.grpc as grpcclient  # noqa: E402

NAME = "swap_availability"
MODEL = "swap"
SYSTEMS = ("tritonctl", "Triton explicit (in place + load)", "Triton poll")


@dataclass
class SystemRun:
    name: str
    repo: Path
    url: str = ""
    probe: c.Probe | None = None
    swap_s: list[float] = field(default_factory=list)
    fail_s: list[float] = field(default_factory=list)
    not_served: list[int] = field(default_factory=list)
    failing_not_detected: list[int] = field(default_factory=list)
    failing_served: list[int] = field(default_factory=list)  # a broken generation answered (must never)
    good: int = 0  # the generation that should serve


class Systems:
    """The three systems and how a swap is done and awaited on each."""

    def __init__(self, base: Path, args: argparse.Namespace) -> None:
        self.args = args
        self.base = base
        self.runs = {s: SystemRun(s, base / f"repo-{i}") for i, s in enumerate(SYSTEMS)}
        for run in self.runs.values():
            run.repo.mkdir()
            c.write_pair_model(run.repo, MODEL, 0)
        self.daemon = c.daemon_process(self.runs[SYSTEMS[0]].repo, base / "state", args.settle)
        self.explicit = c.triton_server(self.runs[SYSTEMS[1]].repo, base / "explicit-work", mode="explicit")
        self.poll = c.triton_server(self.runs[SYSTEMS[2]].repo, base / "poll-work", mode="poll")
        self.explicit_client: grpcclient.InferenceServerClient | None = None

    def start(self) -> None:
        self.explicit.start()
        self.poll.start()
        self.daemon.start()
        self.explicit_client = grpcclient.InferenceServerClient(self.explicit.grpc_url)
        self.explicit_client.load_model(MODEL, client_timeout=120)
        urls = [self.daemon.triton_url(), self.explicit.grpc_url, self.poll.grpc_url]
        for run, url in zip(self.runs.values(), urls, strict=True):
            run.url = url
            if c.serves(url, MODEL, 0, 60) is None:
                raise SystemExit(f"{run.name}: generation 0 not served within 60 s")
            run.probe = c.Probe(url, MODEL, threads=self.args.clients, active=False, timeout_s=10).start()

    def stop(self) -> None:
        for run in self.runs.values():
            if run.probe is not None:
                run.probe.stop()
        if self.explicit_client is not None:
            self.explicit_client.close()
        self.daemon.stop()
        self.explicit.stop()
        self.poll.stop()

    def _last_event_id(self) -> int:
        rows = c.audit_rows(self.base / "state", MODEL, limit=1)
        return int(rows[0]["id"]) if rows else 0

    def swap(self, system: str, index: int, gen: int, broken: bool) -> None:
        run = self.runs[system]
        probe = run.probe
        assert probe is not None
        files = c.pair_files(MODEL, gen, broken=broken)
        started = time.monotonic()
        failed_before = c.triton_load_counts(self.poll.log_path)["failed"] if system == SYSTEMS[2] else 0
        audit_before = self._last_event_id() if system == SYSTEMS[0] and broken else 0
        c.write_now([run.repo / MODEL], files)
        load_error: str | None = None
        if system == SYSTEMS[1]:
            assert self.explicit_client is not None
            try:
                self.explicit_client.load_model(MODEL, client_timeout=120)
            except Exception as exc:  # noqa: BLE001 - the failing swaps fail here
                load_error = str(exc)
        if not broken:
            done = c.wait_until(lambda: probe.latest == (gen, gen), self.args.swap_timeout, 0.005)
            if done:
                run.swap_s.append(time.monotonic() - started)
                run.good = gen
            else:
                run.not_served.append(index)
            return
        # a failing swap: wait until the system has given up on it
        if system == SYSTEMS[0]:
            def settled() -> bool:
                rows = c.audit_rows(self.base / "state", MODEL, limit=20)
                return any(r["id"] > audit_before and r["action"] == "deploy"
                           and r["outcome"] in ("rolled_back", "failed") for r in rows)

            detected = c.wait_until(settled, self.args.swap_timeout, 0.1)
        elif system == SYSTEMS[1]:
            detected = load_error is not None
        else:
            detected = c.wait_until(lambda: c.triton_load_counts(self.poll.log_path)["failed"] > failed_before,
                                    self.args.swap_timeout, 0.05)
        if detected:
            run.fail_s.append(time.monotonic() - started)
        else:
            run.failing_not_detected.append(index)
        # the previous good generation must still (or again) answer
        if not c.wait_until(lambda: probe.latest == (run.good, run.good), 10, 0.005):
            run.not_served.append(index)
        if any(s.code_gen == gen for s in probe.stats.since(started)):
            run.failing_served.append(index)


def script(ok: int, failing: int, seed: int) -> list[bool]:
    """True = a failing swap; shuffled, but never two failing swaps first (something good must serve)."""
    rng = random.Random(seed)
    swaps = [False] * ok + [True] * failing
    rng.shuffle(swaps)
    return swaps


def summarise(run: SystemRun, t_windows: list[tuple[float, float]]) -> dict[str, Any]:
    assert run.probe is not None
    samples = run.probe.stats.snapshot()
    lat = [s.latency_s for s in samples if s.error is None]
    errors = [s for s in samples if s.error is not None]
    examples: list[str] = []
    for s in errors:
        if s.error and len(examples) < 5 and not any(s.error[:50] in e for e in examples):
            examples.append(s.error[:220])
    active_s = sum(b - a for a, b in t_windows)
    return {
        "requests": len(samples), "failed_requests": len(errors),
        "errors_by_kind": dict(Counter(c.classify_error(s.error or "") for s in errors)),
        "error_examples": examples,
        "latency_p50_ms": round(c.pct(lat, 50) * 1000, 2) if lat else None,
        "latency_p99_ms": round(c.pct(lat, 99) * 1000, 2) if lat else None,
        "latency_max_ms": round(max(lat) * 1000, 2) if lat else None,
        "requests_per_s": round(len(samples) / active_s, 1) if active_s else None,
        "swaps_ok": len(run.swap_s), "swap_time_median_s": round(c.median(run.swap_s), 3) if run.swap_s else None,
        "failing_detected": len(run.fail_s),
        "failing_time_median_s": round(c.median(run.fail_s), 3) if run.fail_s else None,
        "swaps_not_served": run.not_served, "failing_not_detected": run.failing_not_detected,
        "broken_generation_answered": run.failing_served,
    }


def run(args: argparse.Namespace, console: Any) -> dict[str, Any]:
    machine = c.machine_info()
    swaps = script(args.swaps, args.failing, args.seed)
    windows: dict[str, list[tuple[float, float]]] = {s: [] for s in SYSTEMS}
    with c.workspace(NAME, keep=args.keep) as base:
        systems = Systems(base, args)
        try:
            systems.start()
            console.print(f"[dim]{len(swaps)} swaps per system in blocks of {args.block}; {args.clients} clients[/dim]")
            blocks = [list(range(i, min(i + args.block, len(swaps)))) for i in range(0, len(swaps), args.block)]
            for k, block in enumerate(blocks):
                order = SYSTEMS[k % 3:] + SYSTEMS[: k % 3]  # rotate who goes first
                for system in order:
                    probe = systems.runs[system].probe
                    assert probe is not None
                    probe.active.set()
                    time.sleep(0.2)  # clients running before the first swap of the block
                    t_start = time.monotonic()
                    for index in block:
                        systems.swap(system, index, index + 1, swaps[index])
                    time.sleep(0.2)
                    windows[system].append((t_start, time.monotonic()))
                    probe.active.clear()
                    time.sleep(0.1)
                console.print(f"[dim]block {k + 1}/{len(blocks)} done[/dim]")
            audit = c.audit_rows(base / "state", MODEL)
        finally:
            systems.stop()
        results = {s: summarise(systems.runs[s], windows[s]) for s in SYSTEMS}
        deploys = Counter(r["outcome"] for r in audit if r["action"] == "deploy")
        results[SYSTEMS[0]]["deploys_by_outcome"] = dict(deploys)
        for system, log in ((SYSTEMS[1], systems.explicit.log_path), (SYSTEMS[2], systems.poll.log_path),
                            (SYSTEMS[0], base / "state" / "triton" / "tritonserver.log")):
            results[system]["triton_loads"] = c.triton_load_counts(log)
    report = c.base_report(NAME, args.argv, args.quick, machine)
    report.update({
        "settings": {"swaps_ok": args.swaps, "swaps_failing": args.failing, "clients": args.clients,
                     "block": args.block, "settle_s": args.settle, "poll_secs": 1, "seed": args.seed},
        "systems": results,
    })
    report["rows"] = [r.to_json() for r in rows(report)]
    return report


def rows(report: dict[str, Any]) -> list[c.Row]:
    out: list[c.Row] = []
    for system in SYSTEMS:
        s = report["systems"][system]
        ctl = system == SYSTEMS[0]
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(s["errors_by_kind"].items()))
        out.append(c.Row("failed requests", system, f"{s['failed_requests']} of {s['requests']}",
                         "0" if ctl else "-", (s["failed_requests"] == 0) if ctl else None, kinds,
                         value=s["failed_requests"]))
    for system in SYSTEMS:
        s = report["systems"][system]
        p50, p99, mx = s["latency_p50_ms"], s["latency_p99_ms"], s["latency_max_ms"]
        out.append(c.Row("latency p50 / p99 / max", system,
                         "-" if p50 is None else f"{p50:.1f} / {p99:.1f} / {mx:.0f} ms", value=p99,
                         note=f"{s['requests_per_s']} req/s"))
    for system in SYSTEMS:
        s = report["systems"][system]
        total_ok, total_fail = report["settings"]["swaps_ok"], report["settings"]["swaps_failing"]
        problems = []
        if s["swaps_not_served"]:
            problems.append(f"{len(s['swaps_not_served'])} swaps not served in time")
        if s["failing_not_detected"]:
            problems.append(f"{len(s['failing_not_detected'])} failing swaps not detected")
        if s["broken_generation_answered"]:
            problems.append(f"broken generation answered in {len(s['broken_generation_answered'])} swaps")
        med = s["swap_time_median_s"]
        fmed = s["failing_time_median_s"]
        out.append(c.Row("swaps done (ok / failing handled)", system,
                         f"{s['swaps_ok']}/{total_ok}, {s['failing_detected']}/{total_fail}", value=s["swaps_ok"],
                         note=(f"median {med:.2f} s per swap" if med is not None else "")
                         + (f", {fmed:.2f} s per failing one" if fmed is not None else "")
                         + ("; " + "; ".join(problems) if problems else "")))
    return out


def render(report: dict[str, Any], console: Any) -> None:
    s = report["settings"]
    c.render_report(f"swap availability: {s['swaps_ok']} successful + {s['swaps_failing']} failing swaps per system, "
                    f"{s['clients']} closed-loop clients, tritonctl settle {s['settle_s']} s", report, console)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="10 + 2 swaps (CI smoke)")
    parser.add_argument("--swaps", type=int, help="successful swaps per system (default 100; 10 with --quick)")
    parser.add_argument("--failing", type=int, help="failing swaps per system (default 10; 2 with --quick)")
    parser.add_argument("--clients", type=int, default=4, help="closed-loop client threads")
    parser.add_argument("--block", type=int, help="swaps per block before the next system's turn (10; 4 quick)")
    parser.add_argument("--settle", type=float, default=0.5, help="tritonctl's settle window (s)")
    parser.add_argument("--swap-timeout", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--keep", action="store_true")

    def prepare(args: argparse.Namespace) -> None:
        args.swaps = args.swaps if args.swaps is not None else (10 if args.quick else 100)
        args.failing = args.failing if args.failing is not None else (2 if args.quick else 10)
        args.block = args.block or (4 if args.quick else 10)

    return c.bench_main(NAME, parser, argv, run, prepare=prepare, render=render, timed=True)


if __name__ == "__main__":
    sys.exit(main())
