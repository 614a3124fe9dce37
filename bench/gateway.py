"""The gateway's cost: the same requests straight to tritonserver and through the gateway, side by side.

Issue 54's benchmark (item 7). One tritonserver serves a python identity model under its private name
(`ident__cccccccc`, tests/gateway_harness.py's), one gateway process (`python -m controlplane.gateway`)
routes the public name `ident` to it. For each protocol (gRPC, HTTP), tensor (16 FP32 = 64 bytes, and
262,144 FP32 = 1 MiB, echoed back: 1 MiB each way) and concurrency (1: tritonclient's sync client; 16:
its asyncio client with 16 tasks), each round sends N requests direct, then N through the gateway,
back to back, and records throughput, p50 and p99 latency, and the CPU seconds each process spent
(its own /proc/PID/stat utime + stime; the gateway's per request is the figure the targets judge).
Each round also sends the same requests through a relay that only copies bytes (bench/byterelay.py:
uvloop, no HTTP/2, no renaming; clients use the private name through it): the floor of any extra
process on the path, measured beside the gateway. The rows quote the median over rounds of each figure,
and of each ratio measured within one round.

Targets (this 2-core machine, the client on it too): gateway CPU ≤ 150 µs per small gRPC request and
≤ 200 µs per small HTTP request; added p50 ≤ 0.25 ms at concurrency 1 (small tensors); ≥ 90 % of direct
throughput with 1 MiB tensors.

    python bench/gateway.py            # 5 rounds
    python bench/gateway.py --quick    # 1 round, fewer requests
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as c  # noqa: E402
import numpy as np  # noqa: E402
import tritonclient.grpc as grpcclient  # noqa: E402
import tritonclient.grpc.aio as grpcaio  # noqa: E402
import tritonclient.http as httpclient  # noqa: E402
import tritonclient.http.aio as httpaio  # noqa: E402

from controlplane.gateway.launcher import GatewayProcess, free_port  # noqa: E402
from controlplane.gateway.routes import RouteTable, table_to_json  # noqa: E402
from controlplane.triton.launcher import TritonServer  # noqa: E402
from tests.gateway_harness import model_set, private, route, write_models  # noqa: E402

NAME = "gateway"
SMALL, BIG = 16, 1 << 18  # FP32 elements: 64 bytes, 1 MiB
CASES = [(proto, size, conc) for proto in ("grpc", "http") for size in (SMALL, BIG) for conc in (1, 16)]
COUNTS = {(SMALL, 1): 2000, (SMALL, 16): 4000, (BIG, 1): 150, (BIG, 16): 300}
CPU_TARGET_US = {"grpc": 150.0, "http": 200.0}
ADDED_P50_TARGET_MS = 0.25
THROUGHPUT_TARGET = 0.90


def _tensor(module: Any, size: int, binary: bool) -> Any:
    x = module.InferInput("INPUT0", [size], "FP32")
    if module in (httpclient, httpaio):
        x.set_data_from_numpy(np.ones(size, dtype=np.float32), binary_data=binary)
    else:
        x.set_data_from_numpy(np.ones(size, dtype=np.float32))
    return x


def sync_run(proto: str, url: str, model: str, size: int, n: int) -> list[float]:
    module = grpcclient if proto == "grpc" else httpclient
    client = module.InferenceServerClient(url)
    x = _tensor(module, size, True)
    kwargs = {} if proto == "grpc" else {"outputs": [httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)]}
    latencies = []
    try:
        for _ in range(n):
            began = time.perf_counter()
            client.infer(model, [x], **kwargs)
            latencies.append(time.perf_counter() - began)
    finally:
        client.close()
    return latencies


async def async_run(proto: str, url: str, model: str, size: int, n: int, concurrency: int) -> list[float]:
    module: Any = grpcaio if proto == "grpc" else httpaio
    client = module.InferenceServerClient(url)
    x = _tensor(module, size, True)
    kwargs = {} if proto == "grpc" else {"outputs": [httpaio.InferRequestedOutput("OUTPUT0", binary_data=True)]}
    latencies: list[float] = []

    async def worker(count: int) -> None:
        for _ in range(count):
            began = time.perf_counter()
            await client.infer(model, [x], **kwargs)
            latencies.append(time.perf_counter() - began)

    try:
        await asyncio.gather(*(worker(n // concurrency) for _ in range(concurrency)))
    finally:
        await client.close()
    return latencies


def check_answer(proto: str, url: str, model: str, size: int) -> None:
    """One request answered right: the name asked for, the tensor echoed (a benchmark of wrong answers
    measures nothing)."""
    module: Any = grpcclient if proto == "grpc" else httpclient
    client = module.InferenceServerClient(url)
    try:
        x = _tensor(module, size, True)
        result = client.infer(model, [x])
        name = result.get_response().model_name if proto == "grpc" else result.get_response()["model_name"]
        if name != model or not np.array_equal(result.as_numpy("OUTPUT0"), np.ones(size, dtype=np.float32)):
            raise RuntimeError(f"{url}: answered {name!r}, or a wrong tensor, for {model!r}")
    finally:
        client.close()


def measure(proto: str, url: str, model: str, size: int, conc: int, n: int, pids: dict[str, int]) -> dict[str, Any]:
    """N requests; throughput, latency percentiles and each process's CPU per request."""
    check_answer(proto, url, model, size)
    warm = max(10, n // 20)
    if conc == 1:
        sync_run(proto, url, model, size, warm)
    else:
        asyncio.run(async_run(proto, url, model, size, warm, conc))
    cpu0 = {name: c.cpu_seconds(pid) for name, pid in pids.items()}
    client0 = time.process_time()
    began = time.perf_counter()
    if conc == 1:
        latencies = sync_run(proto, url, model, size, n)
    else:
        latencies = asyncio.run(async_run(proto, url, model, size, n, conc))
    elapsed = time.perf_counter() - began
    done = len(latencies)
    out = {"requests": done, "seconds": round(elapsed, 4), "throughput": round(done / elapsed, 1),
           "p50_ms": round(c.pct(latencies, 50) * 1000, 4), "p99_ms": round(c.pct(latencies, 99) * 1000, 4),
           "client_cpu_us": round((time.process_time() - client0) / done * 1e6, 1)}
    for name, pid in pids.items():
        out[f"{name}_cpu_us"] = round((c.cpu_seconds(pid) - cpu0[name]) / done * 1e6, 1)
    return out


def case_key(proto: str, size: int, conc: int) -> str:
    return f"{proto} {'64 B' if size == SMALL else '1 MiB'} c={conc}"


def run(args: argparse.Namespace, console: Any) -> dict[str, Any]:
    machine = c.machine_info()
    report = c.base_report(NAME, args.argv, args.quick, machine)
    rounds: dict[str, list[dict[str, Any]]] = {case_key(*case): [] for case in CASES}
    with c.workspace("gateway") as base:
        models = {name: spec for name, spec in model_set().items() if name == private("ident", "c")}
        write_models(base / "serving", models)
        triton = TritonServer(model_repository=base / "serving", workdir=base / "triton")
        triton.start(live_timeout_s=120.0, load=sorted(models))
        gateway = GatewayProcess(base / "gateway", triton.grpc_url, triton.http_url, grpc_address="127.0.0.1:0",
                                 http_address="127.0.0.1:0", drain_s=10.0)
        gateway.routes_file.parent.mkdir(parents=True, exist_ok=True)
        gateway.routes_file.write_text(json.dumps(table_to_json(RouteTable(1, {"ident": route("ident", ("c", 100))}))))
        relays: list[subprocess.Popen[bytes]] = []
        try:
            gateway.start()
            relay_ports = {}
            for proto, target in (("grpc", triton.grpc_url), ("http", triton.http_url)):
                relay_ports[proto] = free_port()
                relays.append(subprocess.Popen([sys.executable, str(Path(__file__).parent / "byterelay.py"),
                                                str(relay_ports[proto]), target]))
            time.sleep(1.0)
            assert triton.pid is not None and gateway.pid is not None
            pids = {"gateway": gateway.pid, "triton": triton.pid, "relay_grpc": relays[0].pid,
                    "relay_http": relays[1].pid}
            urls = {proto: (getattr(triton, f"{proto}_url"), f"127.0.0.1:{gateway.ports[proto]}",
                            f"127.0.0.1:{relay_ports[proto]}") for proto in ("grpc", "http")}
            for index in range(args.rounds):
                for proto, size, conc in CASES:
                    n = max(conc * 2, COUNTS[(size, conc)] // (5 if args.quick else 1))
                    direct_url, gateway_url, relay_url = urls[proto]
                    direct = measure(proto, direct_url, private("ident", "c"), size, conc, n, pids)
                    relay = measure(proto, relay_url, private("ident", "c"), size, conc, n, pids)
                    relay["relay_cpu_us"] = relay.pop(f"relay_{proto}_cpu_us")
                    through = measure(proto, gateway_url, "ident", size, conc, n, pids)
                    key = case_key(proto, size, conc)
                    rounds[key].append({"direct": direct, "gateway": through, "relay": relay,
                                        "throughput_ratio": round(through["throughput"] / direct["throughput"], 4),
                                        "relay_throughput_ratio": round(relay["throughput"] / direct["throughput"], 4),
                                        "added_p50_ms": round(through["p50_ms"] - direct["p50_ms"], 4),
                                        "added_p99_ms": round(through["p99_ms"] - direct["p99_ms"], 4),
                                        "relay_added_p50_ms": round(relay["p50_ms"] - direct["p50_ms"], 4)})
                    console.print(f"round {index + 1}/{args.rounds} {key}: direct {direct['throughput']:.0f}/s "
                                  f"p50 {direct['p50_ms']:.3f} ms; relay {relay['throughput']:.0f}/s "
                                  f"{relay['relay_cpu_us']:.0f} µs; gateway {through['throughput']:.0f}/s "
                                  f"p50 {through['p50_ms']:.3f} ms, {through['gateway_cpu_us']:.0f} µs CPU/req")
        finally:
            for relay_process in relays:
                relay_process.terminate()
                relay_process.wait(10)
            gateway.stop(15.0)
            triton.stop()
    report["rounds"] = rounds
    report["summary"] = {key: summarize(items) for key, items in rounds.items()}
    report["rows"] = [r.to_json() for r in rows(report)]
    return report


def summarize(items: list[dict[str, Any]]) -> dict[str, float]:
    def med(path: tuple[str, ...]) -> float:
        values = []
        for item in items:
            value: Any = item
            for key in path:
                value = value[key]
            values.append(float(value))
        return round(c.median(values), 4)

    return {"direct_throughput": med(("direct", "throughput")), "gateway_throughput": med(("gateway", "throughput")),
            "throughput_ratio": med(("throughput_ratio",)), "direct_p50_ms": med(("direct", "p50_ms")),
            "gateway_p50_ms": med(("gateway", "p50_ms")), "added_p50_ms": med(("added_p50_ms",)),
            "added_p99_ms": med(("added_p99_ms",)), "gateway_cpu_us": med(("gateway", "gateway_cpu_us")),
            "triton_cpu_us_direct": med(("direct", "triton_cpu_us")),
            "triton_cpu_us_gateway": med(("gateway", "triton_cpu_us")),
            "client_cpu_us_direct": med(("direct", "client_cpu_us")), "relay_cpu_us": med(("relay", "relay_cpu_us")),
            "relay_throughput_ratio": med(("relay_throughput_ratio",)),
            "relay_added_p50_ms": med(("relay_added_p50_ms",)), "rounds": len(items)}


def rows(report: dict[str, Any]) -> list[c.Row]:
    out: list[c.Row] = []
    for proto, size, conc in CASES:
        key = case_key(proto, size, conc)
        s = report["summary"][key]
        note = f"median of {s['rounds']} rounds"
        if size == SMALL:
            target = CPU_TARGET_US[proto]
            out.append(c.Row(f"gateway CPU per request, {key}", "gateway", f"{s['gateway_cpu_us']:.0f} µs",
                             f"≤ {target:.0f} µs", s["gateway_cpu_us"] <= target,
                             f"{note}; tritonserver {s['triton_cpu_us_direct']:.0f} µs", s["gateway_cpu_us"]))
        else:
            out.append(c.Row(f"gateway CPU per request, {key}", "gateway", f"{s['gateway_cpu_us']:.0f} µs", note=note,
                             value=s["gateway_cpu_us"]))
        if conc == 1 and size == SMALL:
            out.append(c.Row(f"added p50, {key}", "gateway", f"{s['added_p50_ms']:.3f} ms",
                             f"≤ {ADDED_P50_TARGET_MS} ms", s["added_p50_ms"] <= ADDED_P50_TARGET_MS,
                             f"direct p50 {s['direct_p50_ms']:.3f} ms; added p99 {s['added_p99_ms']:.3f} ms",
                             s["added_p50_ms"]))
        else:
            out.append(c.Row(f"added p50, {key}", "gateway", f"{s['added_p50_ms']:.3f} ms",
                             note=f"added p99 {s['added_p99_ms']:.3f} ms", value=s["added_p50_ms"]))
        out.append(c.Row(f"byte relay (floor), {key}", "byte relay", f"{s['relay_cpu_us']:.0f} µs",
                         note=f"{s['relay_throughput_ratio'] * 100:.0f} % of direct throughput, added p50 "
                              f"{s['relay_added_p50_ms']:.3f} ms", value=s["relay_cpu_us"]))
        ratio = s["throughput_ratio"]
        met = ratio >= THROUGHPUT_TARGET if size == BIG else None
        out.append(c.Row(f"throughput vs direct, {key}", "gateway", f"{ratio * 100:.0f} %",
                         f"≥ {THROUGHPUT_TARGET * 100:.0f} %" if size == BIG else "-", met,
                         f"direct {s['direct_throughput']:.0f}/s, gateway {s['gateway_throughput']:.0f}/s", ratio))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1 round, a fifth of the requests")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default 5, 1 with --quick)")

    def prepare(args: argparse.Namespace) -> None:
        if args.rounds is None:
            args.rounds = 1 if args.quick else 5

    def render(report: dict[str, Any], console: Any) -> None:
        c.render_report("Gateway cost: direct vs through the gateway (bench/gateway.py)", report, console)

    return c.bench_main(NAME, parser, argv, run, prepare=prepare, render=render, timed=True)


if __name__ == "__main__":
    sys.exit(main())
