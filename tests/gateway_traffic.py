"""Clients through a daemon's gateway, and what they must see across a switch: every answer from the old or
the new digest, whole, and none from the old one once the switch was seen.

- `write_probe`: a python model whose every answer says which code, weights, config and version produced it
  (code: model.py's constant; weights: a file initialize() reads from its version directory; config: the
  `gen` parameter Triton parsed; version: the version directory Triton loaded), so an answer assembled from
  two trees shows in the answer itself.
- `gateway_urls`: where clients send inference — the gateway's ports, read from its record
  `<state>/gateway/gateway.json` (controlplane/gateway/launcher.py), the addresses clients of
  `--launch-triton` use.
- `Traffic`: gRPC and HTTP clients (tritonclient, as users run them), each asking one model (and version)
  every `period_s`, recording when each request began and ended and what came back.
- `RouteWatch`: polls the gateway's route table over its control socket (a few ms apart) and records when
  each model's route changed: the moment a switch was *seen*, after which no request may begin and be
  answered by the old digest.
- `probe_verdict`: the figures of one switch from those records.
- `kill_gateway`: SIGKILL a daemon's gateway under clients and measure what they lost until the daemon's
  supervision had it serving again (tests/test_gateway_daemon_e2e.py asserts on it, bench/gateway_kills.py
  records it).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from controlplane.gateway.control import GatewayControl
from tests.harness import wait_for

PROBE_CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "gen" data_type: TYPE_FP32 dims: [ 4 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
parameters {{ key: "gen" value {{ string_value: "{gen}" }} }}
{extra}"""

# initialize() may sleep (a load long enough for a kill to land inside it), then reads its "weights" from
# the version directory Triton gave it; each answer is [code gen, weights gen, config gen, version].
PROBE_MODEL = """import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils

CODE_GEN = {gen}


class TritonPythonModel:
    def initialize(self, args):
        time.sleep({init_s})
        config = json.loads(args["model_config"])
        self.config_gen = int(config["parameters"]["gen"]["string_value"])
        self.version = int(args["model_version"])
        with open(os.path.join(args["model_repository"], args["model_version"], "weights.txt")) as handle:
            self.weights_gen = int(handle.read())

    def execute(self, requests):
        row = np.array([CODE_GEN, self.weights_gen, self.config_gen, self.version], dtype=np.float32)
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("gen", np.tile(row, (x.shape[0], 1)))]))
        return out
"""


def write_probe(repo: Path, name: str, gen: int, *, versions: tuple[int, ...] = (1,), policy: str = "",
                init_s: float = 0.0, smoke: bool = True) -> None:
    """Generation `gen` of probe model `name` with the version directories `versions` (`policy`: a
    config.pbtxt `version_policy` line); a smoke test of the default version when `smoke`."""
    model = repo / name
    model.mkdir(parents=True, exist_ok=True)
    for version in versions:
        (model / str(version)).mkdir(exist_ok=True)
        (model / str(version) / "model.py").write_text(PROBE_MODEL.format(gen=gen, init_s=init_s))
        (model / str(version) / "weights.txt").write_text(str(gen))
    (model / "config.pbtxt").write_text(PROBE_CONFIG.format(name=name, gen=gen, extra=policy))
    if smoke:
        data = [gen, gen, gen, max(versions)]
        request = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [0]}],
                   "outputs": [{"name": "gen", "data": data}]}
        (model / "smoke.json").write_text(json.dumps({"requests": [request]}))
    elif (model / "smoke.json").exists():
        (model / "smoke.json").unlink()


def gateway_record(state: Path) -> dict[str, Any]:
    return dict(json.loads((state / "gateway" / "gateway.json").read_text()))


def gateway_urls(state: Path) -> tuple[str, str]:
    """(gRPC, HTTP) HOST:PORT of the daemon's gateway: where clients send inference."""
    ports = gateway_record(state)["ports"]
    return f"127.0.0.1:{ports['grpc']}", f"127.0.0.1:{ports['http']}"


def control(state: Path, timeout_s: float = 5.0) -> GatewayControl:
    return GatewayControl(state / "gateway" / "gateway.sock", timeout_s)


def routed_digest(state: Path, model: str) -> str | None:
    """The digest the gateway sends `model`'s requests to now (its serving target), None without a route."""
    route = control(state).routes().routes.get(model)
    target = route.serving() if route is not None else None
    return target.digest if target is not None else None


def probe_answer(client: grpcclient.InferenceServerClient, model: str, version: str = "") -> tuple[int, ...]:
    """One probe answer over gRPC: (code gen, weights gen, config gen, version)."""
    x = grpcclient.InferInput("x", [1, 1], "FP32")
    x.set_data_from_numpy(np.zeros((1, 1), dtype=np.float32))
    result = client.infer(model, [x], model_version=version, client_timeout=10)
    return tuple(int(v) for v in np.asarray(result.as_numpy("gen")).reshape(-1))


