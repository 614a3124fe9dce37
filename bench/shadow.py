"""A shadow's cost in the gateway: the same requests through a route without a shadow, through one whose shadow
copies none of them, and through one whose shadow copies every one (issue 55 item 4; docs/gateway.md "Shadow").

One tritonserver serves two identical python identity models under private names (`ident__cccccccc`, the
serving version, and `ident__dddddddd`, the shadow); one gateway routes `ident` to the first. Each round, for
gRPC and HTTP (binary tensors) and a small tensor (16 FP32 = 64 bytes) and a larger one (16,384 FP32 = 64 KiB),
sends N requests paced under the gateway's copy rate (so that every request of the copying case is copied),
in three cases: the route has no shadow; it has a shadow whose `fraction` copies (practically) none; its
shadow copies every request. It records the gateway's CPU per client request (the run time of its threads,
the comparing one included, from /proc/PID/task/*/schedstat: nanoseconds, where utime + stime count 10 ms
ticks, too coarse for the few milliseconds a quick run's window holds), tritonserver's (the copy is a
second inference there), the client's p50 latency, and the shadow's figures (every pair compared, all
agreeing: the answers are equal). The rows quote medians over rounds. No target: the issue asks that
requests not copied pay nothing and that a copied request's cost is bounded; this says how much it is on
this machine.

    python bench/shadow.py            # 5 rounds
    python bench/shadow.py --quick    # 1 round, fewer requests
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as c  # noqa: E402
import numpy as np  # noqa: E402
import tritonclient.grpc as grpcclient  # noqa: E402
import tritonclient.http as httpclient  # noqa: E402

from controlplane.gateway.control import GatewayControl  # noqa: E402
from controlplane.gateway.launcher import GatewayProcess  # noqa: E402
from controlplane.gateway.routes import Route, RouteTable, Shadow, Target, table_to_json  # noqa: E402
from controlplane.gateway.shadow import COPY_RATE  # noqa: E402
from controlplane.triton.launcher import TritonServer  # noqa: E402
from tests.gateway_harness import IDENT, config, digest, private, write_models  # noqa: E402

NAME = "shadow"
SIZES = {"64 B": 16, "64 KiB": 16384}
CASES = ("no shadow", "shadow, none copied", "shadow, every request copied")
PACE = 0.8 * COPY_RATE  # requests a second: under the copy rate, so that every request can be copied


def models() -> dict[str, tuple[str, str]]:
    out = {}
    for char in ("c", "d"):
        name = private("ident", char)
        out[name] = (config(name, [("INPUT0", "TYPE_FP32", "-1")], [("OUTPUT0", "TYPE_FP32", "-1")]), IDENT)
    return out


def route_for(case: str, ident: str) -> Route:
    serving = Target(private("ident", "c"), digest("c"), 100)
    if case == "no shadow":
        return Route("ident", (serving,))
    fraction = 1e-12 if case == "shadow, none copied" else 1.0
    shadow = Shadow(private("ident", "d"), digest("d"), ident, fraction=fraction)
    return Route("ident", (serving, Target(private("ident", "d"), digest("d"), 0)), shadow=shadow)


def paced(proto: str, url: str, size: int, n: int) -> list[float]:
    """N requests, one at a time, at most PACE a second; each one's latency."""
    module: Any = grpcclient if proto == "grpc" else httpclient
    client = module.InferenceServerClient(url)
    x = module.InferInput("INPUT0", [size], "FP32")
    values = np.ones(size, dtype=np.float32)
    if proto == "http":
        x.set_data_from_numpy(values, binary_data=True)
        kwargs: dict[str, Any] = {"outputs": [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)]}
    else:
        x.set_data_from_numpy(values)
        kwargs = {}
    latencies = []
    started = time.monotonic()
    try:
        for i in range(n):
            began = time.perf_counter()
            result = client.infer("ident", [x], **kwargs)
            latencies.append(time.perf_counter() - began)
            if i == 0 and not np.array_equal(result.as_numpy("OUTPUT0"), values):
                raise RuntimeError(f"{url}: a wrong answer for ident")
            time.sleep(max(0.0, started + (i + 1) / PACE - time.monotonic()))
    finally:
        client.close()
    return latencies


def compared(control: GatewayControl, ident: str, timeout_s: float = 5.0) -> dict[str, Any]:
    """The route's shadow figures once every copied request's pair is compared (the comparing thread runs
    behind the answers: a pair still in flight would count in the next window), or at the timeout."""
    def settled(figures: dict[str, Any]) -> tuple[int, int, int]:
        return int(figures.get("copied", 0)), int(figures.get("pairs", 0)), sum(figures.get("skipped", {}).values())

    deadline = time.monotonic() + timeout_s
    last: dict[str, Any] | None = None
    while True:  # none in flight, and nothing counted since the last look (a pair's compare ends after that)
        figures = dict(control.figures()["shadows"].get(ident, {}))
        if (not figures.get("in_flight") and last is not None and settled(figures) == settled(last)) \
                or time.monotonic() > deadline:
            return figures
        last = figures
        time.sleep(0.15)


