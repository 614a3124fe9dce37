"""End-to-end harness: the real `tritonctl daemon` as a subprocess (with its launched tritonserver),
the installed `tritonctl` CLI as subprocesses, and a generation-reporting python model to edit."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient

BIN = Path(sys.executable).parent
# Tests run in parallel: a launched tritonserver never takes Triton's default ports 8000-8002.
FREE_PORTS = ["--triton-grpc-port", "0", "--triton-http-port", "0", "--triton-metrics-port", "0"]
TRITONCTL = str(BIN / "tritonctl")

def python_config(name: str, src: str = "x", dst: str = "gen") -> str:
    """config.pbtxt of a python model with one FP32 input `src` and one FP32 output `dst`, batching to 8."""
    return (f'name: "{name}"\nbackend: "python"\nmax_batch_size: 8\n'
            f'input [ {{ name: "{src}" data_type: TYPE_FP32 dims: [ 1 ] }} ]\n'
            f'output [ {{ name: "{dst}" data_type: TYPE_FP32 dims: [ 1 ] }} ]\n'
            "instance_group [ { kind: KIND_CPU count: 1 } ]\n")


def gen_config(name: str, gen: int) -> str:
    """The generation model's config: its generation is a parameter too (what test_snapshot reads)."""
    return python_config(name) + f'parameters {{ key: "gen" value {{ string_value: "{gen}" }} }}\n'


PYTHON_MODEL = """import numpy as np
import triton_python_backend_utils as pb_utils
{prelude}

class TritonPythonModel:
    def initialize(self, args):
        {init}

    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "{src}").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("{dst}", {expr})]))
        return out
"""


def python_model(expr: str, *, src: str = "x", dst: str = "gen", init: str = "pass", prelude: str = "") -> str:
    """model.py answering each request with `expr` (of the input `x`, FP32) as output `dst`; `init` is
    initialize()'s body, `prelude` module-level lines."""
    return PYTHON_MODEL.format(prelude=prelude, init=init, src=src, dst=dst, expr=expr)


def write_gen_model(repo: Path, name: str, gen: int, *, init: str = "pass", smoke_gen: int | None = None) -> Path:
    """A model whose every response is its generation number; `init` is initialize()'s body."""
    model = repo / name
    (model / "1").mkdir(parents=True, exist_ok=True)
    (model / "config.pbtxt").write_text(gen_config(name, gen))
    (model / "1" / "model.py").write_text(python_model("np.full_like(x, GEN, dtype=np.float32)", init=init,
                                                       prelude=f"\nGEN = {gen}\n"))
    if smoke_gen is not None:
        smoke = {"requests": [{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [0]}],
                               "outputs": [{"name": "gen", "data": [smoke_gen]}]}]}
        (model / "smoke.json").write_text(json.dumps(smoke))
    return model


def infer_gen(client: grpcclient.InferenceServerClient, name: str) -> float:
    x = grpcclient.InferInput("x", [1, 1], "FP32")
    x.set_data_from_numpy(np.zeros((1, 1), dtype=np.float32))
    return float(client.infer(name, [x], client_timeout=10).as_numpy("gen")[0][0])


def answers(client: grpcclient.InferenceServerClient, name: str, gen: float) -> bool:
    """Whether `name` answers with generation `gen` right now (False while loading or unreachable)."""
    try:
        return infer_gen(client, name) == gen
    except Exception:  # noqa: BLE001 - not loaded yet, or Triton restarting
        return False


def wait_for(predicate: Callable[[], Any], timeout_s: float = 30.0, interval_s: float = 0.1, what: str = "") -> Any:
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval_s)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what or predicate} (last: {last!r})")


