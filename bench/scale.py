"""Scale (issue 26): N = 200, 1,000, 2,000, 5,000 and 10,000 models, side by side, in one run each.

The repository: one python model `base` (answers [gen, gen]) and N-1 tiny ensembles over it
(`m00001`, ... : config.pbtxt and an empty 1/). Ensembles, because they are real models to both
systems yet need no process of their own: every python model instance runs a ≈37 MB stub process,
so N python models cannot all load on this machine.

Per N, in this order:
  * Triton explicit, `--model-control-mode=explicit --load-model=*`: start to live and to every model
    READY in its index; idle CPU and RSS (the baseline tritonctl's auto policy is held against).
  * Triton poll (`--repository-poll-secs=1`): its own start-up, to live (bounded).
  * Triton explicit started with no model, then every model loaded by its own `load_model` request,
    `base` first, the ensembles one at a time and then four at a time (up to `--one-by-one-max`
    models): what any control plane that loads models one request at a time pays in Triton alone,
    since Triton's cost per request grows with the models it holds.
  * tritonctl, `--policy manual` (record only, nothing to load), its own launched tritonserver:
    (a) first start to READY; (b) restart with nothing changed to READY; with the daemon's counters
    (tritonctl_source_captures_total, tritonctl_startup_models_total) from its metrics endpoint.
  * tritonctl, `--policy auto`, READY after the scan (`ready_waits_for_deploys = false`),
    `--keep-triton`: (a) first start to READY and to every model READY in Triton's index;
    (d) idle CPU of the daemon (process CPU time over the idle window, its rescans and reconciles
    included; its tritonserver reported apart) and its RSS; (e) `status --json` and `versions M`
    (medians of 3, through the CLI); (c) one edit while N models serve: a python model directory
    renamed into the repository, time to its first answer less Triton's own load of it (Triton's
    log); (b) a restart with nothing changed (the tritonserver kept serving): to READY and to every
    model READY again; (f) a start after a reboot (the daemon and its tritonserver both stopped): to
    READY and to every model READY in a fresh tritonserver, once with `launch_loads_serving` (the
    server loads them in its own start-up, controlplane/startup/preload.py) and once without (one
    load request each, as before).

Bytecode: the daemons and CLIs run without PYTHONDONTWRITEBYTECODE (set in this machine's environment), as
an installed tritonctl runs: with it, every restart compiled tritonctl's own modules from source again.

Targets at 10,000 models (on this 2-core machine): first start -> READY <= 20 s (manual); restart,
nothing changed -> READY <= 2 s; every model serving (auto, recorded by the daemon) within 60 s, and
within 4x Triton explicit's start-up at 2,000 models (issue 39);
one edit's overhead within 50 ms of its overhead at the smallest N; idle CPU <= 1 % of one core;
daemon RSS <= 300 MB; `status --json` <= 1 s. The report is written after every part of every N,
so a run cut short keeps what it finished.

    python bench/scale.py                        # 200,1000,2000,5000,10000
    python bench/scale.py --counts 200,1000      # some sizes
    python bench/scale.py --quick                # 200 models, short idle window
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as c  # noqa: E402

NAME = "scale"
TARGET_IDLE_PCT = 1.0
TARGET_RSS_MB = 300.0
TARGET_READY_S = 20.0
TARGET_RESTART_S = 2.0
TARGET_SERVING_RATIO = 4.0  # every model serving (auto) vs Triton explicit's own start-up (issue 39: at 2,000)
TARGET_SERVING_S = 60.0  # every model serving (auto) at 10,000 models (issue 39)
TARGET_EDIT_DRIFT_MS = 50.0  # one edit's overhead at the largest N vs at the smallest
TARGET_STATUS_S = 1.0
GATE_MODELS = 10_000
EDIT_TRIALS = 3

ENSEMBLE = """name: "{name}"
platform: "ensemble"
max_batch_size: 8
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "gen" data_type: TYPE_FP32 dims: [ 2 ] }} ]
ensemble_scheduling {{
  step [ {{ model_name: "base" model_version: -1 input_map {{ key: "x" value: "x" }}
            output_map {{ key: "gen" value: "gen" }} }} ]
}}
"""


def make_repository(repo: Path, count: int) -> None:
    repo.mkdir(parents=True)
    c.write_pair_model(repo, "base", 1)
    for i in range(1, count):
        name = f"m{i:05d}"
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(ENSEMBLE.format(name=name))


def inotify_watches(pid: int) -> int:
    """Watches held by the inotify instances of `pid` (lines 'inotify wd:' in /proc/<pid>/fdinfo)."""
    total = 0
    try:
        for fd in os.listdir(f"/proc/{pid}/fdinfo"):
            try:
                total += sum(1 for line in Path(f"/proc/{pid}/fdinfo/{fd}").read_text().splitlines()
                             if line.startswith("inotify wd:"))
            except OSError:
                continue
    except OSError:
        return -1
    return total


def idle_cpu(pids: dict[str, list[int]], window_s: float) -> dict[str, float]:
    """Percent of one core each group of processes used over the window."""
    def total(group: list[int]) -> float:
        s = 0.0
        for p in group:
            try:
                s += c.cpu_seconds(p)
            except (OSError, ValueError, IndexError):
                pass
        return s

    before = {k: total(v) for k, v in pids.items()}
    t0 = time.monotonic()
    time.sleep(window_s)
    wall = time.monotonic() - t0
    return {k: round(100 * (total(v) - before[k]) / wall, 3) for k, v in pids.items()}


def rss_mb(pid: int, key: str) -> float:
    """MB of VmRSS / VmHWM; 0 for a process that has gone meanwhile."""
    try:
        return round(c.status_kb(pid, key) / 1024, 1)
    except (OSError, ValueError):
        return 0.0


def _all_ready(url: str, count: int, state: Path | None = None) -> Callable[[], bool]:
    """Whether Triton's index lists `count` models READY. A tritonctl-launched server restricts its
    repository API to the key in `state`/triton/server.json (controlplane/triton/launcher.py)."""
    import json

    import tritonclient.grpc as grpcclient

    def check() -> bool:
        headers = None
        if state is not None:
            try:
                key = json.loads((state / "triton" / "server.json").read_text()).get("restricted_key")
            except (OSError, ValueError):
                return False
            headers = {"triton-grpc-protocol-tritonctl-key": key} if key else None
        client = grpcclient.InferenceServerClient(url)
        try:
            index = client.get_model_repository_index(headers=headers, client_timeout=60)
            return sum(1 for m in index.models if m.state == "READY") >= count
        except Exception:  # noqa: BLE001 - not up yet
            return False
        finally:
            client.close()

    return check


def _metrics_text(port: int, timeout_s: float = 30.0) -> str:
    """The daemon's metrics endpoint, as text (controlplane/outcomes/metrics.py)."""
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=timeout_s) as response:
        return response.read().decode()


