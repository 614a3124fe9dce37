"""Shared helpers of the side-by-side benchmarks (tritonctl against Triton's own poll and explicit modes).

What every benchmark needs and should do the same way: the machine description (with the tritonserver
version the wheel ships), a results table with a Target / Measured / Result column that never hides a
miss, the JSON report under bench/results/, a model that reports which config AND which code serve, a
writer that writes files slowly (chunks, pauses, in place or temp + rename), closed-loop probe clients,
the systems under test (a real `tritonctl daemon --launch-triton` subprocess, a real tritonserver in
poll or explicit mode) and /proc readings (CPU seconds, peak RSS).

Nothing here fakes Triton: every system is the real binary from the nvidia-pytriton wheel.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import resource
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import tritonclient.grpc as grpcclient  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from controlplane.triton.launcher import TritonServer  # noqa: E402
from tests.harness import descendants  # noqa: E402,F401 - bench scripts use c.descendants

RESULTS = ROOT / "bench" / "results"

# --- console, rows, report ------------------------------------------------------------------------------


def make_console() -> Console:
    console = Console(highlight=False)
    if not console.is_terminal:  # a log or CI: do not fold the table at 80 columns
        console.width = 140
    return console


@dataclass
class Row:
    """One line of a results table. `met` is None for an informational row (no target)."""

    measurement: str
    system: str
    measured: str
    target: str = "-"
    met: bool | None = None
    note: str = ""
    value: float | int | None = None  # the number behind `measured`, for the JSON

    def to_json(self) -> dict[str, Any]:
        return {"measurement": self.measurement, "system": self.system, "target": self.target,
                "measured": self.measured, "value": self.value, "met": self.met, "note": self.note}


def verdict(met: bool | None) -> str:
    return {True: "[green]met[/green]", False: "[bold red]MISSED[/bold red]", None: "info"}[met]


def render_rows(title: str, rows: Sequence[Row], console: Console, footer: str = "") -> None:
    table = Table(title=title, title_justify="left")
    for column in ("Measurement", "System", "Target", "Measured", "Result", "Note"):
        table.add_column(column, justify="right" if column == "Measured" else "left",
                         overflow="fold", max_width=48 if column == "Note" else None)
    for r in rows:
        table.add_row(r.measurement, r.system, r.target, r.measured, verdict(r.met), r.note)
    console.print(table)
    if footer:
        console.print(footer)


def render_report(title: str, report: dict[str, Any], console: Console) -> None:
    """A benchmark's table from its report's rows, the machine under it."""
    render_rows(title, [Row(**r) for r in report["rows"]], console, machine_line(report["machine"]))


def results_path(name: str, quick: bool, out: Path | None = None) -> Path:
    return out or RESULTS / (f"{name}-quick.json" if quick else f"{name}.json")


def write_report(path: Path, report: dict[str, Any], console: Console) -> None:
    """Write the JSON, stamped with what makes it reproducible: the commit and the load at the end."""
    machine = report.setdefault("machine", {})
    machine["load_average_end"] = load_average()
    report.setdefault("git_commit", machine.get("git_commit") or git_commit())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    console.print(f"results: {path}")


def missed_target(args: Any, report: dict[str, Any]) -> int:
    """The usual exit code: 1 when --check was given and a row missed its target."""
    return 1 if args.check and any(r["met"] is False for r in report["rows"]) else 0


def bench_main(name: str, parser: Any, argv: Sequence[str] | None, run: Callable[[Any, Console], dict[str, Any]],
               *, prepare: Callable[[Any], None] | None = None,
               render: Callable[[dict[str, Any], Console], None] | None = None, timed: bool = False,
               check: bool = True, exit_code: Callable[[Any, dict[str, Any]], int] = missed_target) -> int:
    """The tail every benchmark's main() shares: parse (`parser` holds the script's own options, --quick
    among them; --out and, with `check`, --check are added here), `prepare` (sizes that depend on --quick),
    run, print the table, write the results file with its provenance, and the exit code.

    `timed`: record `runtime_s` around `run` and print it after the table."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser.add_argument("--out", type=Path, help=f"JSON results (default bench/results/{name}.json, "
                                                 f"{name}-quick.json with --quick)")
    if check:
        parser.add_argument("--check", action="store_true", help="exit 1 if a target is missed")
    args = parser.parse_args(argv)
    args.argv = argv
    if prepare is not None:
        prepare(args)
    console = make_console()
    started = time.monotonic()
    report = run(args, console)
    if timed:
        report["runtime_s"] = round(time.monotonic() - started, 1)
    if render is not None:
        render(report, console)
    if timed:
        console.print(f"runtime {report['runtime_s']:.0f} s")
    write_report(results_path(name, getattr(args, "quick", False), args.out), report, console)
    return exit_code(args, report)


