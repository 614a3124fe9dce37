"""Validate each case offline, ask the deploy-time host check, load it into a real tritonserver.

Every case is written into one repository and validated offline first; the loads then run a few at
a time against one server (explicit mode, completing python models' configs as the daemon's does), each
model unloaded after its verdict. Triton's answer
to a failed load is often only "failed to poll from model repository": its reason is in the
server's log, so each load reads the E-lines the server wrote about the case's models
(controlplane/triton/serverlog.py, as the daemon does). What counts as agreement is decided in
`tests.differential.verdicts`.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from controlplane.errors import HostCapabilityError
from controlplane.triton.capabilities import HostProbe, probe_for
from controlplane.triton.launcher import TritonServer
from controlplane.triton.serverlog import LOG_FLUSH_WAIT_S, LogCursor, parse_lines, reasons_for
from controlplane.validation.modelconfig import Problem, ValidationResult, validate_paths
from tests.differential.cases import Case

LOAD_TIMEOUT_S = 180.0  # generous: on 2 shared cores under load an ensemble's load took 20 s
# Loads in flight at once against the one server. Measured side by side on 2 shared cores (the 45
# ensemble cases, load average about 25): 1 at a time 217 s, 4 173 s, 8 133 s (docs/validation.md).
WORKERS = 8
MAX_ATTEMPTS = 4
LOG_WAIT_S = 3.0
_GONE = ("failed to connect", "Connection reset", "Socket closed", "connection refused", "Broken pipe")


@dataclass
class Outcome:
    case: Case
    offline_ok: bool
    offline: list[Problem]  # validation's errors, every model of the case
    triton_ok: bool
    triton: str  # Triton's answer, with the reasons its log gives ("" when it loads)
    load_s: float
    deploy: str = ""  # the deploy-time host check's refusal for a launched server ("" when it passes)
    server_died: bool = False  # every attempt met a dying server: no verdict from Triton
    warnings: list[Problem] = field(default_factory=list)  # validation's warnings

    @property
    def verdict(self) -> str:
        if self.offline_ok == self.triton_ok:
            return "agree"
        return "false_accept" if self.offline_ok else "false_refusal"

    @property
    def offline_lines(self) -> list[str]:
        return [p.line() for p in self.offline]


@dataclass
class _Load:
    ok: bool
    message: str
    seconds: float
    gone: bool = False  # the server died or stopped answering: ask again after a restart


def validate_case(case: Case, repo: Path) -> tuple[bool, list[Problem], list[ValidationResult]]:
    dirs = [repo / case.model_name(role) for role in case.models]
    results = list(validate_paths(dirs))
    errors = [p for r in results for p in r.errors]
    return not errors, errors, results


def host_check(probe: HostProbe, results: list[ValidationResult]) -> str:
    """What the daemon's check before a load says about the case's models (its HostCapabilityError)."""
    for result in results:
        try:
            probe.check(result.config, result.path)
        except HostCapabilityError as exc:
            return str(exc)
    return ""


def _log_reasons(case: Case, cursor: LogCursor) -> list[str]:
    """The E-lines the server wrote about the case's models since `cursor`. Triton answers the load
    and writes its log line from different threads: wait for a line up to LOG_WAIT_S (under load the
    line can trail the answer by more than the daemon's LOG_FLUSH_WAIT_S)."""
    names = [case.model_name(role) for role in case.models]
    deadline = time.monotonic() + LOG_WAIT_S
    while True:
        text = cursor.read_new()  # everything since the cursor was made
        found = [r for name in names for r in reasons_for(name, parse_lines(text))]
        if found or time.monotonic() >= deadline:
            return list(dict.fromkeys(found))
        time.sleep(LOG_FLUSH_WAIT_S / 2)


def load_case(client: grpcclient.InferenceServerClient, server: TritonServer, case: Case) -> _Load:
    """Load the case's target (an ensemble loads its steps), note why it failed, unload it all."""
    target = case.model_name(case.target)
    cursor = LogCursor(server.log_path)
    started = time.monotonic()
    try:
        client.load_model(target, client_timeout=LOAD_TIMEOUT_S)
        ok, message = True, ""
    except InferenceServerException as exc:
        ok, message = False, " ".join(str(exc.message() or exc).split())
    elapsed = time.monotonic() - started
    if not ok:
        if not server.is_running() or any(word.lower() in message.lower() for word in _GONE):
            return _Load(False, message, elapsed, gone=True)
        reasons = _log_reasons(case, cursor)
        if reasons:
            message = f"{message} | log: {'; '.join(reasons)}"
    for role in case.models:
        try:
            client.unload_model(case.model_name(role), client_timeout=LOAD_TIMEOUT_S)
        except InferenceServerException:
            pass
    return _Load(ok, message, elapsed)


crashes: list[str] = []  # server exits seen (and survived by a restart) in this process


class _Restarts:
    """The one server, restarted once per crash however many loads saw it die.

    Measured: tritonserver 2.51 sometimes dies (SIGSEGV, a native backtrace in its log) shortly after
    it failed a model's warmup; the loads in flight then fail with it. The first worker to see that
    notes it and starts the server again (same ports, same repository, nothing loaded); the others
    wait for it, and each asks again for its own case.
    """

    def __init__(self, server: TritonServer) -> None:
        self.server = server
        self.generation = 0
        self.lock = threading.Lock()

    def current(self) -> int:
        with self.lock:  # blocks while a restart is under way
            return self.generation

    def restart(self, seen: int, case: Case) -> None:
        with self.lock:
            if self.generation != seen:
                return  # another worker restarted it already
            log = self.server.log_tail(20000).splitlines()
            signal = next((line.strip() for line in log if "Signal (" in line), "no signal line")
            crashes.append(f"while loading {case.name}: {signal}")
            self.server.stop()
            self.server.start()
            self.generation += 1


class _Turns:
    """Who may load now: first attempts share the server; a case asked again after the server died
    has it to itself.

    Measured in CI (2 shared cores): with the four warm-up cases in flight together, each attempt met
    a server that one of the others had just killed, four times over, and no case got a verdict. Alone,
    a case's load either gets Triton's answer or is the one that kills the server (tritonserver 2.51
    segfaults in some failing warm-ups before it logs their reason: `verdicts.unexpected` takes a case
    that kills it at every attempt as refused). A case waiting for its turn alone goes before first
    attempts not yet started.
    """

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.sharing = 0
        self.alone = False
        self.waiting_alone = 0

    @contextmanager
    def turn(self, alone: bool) -> Iterator[None]:
        with self.cond:
            if alone:
                self.waiting_alone += 1
                self.cond.wait_for(lambda: not self.alone and not self.sharing)
                self.waiting_alone -= 1
                self.alone = True
            else:
                self.cond.wait_for(lambda: not self.alone and not self.waiting_alone)
                self.sharing += 1
        try:
            yield
        finally:
            with self.cond:
                if alone:
                    self.alone = False
                else:
                    self.sharing -= 1
                self.cond.notify_all()


def _load_all(cases: list[Case], server: TritonServer, workers: int) -> list[_Load]:
    """Load every case, `workers` at a time, each worker with its own gRPC client (a new one after a
    restart); a case whose load met a dying server is asked again, alone on the server (`_Turns`), up
    to MAX_ATTEMPTS times."""
    restarts = _Restarts(server)
    turns = _Turns()
    local = threading.local()
    clients: list[grpcclient.InferenceServerClient] = []
    clients_lock = threading.Lock()

    def client_for(generation: int) -> grpcclient.InferenceServerClient:
        if getattr(local, "generation", None) != generation:
            local.client = grpcclient.InferenceServerClient(server.grpc_url)
            local.generation = generation
            with clients_lock:
                clients.append(local.client)
        return local.client  # type: ignore[no-any-return]

    def one(case: Case) -> _Load:
        load = _Load(False, "not loaded", 0.0, gone=True)
        for attempt in range(MAX_ATTEMPTS):
            with turns.turn(alone=attempt > 0):  # a case waiting to go alone waits for this restart too
                generation = restarts.current()
                load = load_case(client_for(generation), server, case)
                if load.gone:
                    restarts.restart(generation, case)
            if not load.gone:
                return load
        return load

    try:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            return list(pool.map(one, cases))
    finally:
        for client in clients:
            client.close()


def run(cases: Iterable[Case], server: TritonServer, workers: int = WORKERS) -> list[Outcome]:
    """Write and validate every case, then load them `workers` at a time; compare case by case."""
    cases = list(cases)
    repo = server.model_repository
    offline: dict[str, tuple[bool, list[Problem]]] = {}
    warned: dict[str, list[Problem]] = {}
    deploy: dict[str, str] = {}
    for case in cases:
        case.write(repo)
    probe = probe_for(server.grpc_url, server, None)  # the daemon's probe for the server it launched
    for case in cases:
        ok, errors, results = validate_case(case, repo)
        offline[case.name] = (ok, errors)
        warned[case.name] = [p for r in results for p in r.warnings]
        deploy[case.name] = host_check(probe, results)
    loads = dict(zip((c.name for c in cases), _load_all(cases, server, workers), strict=True))
    return [Outcome(c, offline[c.name][0], offline[c.name][1], loads[c.name].ok, loads[c.name].message,
                    loads[c.name].seconds, deploy[c.name], loads[c.name].gone, warned[c.name]) for c in cases]


def suite_server(base: Path) -> TritonServer:
    """The suite's tritonserver: it completes python models' configs, as the daemon's does by default
    (`triton_auto_complete`; cases_autocomplete needs it, and no other case's verdict changes with it)."""
    return TritonServer(model_repository=base / "repo", workdir=base / "work", disable_auto_complete=False)


def run_with_own_server(cases: Iterable[Case], workers: int = WORKERS) -> list[Outcome]:
    base = Path(tempfile.mkdtemp(prefix="tritonctl-differential-"))
    server = suite_server(base)
    (base / "repo").mkdir()
    server.start()
    try:
        return run(cases, server, workers)
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)