def descendants(pid: int) -> list[int]:
    """Every process whose parent chain reaches `pid` (python stubs of a tritonserver, say)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry}/stat").read_text()
            parents[int(entry)] = int(text[text.rindex(")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            continue
    found: list[int] = []
    frontier = [pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parents.items() if pp == p]
        found += kids
        frontier += kids
    return found


def python_stubs(server_pid: int) -> list[int]:
    """The python backend stubs of one tritonserver: processes below it whose program is the stub (found
    by the process tree, not by a position in their argv)."""
    stubs = []
    for pid in descendants(server_pid):
        try:
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
        except OSError:
            continue
        if Path(argv0).name == "triton_python_backend_stub":
            stubs.append(pid)
    return stubs


# The suite's daemons switch a deploy at once, as tritonctl did before issue 55: with a gateway the defaults
# are canary steps [10, 100] with a 60 s bake (docs/bake.md "Safe defaults"), which the end-to-end tests
# written before them do not expect. Every daemon a test starts gets these unless the test says otherwise:
# DaemonProcess by default (`switch_at_once=False` opts out: a test of the defaults), and every other launch
# (a `tritonctl daemon` subprocess, CliRunner) through the environment tests/conftest.py sets for the session.
# A flag (`--bake 4s`) or a model's own `tritonctl.*` parameter still wins over them.
SWITCH_AT_ONCE_ENV = {"TRITONCTL_CANARY_STEPS": "[100]", "TRITONCTL_BAKE_S": "0"}

# Triton's python backend spends more than a second more on every python model's load when auto-complete
# is on, whatever the config (docs/benchmarks.md "Auto-complete's cost per python load": 0.2 s → 1.5 s),
# and the suite loads python models more than a thousand times: on the 2-core CI machine that alone was
# a quarter of the suite's time. So every daemon the suite starts launches its tritonserver with
# auto-complete off, like SWITCH_AT_ONCE_ENV, unless its test asks for it (`DaemonProcess(auto_complete=True)`,
# or the variable in its env): the tests of auto-completed models, and of the product's defaults, do.
NO_AUTO_COMPLETE_ENV = {"TRITONCTL_TRITON_AUTO_COMPLETE": "false"}
TEST_DEFAULTS_ENV = {**SWITCH_AT_ONCE_ENV, **NO_AUTO_COMPLETE_ENV}


@dataclass
class DaemonProcess:
    """The real `tritonctl daemon` as a subprocess (with its launched tritonserver). It runs with
    SWITCH_AT_ONCE_ENV (canary steps [100], no bake: a deploy switches at once) unless `switch_at_once` is
    False, which a test of the safe defaults sets (then the mode's defaults apply: docs/bake.md)."""

    repository: Path
    state_dir: Path
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    settle_s: float = 0.2
    launch: bool = True  # --launch-triton; False: pass --triton-url in extra_args
    # a command the daemon runs under, e.g. ["prlimit", "--nofile=1024:1024", "--"] (a file limit)
    wrapper: list[str] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    switch_at_once: bool = True  # SWITCH_AT_ONCE_ENV (False: the mode's defaults, canary steps and a bake)
    auto_complete: bool = False  # True: the product's default, tritonserver completes configs (see above)

    @property
    def log_path(self) -> Path:
        return self.state_dir.parent / f"{self.state_dir.name}-daemon.log"

    def start(self, wait: bool = True) -> DaemonProcess:
        env = dict(os.environ)
        env.pop("NOTIFY_SOCKET", None)
        env.setdefault("TRITONCTL_RECONCILE_INTERVAL_S", "1")
        env.setdefault("TRITONCTL_LOG_LEVEL", "debug")  # tests read the deploy steps' lines (DEBUG)
        opted = ((SWITCH_AT_ONCE_ENV, self.switch_at_once), (NO_AUTO_COMPLETE_ENV, not self.auto_complete))
        for defaults, wanted in opted:
            for name, value in defaults.items():  # see SWITCH_AT_ONCE_ENV, NO_AUTO_COMPLETE_ENV
                if wanted:
                    env.setdefault(name, value)
                elif env.get(name) == value:
                    env.pop(name)
        env.update(self.env)
        args = [*self.wrapper, TRITONCTL, "daemon", "--repository", str(self.repository),
                "--state-dir", str(self.state_dir), "--settle", str(self.settle_s),
                *(["--launch-triton", *FREE_PORTS] if self.launch else []), *self.extra_args]
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        log.close()
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout_s: float = 90.0) -> None:
        """The control API answers and, with --launch-triton, its tritonserver too (a first start
        launches it only once the start-up scan has staged its deploys: controlplane/startup/bulk.py)."""
        def ready() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"daemon exited {self.proc.returncode}: {self.log_tail()}")
            result = self.run("status", "--json")
            return result.exit_code == 0 and (not self.launch or bool(json.loads(result.stdout)["triton_reachable"]))

        wait_for(ready, timeout_s, 0.2, "daemon ready")

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def cli(self, *args: str, check: bool = True, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
        full = [TRITONCTL, *args]
        if args and args[0] != "validate" and "--state-dir" not in args:
            full += ["--state-dir", str(self.state_dir)]
        result = subprocess.run(full, capture_output=True, text=True, timeout=timeout_s)
        if check and result.returncode != 0:
            raise AssertionError(f"{' '.join(args)} exited {result.returncode}: {result.stderr}{result.stdout}")
        return result

    def run(self, *args: str) -> Any:
        """The CLI in-process (click's CliRunner): same code path, no interpreter start-up per call."""
        from click.testing import CliRunner

        from cli.main import cli

        return CliRunner().invoke(cli, [*args, "--state-dir", str(self.state_dir)])

    def json(self, *args: str) -> Any:
        result = self.run(*args, "--json")
        if result.exit_code != 0:
            raise AssertionError(f"{' '.join(args)} exited {result.exit_code}: {result.output}")
        return json.loads(result.stdout)

    def status(self) -> dict[str, Any]:
        return dict(self.json("status"))

    def model_status(self, name: str) -> dict[str, Any]:
        for row in self.status()["models"]:
            if row["model"] == name:
                return dict(row)
        return {}

    def triton_url(self) -> str:
        return str(self.status()["triton_url"])

    def triton_pid(self) -> int | None:
        """The launched tritonserver's pid (its command line names our serving directory)."""
        wanted = f"--model-repository={self.state_dir / 'serving'}"
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
                stat = Path(f"/proc/{pid}/stat").read_text()
            except OSError:
                continue
            # the server itself, not a python stub (whose paths may contain the word) nor a zombie
            if Path(cmdline[0]).name == "tritonserver" and wanted in cmdline and stat[stat.rfind(")") + 2] != "Z":
                return int(pid)
        return None

    def audit(self, *filters: str) -> list[dict[str, Any]]:
        """The audit log: asked of the daemon; once it stopped, read from its registry as an operator
        would after the fact (`--db-url`: the read verbs need no daemon then)."""
        if self.proc is not None and self.proc.poll() is not None:
            filters = (*filters, "--db-url", f"sqlite:///{self.state_dir / 'registry.db'}")
        return list(self.json("audit", *filters))

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 60.0, *,
             kill_triton: bool | None = None) -> int | None:
        """Stop the daemon, then kill its tritonserver and gateway if it left them. A daemon started with
        `--keep-triton` that exited cleanly leaves them serving for the next start to adopt (what the flag is
        for, and what a restart measurement needs); `kill_triton=True` kills them anyway (a test's last stop)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        code = self.proc.returncode
        kept = "--keep-triton" in self.extra_args and code == 0
        if kill_triton or (kill_triton is None and not kept):
            self.kill_tritonserver()
            kill_gateway(self.state_dir)  # a daemon killed, or kept, leaves its gateway running as well
        return code

    def kill(self) -> None:
        """SIGKILL the daemon alone (its tritonserver, in its own session, survives like after a crash)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def kill_tritonserver(self) -> None:
        """SIGKILL the tritonserver this daemon launched (its process group), wherever the daemon is."""
        pid = self.triton_pid()
        if pid:
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                return
            # gone before the next start: a process killed is not gone yet (its exit, its ports)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and _alive(pid):
                time.sleep(0.05)