@dataclass(frozen=True)
class Sample:
    began: float  # time.monotonic() as the request was sent
    ended: float
    protocol: str  # grpc | http
    version: str  # the version asked for ("" : the model's default)
    answer: tuple[int, ...] | None  # (code gen, weights gen, config gen, version) or the model's own output
    error: str | None = None


@dataclass
class Traffic:
    """Clients through the gateway until `stop`: one thread per (protocol, version) in `lanes`."""

    grpc_url: str
    http_url: str
    model: str
    lanes: tuple[tuple[str, str], ...] = (("grpc", ""), ("http", ""))
    period_s: float = 0.01
    output: str = "gen"
    samples: list[Sample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> Traffic:
        for protocol, version in self.lanes:
            thread = threading.Thread(target=self._run, args=(protocol, version), daemon=True,
                                      name=f"traffic-{self.model}-{protocol}-{version or 'default'}")
            thread.start()
            self._threads.append(thread)
        return self

    def _ask(self, client: Any, protocol: str, version: str) -> tuple[int, ...]:
        module = grpcclient if protocol == "grpc" else httpclient
        x = module.InferInput("x", [1, 1], "FP32")
        x.set_data_from_numpy(np.zeros((1, 1), dtype=np.float32))
        if protocol == "grpc":
            result = client.infer(self.model, [x], model_version=version, client_timeout=10)
        else:
            result = client.infer(self.model, [x], model_version=version)
        return tuple(int(v) for v in np.asarray(result.as_numpy(self.output)).reshape(-1))

    def _run(self, protocol: str, version: str) -> None:
        if protocol == "grpc":
            client: Any = grpcclient.InferenceServerClient(self.grpc_url)
        else:
            client = httpclient.InferenceServerClient(self.http_url, connection_timeout=10, network_timeout=10)
        try:
            while not self._stop.is_set():
                began = time.monotonic()
                try:
                    answer: tuple[int, ...] | None = self._ask(client, protocol, version)
                    error = None
                except Exception as exc:  # noqa: BLE001 - every failure is what the test counts
                    answer, error = None, " ".join(str(exc).split())[:300]
                sample = Sample(began, time.monotonic(), protocol, version, answer, error)
                with self._lock:
                    self.samples.append(sample)
                self._stop.wait(max(0.0, self.period_s - (time.monotonic() - began)))
        finally:
            client.close()

    def since(self, t0: float = 0.0) -> list[Sample]:
        with self._lock:
            return [s for s in self.samples if s.began >= t0]

    def answered(self, t0: float = 0.0) -> int:
        return sum(1 for s in self.since(t0) if s.error is None)

    def stop(self) -> list[Sample]:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)
        with self._lock:
            return list(self.samples)

    def __enter__(self) -> Traffic:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class RouteWatch:
    """Every change of the gateway's routes for `models`, with the monotonic time it was first seen."""

    def __init__(self, state: Path, models: tuple[str, ...], interval_s: float = 0.003) -> None:
        self.state, self.models, self.interval_s = state, models, interval_s
        self.changes: list[tuple[float, dict[str, tuple[tuple[str, int], ...]]]] = []
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="route-watch")

    def _read(self) -> dict[str, tuple[tuple[str, int], ...]]:
        table = control(self.state, 2.0).routes()
        return {m: tuple((t.digest, t.weight) for t in table.routes[m].targets) if m in table.routes else ()
                for m in self.models}

    def _run(self) -> None:
        last: dict[str, tuple[tuple[str, int], ...]] | None = None
        while not self._stop.is_set():
            try:
                now = self._read()
            except Exception:  # noqa: BLE001 - the gateway restarting: counted, looked at again
                self.errors += 1
                now = None
            if now is not None and now != last:
                self.changes.append((time.monotonic(), now))
                last = now
            self._stop.wait(self.interval_s)

    def seen(self, model: str, digest: str, since: float = 0.0) -> float | None:
        """When the watch first saw `model` routed to `digest` alone (every request to it), after `since`."""
        for at, routes in self.changes:
            if at > since and routes.get(model) and routes[model][0][0] == digest and routes[model][0][1] == 100:
                return at
        return None

    def __enter__(self) -> RouteWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


@dataclass
class Verdict:
    """One switch from `old` to `new` (generations) as the clients saw it."""

    requests: int
    failed: int
    mixed: int  # an answer not whole (code, weights, config differ), of a third generation, or of another version
    stale: int  # answers of the old generation to requests that began after the switch was seen
    old: int  # answers of the old generation
    new: int
    errors: list[str]
    examples: list[str]

    def ok(self) -> bool:
        return self.failed == 0 and self.mixed == 0 and self.stale == 0