def two_trees_parser(doc: str | None, models: int, rounds: int) -> argparse.ArgumentParser:
    """The options of a benchmark that runs this checkout and another in turns (restart_ab, first_start_ab)."""
    parser = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0])
    parser.add_argument("--other", required=True, help="the other tree (a worktree with its own .venv)")
    parser.add_argument("--models", type=int, default=models)
    parser.add_argument("--rounds", type=int, default=rounds)
    return parser


def per_tree(report: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """("other", its commit), then ("this", its commit): the order a two-tree benchmark's rows go in."""
    for key in ("other", "this"):
        yield key, report["trees"][key]["git_commit"][:8]


def two_trees_report(report: dict[str, Any], models: int, runs: dict[str, list[dict[str, float]]],
                     fields: Sequence[str], rows: Callable[[dict[str, Any]], list[Row]]) -> dict[str, Any]:
    """A two-tree benchmark's report completed: its runs, each field's median per tree
    (`<tree>_<field>_median`), the load average at the end, and its rows."""
    report["models"] = models
    report["runs"] = runs
    for key, items in runs.items():
        for name in fields:
            report[f"{key}_{name}_median"] = median([r[name] for r in items])
    report["machine"]["load_average_end"] = load_average()
    report["rows"] = [r.to_json() for r in rows(report)]
    return report


def two_trees_main(name: str, parser: Any, argv: Sequence[str] | None, run: Callable[[Any, Console], dict[str, Any]],
                   title: str, rows: Callable[[dict[str, Any]], list[Row]]) -> int:
    """bench_main for a two-tree benchmark: its table titled `title`, exit 0 (a comparison has no target)."""
    def render(report: dict[str, Any], console: Console) -> None:
        render_rows(title, rows(report), console, machine_line(report["machine"]))

    return bench_main(name, parser, argv, run, render=render, check=False, exit_code=lambda *_: 0)


def now_iso() -> str:
    return datetime.now(timezone.utc).replace(tzinfo=None).isoformat(timespec="seconds") + "Z"


def base_report(name: str, argv: Sequence[str], quick: bool, machine: dict[str, Any]) -> dict[str, Any]:
    return {"benchmark": name, "command": f"python bench/{name}.py " + " ".join(argv), "quick": quick,
            "when": now_iso(), "machine": machine}


# --- machine ------------------------------------------------------------------------------------------


_TRITON_VERSION: str | None = None


def tritonserver_version() -> str:
    """The version the embedded tritonserver reports (starts one briefly, once per process)."""
    global _TRITON_VERSION
    if _TRITON_VERSION is None:
        with tempfile.TemporaryDirectory(prefix="tritonctl-bench-ver-") as tmp:
            server = TritonServer(model_repository=Path(tmp) / "repo", workdir=Path(tmp) / "work")
            try:
                server.start(live_timeout_s=60)
                _TRITON_VERSION = server_version(server.grpc_url)
            except Exception as exc:  # noqa: BLE001 - reported, not fatal
                _TRITON_VERSION = f"unknown ({exc})"
            finally:
                server.stop()
    return _TRITON_VERSION


def server_version(url: str) -> str:
    client = grpcclient.InferenceServerClient(url)
    try:
        return str(client.get_server_metadata(client_timeout=5).version)
    finally:
        client.close()


def _package_version(name: str) -> str:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:  # noqa: BLE001
        return "?"


def git_commit(tree: Path | None = None) -> str:
    """HEAD of the checkout the benchmark ran from (or of `tree`), with `-dirty` when tracked files had changes."""
    import subprocess

    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tree or ROOT, capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=tree or ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


DIRTY = "-dirty"


def short_commit(commit: object, length: int = 8) -> str:
    """A recorded git commit cut to `length` hex digits, its `-dirty` mark kept: a run from a tree with
    uncommitted changes never reads as a clean commit."""
    text = str(commit)
    head = text.removesuffix(DIRTY)
    return head[:length] + (DIRTY if text.endswith(DIRTY) else "")


def load_average() -> list[float]:
    """1, 5 and 15 minute load averages (a shared machine: other work runs alongside)."""
    return [round(x, 2) for x in os.getloadavg()]


def machine_info(with_triton: bool = True) -> dict[str, Any]:
    """The machine a result came from: recorded once per results JSON (bench/README.md)."""
    cpu = ""
    mem_kb = 0
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    except OSError:
        pass
    try:
        nproc = len(os.sched_getaffinity(0))
    except AttributeError:
        nproc = os.cpu_count() or 0
    try:
        watches = int(Path("/proc/sys/fs/inotify/max_user_watches").read_text())
    except (OSError, ValueError):
        watches = None
    return {
        "nproc": nproc, "cpu_count": os.cpu_count(), "cpu_model": cpu or platform.processor(),
        "memory_gib": round(mem_kb / 1024 / 1024, 1), "python": platform.python_version(),
        "platform": platform.platform(),
        "tritonserver": tritonserver_version() if with_triton else "n/a",
        "nvidia_pytriton": _package_version("nvidia-pytriton"), "tritonclient": _package_version("tritonclient"),
        "watchdog": _package_version("watchdog"),
        "inotify_max_user_watches": watches,
        "uname": " ".join(platform.uname()),
        "git_commit": git_commit(),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "load_average_start": load_average(),
    }


def machine_line(m: dict[str, Any]) -> str:
    return (f"{m['cpu_model']}, {m['nproc']} CPUs, {m['memory_gib']} GiB; Python {m['python']}; tritonserver "
            f"{m['tritonserver']} (nvidia-pytriton {m['nvidia_pytriton']}); load average at start "
            f"{m['load_average_1m']} (shared machine: other work runs alongside)")


# --- numbers ------------------------------------------------------------------------------------------


def pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); nan for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def fmt_ms(seconds: float) -> str:
    return "-" if seconds != seconds else f"{seconds * 1000:.0f} ms" if seconds >= 0.1 else f"{seconds * 1000:.1f} ms"