def _serving_in_registry(port: int, count: int) -> Callable[[], bool]:
    """Whether the daemon's metrics say `count` models are `serving`: their deploys ended and recorded
    (Triton's index lists a model READY before the daemon has verified and recorded it)."""

    def check() -> bool:
        try:
            text = _metrics_text(port, 60.0)
        except OSError:
            return False
        return len(re.findall(r'^tritonctl_model_state\{[^}]*state="serving"\} 1\.0$', text, re.M)) >= count

    return check


def _start_to_ready(daemon: Any, args: argparse.Namespace, count: int | None, out: dict[str, Any], tag: str,
                    metrics_port: int | None = None) -> None:
    """Start `daemon`; time its READY log line and (`count`) every model READY in Triton's index, then
    (`metrics_port`) every model `serving` in the daemon's own record: `all_recorded_s`, when its deploys
    are over."""
    daemon.log_path.write_text("")  # the READY line of this start only
    t0 = time.monotonic()
    daemon.start(wait=False)
    ready = c.wait_until(lambda: daemon.proc.poll() is not None or "ready: control socket" in daemon.log_tail(10**7),
                         args.daemon_start_timeout, 0.02)
    if ready is None or daemon.proc.poll() is not None:
        raise SystemExit(f"daemon not READY after {args.daemon_start_timeout} s: {daemon.log_tail()}")
    out[f"{tag}ready_s"] = round(time.monotonic() - t0, 2)
    try:  # the daemon's own CPU until READY (utime + stime): what the machine's load does not inflate
        out[f"{tag}ready_cpu_s"] = round(c.cpu_seconds(daemon.proc.pid), 2)
        out[f"{tag}ready_children_cpu_s"] = round(c.children_cpu_seconds(daemon.proc.pid), 2)  # capture workers
    except (OSError, ValueError, IndexError):
        out[f"{tag}ready_cpu_s"] = out[f"{tag}ready_children_cpu_s"] = None
    if count is None:
        return
    if c.wait_until(_all_ready(daemon.triton_url(), count, daemon.state_dir), args.daemon_start_timeout,
                    0.5) is None:
        out[f"{tag}all_serving_s"] = None
    else:
        out[f"{tag}all_serving_s"] = round(time.monotonic() - t0, 2)
    if metrics_port is not None:
        recorded = c.wait_until(_serving_in_registry(metrics_port, count), args.daemon_start_timeout, 1.0)
        out[f"{tag}all_recorded_s"] = None if recorded is None else round(time.monotonic() - t0, 2)


def _rescan_done(daemon: Any, args: argparse.Namespace) -> bool:
    """Wait for the evidence that this start's inotify watches are in place and the rescan after them
    ran (it runs behind READY), then one settle window more, for a change it found to be captured: the
    restart's counters are read after everything that start does. False: no such line (polling)."""
    seen = c.wait_until(lambda: "inotify watches in place" in daemon.log_tail(10**7), args.daemon_start_timeout, 0.2)
    if seen is None:
        return False
    time.sleep(daemon.settle_s + 1.5)
    return True


