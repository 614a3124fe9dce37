"""Scale: a source repository of 1,000 and 10,000 tiny models (--quick: 200), a handful loaded.

The repository: one python model `base` (answers [gen, gen]) and N-1 tiny ensembles over it
(`m00001`, ... : config.pbtxt and an empty 1/). Ensembles, because they are real models to both
systems yet need no process of their own: every python model instance runs a ≈37 MB stub process,
so N python models cannot all load on this machine, which Triton's poll mode would have to do.

  * tritonctl: `tritonctl daemon --launch-triton --policy manual` on the repository (the initial scan
    snapshots, validates and records every model), then `tritonctl load` base, m00001, m00002.
    Measured: cold start to the control socket answering and to READY (the daemon's "ready" log line,
    written after the initial scan), idle CPU of the daemon over 60 s (--quick 10 s; utime + stime
    from /proc/<pid>/stat; its tritonserver and stubs reported apart), peak RSS (VmHWM), inotify
    watches it holds (fs.inotify.max_user_watches is the limit).
  * Triton poll: `tritonserver --model-control-mode=poll --repository-poll-secs=1` on the same
    repository; it loads every model before it is live. Measured: start to live (bounded by
    --triton-start-timeout; when it does not make it, the table says so), idle CPU, peak RSS.

Targets (tritonctl, 10,000 models): idle CPU <= 1 % of one core; daemon RSS <= 200 MB.

With --serve-all (issue 15, item 2): every model serves. tritonctl runs with `--policy auto` and
READY after the scan (`ready_waits_for_deploys = false`): first start to READY, to every model READY
in Triton's index, a restart with nothing changed (to READY and to all serving again), idle CPU of
the daemon plus its tritonserver (which includes the daemon's reconciles: one repository-index call
per cycle, controlplane/servedview.py), peak RSS. Beside it Triton explicit holding the same models
(`--model-control-mode=explicit --load-model=*`: start to live, idle CPU, RSS) and Triton poll.
Targets: READY <= 20 s, restart <= 3 s, idle CPU (daemon + its tritonserver) <= 1 % of one core
above Triton explicit's own idle.

    python bench/scale.py            # 1,000 and 10,000 models
    python bench/scale.py --quick    # 200 models
"""

from __future__ import annotations

import argparse
import os
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
TARGET_RSS_MB = 200.0
LOADED = ("base", "m00001", "m00002")

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


def measure_tritonctl(repo: Path, state: Path, count: int, args: argparse.Namespace, console: Any) -> dict[str, Any]:
    daemon = c.daemon_process(repo, state, 1.0, policy="manual")
    out: dict[str, Any] = {"models": count}
    t0 = time.monotonic()
    daemon.start(wait=False)
    try:
        assert daemon.proc is not None
        pid = daemon.proc.pid

        def socket_answers() -> bool:
            if daemon.proc is not None and daemon.proc.poll() is not None:
                raise SystemExit(f"daemon exited {daemon.proc.returncode}: {daemon.log_tail()}")
            return bool(daemon.run("status", "--json").exit_code == 0)

        if c.wait_until(socket_answers, args.daemon_start_timeout, 0.1) is None:
            raise SystemExit(f"daemon socket not answering after {args.daemon_start_timeout} s: {daemon.log_tail()}")
        out["socket_answering_s"] = round(time.monotonic() - t0, 2)
        ready = c.wait_until(lambda: "ready: control socket" in daemon.log_tail(10_000_000),
                             args.daemon_start_timeout, 0.2)
        if ready is None:
            raise SystemExit(f"daemon not READY after {args.daemon_start_timeout} s: {daemon.log_tail()}")
        out["ready_s"] = round(time.monotonic() - t0, 2)
        console.print(f"[dim]tritonctl, {count} models: socket {out['socket_answering_s']} s, "
                      f"READY {out['ready_s']} s[/dim]")
        out["rss_after_start_mb"] = rss_mb(pid, "VmRSS")
        loads = []
        for name in LOADED:
            t = time.monotonic()
            daemon.cli("load", name)
            loads.append(round(time.monotonic() - t, 2))
        out["load_s"] = loads
        status = daemon.status()
        out["models_in_registry"] = len(status["models"])
        out["models_serving"] = sum(1 for m in status["models"] if m["state"] == "serving")
        time.sleep(2.0)  # let the loads' stubs and the CLI's work finish
        triton_pid = daemon.triton_pid()
        triton_group = [triton_pid, *c.descendants(triton_pid)] if triton_pid else []
        cpu = idle_cpu({"daemon": [pid], "triton": triton_group}, args.idle)
        out["idle_cpu_pct"] = cpu["daemon"]
        out["idle_cpu_pct_triton"] = cpu["triton"]
        out["rss_mb"] = rss_mb(pid, "VmRSS")
        out["peak_rss_mb"] = rss_mb(pid, "VmHWM")
        out["triton_rss_mb"] = round(sum(rss_mb(p, "VmRSS") for p in triton_group), 1)
        out["inotify_watches"] = inotify_watches(pid)
        out["threads"] = c.status_kb(pid, "Threads")
    finally:
        daemon.stop()
    out["store_objects"] = sum(1 for _ in (state / "store" / "objects").rglob("*") if _.is_file())
    return out


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