def fmt_s(seconds: float) -> str:
    return "-" if seconds != seconds else f"{seconds:.2f} s"


# --- the test model: which config and which code serve ------------------------------------------------

PAIR_CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "gen" data_type: TYPE_FP32 dims: [ 2 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
parameters {{ key: "gen" value {{ string_value: "{gen}" }} }}
"""

# GEN is the file's last line: a partly written model.py that is valid Python has no GEN and answers
# with an error (NameError, or "does not implement execute" when cut before execute). The padding
# comment grows with the generation, so two generations never have the same size (a same-size
# rewrite within one second would let the python stub run stale bytecode in Triton's own modes).
PAIR_MODEL = '''"""Benchmark model: answers [config generation, code generation] for every request."""
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        params = json.loads(args["model_config"]).get("parameters", {{}})
        self.config_gen = float(params.get("gen", {{}}).get("string_value", "-1"))
        {init}

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            gens = np.tile(np.array([[self.config_gen, GEN]], dtype=np.float32), (x.shape[0], 1))
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("gen", gens)]))
        return responses

# padding {pad}
GEN = {gen}
'''


def pair_files(name: str, gen: int, *, broken: bool = False) -> dict[str, str]:
    """config.pbtxt and 1/model.py of generation `gen`; `broken`: initialize raises (a failing swap)."""
    init = f'raise RuntimeError("generation {gen} is broken on purpose")' if broken else "pass"
    return {
        "config.pbtxt": PAIR_CONFIG.format(name=name, gen=gen),
        "1/model.py": PAIR_MODEL.format(gen=gen, init=init, pad="." * (gen % 100_000)),
    }


def write_pair_model(repo: Path, name: str, gen: int, *, broken: bool = False) -> Path:
    model = repo / name
    (model / "1").mkdir(parents=True, exist_ok=True)
    for rel, text in pair_files(name, gen, broken=broken).items():
        (model / rel).write_text(text)
    return model


_ZERO = np.zeros((1, 1), dtype=np.float32)


def infer_pair(client: grpcclient.InferenceServerClient, name: str, timeout_s: float = 5.0) -> tuple[int, int]:
    """(config generation, code generation) of what serves `name`."""
    x = grpcclient.InferInput("x", [1, 1], "FP32")
    x.set_data_from_numpy(_ZERO)
    out = client.infer(name, [x], client_timeout=timeout_s).as_numpy("gen")
    return int(out[0][0]), int(out[0][1])


# answers that show half-written content serving: code cut short (no GEN, no execute, a hang), or a
# config cut short (its inputs or outputs missing)
PARTIAL_MARKERS = ("does not implement execute", "is not defined", "NameError", "Deadline Exceeded",
                   "DEADLINE_EXCEEDED", "SyntaxError", "expected 0 inputs", "missing required input",
                   "unexpected inference output")


def classify_error(message: str) -> str:
    """'partial' when the answer shows half-written code served; 'unavailable' when nothing served."""
    if any(m in message for m in PARTIAL_MARKERS):
        return "partial"
    if "unknown model" in message or "no available versions" in message or "not found" in message.lower() \
            or "is not ready" in message or "UNAVAILABLE" in message:
        return "unavailable"
    return "other"


# --- probes: closed-loop clients ----------------------------------------------------------------------


@dataclass
class Sample:
    t: float  # time.monotonic() when the answer (or error) came
    latency_s: float
    config_gen: int | None
    code_gen: int | None
    error: str | None = None


@dataclass
class ProbeStats:
    samples: list[Sample] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, s: Sample) -> None:
        with self.lock:
            self.samples.append(s)

    def snapshot(self) -> list[Sample]:
        with self.lock:
            return list(self.samples)

    def since(self, t0: float) -> list[Sample]:
        with self.lock:
            return [s for s in self.samples if s.t >= t0]


class Probe:
    """`threads` clients asking `model` at `url` in a closed loop (`pause_s` think time between requests)."""

    def __init__(self, url: str, model: str, threads: int = 1, pause_s: float = 0.0, timeout_s: float = 5.0,
                 active: bool = True) -> None:
        self.url, self.model, self.threads, self.pause_s, self.timeout_s = url, model, threads, pause_s, timeout_s
        self.stats = ProbeStats()
        self.latest: tuple[int, int] | None = None  # the last (config gen, code gen) answered
        self.active = threading.Event()  # cleared: the clients wait (a paused probe sends nothing)
        if active:
            self.active.set()
        self._stop = threading.Event()
        self._workers: list[threading.Thread] = []

    def _loop(self) -> None:
        client = grpcclient.InferenceServerClient(self.url)
        try:
            while not self._stop.is_set():
                if not self.active.is_set():
                    self.active.wait(0.1)
                    continue
                t0 = time.monotonic()
                try:
                    cfg, code = infer_pair(client, self.model, self.timeout_s)
                    t1 = time.monotonic()
                    self.stats.add(Sample(t1, t1 - t0, cfg, code))
                    self.latest = (cfg, code)
                except Exception as exc:  # noqa: BLE001 - every failure is a result
                    t1 = time.monotonic()
                    self.stats.add(Sample(t1, t1 - t0, None, None, " ".join(str(exc).split())[:300]))
                if self.pause_s:
                    self._stop.wait(self.pause_s)
        finally:
            client.close()

    def start(self) -> Probe:
        for i in range(self.threads):
            t = threading.Thread(target=self._loop, name=f"probe-{self.model}-{i}", daemon=True)
            t.start()
            self._workers.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        self.active.set()
        for t in self._workers:
            t.join(self.timeout_s + 5)


def wait_until(predicate: Callable[[], Any], timeout_s: float, interval_s: float = 0.02) -> Any:
    """The predicate's first truthy value, or None after the timeout (never raises on timeout)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            return None
        time.sleep(interval_s)


def serves(url: str, model: str, gen: int, timeout_s: float) -> float | None:
    """Wait until `model` answers (gen, gen); the monotonic time it first did, None on timeout."""
    client = grpcclient.InferenceServerClient(url)
    try:
        def check() -> float | None:
            try:
                return time.monotonic() if infer_pair(client, model, 5.0) == (gen, gen) else None
            except Exception:  # noqa: BLE001 - not there yet
                return None

        return wait_until(check, timeout_s, 0.01)
    finally:
        client.close()


# --- slow writers -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FileWrite:
    """How one file of an edit is written: in place or to a temp file renamed over it, in chunks."""

    rel: str
    data: bytes
    mode: str  # "inplace" | "rename"
    cuts: tuple[int, ...]  # byte offsets where the writer pauses (sorted, inside the data)
    pauses: tuple[float, ...]  # one pause per cut

    def chunks(self) -> list[bytes]:
        bounds = [0, *self.cuts, len(self.data)]
        return [self.data[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def random_cuts(rng: random.Random, data: bytes, n: int, at_lines: float = 0.5) -> tuple[int, ...]:
    """`n` cut points; with probability `at_lines` each falls at a line end (a fragment that may be
    valid Python, the dangerous kind), otherwise anywhere."""
    line_ends = [i + 1 for i, b in enumerate(data) if b == 10 and 0 < i + 1 < len(data)]
    cuts: set[int] = set()
    for _ in range(n):
        if line_ends and rng.random() < at_lines:
            cuts.add(rng.choice(line_ends))
        elif len(data) > 2:
            cuts.add(rng.randrange(1, len(data) - 1))
    return tuple(sorted(cuts))


def write_mirrored(targets: Sequence[Path], fw: FileWrite, sleep: Callable[[float], None] = time.sleep,
                   on_write: Callable[[float], None] | None = None) -> float:
    """Write `fw` under every target model directory in lockstep (same chunks, same pauses), so several
    systems see the identical edit at the same moments. Returns time.monotonic() of the last close().
    `on_write` gets the monotonic time of every chunk written (and of the rename)."""
    tmp_name = f".{Path(fw.rel).name}.bench.tmp"  # debris to tritonctl, an unused file to Triton
    handles = []
    for base in targets:
        path = base / fw.rel
        path.parent.mkdir(parents=True, exist_ok=True)
        dest = path if fw.mode == "inplace" else path.parent / tmp_name
        handles.append((path, dest, open(dest, "wb", buffering=0)))  # noqa: SIM115 - closed below
    chunks = fw.chunks()
    try:
        for i, chunk in enumerate(chunks):
            for _path, _dest, fh in handles:
                fh.write(chunk)
            if on_write:
                on_write(time.monotonic())
            if i < len(fw.pauses):
                sleep(fw.pauses[i])
    finally:
        for _path, _dest, fh in handles:
            fh.close()
    closed = time.monotonic()
    if fw.mode == "rename":
        for path, dest, _fh in handles:
            os.replace(dest, path)
        closed = time.monotonic()
        if on_write:
            on_write(closed)
    return closed


def write_now(targets: Sequence[Path], files: dict[str, str]) -> float:
    """Write whole files at once (one write each, in place); time of the last close()."""
    closed = time.monotonic()
    for base in targets:
        for rel, text in files.items():
            path = base / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "w") as fh:
                fh.write(text)
            closed = time.monotonic()
    return closed


# --- systems under test -------------------------------------------------------------------------------


def triton_server(repo: Path, workdir: Path, mode: str = "explicit", poll_secs: int = 1,
                  extra: Sequence[str] = ()) -> TritonServer:
    """A tritonserver on `repo` in `mode` ("poll": Triton watches the repository itself)."""
    args = list(extra)
    if mode == "poll":
        args += [f"--repository-poll-secs={poll_secs}", "--exit-on-error=false"]
    return TritonServer(model_repository=repo, workdir=workdir, control_mode=mode, extra_args=args)


def daemon_process(repo: Path, state: Path, settle_s: float, *, policy: str = "auto",
                   reconcile_s: float = 10.0, extra: Sequence[str] = (), launch: bool = True) -> Any:
    """The real `tritonctl daemon --launch-triton` as a subprocess (tests/harness.py's DaemonProcess).
    The reconcile interval is the daemon's default (10 s), not the harness's 1 s for tests. `launch=False`:
    `extra` names the tritonserver (`--triton-url`)."""
    from tests.harness import DaemonProcess

    return DaemonProcess(repo, state, extra_args=["--policy", policy, *extra], auto_complete=True,
                         env={"TRITONCTL_RECONCILE_INTERVAL_S": str(reconcile_s)}, settle_s=settle_s, launch=launch)


def inference_url(daemon: Any) -> str:
    """Where a daemon's clients send gRPC inference: its gateway's port (`<state>/gateway/gateway.json`, the
    launcher's record) when a gateway carries the traffic, else its tritonserver's."""
    record = daemon.state_dir / "gateway" / "gateway.json"
    if record.exists():
        return f"127.0.0.1:{json.loads(record.read_text())['ports']['grpc']}"
    return str(daemon.triton_url())


def served_as(model: str) -> str:
    """A regex for the names Triton loads `model` under: its own, or the gateway's private name for one
    digest (`model__1a2b3c4d`, controlplane/deploy/aliases.py private_name)."""
    return rf"{re.escape(model)}(?:__[0-9a-f]{{8}})?"


def triton_log_count(server_log: Path, needle: str) -> int:
    try:
        return server_log.read_text(errors="replace").count(needle)
    except OSError:
        return 0


def triton_load_counts(server_log: Path) -> dict[str, int]:
    """Loads Triton itself reports: one `successfully loaded 'm'` or `failed to load 'm'` line per
    load (the per-version failure line is not counted again); `Poll failed` when poll mode could not
    even read a config."""
    try:
        text = server_log.read_text(errors="replace")
    except OSError:
        text = ""
    return {"loaded": len(re.findall(r"successfully loaded '[^']+'\"", text)),
            "failed": len(re.findall(r"failed to load '[^']+'\"", text)),
            "poll_failed": text.count("Poll failed for model directory")}


def audit_rows(state: Path, model: str | None = None, limit: int = 10_000) -> list[dict[str, Any]]:
    """The daemon's audit log, read from its registry directly (what `tritonctl audit --json` shows)."""
    from controlplane.store.registry import Registry
    from controlplane.views import queries

    registry = Registry(f"sqlite:///{state / 'registry.db'}")
    try:
        return queries.audit(registry, model=model, limit=limit).to_json()
    finally:
        registry.close()


# --- /proc --------------------------------------------------------------------------------------------

CLK_TCK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` (its own threads; not its children) in seconds."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def fine_cpu_seconds(pid: int) -> float:
    """The CPU time `pid`'s live threads ran, in nanoseconds' resolution (/proc/PID/task/*/schedstat): for a
    window of a few milliseconds, which utime + stime (clock ticks of 10 ms) may count as 0. A thread that
    exited meanwhile is not counted: for long-lived servers (the gateway's event loop and its threads)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total / 1e9


def children_cpu_seconds(pid: int) -> float:
    """cutime + cstime of `pid`: the CPU of its children it waited for (the daemon's capture workers,
    joined before READY; not its tritonserver, which runs on) in seconds."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[13]) + int(fields[14])) / CLK_TCK


def waited_children_cpu_ms() -> float:
    """User + system CPU of this process's children it waited for, so far, in milliseconds: the
    difference around a `subprocess.run` is that command's own CPU time (which a shared machine's load
    does not inflate the way it inflates wall time)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (usage.ru_utime + usage.ru_stime) * 1000.0


def status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


# --- temp dirs ----------------------------------------------------------------------------------------


@contextmanager
def workspace(prefix: str, keep: bool = False) -> Iterator[Path]:
    """A fresh directory under $TMPDIR (/tmp), removed afterwards unless `keep`."""
    path = Path(tempfile.mkdtemp(prefix=f"tritonctl-bench-{prefix}-"))
    try:
        yield path
    finally:
        if not keep:
            shutil.rmtree(path, ignore_errors=True)