def _counters(port: int) -> dict[str, float]:
    """The daemon's own counts of the source pipeline (controlplane/outcomes/metrics.py)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(_metrics_text(port)):
        for sample in family.samples:
            if sample.name.startswith(("tritonctl_source_", "tritonctl_startup_models")):
                label = sample.labels.get("result")
                out[sample.name.removeprefix("tritonctl_") + (f"_{label}" if label else "")] = sample.value
    return out


def _metrics_args() -> tuple[int, list[str]]:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    return port, ["--metrics-port", str(port)]


def _stop_kept_triton(daemon: Any) -> None:
    """--keep-triton left the daemon's tritonserver running, and its gateway: stop the server by its pid (the
    one this run launched), and the gateway (tests/harness.py kill_gateway)."""
    import signal

    from tests.harness import kill_gateway

    kill_gateway(daemon.state_dir)
    triton_pid = daemon.triton_pid()
    if triton_pid:
        os.kill(triton_pid, signal.SIGTERM)
        c.wait_until(lambda: daemon.triton_pid() is None, 60, 0.2)


def measure_manual(repo: Path, state: Path, count: int, args: argparse.Namespace, console: Any) -> dict[str, Any]:
    """(a) first start to READY and (b) a restart with nothing changed, policy manual (record only)."""
    port, extra = _metrics_args()
    daemon = c.daemon_process(repo, state, 1.0, policy="manual", extra=[*extra, "--keep-triton"])
    out: dict[str, Any] = {"models": count}
    try:
        _start_to_ready(daemon, args, None, out, "first_")  # its tritonserver launched
        out["first_counters"] = _counters(port)
        daemon.stop()
        _start_to_ready(daemon, args, None, out, "restart_")  # its tritonserver adopted
        out["restart_rescan_done"] = _rescan_done(daemon, args)
        out["restart_counters"] = _counters(port)
        out["peak_rss_mb"] = rss_mb(daemon.proc.pid, "VmHWM")
        # (e) at every N, not only where auto policy ran: N models recorded, none serving
        out["status_json_s"] = _cli_median(daemon, 3, "status", "--json")
        out["versions_s"] = _cli_median(daemon, 3, "versions", "m00001")
    finally:
        daemon.stop()
        _stop_kept_triton(daemon)
    console.print(f"[dim]tritonctl manual, {count} models: first start READY {out['first_ready_s']} s, restart "
                  f"READY {out['restart_ready_s']} s (captures {out['restart_counters'].get('source_captures_total')})"
                  "[/dim]")
    return out


def _cli_median(daemon: Any, runs: int, *argv: str) -> float:
    times = []
    for _ in range(runs):
        t = time.monotonic()
        daemon.cli(*argv, timeout_s=300)
        times.append(time.monotonic() - t)
    return round(c.median(times), 3)


def _edit_latency(daemon: Any, repo: Path, staging: Path, trial: int, args: argparse.Namespace) -> dict[str, Any]:
    """A python model directory renamed into the repository while N serve: first answer less Triton's load."""
    from change_latency import triton_load_s

    model = f"edit{trial}"
    staged = c.write_pair_model(staging, model, 1)
    # older than RACY_RECORD_NS when it is captured: its signature is recorded as trusted, so the restart
    # with nothing changed has nothing to capture again (a model captured within a second of its last
    # write is captured again at the next start: controlplane/source/poller.py)
    time.sleep(1.2)
    t0 = time.monotonic()
    os.rename(staged, repo / model)
    first = c.serves(daemon.triton_url(), model, 1, args.edit_timeout)
    if first is None:
        return {"model": model, "latency_s": None}
    time.sleep(0.5)  # Triton's log line is written
    log_text = "\n".join(p.read_text(errors="replace") for p in (daemon.state_dir / "triton").rglob("*.log"))
    load = triton_load_s(log_text, model)
    return {"model": model, "latency_s": round(first - t0, 4), "triton_load_s": load,
            "added_s": None if load is None else round(first - t0 - load, 4)}