def measure(control: GatewayControl, proto: str, url: str, size: int, case: str, n: int,
            pids: dict[str, int]) -> dict[str, Any]:
    ident = secrets.token_hex(8)  # each case its own figures
    control.update(set={"ident": route_for(case, ident)})
    paced(proto, url, size, max(5, n // 20))  # warm: connections, the comparing thread, numpy
    before = compared(control, ident)
    cpu0 = {name: c.fine_cpu_seconds(pid) for name, pid in pids.items()}
    latencies = paced(proto, url, size, n)
    after = compared(control, ident)
    out: dict[str, Any] = {"requests": n, "p50_ms": round(c.pct(latencies, 50) * 1000, 4)}
    for name, pid in pids.items():
        out[f"{name}_cpu_us"] = round((c.fine_cpu_seconds(pid) - cpu0[name]) / n * 1e6, 1)
    for key in ("copied", "pairs", "agreed", "disagreed"):
        out[key] = int(after.get(key, 0)) - int(before.get(key, 0))
    out["skipped"] = sum(after.get("skipped", {}).values()) - sum(before.get("skipped", {}).values())
    return out


def run(args: argparse.Namespace, console: Any) -> dict[str, Any]:
    machine = c.machine_info()
    report = c.base_report(NAME, args.argv, args.quick, machine)
    report["pace_per_s"] = PACE
    keys = [f"{proto} {size} {case}" for proto in ("grpc", "http") for size in SIZES for case in CASES]
    rounds: dict[str, list[dict[str, Any]]] = {key: [] for key in keys}
    with c.workspace("shadow") as base:
        found = models()
        write_models(base / "serving", found)
        triton = TritonServer(model_repository=base / "serving", workdir=base / "triton")
        triton.start(live_timeout_s=120.0, load=sorted(found))
        gateway = GatewayProcess(base / "gateway", triton.grpc_url, triton.http_url, grpc_address="127.0.0.1:0",
                                 http_address="127.0.0.1:0", drain_s=10.0)
        gateway.routes_file.parent.mkdir(parents=True, exist_ok=True)
        gateway.routes_file.write_text(json.dumps(table_to_json(RouteTable(1, {"ident": route_for("no shadow", "")}))))
        try:
            gateway.start()
            assert triton.pid is not None and gateway.pid is not None
            pids = {"gateway": gateway.pid, "triton": triton.pid}
            control = gateway.control(10.0)
            for index in range(args.rounds):
                for proto in ("grpc", "http"):
                    url = f"127.0.0.1:{gateway.ports[proto]}"
                    for size_name, size in SIZES.items():
                        for case in CASES:
                            found_case = measure(control, proto, url, size, case, args.requests, pids)
                            key = f"{proto} {size_name} {case}"
                            rounds[key].append(found_case)
                            console.print(f"round {index + 1}/{args.rounds} {key}: gateway "
                                          f"{found_case['gateway_cpu_us']:.0f} µs/req, tritonserver "
                                          f"{found_case['triton_cpu_us']:.0f} µs/req, p50 {found_case['p50_ms']:.3f} ms"
                                          f", {found_case['pairs']} pairs")
        finally:
            gateway.stop(15.0)
            triton.stop()
    report["rounds"] = rounds
    report["summary"] = {key: {field: c.median([r[field] for r in items])
                               for field in ("gateway_cpu_us", "triton_cpu_us", "p50_ms", "copied", "pairs",
                                             "agreed", "disagreed", "skipped")}
                         for key, items in rounds.items()}
    report["rows"] = [r.to_json() for r in rows(report)]
    return report


def rows(report: dict[str, Any]) -> list[c.Row]:
    out = []
    for key, s in report["summary"].items():
        out.append(c.Row(f"gateway CPU per request, {key}", "gateway", f"{s['gateway_cpu_us']:.0f} µs",
                         note=f"tritonserver {s['triton_cpu_us']:.0f} µs, p50 {s['p50_ms']:.3f} ms, "
                              f"{s['pairs']:.0f} pairs ({s['disagreed']:.0f} disagreed)",
                         value=s["gateway_cpu_us"]))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 round of fewer requests")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--requests", type=int, default=None, help="requests per case and round")

    def prepare(args: argparse.Namespace) -> None:
        args.rounds = args.rounds or (1 if args.quick else 5)
        args.requests = args.requests or (60 if args.quick else 300)

    return c.bench_main(NAME, parser, argv, run, prepare=prepare, render=lambda r, con: c.render_report(
        "A shadow's cost in the gateway", r, con), check=False, exit_code=lambda *_: 0)


if __name__ == "__main__":
    raise SystemExit(main())