def _start_to_ready(daemon: Any, args: argparse.Namespace, count: int, out: dict[str, Any], tag: str) -> None:
    """Start `daemon`; time its socket, its READY log line and every model READY in Triton's index."""
    daemon.log_path.write_text("")  # the READY line of this start only
    t0 = time.monotonic()
    daemon.start(wait=False)
    ready = c.wait_until(lambda: daemon.proc.poll() is not None or "ready: control socket" in daemon.log_tail(10**7),
                         args.daemon_start_timeout, 0.05)
    if ready is None or daemon.proc.poll() is not None:
        raise SystemExit(f"daemon not READY after {args.daemon_start_timeout} s: {daemon.log_tail()}")
    out[f"{tag}ready_s"] = round(time.monotonic() - t0, 2)
    if c.wait_until(_all_ready(daemon.triton_url(), count, daemon.state_dir), args.daemon_start_timeout,
                    0.5) is None:
        out[f"{tag}all_serving_s"] = None
    else:
        out[f"{tag}all_serving_s"] = round(time.monotonic() - t0, 2)


def measure_tritonctl_all(repo: Path, state: Path, count: int, args: argparse.Namespace,
                          console: Any) -> dict[str, Any]:
    """Every model serving through tritonctl (policy auto, READY after the scan)."""
    daemon = c.daemon_process(repo, state, 1.0, policy="auto")
    daemon.env["TRITONCTL_READY_WAITS_FOR_DEPLOYS"] = "false"
    out: dict[str, Any] = {"models": count}
    try:
        _start_to_ready(daemon, args, count, out, "")
        console.print(f"[dim]tritonctl, {count} models serving: READY {out['ready_s']} s, all serving "
                      f"{out['all_serving_s']} s[/dim]")
        time.sleep(5.0)
        pid = daemon.proc.pid
        triton_pid = daemon.triton_pid()
        triton_group = [triton_pid, *c.descendants(triton_pid)] if triton_pid else []
        cpu = idle_cpu({"daemon": [pid], "triton": triton_group}, args.idle)
        out["idle_cpu_pct"] = cpu["daemon"]
        out["idle_cpu_pct_triton"] = cpu["triton"]
        # the daemon's idle CPU is its reconciles (every 10 s) and little else: CPU per cycle
        out["reconcile_cpu_ms_per_cycle"] = round(cpu["daemon"] / 100 * 10.0 * 1000, 1)
        out["peak_rss_mb"] = rss_mb(pid, "VmHWM")
        out["triton_rss_mb"] = round(sum(rss_mb(p, "VmRSS") for p in triton_group), 1)
        daemon.stop()
        _start_to_ready(daemon, args, count, out, "restart_")
        console.print(f"[dim]tritonctl restart, nothing changed: READY {out['restart_ready_s']} s, all serving "
                      f"{out['restart_all_serving_s']} s[/dim]")
    finally:
        daemon.stop()
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
        out["idle_cpu_pct"] = idle_cpu({"triton": group}, args.idle)["triton"]
        out["rss_mb"] = round(sum(rss_mb(p, "VmRSS") for p in group), 1)
        out["peak_rss_mb"] = rss_mb(server.pid, "VmHWM")
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
    with c.workspace(NAME) as base:
        for count in args.counts:
            repo = base / f"repo-{count}"
            t = time.monotonic()
            make_repository(repo, count)
            console.print(f"[dim]{count} models written in {time.monotonic() - t:.1f} s[/dim]")
            if args.serve_all:
                explicit = measure_triton_explicit(repo, base / f"explicit-{count}", count, args, console)
                ctl = measure_tritonctl_all(repo, base / f"state-{count}", count, args, console)
            else:
                ctl = measure_tritonctl(repo, base / f"state-{count}", count, args, console)
            shutil.rmtree(base / f"state-{count}", ignore_errors=True)
            timeout = args.triton_start_timeout if count <= 1000 else args.triton_start_timeout_large
            poll = measure_triton_poll(repo, base / f"poll-{count}", count, args, console, timeout)
            results.append({"models": count, "tritonctl": ctl, "triton_poll": poll,
                            **({"triton_explicit": explicit} if args.serve_all else {})})
            shutil.rmtree(repo, ignore_errors=True)
            subprocess.run(["sync"], check=False)
    report = c.base_report(NAME, args.argv, args.quick, machine)
    report.update({"settings": {"counts": args.counts, "idle_window_s": args.idle, "loaded": list(LOADED),
                                "policy": "auto" if args.serve_all else "manual", "serve_all": args.serve_all,
                                "reconcile_interval_s": 10.0, "triton_poll_secs": 1},
                   "results": results})
    report["rows"] = [r.to_json() for r in rows(report)]
    return report


