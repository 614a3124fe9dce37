"""A real tritonserver serving python models under private names, and the gateway in front of it.

`GatewayRig.start` writes a serving directory itself (each model `<public>__<8 hex>` with its config's
`name` set to that private name, as the daemon publishes them), starts tritonserver in explicit mode
with `--disable-auto-complete-config` (the project's launcher) loading those models, writes a routes file
naming one digest per public model, and starts `python -m controlplane.gateway` (launcher.py) with
gRPC, HTTP and metrics listeners on free loopback ports. Nothing here fakes Triton or the gateway.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controlplane.gateway.control import GatewayControl
from controlplane.gateway.launcher import GatewayProcess
from controlplane.gateway.routes import Route, RouteTable, Target, table_to_json
from controlplane.triton.launcher import TritonServer

# digests of the test models: private name = <model>__<first 8>
DIGESTS = {c: c * 8 + "0" * 56 for c in "abcdef1234"}


def digest(char: str) -> str:
    return DIGESTS[char]


def private(model: str, char: str) -> str:
    return f"{model}__{digest(char)[:8]}"


def config(name: str, inputs: list[tuple[str, str, str]], outputs: list[tuple[str, str, str]], *,
           max_batch: int = 0, decoupled: bool = False, extra: str = "") -> str:
    """A complete config.pbtxt (auto-complete is off): (name, TYPE_x, dims) per tensor."""
    def tensors(kind: str, items: list[tuple[str, str, str]]) -> str:
        body = ", ".join(f'{{ name: "{n}" data_type: {t} dims: [ {d} ] }}' for n, t, d in items)
        return f"{kind} [ {body} ]\n"

    text = (f'name: "{name}"\nbackend: "python"\nmax_batch_size: {max_batch}\n' + tensors("input", inputs)
            + tensors("output", outputs) + "instance_group [ { kind: KIND_CPU count: 1 } ]\n")
    if decoupled:
        text += "model_transaction_policy { decoupled: true }\n"
    return text + extra


HEADER = "import numpy as np\nimport triton_python_backend_utils as pb_utils\n\n"

GEN = HEADER + '''GEN = {gen}

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("gen", np.full_like(x, GEN))]))
        return out
'''

IDENT = HEADER + '''class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy())]) for r in requests]
'''

TEXT = HEADER + '''class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            words = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            upper = np.array([w.decode("utf-8").upper().encode("utf-8") for w in words.reshape(-1)],
                             dtype=np.object_).reshape(words.shape)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("UPPER", upper)]))
        return out
'''

# x < 0 raises (Triton counts a failure); x == 1 answers InferenceResponse(error=...) (Triton counts a
# success, the client gets an error); x >= 2 sleeps x/10 s then echoes (a slow request); else echoes
BOOM = HEADER + '''import time

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            if (x < 0).any():
                raise pb_utils.TritonModelException("negative input refused by boom")
            if (x == 1).any():
                out.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("boom answers an error for 1")))
                continue
            if (x >= 2).any():
                time.sleep(float(x.max()) / 10)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", x)]))
        return out
'''

# decoupled: IN responses per request, each OUT = IN (python_backend's square_int32 example, written here)
REPEAT = HEADER + '''class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            sender = request.get_response_sender()
            for _ in range(int(value[0])):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
'''

ADD_SUB = HEADER + '''class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", (a + b).astype(np.float32)),
                                                   pb_utils.Tensor("OUTPUT1", (a - b).astype(np.float32))]))
        return out
'''

# BLS (python_backend's bls example, written here): calls the model MODEL_NAME names, inside tritonserver
BLS = HEADER + '''class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            name = pb_utils.get_input_tensor_by_name(request, "MODEL_NAME").as_numpy()[0]
            name = name.decode() if isinstance(name, bytes) else str(name)
            inner = pb_utils.InferenceRequest(
                model_name=name, requested_output_names=["OUTPUT0", "OUTPUT1"],
                inputs=[pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                        pb_utils.get_input_tensor_by_name(request, "INPUT1")])
            answer = inner.exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            out.append(pb_utils.InferenceResponse([pb_utils.get_output_tensor_by_name(answer, "OUTPUT0"),
                                                   pb_utils.get_output_tensor_by_name(answer, "OUTPUT1")]))
        return out
'''

FP32_X = [("x", "TYPE_FP32", "1")]
ADD_SUB_IO = ([("INPUT0", "TYPE_FP32", "4"), ("INPUT1", "TYPE_FP32", "4")],
              [("OUTPUT0", "TYPE_FP32", "4"), ("OUTPUT1", "TYPE_FP32", "4")])


def model_set() -> dict[str, tuple[str, str]]:
    """name -> (config text, model.py) of every model the rig loads (private names, and add_sub public too)."""
    models = {}
    for char, gen in (("a", 1), ("b", 2)):
        name = private("gen", char)
        models[name] = (config(name, FP32_X, [("gen", "TYPE_FP32", "1")], max_batch=8), GEN.format(gen=gen))
    name = private("ident", "c")
    models[name] = (config(name, [("INPUT0", "TYPE_FP32", "-1")], [("OUTPUT0", "TYPE_FP32", "-1")]), IDENT)
    name = private("text", "d")
    models[name] = (config(name, [("TEXT", "TYPE_STRING", "-1")], [("UPPER", "TYPE_STRING", "-1")], max_batch=8), TEXT)
    name = private("boom", "e")
    models[name] = (config(name, FP32_X, [("y", "TYPE_FP32", "1")], max_batch=8), BOOM)
    name = private("square_int32", "f")
    models[name] = (config(name, [("IN", "TYPE_INT32", "1")], [("OUT", "TYPE_INT32", "1")], decoupled=True), REPEAT)
    for public in (private("add_sub", "1"), "add_sub"):  # "add_sub" public too: the BLS model calls it by name
        models[public] = (config(public, *ADD_SUB_IO), ADD_SUB)
    name = private("bls_sync", "2")
    bls_inputs = [*ADD_SUB_IO[0], ("MODEL_NAME", "TYPE_STRING", "1")]
    models[name] = (config(name, bls_inputs, ADD_SUB_IO[1]), BLS)
    name = private("pipe", "3")  # an ensemble whose one step is gen's private name, as the daemon publishes it
    step = ('ensemble_scheduling { step [ { model_name: "' + private("gen", "a") + '" model_version: -1 '
            'input_map { key: "x" value: "x" } output_map { key: "gen" value: "gen" } } ] }\n')
    models[name] = (f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: 8\n'
                    'input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
                    'output [ { name: "gen" data_type: TYPE_FP32 dims: [ 1 ] } ]\n' + step, "")
    return models


def write_models(repo: Path, models: dict[str, tuple[str, str]]) -> None:
    for name, (config_text, code) in models.items():
        (repo / name / "1").mkdir(parents=True, exist_ok=True)
        (repo / name / "config.pbtxt").write_text(config_text)
        if code:  # an ensemble has no code
            (repo / name / "1" / "model.py").write_text(code)


def route(model: str, *targets: tuple[str, int], sticky: str | None = None) -> Route:
    """A route over (digest char, weight) targets."""
    return Route(model, tuple(Target(private(model, c), digest(c), w) for c, w in targets), sticky)


def default_routes() -> RouteTable:
    routes = {m: route(m, (c, 100)) for m, c in (("gen", "a"), ("ident", "c"), ("text", "d"), ("boom", "e"),
                                                  ("square_int32", "f"), ("add_sub", "1"), ("bls_sync", "2"),
                                                  ("pipe", "3"))}
    return RouteTable(1, routes)


@dataclass
class GatewayRig:
    base: Path
    triton: TritonServer
    gateway: GatewayProcess
    started: list[Any] = field(default_factory=list)

    @classmethod
    def start(cls, base: Path) -> GatewayRig:
        repo = base / "serving"
        models = model_set()
        write_models(repo, models)
        triton = TritonServer(model_repository=repo, workdir=base / "triton", metrics_port=0)
        triton.start(live_timeout_s=120.0, load=sorted(models))
        rig = cls(base, triton, cls.new_gateway(base, triton))
        try:
            rig.gateway.routes_file.parent.mkdir(parents=True, exist_ok=True)
            rig.gateway.routes_file.write_text(json.dumps(table_to_json(default_routes())))
            rig.gateway.start()
        except BaseException:
            triton.stop()
            raise
        return rig

    @staticmethod
    def new_gateway(base: Path, triton: TritonServer, workdir: str = "gateway") -> GatewayProcess:
        return GatewayProcess(base / workdir, triton.grpc_url, triton.http_url, f"127.0.0.1:{triton.metrics_port}",
                              grpc_address="127.0.0.1:0", http_address="127.0.0.1:0",
                              metrics_address="127.0.0.1:0", drain_s=10.0)

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.gateway.ports['grpc']}"

    @property
    def http_url(self) -> str:
        return f"127.0.0.1:{self.gateway.ports['http']}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.gateway.ports['metrics']}/metrics"

    @property
    def control(self) -> GatewayControl:
        return self.gateway.control(10.0)

    def stop(self) -> None:
        self.gateway.stop(15.0)
        self.triton.stop()
