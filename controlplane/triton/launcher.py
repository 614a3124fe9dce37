"""Find, assemble and run an embedded tritonserver in explicit mode.

PyPI's nvidia-pytriton wheel ships a real tritonserver with the python backend, but not ready to run:
the backend directory lacks the `triton_python_backend_stub` of the running interpreter, the stub
needs the wheel's bundled libraries, and model code imports packages from the first `python3` on
PATH. This module hides those facts (measured in shared/TRITON_NOTES.md) behind `TritonServer`,
which starts the server on loopback ports, waits until it is live and stops it within a bound.

The daemon's server is the data plane and outlives the control plane: it runs in its own session
without a parent-death signal, its pid, ports, start time and restricted key are recorded in
`server.json` (mode 0600) in its work directory, and a restarted daemon `adopt`s it — the same
process (pid alive, same start time and command line) and answering — instead of starting another.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from controlplane.errors import LauncherError
from controlplane.snapshot.fsutil import ensure_dir, open_private, write_atomic

RESTRICTED_HEADER = "tritonctl-key"
# What the key guards (the same group on gRPC and HTTP): loading code, and the endpoints that would let
# any local caller map or write Triton's shared memory, rewrite its log settings or turn tracing on to a
# file. Health, metadata, model config, statistics and inference stay open.
RESTRICTED_PROTOCOLS = ("model-repository", "shared-memory", "logging", "trace")
RECORD_FILE = "server.json"
# Off: python models' auto_complete_config is not run (each python load ~1.2 s faster, measured on 2.51:
# the python backend sleeps 1 s after every completion), and a config that needs it does not load.
DISABLE_AUTO_COMPLETE = "--disable-auto-complete-config"
_LOG_TAIL_CHARS = 2000
WAIT_CALLBACK_S = 5.0  # how often start() calls on_wait while the server is not live yet
LIVE_CHANNEL_ARGS = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
                     ("grpc.max_reconnect_backoff_ms", 100)]


def _wheel_root() -> Path | None:
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations))) / "tritonserver"
    return root if (root / "bin" / "tritonserver").exists() else None


def find_tritonserver(explicit: str | os.PathLike[str] | None = None) -> Path:
    """The tritonserver binary: an explicit path, then $PATH, then the nvidia-pytriton wheel."""
    if explicit:
        path = Path(explicit)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise LauncherError(f"tritonserver binary {path}: not an executable file")
        return path
    on_path = shutil.which("tritonserver")
    if on_path:
        return Path(on_path)
    wheel = _wheel_root()
    if wheel is not None:
        return wheel / "bin" / "tritonserver"
    raise LauncherError(
        "no tritonserver found: pass --tritonserver PATH, put one on $PATH, "
        "or install the embedded extra (pip install 'tritonctl[embedded]')"
    )


def _bundled_libs_dir(server: Path) -> Path | None:
    candidate = server.resolve().parent.parent.parent.parent / "nvidia_pytriton.libs"
    return candidate if candidate.is_dir() else None


def assemble_backend_dir(dest: Path, server: Path) -> Path:
    """Make `dest/python/` a python backend whose stub matches the running interpreter.

    Links (never copies) the wheel's files so the stub still finds its bundled libraries. For a
    tritonserver that is not from the wheel, its own `backends/` directory is used as it is.
    """
    wheel_backends = server.resolve().parent.parent / "backends"
    stubs = server.resolve().parent.parent / "python_backend_stubs"
    if not stubs.is_dir():
        if wheel_backends.is_dir():
            return wheel_backends
        raise LauncherError(f"tritonserver {server}: no backends directory next to it; pass --backend-dir")
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = stubs / version / "triton_python_backend_stub"
    if not stub.exists():
        raise LauncherError(f"{stubs}: no triton_python_backend_stub for Python {version}")
    dest.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
    python_dir = ensure_dir(ensure_dir(dest, 0o750) / "python", 0o750)  # its stub runs every python model
    wanted = {
        "libtriton_python.so": wheel_backends / "python" / "libtriton_python.so",
        "triton_python_backend_utils.py": wheel_backends / "python" / "triton_python_backend_utils.py",
        "triton_python_backend_stub": stub,
    }
    for name, target in wanted.items():
        link = python_dir / name
        if link.is_symlink() or link.exists():
            if link.is_symlink() and Path(os.readlink(link)) == target:
                continue
            link.unlink()
        link.symlink_to(target)
    return dest


# What a launched tritonserver and its python stubs (the models' code) get of the daemon's environment, and
# nothing else (issue 58, item 7): programs, libraries, locale, time zone, user, the stub's Python, GPUs.
PASSED_VARIABLES = frozenset({
    "PATH", "LD_LIBRARY_PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "PYTHONPATH",
    "PYTHONHOME", "VIRTUAL_ENV", "SSL_CERT_FILE", "SSL_CERT_DIR", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
})  # fmt: skip
PASSED_PREFIXES = ("LC_", "CUDA_", "NVIDIA_")


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM when the daemon dies, so a crash leaves no orphan server."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux/glibc: the server outlives a crashed parent, as an external one would


def process_start_time(pid: int) -> int | None:
    """The kernel's start time of `pid` (clock ticks since boot), None if no such process.

    Together with the pid it names one process: a pid reused after the server died has another one.
    """
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields_after_comm = stat[stat.rfind(")") + 2 :].split()
    if not fields_after_comm or fields_after_comm[0] == "Z":
        return None  # a zombie has stopped serving
    return int(fields_after_comm[19])  # field 22 of proc(5): starttime


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def free_port(host: str = "127.0.0.1", *, besides: tuple[int, ...] = ()) -> int:
    """A TCP port that was free a moment ago (the server retries on the rare collision), other than
    `besides`: binding and closing may hand the same port back twice in a row, and tritonserver refuses
    two of its protocols on one port."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port = int(sock.getsockname()[1])
        if port not in besides:
            return port