def kill_gateway(state_dir: Path) -> None:
    """SIGKILL the gateway a daemon of `state_dir` started (`gateway/gateway.json`: its pid and start time, so
    that a pid reused since is left alone), and wait until it is gone."""
    from controlplane.gateway.launcher import start_time

    try:
        record = json.loads((state_dir / "gateway" / "gateway.json").read_text())
        pid, started = int(record["pid"]), int(record["start_time"])
        if start_time(pid) != started:
            return
        os.kill(pid, signal.SIGKILL)
    except (OSError, ValueError, KeyError):
        return
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie has exited: its ports are closed)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@contextmanager
def request_loop(url: str, model: str, threads: int = 2) -> Iterator[dict[str, Any]]:
    """Clients sending inference requests in a closed loop; counts results per generation and failures."""
    stats: dict[str, Any] = {"ok": 0, "failed": 0, "errors": [], "gens": {}}
    stop = threading.Event()
    lock = threading.Lock()

    def worker() -> None:
        client = grpcclient.InferenceServerClient(url)
        try:
            while not stop.is_set():
                try:
                    gen = infer_gen(client, model)
                    with lock:
                        stats["ok"] += 1
                        stats["gens"][gen] = stats["gens"].get(gen, 0) + 1
                except Exception as exc:  # noqa: BLE001 - counted and reported by the test
                    with lock:
                        stats["failed"] += 1
                        if len(stats["errors"]) < 5:
                            stats["errors"].append(str(exc))
        finally:
            client.close()

    workers = [threading.Thread(target=worker, daemon=True) for _ in range(threads)]
    for w in workers:
        w.start()
    try:
        yield stats
    finally:
        stop.set()
        for w in workers:
            w.join(15)