TARGET_READY_S = 20.0
TARGET_RESTART_S = 3.0


def rows_serve_all(report: dict[str, Any]) -> list[c.Row]:
    out: list[c.Row] = []
    window = report["settings"]["idle_window_s"]
    biggest = max(report["settings"]["counts"])

    def s(v: Any) -> str:
        return "-" if v is None else f"{v:.1f} s"

    for res in report["results"]:
        n = res["models"]
        ctl, poll, ex = res["tritonctl"], res["triton_poll"], res["triton_explicit"]
        tag = f"{n:,} models, all serving"
        gate = n == biggest
        out.append(c.Row(f"{tag}: first start to READY / all READY in Triton", "tritonctl",
                         f"{s(ctl['ready_s'])} / {s(ctl['all_serving_s'])}",
                         f"<= {TARGET_READY_S:g} s (READY)" if gate else "-",
                         (ctl["ready_s"] <= TARGET_READY_S) if gate else None, "policy auto; READY after the scan",
                         value=ctl["ready_s"]))
        out.append(c.Row(f"{tag}: restart, nothing changed: READY / all READY", "tritonctl",
                         f"{s(ctl['restart_ready_s'])} / {s(ctl['restart_all_serving_s'])}",
                         f"<= {TARGET_RESTART_S:g} s" if gate else "-",
                         (ctl["restart_ready_s"] <= TARGET_RESTART_S) if gate else None, value=ctl["restart_ready_s"]))
        out.append(c.Row(f"{tag}: start to live (every model loaded)", "Triton explicit",
                         s(ex.get("live_s")), value=ex.get("live_s"), note=ex.get("error", "")[:80]))
        out.append(c.Row(f"{tag}: start to live (every model loaded)", "Triton poll",
                         s(poll.get("live_s")), value=poll.get("live_s"), note=poll.get("crashed", "") or ""))
        above = None
        if ex.get("idle_cpu_pct") is not None:
            above = round(ctl["idle_cpu_pct"] + ctl["idle_cpu_pct_triton"] - ex["idle_cpu_pct"], 2)
        out.append(c.Row(f"{tag}: idle CPU over {window:g} s, daemon + its tritonserver (% of one core)",
                         "tritonctl", f"{ctl['idle_cpu_pct']:.2f} + {ctl['idle_cpu_pct_triton']:.2f} %",
                         f"<= {TARGET_IDLE_PCT:g} % above explicit" if gate else "-",
                         (above is not None and above <= TARGET_IDLE_PCT) if gate else None,
                         f"{above} % above Triton explicit's idle; daemon CPU per 10 s reconcile cycle "
                         f"{ctl['reconcile_cpu_ms_per_cycle']:.0f} ms", value=above))
        if ex.get("idle_cpu_pct") is not None:
            out.append(c.Row(f"{tag}: idle CPU over {window:g} s (% of one core)", "Triton explicit",
                             f"{ex['idle_cpu_pct']:.2f} %", value=ex["idle_cpu_pct"]))
        if poll.get("idle_cpu_pct") is not None:
            out.append(c.Row(f"{tag}: idle CPU over {window:g} s (% of one core)", "Triton poll",
                             f"{poll['idle_cpu_pct']:.2f} %", value=poll["idle_cpu_pct"], note="no daemon"))
        out.append(c.Row(f"{tag}: peak RSS", "tritonctl", f"{ctl['peak_rss_mb']:.0f} MB daemon",
                         value=ctl["peak_rss_mb"], note=f"its tritonserver + stubs {ctl['triton_rss_mb']:.0f} MB"))
        if ex.get("rss_mb") is not None:
            out.append(c.Row(f"{tag}: RSS (server + stubs)", "Triton explicit", f"{ex['rss_mb']:.0f} MB",
                             value=ex["rss_mb"]))
    return out