@dataclass
class TritonServer:
    """One tritonserver process in explicit mode (or `control_mode`) on loopback.

    Ports left at 0 are chosen free at start. `restricted_key` restricts the model-repository,
    shared-memory, logging and trace protocols (gRPC and HTTP; `RESTRICTED_PROTOCOLS`) to callers that
    send header `tritonctl-key: <key>`. Triton takes the key only on its command line (docs/operations.md,
    "The Triton key").
    """

    model_repository: Path
    workdir: Path
    grpc_port: int = 0
    http_port: int = 0
    metrics_port: int | None = None
    host: str = "127.0.0.1"
    tritonserver: str | None = None
    restricted_key: str | None = None
    exit_timeout_s: int = 5
    # True: tests' and benchmarks' servers load fast; the daemon's follows `triton_auto_complete` (startup/launch.py)
    disable_auto_complete: bool = True
    control_mode: str = "explicit"  # "poll" only to compare with Triton's own mode (bench/)
    extra_args: Sequence[str] = ()
    env: dict[str, str] = field(default_factory=dict)
    # True: the server gets SIGTERM when its parent dies (tests, benchmarks: no orphans). The daemon
    # passes False: its tritonserver is the data plane and keeps serving through a control-plane crash.
    die_with_parent: bool = True
    # Where start() records pid, ports, start time and key for a later `adopt` (None: not recorded).
    record_path: Path | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    backend_dir: Path | None = field(default=None, init=False)  # set by start(): what it can run
    adopted_pid: int | None = field(default=None, init=False, repr=False)  # a server this process did not start
    _adopted_start: int | None = field(default=None, init=False, repr=False)
    _log_handle: object = field(default=None, init=False, repr=False)

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"{self.host}:{self.http_port}"

    @property
    def metrics_url(self) -> str | None:
        """Its Prometheus metrics endpoint; None with metrics off."""
        return f"http://{self.host}:{self.metrics_port}/metrics" if self.metrics_port else None

    @property
    def log_path(self) -> Path:
        return self.workdir / "tritonserver.log"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else self.adopted_pid

    def is_running(self) -> bool:
        if self.adopted_pid is not None:
            return process_start_time(self.adopted_pid) == self._adopted_start
        return self.process is not None and self.process.poll() is None

    # -- the record a restarted daemon adopts ---------------------------------------------------

    def write_record(self) -> None:
        """Record pid, ports, start time and key (0600: the key lets its holder load code)."""
        if self.record_path is None or self.pid is None:
            return
        record = {
            "pid": self.pid,
            "start_time": process_start_time(self.pid),
            "grpc_port": self.grpc_port,
            "http_port": self.http_port,
            "metrics_port": self.metrics_port,
            "host": self.host,
            "model_repository": str(self.model_repository),
            "restricted_key": self.restricted_key,
        }
        # through a new, exclusively created temporary file: a link planted at any name is not followed
        write_atomic(self.record_path, json.dumps(record).encode(), mode=0o600)

    def forget_record(self) -> None:
        if self.record_path is not None:
            try:
                self.record_path.unlink()
            except FileNotFoundError:
                pass

    def auto_completes(self) -> bool:
        """Whether this server completes python models' configs: its own command line says (an adopted
        server keeps the flags it was started with), else what `start` would give it."""
        pid = self.pid
        command = _cmdline(pid) if pid is not None and self.is_running() else []
        if command:
            return DISABLE_AUTO_COMPLETE not in command
        return not self.disable_auto_complete

    def inference_urls(self) -> str:
        """"; inference: gRPC HOST:PORT, HTTP http://HOST:PORT" (the daemon's ready line)."""
        return f"; inference: gRPC {self.grpc_url}, HTTP http://{self.http_url}"

    def adopt(self, live_timeout_s: float = 10.0) -> bool:
        """Take over the server `record_path` names if it is still ours and answering.

        Ours: the recorded pid is alive with the recorded start time, and its command line is a
        tritonserver on this `model_repository`. Answering: live within `live_timeout_s`. A recorded
        server that is ours but does not answer is killed (the caller starts a fresh one); a record
        naming anything else is dropped. Returns whether the server was adopted.
        """
        if self.record_path is None or self.is_running():
            return False
        try:
            record = json.loads(self.record_path.read_text())
            pid, started = int(record["pid"]), record["start_time"]
        except (OSError, ValueError, KeyError, TypeError):
            self.forget_record()
            return False
        cmdline = _cmdline(pid)
        ours = (
            started is not None
            and process_start_time(pid) == started
            and bool(cmdline)
            and Path(cmdline[0]).name == "tritonserver"
            and f"--model-repository={self.model_repository}" in cmdline
        )
        if not ours:
            self.forget_record()
            return False
        self.adopted_pid, self._adopted_start = pid, int(started)
        self.host = str(record.get("host") or self.host)
        self.grpc_port, self.http_port = int(record["grpc_port"]), int(record["http_port"])
        self.metrics_port = record.get("metrics_port")
        self.restricted_key = record.get("restricted_key")
        try:
            self.wait_live(live_timeout_s)
        except LauncherError:
            self.stop()  # ours but hung: the caller starts a fresh one
            return False
        return True

    def command(self, server: Path, backend_dir: Path, load: Sequence[str] = ()) -> list[str]:
        """The command line; `load`: models Triton loads during its own start-up, in one pass of its
        model-load threads (as `--load-model=*` does), before it goes live; a model that fails to load
        leaves the others serving (`--exit-on-error=false`)."""
        args = [
            str(server),
            f"--model-repository={self.model_repository}",
            f"--model-control-mode={self.control_mode}",
            f"--backend-directory={backend_dir}",
            f"--grpc-address={self.host}",
            f"--grpc-port={self.grpc_port}",
            f"--http-address={self.host}",
            f"--http-port={self.http_port}",
            f"--exit-timeout-secs={self.exit_timeout_s}",
            "--strict-readiness=true",
            "--log-verbose=0",
        ]
        if self.metrics_port is None:
            args.append("--allow-metrics=false")
        else:
            # request latency quantiles per model (nv_inference_request_summary_us): a bake's p99 (triton/summaries.py)
            args += [f"--metrics-address={self.host}", f"--metrics-port={self.metrics_port}",
                     "--metrics-config=summary_latencies=true"]
        if self.disable_auto_complete:
            args.append(DISABLE_AUTO_COMPLETE)
        if self.restricted_key:
            rule = f"{','.join(RESTRICTED_PROTOCOLS)}:{RESTRICTED_HEADER}={self.restricted_key}"
            args += [f"--grpc-restricted-protocol={rule}", f"--http-restricted-api={rule}"]
        args += list(self.extra_args)
        if load:
            args += ["--exit-on-error=false", *(f"--load-model={name}" for name in load)]
        return args

    def _environment(self, server: Path) -> dict[str, str]:
        """PASSED_VARIABLES of the daemon's environment: its secrets (MLFLOW_*, AWS_*, TRITONCTL_*) reach no model."""
        env = {k: v for k, v in os.environ.items() if k in PASSED_VARIABLES or k.startswith(PASSED_PREFIXES)}
        # The python stub imports model code with the first python3 on PATH: make it ours.
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        libs = _bundled_libs_dir(server)
        if libs is not None:
            env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(libs), env.get("LD_LIBRARY_PATH")]))
        env.update(self.env)
        return env

    def start(self, live_timeout_s: float = 60.0, load: Sequence[str] = (),
              on_wait: Callable[[], object] | None = None) -> TritonServer:
        """Start the server and return once it is live; raise LauncherError with the log tail if not.

        `load`: models to load during Triton's own start-up (see `command`); it goes live only once
        they loaded or failed, so `live_timeout_s` must cover them. `on_wait` is called about every
        `WAIT_CALLBACK_S` while waiting (the daemon extends systemd's start timeout)."""
        if self.is_running():
            return self
        self.adopted_pid = self._adopted_start = None
        server = find_tritonserver(self.tritonserver)
        for directory in (self.workdir, self.model_repository):  # 0750 whatever the umask (issue 58)
            directory.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
            ensure_dir(directory, 0o750)
        backend_dir = self.backend_dir = assemble_backend_dir(self.workdir / "backends", server)
        choose_ports = self.grpc_port == 0
        last_error: LauncherError | None = None
        for _attempt in range(3 if choose_ports else 1):
            if choose_ports:
                self.grpc_port = free_port(self.host)
                self.http_port = free_port(self.host, besides=(self.grpc_port,))
            elif self.http_port == 0:
                self.http_port = free_port(self.host, besides=(self.grpc_port,))
            if self.metrics_port == 0:
                self.metrics_port = free_port(self.host, besides=(self.grpc_port, self.http_port))
            try:
                self._spawn(server, backend_dir, load)
                self.write_record()  # now, not once live: a daemon killed meanwhile leaves no unrecorded server
                self.wait_live(live_timeout_s, on_wait)
                return self
            except LauncherError as exc:
                last_error = exc
                self.stop()
                if "address already in use" not in self.log_tail().lower():
                    break
        assert last_error is not None
        raise last_error

    def _spawn(self, server: Path, backend_dir: Path, load: Sequence[str] = ()) -> None:
        log = open(open_private(self.log_path, os.O_WRONLY | os.O_APPEND), "ab")  # noqa: SIM115 - closed in stop()
        self._log_handle = log
        self.process = subprocess.Popen(
            self.command(server, backend_dir, load),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self._environment(server),
            start_new_session=True,  # its python stubs share the group, so stop() reaches them
            preexec_fn=_die_with_parent if self.die_with_parent else None,
            umask=0o027,  # what it and its stubs write (__pycache__ beside the stub) is not the group's to change
        )

    def log_tail(self, chars: int = _LOG_TAIL_CHARS) -> str:
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        return data[-chars:].decode("utf-8", "replace")

    def wait_live(self, timeout_s: float = 60.0, on_wait: Callable[[], object] | None = None) -> None:
        import tritonclient.grpc as grpcclient  # deferred: heavy import

        deadline = time.monotonic() + timeout_s
        next_call = time.monotonic() + WAIT_CALLBACK_S
        # gRPC's reconnect backoff grows to seconds while the server is not listening yet (a start-up that
        # loads 2,000 models: live 2 s after launch, seen 17 s after): retry the connection every 100 ms
        client = grpcclient.InferenceServerClient(self.grpc_url, channel_args=LIVE_CHANNEL_ARGS)
        try:
            while time.monotonic() < deadline:
                if not self.is_running():
                    code = self.process.returncode if self.process else None
                    raise LauncherError(
                        f"tritonserver exited with code {code}; log {self.log_path}: "
                        + self.log_tail(600).strip().replace("\n", " | ")
                    )
                try:
                    if client.is_server_live(client_timeout=1.0):
                        return
                except Exception:  # noqa: BLE001 - not up yet; any transport error means retry
                    pass
                if on_wait is not None and time.monotonic() >= next_call:
                    on_wait()
                    next_call = time.monotonic() + WAIT_CALLBACK_S
                time.sleep(0.05)
        finally:
            client.close()
        raise LauncherError(f"tritonserver not live after {timeout_s:.0f}s; log {self.log_path}")

    def _stop_adopted(self, bound: float) -> None:
        """stop() for a server another daemon started: not our child, so poll instead of wait."""
        pid = self.adopted_pid
        assert pid is not None
        for sig, wait_s in ((signal.SIGTERM, bound), (signal.SIGKILL, 10.0)):
            if not self.is_running():
                break
            try:
                os.killpg(pid, sig)
            except (ProcessLookupError, PermissionError):
                break
            deadline = time.monotonic() + wait_s
            while self.is_running() and time.monotonic() < deadline:
                time.sleep(0.05)
        try:
            os.killpg(pid, signal.SIGKILL)  # stubs it left behind
        except (ProcessLookupError, PermissionError):
            pass
        self.adopted_pid = self._adopted_start = None
        self.forget_record()

    def stop(self, timeout_s: float | None = None) -> int | None:
        """SIGTERM, then SIGKILL to the whole process group after the bound. Returns the exit code."""
        proc = self.process
        bound = timeout_s if timeout_s is not None else self.exit_timeout_s + 5.0
        if proc is None:
            if self.adopted_pid is not None:
                self._stop_adopted(bound)
            return None
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=bound)
            except subprocess.TimeoutExpired:
                pass
        # The server, or a stub it left behind (execute() that never returns), may ignore SIGTERM.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        code = proc.wait()
        if self._log_handle is not None:
            self._log_handle.close()  # type: ignore[attr-defined]
            self._log_handle = None
        self.forget_record()
        return code

    def release(self) -> None:
        """Leave the server running (daemon stopping with --keep-triton): a later daemon adopts it."""
        if self._log_handle is not None:
            self._log_handle.close()  # type: ignore[attr-defined]
            self._log_handle = None
        self.process = None
        self.adopted_pid = self._adopted_start = None

    def kill(self) -> None:
        """Abrupt death (SIGKILL to the group), for fault tests and a supervisor's last resort."""
        if self.adopted_pid is not None:
            try:
                os.killpg(self.adopted_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            while self.is_running():
                time.sleep(0.02)
            return
        if self.process is not None and self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.process.wait()

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