def measure_auto(repo: Path, state: Path, count: int, args: argparse.Namespace, console: Any) -> dict[str, Any]:
    """Every model serving through tritonctl (policy auto, READY after the scan, tritonserver kept)."""
    port, extra = _metrics_args()
    daemon = c.daemon_process(repo, state, 1.0, policy="auto", extra=[*extra, "--keep-triton"])
    daemon.env["TRITONCTL_READY_WAITS_FOR_DEPLOYS"] = "false"
    out: dict[str, Any] = {"models": count}
    staging = state.parent / f"staging-{count}"
    staging.mkdir(exist_ok=True)
    try:
        _start_to_ready(daemon, args, count, out, "", port)
        console.print(f"[dim]tritonctl auto, {count} models: READY {out['ready_s']} s, all serving "
                      f"{out['all_serving_s']} s, all recorded {out['all_recorded_s']} s[/dim]")
        time.sleep(5.0)
        pid = daemon.proc.pid
        triton_pid = daemon.triton_pid()
        triton_group = [triton_pid, *c.descendants(triton_pid)] if triton_pid else []
        window = args.idle_large if count >= args.idle_large_from else args.idle
        cpu = idle_cpu({"daemon": [pid], "triton": triton_group}, window)
        out["idle_window_s"] = window
        out["idle_cpu_pct"] = cpu["daemon"]
        out["idle_cpu_pct_triton"] = cpu["triton"]
        out["rss_mb"] = rss_mb(pid, "VmRSS")
        out["peak_rss_mb"] = rss_mb(pid, "VmHWM")
        out["triton_rss_mb"] = round(sum(rss_mb(p, "VmRSS") for p in triton_group), 1)
        out["inotify_watches"] = inotify_watches(pid)
        out["status_json_s"] = _cli_median(daemon, 3, "status", "--json")
        out["versions_s"] = _cli_median(daemon, 3, "versions", "m00001")
        edits = [_edit_latency(daemon, repo, staging, k, args) for k in range(args.edits)]
        out["edits"] = edits
        added = [e["added_s"] for e in edits if e.get("added_s") is not None]
        out["edit_added_median_s"] = round(c.median(added), 4) if added else None
        console.print(f"[dim]  idle {cpu['daemon']:.2f} % over {window:g} s, RSS {out['rss_mb']} MB, status "
                      f"{out['status_json_s']} s, edit +{out['edit_added_median_s']} s beyond Triton's load[/dim]")
        daemon.stop()  # --keep-triton: the tritonserver keeps serving every model
        _start_to_ready(daemon, args, count + len(edits), out, "restart_")
        # READY comes before the scan here (ready_waits_for_deploys = false): its counts once it ran
        seen = c.wait_until(lambda: (k := _counters(port)) and k.get("startup_models_total_unchanged", 0)
                            + k.get("startup_models_total_changed", 0) >= count + len(edits) and k, 600, 0.5)
        out["restart_rescan_done"] = bool(seen) and _rescan_done(daemon, args)
        out["restart_counters"] = _counters(port)
        console.print(f"[dim]  restart, nothing changed: READY {out['restart_ready_s']} s, all serving "
                      f"{out['restart_all_serving_s']} s[/dim]")
        if args.reboot:  # (f) the daemon and its tritonserver both gone: the next start launches a fresh one
            ways = [("reboot_", "true")]
            if count <= args.one_by_one_max:  # 151 s at 1,000 models before; it grows as N squared (Triton)
                ways.append(("reboot_one_by_one_", "false"))
            for tag, loads in ways:
                daemon.stop(kill_triton=True)
                daemon.env["TRITONCTL_LAUNCH_LOADS_SERVING"] = loads
                _start_to_ready(daemon, args, count + len(edits), out, tag)
                # the daemon's own line: Triton live, its start-up loads done (controlplane/daemon.py)
                live = re.search(r"tritonserver live ([0-9.]+) s after launch, its start-up loads done \((\d+) of",
                                 daemon.log_tail(10**7))
                out[tag + "triton_live_s"] = float(live.group(1)) if live else None
                out[tag + "start_up_loads"] = int(live.group(2)) if live else 0
                console.print(f"[dim]  reboot (launch_loads_serving = {loads}): READY {out[tag + 'ready_s']} s, "
                              f"all serving {out[tag + 'all_serving_s']} s[/dim]")
            daemon.env.pop("TRITONCTL_LAUNCH_LOADS_SERVING")
    finally:
        daemon.stop()
        _stop_kept_triton(daemon)
        for edit in staging.iterdir():
            shutil.rmtree(edit, ignore_errors=True)
        for k in range(args.edits):
            shutil.rmtree(repo / f"edit{k}", ignore_errors=True)
    return out


def measure_triton_explicit(repo: Path, work: Path, count: int, args: argparse.Namespace,
                            console: Any) -> dict[str, Any]:
    """Triton explicit holding every model (`--load-model=*`): start to live (all loaded), idle CPU, RSS."""
    server = c.triton_server(repo, work, mode="explicit", extra=["--load-model=*"])
    out: dict[str, Any] = {"models": count}
    t0 = time.monotonic()
    try:
        try:
            server.start(live_timeout_s=args.daemon_start_timeout)
        except Exception as exc:  # noqa: BLE001 - a start that does not finish is a result
            out["live_s"] = None
            out["error"] = " ".join(str(exc).split())[:300]
            return out
        out["live_s"] = round(time.monotonic() - t0, 2)
        ok = c.wait_until(_all_ready(server.grpc_url, count), 120, 0.5)
        out["all_ready_s"] = None if ok is None else round(time.monotonic() - t0, 2)
        console.print(f"[dim]Triton explicit, {count} models: live {out['live_s']} s[/dim]")
        time.sleep(5.0)
        assert server.pid is not None
        group = [server.pid, *c.descendants(server.pid)]
        out["idle_cpu_pct"] = idle_cpu({"triton": group}, args.idle_baseline)["triton"]
        out["rss_mb"] = round(sum(rss_mb(p, "VmRSS") for p in group), 1)
        out["peak_rss_mb"] = rss_mb(server.pid, "VmHWM")
    finally:
        server.stop(timeout_s=30)
    return out