def token_daemon(repo: Path, base: Path, token: str,
                 extra_args: Sequence[str] = ()) -> tuple[DaemonProcess, str, Path]:
    """A started daemon over `repo` (state in `base/state`) with the control API on a free loopback TCP port
    behind `token` (in `base/token`, mode 0600), and `extra_args`: (daemon, HOST:PORT, token file)."""
    from controlplane.triton.launcher import free_port

    token_file = base / "token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    address = f"127.0.0.1:{free_port()}"
    daemon = DaemonProcess(repo, base / "state",
                           extra_args=["--listen", address, "--token-file", str(token_file), *extra_args])
    return daemon.start(), address, token_file


def copy_example(name: str, dest_repo: Path) -> Path:
    src = Path(__file__).resolve().parent.parent / "examples" / "model_repository" / name
    return Path(shutil.copytree(src, dest_repo / name))


@contextmanager
def example_daemon(base: Path, *examples: str, bare: bool = False, settle_s: float = 0.2,
                   extra_args: Sequence[str] = ()) -> Iterator[DaemonProcess]:
    """A daemon with its launched tritonserver over a new repository `base/repo` holding the named examples
    (default `linear`; `bare`: none); on leaving, it must stop with exit status 0 (the module fixtures'
    daemon)."""
    repo = base / "repo"
    repo.mkdir()
    for name in () if bare else examples or ("linear",):
        copy_example(name, repo)
    proc = DaemonProcess(repo, base / "state", settle_s=settle_s, extra_args=list(extra_args)).start()
    yield proc
    assert proc.stop() == 0, proc.log_tail()


# -- the gateway's layout (docs/gateway.md): where a test finds what Triton itself serves -----------------
#
# With a gateway (a daemon's default with --launch-triton) every digest is loaded in Triton under a private
# name `<model>__<8 hex>`, published at `<state>/serving/<private>`, and the gateway's route table
# `<state>/gateway/routes.json` maps each public model to it; `--no-gateway` loads it under the model's own
# name. These helpers answer the same question either way, so a test asserts the same fact on both paths.


def routes(state_dir: Path) -> dict[str, Any]:
    """The gateway's route table as the daemon left it on disk: model -> its route (targets, state...);
    empty without a gateway."""
    try:
        return dict(json.loads((state_dir / "gateway" / "routes.json").read_text())["routes"])
    except FileNotFoundError:
        return {}


def served_name(state_dir: Path, model: str) -> str | None:
    """The name Triton serves `model` under: its route's active target (the first: the digest the registry
    calls active) with a gateway, its own name without one; None when a gateway has no route for it."""
    if not (state_dir / "gateway" / "routes.json").exists():
        return model
    route = routes(state_dir).get(model)
    return str(route["targets"][0]["name"]) if route and route.get("targets") else None


def served_tree(state_dir: Path, model: str) -> Path:
    """The published tree Triton loaded `model`'s serving digest from (`<state>/serving/<name>`)."""
    name = served_name(state_dir, model)
    assert name is not None, f"the gateway has no route for {model!r}: {routes(state_dir)}"
    return state_dir / "serving" / name


def upstream_url(daemon: DaemonProcess) -> str:
    """tritonserver's own gRPC address (behind the gateway when there is one), where private names answer."""
    status = daemon.status()
    return str((status.get("gateway") or {}).get("upstream_grpc_url") or status["triton_url"])


@contextmanager
def triton_client(daemon: DaemonProcess) -> Iterator[grpcclient.InferenceServerClient]:
    """A gRPC client of the daemon's tritonserver, closed on leaving."""
    client = grpcclient.InferenceServerClient(daemon.triton_url())
    try:
        yield client
    finally:
        client.close()


@contextmanager
def upstream_client(daemon: DaemonProcess) -> Iterator[grpcclient.InferenceServerClient]:
    """A gRPC client of tritonserver itself, past the gateway (private names), closed on leaving."""
    client = grpcclient.InferenceServerClient(upstream_url(daemon))
    try:
        yield client
    finally:
        client.close()


def api_get(daemon: DaemonProcess, path: str) -> tuple[int, dict[str, Any]]:
    """GET `path` of the daemon's control API over its socket: (HTTP status, the JSON document)."""
    from controlplane.api.client import UnixHTTPConnection

    conn = UnixHTTPConnection(str(daemon.state_dir / "tritonctl.sock"), 30)
    try:
        conn.request("GET", path)
        answer = conn.getresponse()
        return answer.status, json.loads(answer.read())
    finally:
        conn.close()