def rows(report: dict[str, Any]) -> list[c.Row]:
    if report["settings"].get("serve_all"):
        return rows_serve_all(report)
    out: list[c.Row] = []
    biggest = max(report["settings"]["counts"])
    window = report["settings"]["idle_window_s"]
    for res in report["results"]:
        n = res["models"]
        ctl, poll = res["tritonctl"], res["triton_poll"]
        tag = f"{n:,} models"
        gate = n == biggest and n >= 10_000
        out.append(c.Row(f"{tag}: cold start to socket answering / READY", "tritonctl",
                         f"{ctl['socket_answering_s']:.1f} s / {ctl['ready_s']:.1f} s", value=ctl["ready_s"],
                         note=f"READY after the initial scan recorded {ctl['models_in_registry']:,} models; "
                              f"loads {', '.join(f'{x:.1f}' for x in ctl['load_s'])} s"))
        live = poll.get("live_s")
        crashed = poll.get("crashed")
        crash_note = (f"then {crashed} within {poll.get('crashed_after_live_s')} s of being live, after "
                      f"{poll.get('reloads_logged_after_live', 0):,} model reloads by its first polls (log tail in "
                      "the JSON)" if crashed else "")
        out.append(c.Row(f"{tag}: start to live (all models loaded)", "Triton poll",
                         f"{live:.1f} s" if live is not None else f"not live after {poll['start_timeout_s']:.0f} s",
                         value=live, note=crash_note or (f"{poll.get('models_ready', 0):,} READY" if live is not None
                                                         else "impractical here: " + poll.get("error", "")[:80])))
        idle_target = f"<= {TARGET_IDLE_PCT:g} %" if gate else "-"
        out.append(c.Row(f"{tag}: idle CPU over {window:g} s (% of one core)", "tritonctl daemon",
                         f"{ctl['idle_cpu_pct']:.2f} %", idle_target,
                         (ctl["idle_cpu_pct"] <= TARGET_IDLE_PCT) if gate else None,
                         f"its tritonserver + stubs: {ctl['idle_cpu_pct_triton']:.2f} %", value=ctl["idle_cpu_pct"]))
        if crashed:
            out.append(c.Row(f"{tag}: idle CPU over {window:g} s (% of one core)", "Triton poll",
                             f"n/a: {crashed}", note="no server left to measure", value=None))
        elif live is not None:
            out.append(c.Row(f"{tag}: idle CPU over {window:g} s (% of one core)", "Triton poll",
                             f"{poll['idle_cpu_pct']:.2f} %", value=poll["idle_cpu_pct"],
                             note=f"polls the repository every 1 s; {poll.get('reloads_during_idle', 0)} model "
                                  "reloads during the window"))
        rss_target = f"<= {TARGET_RSS_MB:g} MB" if gate else "-"
        out.append(c.Row(f"{tag}: peak RSS (VmHWM)", "tritonctl daemon", f"{ctl['peak_rss_mb']:.0f} MB", rss_target,
                         (ctl["peak_rss_mb"] <= TARGET_RSS_MB) if gate else None,
                         f"now {ctl['rss_mb']:.0f} MB; {ctl['inotify_watches']:,} inotify watches; its tritonserver "
                         f"+ stubs {ctl['triton_rss_mb']:.0f} MB", value=ctl["peak_rss_mb"]))
        if live is not None and not crashed:
            out.append(c.Row(f"{tag}: RSS (server + stubs) / server peak", "Triton poll",
                             f"{poll['rss_mb']:.0f} MB / {poll['peak_rss_mb']:.0f} MB", value=poll["rss_mb"]))
    return out


def render(report: dict[str, Any], console: Any) -> None:
    s = report["settings"]
    c.render_rows(f"scale: {', '.join(f'{n:,}' for n in s['counts'])} models (1 python + ensembles), "
                  + ("every model serving (tritonctl policy auto, Triton explicit --load-model=*, Triton poll)"
                     if s.get("serve_all") else f"{len(s['loaded'])} loaded by tritonctl (policy manual)")
                  + f"; idle window {s['idle_window_s']:g} s",
                  [c.Row(**r) for r in report["rows"]], console, c.machine_line(report["machine"]))


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="200 models, 10 s idle window")
    parser.add_argument("--counts", type=lambda s: [int(x) for x in s.split(",")],
                        help="model counts, comma separated (default 1000,10000; 200 with --quick)")
    parser.add_argument("--idle", type=float, help="idle window in seconds (default 60; 10 with --quick)")
    parser.add_argument("--daemon-start-timeout", type=float, default=600.0)
    parser.add_argument("--triton-start-timeout", type=float, default=240.0, help="up to 1,000 models (s)")
    parser.add_argument("--triton-start-timeout-large", type=float, default=240.0, help="above 1,000 models (s)")
    parser.add_argument("--after-live", type=float, default=5.0,
                        help="seconds between Triton poll being live and its idle window (its first polls)")
    parser.add_argument("--serve-all", action="store_true",
                        help="every model serves: tritonctl policy auto, beside Triton explicit --load-model=*")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    args = parser.parse_args(argv)
    args.argv = argv
    args.counts = args.counts or ([200] if args.quick else [1000, 10_000])
    args.idle = args.idle or (10.0 if args.quick else 60.0)
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