def measure_triton_requests(repo: Path, work: Path, count: int, args: argparse.Namespace,
                            console: Any) -> dict[str, Any]:
    """Triton explicit with no model at start; then `base` and each ensemble by its own load request:
    the ensembles in turn (one request at a time), then, on a fresh server, four at a time. Per
    concurrency: first request to the last answered, and the mean request time over each tenth."""
    import concurrent.futures

    import tritonclient.grpc as grpcclient

    names = [f"m{i:05d}" for i in range(1, count)]
    out: dict[str, Any] = {"models": count}
    for concurrency in (1, 4):
        (work / f"c{concurrency}").mkdir(parents=True, exist_ok=True)
        server = c.triton_server(repo, work / f"c{concurrency}", mode="explicit")
        try:
            server.start(live_timeout_s=args.triton_start_timeout)
            client = grpcclient.InferenceServerClient(server.grpc_url)
            t0 = time.monotonic()
            client.load_model("base")
            clients = [grpcclient.InferenceServerClient(server.grpc_url) for _ in range(concurrency)]

            def load(i: int, clients: list[Any] = clients) -> float:
                t = time.monotonic()
                clients[i % len(clients)].load_model(names[i])
                return time.monotonic() - t

            with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
                took = list(pool.map(load, range(len(names))))
            total = round(time.monotonic() - t0, 2)
            ok = c.wait_until(_all_ready(server.grpc_url, count), 60, 0.5)
            tenth = max(1, len(took) // 10)
            out[f"concurrency_{concurrency}"] = {
                "all_loaded_s": total if ok is not None else None,
                "request_ms_by_tenth": [round(1000 * sum(took[i:i + tenth]) / len(took[i:i + tenth]), 1)
                                        for i in range(0, len(took), tenth)]}
            console.print(f"[dim]Triton explicit, {count} load requests, {concurrency} at a time: {total} s[/dim]")
        except Exception as exc:  # noqa: BLE001 - a server that does not finish is a result
            out[f"concurrency_{concurrency}"] = {"all_loaded_s": None, "error": " ".join(str(exc).split())[:300]}
        finally:
            server.stop(timeout_s=30)
    return out


def _exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        import signal

        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def measure_triton_poll(repo: Path, work: Path, count: int, args: argparse.Namespace, console: Any,
                        timeout_s: float) -> dict[str, Any]:
    server = c.triton_server(repo, work, mode="poll")
    out: dict[str, Any] = {"models": count, "start_timeout_s": timeout_s}
    t0 = time.monotonic()
    try:
        try:
            server.start(live_timeout_s=timeout_s)
        except Exception as exc:  # noqa: BLE001 - a start that does not finish is a result
            out["live_s"] = None
            out["error"] = " ".join(str(exc).split())[:300]
            console.print(f"[dim]Triton poll, {count} models: not live after {time.monotonic() - t0:.0f} s[/dim]")
            return out
        live_at = time.monotonic()
        out["live_s"] = round(live_at - t0, 2)
        out["loads_logged_at_live"] = c.triton_load_counts(server.log_path)["loaded"]
        console.print(f"[dim]Triton poll, {count} models: live after {out['live_s']} s[/dim]")
        if not args.poll_idle:  # its own start-up is what the table compares
            return out
        # its first polls: the python stub wrote __pycache__ into the repository during the start,
        # which Triton takes for a change of `base` (and reloads every ensemble that depends on it)
        time.sleep(args.after_live)
        if not _poll_alive(server, out, live_at, console, count):
            return out
        import tritonclient.grpc as grpcclient

        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            index = client.get_model_repository_index(client_timeout=60)
            out["models_ready"] = sum(1 for m in index.models if m.state == "READY")
        except Exception as exc:  # noqa: BLE001 - reported
            out["index_error"] = " ".join(str(exc).split())[:200]
        finally:
            client.close()
        assert server.pid is not None
        group = [server.pid, *c.descendants(server.pid)]
        loads_before = c.triton_load_counts(server.log_path)["loaded"]
        cpu = idle_cpu({"triton": group}, args.idle)
        out["idle_cpu_pct"] = cpu["triton"]
        out["reloads_during_idle"] = c.triton_load_counts(server.log_path)["loaded"] - loads_before
        if not _poll_alive(server, out, live_at, console, count):
            return out
        out["rss_mb"] = round(sum(rss_mb(p, "VmRSS") for p in group), 1)
        out["peak_rss_mb"] = rss_mb(server.pid, "VmHWM")
    finally:
        server.stop(timeout_s=30)
    return out


def _poll_alive(server: Any, out: dict[str, Any], live_at: float, console: Any, count: int) -> bool:
    """Record a crash of the poll-mode server (it happens: 10,000 models) instead of measuring a corpse."""
    if server.is_running():
        return True
    code = server.process.returncode if server.process else None
    out["crashed"] = _exit_text(code)
    out["crashed_after_live_s"] = round(time.monotonic() - live_at, 1)  # at most: noticed at this point
    tail = [line for line in server.log_tail(20_000).splitlines() if line.strip()]
    out["log_tail"] = tail[-25:]
    out["reloads_logged_after_live"] = c.triton_load_counts(server.log_path)["loaded"] - out["loads_logged_at_live"]
    console.print(f"[dim]Triton poll, {count} models: server {out['crashed']} within "
                  f"{out['crashed_after_live_s']} s of being live[/dim]")
    return False


def run(args: argparse.Namespace, console: Any) -> dict[str, Any]:
    machine = c.machine_info()
    results: list[dict[str, Any]] = []
    report = c.base_report(NAME, args.argv, args.quick, machine)
    report["settings"] = {"counts": args.counts, "idle_window_s": args.idle, "idle_window_large_s": args.idle_large,
                          "idle_large_from": args.idle_large_from, "idle_baseline_s": args.idle_baseline,
                          "edits": args.edits, "reconcile_interval_s": 10.0, "triton_poll_secs": 1,
                          "triton_load_threads": 4}
    report["settings"]["bytecode"] = "read (.pyc), PYTHONDONTWRITEBYTECODE unset"
    report["results"], report["rows"], report["runtime_s"] = results, [], 0.0
    # An installed tritonctl reads its bytecode (pip compiles at install). This machine's environment sets
    # PYTHONDONTWRITEBYTECODE, under which every daemon start compiled tritonctl's own ~90 modules from
    # source again: 0.3-0.5 s of CPU of every restart (cProfile: source_to_code), no installed daemon pays.
    # The daemons and CLIs started from here write their .pyc once (a first start) and read them after.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    started = time.monotonic()
    with c.workspace(NAME) as base:
        for count in args.counts:
            repo = base / f"repo-{count}"
            t = time.monotonic()
            make_repository(repo, count)
            console.print(f"[dim]{count} models written in {time.monotonic() - t:.1f} s[/dim]")
            time.sleep(1.5)  # older than the racy-signature window (controlplane/source/poller.py)
            result: dict[str, Any] = {"models": count}
            results.append(result)

            def keep() -> None:
                _write_so_far(report, started, args, console)

            if "explicit" in args.parts:
                result["triton_explicit"] = measure_triton_explicit(repo, base / f"explicit-{count}", count, args,
                                                                    console)
                keep()
            if "requests" in args.parts and count <= args.one_by_one_max:
                result["triton_requests"] = measure_triton_requests(repo, base / f"requests-{count}", count, args,
                                                                    console)
                keep()
            if "poll" in args.parts:
                timeout = args.triton_start_timeout if count <= 1000 else args.triton_start_timeout_large
                result["triton_poll"] = measure_triton_poll(repo, base / f"poll-{count}", count, args, console,
                                                            timeout)
                keep()
            if "manual" in args.parts:
                result["tritonctl_manual"] = measure_manual(repo, base / f"manual-{count}", count, args, console)
                shutil.rmtree(base / f"manual-{count}", ignore_errors=True)
                keep()
            if "auto" in args.parts:
                result["tritonctl"] = measure_auto(repo, base / f"auto-{count}", count, args, console)
                shutil.rmtree(base / f"auto-{count}", ignore_errors=True)
                keep()
            shutil.rmtree(repo, ignore_errors=True)
            subprocess.run(["sync"], check=False)
    return report


def _write_so_far(report: dict[str, Any], started: float, args: argparse.Namespace, console: Any) -> None:
    """The report as it stands, written after every part of every size: a run cut short keeps what it
    finished (10,000 models under auto policy take most of an hour, in Triton's own load requests)."""
    report["rows"] = [r.to_json() for r in rows(report)]
    report["runtime_s"] = round(time.monotonic() - started, 1)
    report["machine"]["load_average_end"] = c.load_average()
    if args.out_path is not None:
        c.write_report(args.out_path, report, console)


def _s(v: Any) -> str:
    return "-" if v is None else f"{v:.2f} s"


def rows(report: dict[str, Any]) -> list[c.Row]:
    out: list[c.Row] = []
    results = sorted(report["results"], key=lambda r: r["models"])
    smallest = results[0] if results else None
    for res in results:
        n = res["models"]
        gate = n >= GATE_MODELS
        tag = f"{n:,} models"
        out += _manual_rows(res, tag, gate)
        out += _auto_rows(res, tag, gate, smallest)
    return out


def _manual_rows(res: dict[str, Any], tag: str, gate: bool) -> list[c.Row]:
    out: list[c.Row] = []
    manual = res.get("tritonctl_manual")
    if manual is not None:
        restart_captures = manual["restart_counters"].get("source_captures_total", 0)
        out.append(c.Row(f"{tag}: (a) first start -> READY, policy manual", "tritonctl", _s(manual["first_ready_s"]),
                         f"<= {TARGET_READY_S:g} s" if gate else "-",
                         (manual["first_ready_s"] <= TARGET_READY_S) if gate else None,
                         f"{manual['first_counters'].get('source_captures_total', 0):.0f} captures"
                         + (f"; daemon CPU to READY {manual['first_ready_cpu_s']:.1f} s, its capture workers' "
                            f"{manual['first_ready_children_cpu_s']:.1f} s"
                            if manual.get("first_ready_children_cpu_s") is not None else ""),
                         value=manual["first_ready_s"]))
        out.append(c.Row(f"{tag}: (b) restart, nothing changed -> READY, policy manual", "tritonctl",
                         _s(manual["restart_ready_s"]), f"<= {TARGET_RESTART_S:g} s" if gate else "-",
                         (manual["restart_ready_s"] <= TARGET_RESTART_S) if gate else None,
                         f"{restart_captures:.0f} captures, "
                         f"{manual['restart_counters'].get('startup_models_total_unchanged', 0):.0f} unchanged"
                         + (f"; daemon CPU to READY {manual['restart_ready_cpu_s']:.1f} s"
                            if manual.get("restart_ready_cpu_s") is not None else ""),
                         value=manual["restart_ready_s"]))
    ex, poll = res.get("triton_explicit") or {}, res.get("triton_poll")
    if ex:
        out.append(c.Row(f"{tag}: start -> live / every model READY", "Triton explicit --load-model=*",
                         f"{_s(ex.get('live_s'))} / {_s(ex.get('all_ready_s'))}", value=ex.get("all_ready_s"),
                         note=ex.get("error", "")[:80]))
    requests = res.get("triton_requests") or {}
    one, four = requests.get("concurrency_1") or {}, requests.get("concurrency_4") or {}
    if one or four:
        out.append(c.Row(f"{tag}: every model loaded by its own load request, one / four at a time",
                         "Triton explicit, load_model",
                         f"{_s(one.get('all_loaded_s'))} / {_s(four.get('all_loaded_s'))}",
                         value=one.get("all_loaded_s"),
                         note=(f"one request: {one['request_ms_by_tenth'][0]:g} ms in the first tenth, "
                               f"{one['request_ms_by_tenth'][-1]:g} ms in the last")
                         if one.get("request_ms_by_tenth") else (one.get("error") or "")[:80]))
    if poll is not None:
        out.append(c.Row(f"{tag}: start -> live (every model loaded)", "Triton poll", _s(poll.get("live_s")),
                         value=poll.get("live_s"), note=(poll.get("error", "") or "")[:80]))
    return out


def _auto_rows(res: dict[str, Any], tag: str, gate: bool, smallest: dict[str, Any] | None) -> list[c.Row]:
    out: list[c.Row] = []
    ctl, ex = res.get("tritonctl"), res.get("triton_explicit") or {}
    if ctl is None:
        return out
    base = ex.get("all_ready_s")
    # serving: recorded `serving` by the daemon (its deploys over) where measured, else READY in Triton's index
    serving = ctl.get("all_recorded_s") or ctl.get("all_serving_s")
    ratio = round(serving / base, 2) if serving and base else None
    floor = ((res.get("triton_requests") or {}).get("concurrency_1") or {}).get("all_loaded_s")
    note = f"{ratio}x Triton explicit's start-up" if ratio else ""
    if floor and serving:
        note += f"; {serving / floor:.2f}x Triton's own load requests, one at a time"
    if ctl.get("all_recorded_s"):
        note += f"; every model READY in Triton's index at {_s(ctl.get('all_serving_s'))}"
    # issue 39's targets: within 4x Triton explicit at 2,000 models, within 60 s at 10,000
    large, gated = res.get("models", 0) >= GATE_MODELS, res.get("models", 0) in (2_000, GATE_MODELS)
    target = f"<= {TARGET_SERVING_S:g} s" if large else f"<= {TARGET_SERVING_RATIO:g}x Triton explicit"
    met = (serving is not None and serving <= TARGET_SERVING_S) if large else (
        ratio is not None and ratio <= TARGET_SERVING_RATIO)
    out.append(c.Row(f"{tag}: (a) first start -> READY / every model serving, policy auto", "tritonctl",
                     f"{_s(ctl['ready_s'])} / {_s(serving)}", target if gated else "-", met if gated else None,
                     note, value=serving))
    restart_auto = ctl.get("restart_ready_s")
    out.append(c.Row(f"{tag}: (b) restart, nothing changed, tritonserver kept -> READY / all serving",
                     "tritonctl", f"{_s(restart_auto)} / {_s(ctl.get('restart_all_serving_s'))}",
                     f"<= {TARGET_RESTART_S:g} s" if gate else "-",
                     (restart_auto is not None and restart_auto <= TARGET_RESTART_S) if gate else None,
                     f"{ctl.get('restart_counters', {}).get('source_captures_total', 0):.0f} captures",
                     value=restart_auto))
    if ctl.get("reboot_all_serving_s") is not None or ctl.get("reboot_one_by_one_all_serving_s") is not None:
        loaded, one_by_one = ctl.get("reboot_all_serving_s"), ctl.get("reboot_one_by_one_all_serving_s")
        out.append(c.Row(f"{tag}: (f) start after a reboot (fresh tritonserver) -> READY / every model serving",
                         "tritonctl", f"{_s(ctl.get('reboot_ready_s'))} / {_s(loaded)}", "-", None,
                         f"one load request each (launch_loads_serving = false): {_s(one_by_one)}; Triton "
                         f"explicit {_s(base)}", value=loaded))
    added = ctl.get("edit_added_median_s")
    drift = None
    first = (smallest or {}).get("tritonctl") or {}
    if added is not None and first.get("edit_added_median_s") is not None:
        drift = round((added - first["edit_added_median_s"]) * 1000, 1)
    out.append(c.Row(f"{tag}: (c) one edit (renamed in) -> first answer, less Triton's own load, median",
                     "tritonctl", _s(added),
                     f"<= +{TARGET_EDIT_DRIFT_MS:g} ms vs {smallest['models']:,}" if gate and smallest else "-",
                     (drift is not None and drift <= TARGET_EDIT_DRIFT_MS) if gate else None,
                     f"{drift:+.0f} ms vs {smallest['models']:,} models" if drift is not None and smallest else "",
                     value=added))
    out.append(c.Row(f"{tag}: (d) idle CPU over {ctl['idle_window_s']:g} s, daemon (% of one core)", "tritonctl",
                     f"{ctl['idle_cpu_pct']:.2f} %", f"<= {TARGET_IDLE_PCT:g} %" if gate else "-",
                     (ctl["idle_cpu_pct"] <= TARGET_IDLE_PCT) if gate else None,
                     f"its tritonserver {ctl['idle_cpu_pct_triton']:.2f} %; Triton explicit "
                     f"{ex.get('idle_cpu_pct', '-')} %", value=ctl["idle_cpu_pct"]))
    out.append(c.Row(f"{tag}: (d) daemon RSS, peak", "tritonctl", f"{ctl['peak_rss_mb']:.0f} MB",
                     f"<= {TARGET_RSS_MB:g} MB" if gate else "-",
                     (ctl["peak_rss_mb"] <= TARGET_RSS_MB) if gate else None,
                     f"now {ctl['rss_mb']:.0f} MB; its tritonserver {ctl['triton_rss_mb']:.0f} MB; Triton explicit "
                     f"{ex.get('rss_mb', '-')} MB", value=ctl["peak_rss_mb"]))
    out.append(c.Row(f"{tag}: (e) status --json / versions M, median of 3", "tritonctl",
                     f"{_s(ctl['status_json_s'])} / {_s(ctl['versions_s'])}",
                     f"<= {TARGET_STATUS_S:g} s (status)" if gate else "-",
                     (ctl["status_json_s"] <= TARGET_STATUS_S) if gate else None, value=ctl["status_json_s"]))
    return out


def render(report: dict[str, Any], console: Any) -> None:
    s = report["settings"]
    c.render_rows(f"scale: {', '.join(f'{n:,}' for n in s['counts'])} models (1 python + ensembles): tritonctl "
                  "(manual; auto, every model serving) beside Triton explicit --load-model=* and Triton poll",
                  [c.Row(**r) for r in report["rows"]], console, c.machine_line(report["machine"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="200 models, 10 s idle window, 1 edit")
    parser.add_argument("--counts", type=lambda s: [int(x) for x in s.split(",")],
                        help="model counts, comma separated (default 200,1000,2000,5000,10000; 200 with --quick)")
    parser.add_argument("--idle", type=float, help="idle window in seconds (default 60; 10 with --quick)")
    parser.add_argument("--idle-large", type=float, default=300.0,
                        help="idle window from --idle-large-from models on (default 300 s: 5 minutes)")
    parser.add_argument("--idle-large-from", type=int, default=10_000)
    parser.add_argument("--idle-baseline", type=float, help="Triton explicit's idle window (default 20; 5 quick)")
    parser.add_argument("--edits", type=int, help=f"edits per size (default {EDIT_TRIALS}; 1 with --quick)")
    parser.add_argument("--edit-timeout", type=float, default=120.0)
    parser.add_argument("--daemon-start-timeout", type=float, default=1200.0)
    parser.add_argument("--triton-start-timeout", type=float, default=240.0, help="up to 1,000 models (s)")
    parser.add_argument("--triton-start-timeout-large", type=float, default=600.0, help="above 1,000 models (s)")
    parser.add_argument("--no-reboot", dest="reboot", action="store_false",
                        help="skip (f): auto policy's start after a reboot, with and without launch_loads_serving")
    parser.add_argument("--one-by-one-max", type=int, default=1000,
                        help="(f) without launch_loads_serving, and Triton's own load requests, only up to "
                             "this many models (their cost grows as N squared, in Triton)")
    parser.add_argument("--poll-idle", action="store_true", help="also Triton poll's idle CPU after its start")
    parser.add_argument("--after-live", type=float, default=5.0,
                        help="seconds between Triton poll being live and its idle window (its first polls)")
    parser.add_argument("--parts", type=lambda v: v.split(","),
                        default=["explicit", "requests", "poll", "manual", "auto"],
                        help="which systems to run, comma separated: explicit, requests, poll, manual, auto "
                             "(default all)")

    def prepare(args: argparse.Namespace) -> None:
        args.counts = args.counts or ([200] if args.quick else [200, 1000, 2000, 5000, 10_000])
        args.idle = args.idle or (10.0 if args.quick else 60.0)
        args.idle_baseline = args.idle_baseline or (5.0 if args.quick else 20.0)
        args.edits = args.edits or (1 if args.quick else EDIT_TRIALS)
        args.out_path = c.results_path(NAME, args.quick, args.out)

    def render_with_runtime(report: dict[str, Any], console: Any) -> None:  # run times itself
        render(report, console)
        console.print(f"runtime {report['runtime_s']:.0f} s")

    return c.bench_main(NAME, parser, argv, run, prepare=prepare, render=render_with_runtime)


if __name__ == "__main__":
    sys.exit(main())