def probe_verdict(samples: list[Sample], old: int, new: int, switched_at: float) -> Verdict:
    """Samples of probe answers ([code, weights, config, version]) around a switch from generation `old` to
    `new` seen at `switched_at`. A version asked for must be the version that answered."""
    failed = [s for s in samples if s.error is not None]
    mixed, stale, counts, examples = 0, 0, {old: 0, new: 0}, []
    for s in samples:
        if s.answer is None:
            continue
        code, weights, config, version = s.answer
        whole = code == weights == config and code in (old, new) and (not s.version or int(s.version) == version)
        if not whole:
            mixed += 1
            if len(examples) < 5:
                examples.append(f"{s.protocol} v{s.version or '-'}: answer {s.answer}")
            continue
        counts[code] += 1
        if code == old and old != new and s.began > switched_at:
            stale += 1
            if len(examples) < 5:
                examples.append(f"{s.protocol} v{s.version or '-'}: old generation {old} began "
                                f"{s.began - switched_at:.3f} s after the switch was seen")
    return Verdict(len(samples), len(failed), mixed, stale, counts[old], counts[new],
                   sorted({s.error or "" for s in failed})[:5], examples)


# A failure that says the gateway was not there (connection refused or reset, gRPC UNAVAILABLE).
REFUSED = ("UNAVAILABLE", "Connection refused", "connection refused", "Connection reset", "failed to connect",
           "Socket closed", "Broken pipe", "RemoteDisconnected", "Connection aborted", "ConnectionRefused",
           "Connection to the server failed", "connection closed")


def decoupled_square(grpc_url: str) -> dict[str, list[int]]:
    """python_backend's decoupled square_int32 client over one gRPC stream at `grpc_url`: requests 4, 2, 0, 1,
    each answered n times (0: none). Every answer is asserted an answer of `square_int32`, none an error;
    the answers' values by request id."""
    answers: list[Any] = []
    client = grpcclient.InferenceServerClient(grpc_url)
    client.start_stream(callback=lambda result, error: answers.append(error or result))
    try:
        for i, value in enumerate([4, 2, 0, 1]):
            x = grpcclient.InferInput("IN", [1], "INT32")
            x.set_data_from_numpy(np.array([value], dtype=np.int32))
            client.async_stream_infer("square_int32", [x], request_id=str(i))
        wait_for(lambda: len(answers) >= 7, 30, 0.05, "seven answers on the stream")
    finally:
        client.stop_stream()
        client.close()
    assert not [a for a in answers if isinstance(a, Exception)], answers
    by_id: dict[str, list[int]] = {}
    for answer in answers:
        assert answer.get_response().model_name == "square_int32"
        by_id.setdefault(answer.get_response().id, []).append(int(answer.as_numpy("OUT")[0]))
    return by_id


def refused(error: str) -> bool:
    return any(w in error for w in REFUSED)


def outage(samples: list[Sample], protocol: str, killed: float) -> float:
    """From the kill to the first answer after the last failure, for one protocol's client."""
    lane = [s for s in samples if s.protocol == protocol and s.ended >= killed]
    last_failure = max((s.ended for s in lane if s.error is not None), default=killed)
    first_back = min((s.ended for s in lane if s.error is None and s.began >= last_failure), default=last_failure)
    return first_back - killed


def kill_gateway(state: Path, model: str, period_s: float = 0.02) -> dict[str, Any]:
    """SIGKILL the gateway of the daemon on `state` while a gRPC and an HTTP client ask `model` every
    `period_s`; wait until the daemon started it again and both clients were answered again. What the clients
    saw: per protocol the outage (kill → first answer after the last failure) and the failed requests, the
    errors, the answers (before and after: its routes), the gateway's pid and ports before and after."""
    before = gateway_record(state)
    grpc, http = gateway_urls(state)
    with Traffic(grpc, http, model, period_s=period_s) as traffic:
        deadline = time.monotonic() + 60
        while traffic.answered() < 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        killed = time.monotonic()
        os.kill(int(before["pid"]), signal.SIGKILL)
        after: dict[str, Any] = {}
        while time.monotonic() < killed + 30:
            try:
                record = gateway_record(state)
            except (OSError, ValueError):
                record = {}
            if record.get("pid") not in (None, before["pid"]) and record.get("ports"):
                after = record
                break
            time.sleep(0.02)
        restarted = time.monotonic()
        while time.monotonic() < restarted + 30 and not all(
                any(s.error is None for s in traffic.since(restarted) if s.protocol == p) for p in ("grpc", "http")):
            time.sleep(0.05)
        time.sleep(1.0)
    samples = traffic.samples
    failed = [s for s in samples if s.error is not None]
    return {
        "restart_s": round(restarted - killed, 3) if after else None,
        "outage_s": {p: round(outage(samples, p, killed), 3) for p in ("grpc", "http")},
        "failed": {p: sum(1 for s in failed if s.protocol == p) for p in ("grpc", "http")},
        "failed_before_the_kill": sum(1 for s in failed if s.ended < killed),
        "failed_not_refused": sorted({s.error or "" for s in failed if not refused(s.error or "")})[:5],
        "errors": sorted({(s.error or "")[:120] for s in failed})[:5],
        "requests": len(samples), "period_s": period_s,
        "answers": sorted({s.answer for s in samples if s.answer is not None}),
        "pid_before": before["pid"], "pid_after": after.get("pid"),
        "same_ports": after.get("ports") == before["ports"],
    }
