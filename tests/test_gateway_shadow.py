"""A shadow through the real gateway and a real tritonserver (issue 55 item 4; docs/gateway.md "Shadow").

One tritonserver serves, under private names, a serving version of two models and several candidate
versions of each; the gateway routes each public name to its serving version and, per test, names a
candidate as the route's shadow (a target of weight 0). Real tritonclient clients (gRPC, HTTP JSON, HTTP
binary) then send requests, and the test reads the gateway's shadow figures from its control channel:

- clients only ever get the serving version's answers, whatever the shadow answers or raises;
- floating outputs within rtol/atol agree; a version off by 0.5 on half its inputs disagrees, and the
  first disagreements name the output, the index and both values;
- a version that raises on some inputs: each such pair is counted as an error of the shadow's side;
- BYTES outputs are compared exactly: a version that changes one word disagrees on requests with it;
- `keep_inputs` false: no disagreement carries inputs; true: the first disagreement's inputs are shown.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from controlplane.gateway.routes import Route, RouteTable, Shadow, Target, table_to_json
from controlplane.gateway.shadow import COPY_RATE, INLINE_BYTES
from controlplane.triton.launcher import TritonServer
from tests.gateway_harness import FP32_X, HEADER, GatewayRig, config, digest, private, write_models

# sh: y = 2x (serving, a); b: 2x plus a float32 rounding's worth (within rtol 1e-5); c: 2x + 0.5 where
# x > 0.5; d: raises where 0.6 < x < 0.8. tx: each word upper-cased (serving, a); b: "world" comes back "WORLD!"
SH = HEADER + '''KIND = "{kind}"

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            if KIND == "raises" and ((x > 0.6) & (x < 0.8)).any():
                raise pb_utils.TritonModelException("this version fails on inputs between 0.6 and 0.8")
            y = (x * 2).astype(np.float32)
            if KIND == "close":
                y = (y * np.float32(1 + 2e-7)).astype(np.float32)
            if KIND == "off":
                y = np.where(x > 0.5, y + np.float32(0.5), y).astype(np.float32)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", y)]))
        return out
'''
TX = HEADER + '''BANG = {bang}

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            words = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            upper = [w.decode("utf-8").upper() for w in words.reshape(-1)]
            if BANG:
                upper = [u + "!" if u == "WORLD" else u for u in upper]
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor(
                "UPPER", np.array([u.encode("utf-8") for u in upper], dtype=np.object_).reshape(words.shape))]))
        return out
'''
SH_KINDS = {"a": "serving", "b": "close", "c": "off", "d": "raises"}
# big: echoes INPUT0 (serving, a); b: the same but element 40,000 doubled (answers over shadow.INLINE_BYTES: the
# comparing thread's)
BIG = HEADER + '''ODD = {odd}

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy().copy()
            if ODD:
                x[40000] *= 2
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", x)]))
        return out
'''


def models() -> dict[str, tuple[str, str]]:
    out = {}
    for char, kind in SH_KINDS.items():
        name = private("sh", char)
        out[name] = (config(name, FP32_X, [("y", "TYPE_FP32", "1")], max_batch=8), SH.format(kind=kind))
    for char, bang in (("a", False), ("b", True)):
        name = private("tx", char)
        out[name] = (config(name, [("TEXT", "TYPE_STRING", "-1")], [("UPPER", "TYPE_STRING", "-1")], max_batch=8),
                     TX.format(bang=bang))
        name = private("big", char)
        out[name] = (config(name, [("INPUT0", "TYPE_FP32", "-1")], [("OUTPUT0", "TYPE_FP32", "-1")]),
                     BIG.format(odd=bang))
    return out


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayRig]:
    base = tmp_path_factory.mktemp("shadow")
    found = models()
    write_models(base / "serving", found)
    triton = TritonServer(model_repository=base / "serving", workdir=base / "triton", metrics_port=0)
    triton.start(live_timeout_s=120.0, load=sorted(found))
    rig = GatewayRig(base, triton, GatewayRig.new_gateway(base, triton))
    try:
        table = RouteTable(1, {m: Route(m, (Target(private(m, "a"), digest("a")),)) for m in ("sh", "tx", "big")})
        rig.gateway.routes_file.parent.mkdir(parents=True, exist_ok=True)
        rig.gateway.routes_file.write_text(json.dumps(table_to_json(table)))
        rig.gateway.start()
    except BaseException:
        triton.stop()
        raise
    yield rig
    rig.stop()


def shadow_of(rig: GatewayRig, model: str, char: str, **spec: Any) -> str:
    """Route `model` to its version a, with `char` as its shadow; the shadow's id."""
    ident = secrets.token_hex(8)
    shadow = Shadow(private(model, char), digest(char), ident, **spec)
    route = Route(model, (Target(private(model, "a"), digest("a"), 100), Target(private(model, char), digest(char), 0)),
                  shadow=shadow)
    rig.control.update(set={model: route})
    return ident


def figures(rig: GatewayRig, ident: str, pairs: int) -> dict[str, Any]:
    """The shadow's figures once `pairs` pairs were compared (the comparing thread is behind the answers)."""
    deadline = time.monotonic() + 30
    while True:
        found = rig.control.figures()["shadows"][ident]
        if found["pairs"] + sum(found["skipped"].values()) >= pairs or time.monotonic() > deadline:
            return dict(found)
        time.sleep(0.05)


def infer_grpc(client: grpcclient.InferenceServerClient, value: float) -> float:
    time.sleep(1.5 / COPY_RATE)  # under the gateway's copy rate: every request is copied
    x = grpcclient.InferInput("x", [1, 1], "FP32")
    x.set_data_from_numpy(np.full((1, 1), value, dtype=np.float32))
    return float(client.infer("sh", [x]).as_numpy("y")[0][0])


def infer_http(client: httpclient.InferenceServerClient, value: float, binary: bool) -> float:
    time.sleep(1.5 / COPY_RATE)
    x = httpclient.InferInput("x", [1, 1], "FP32")
    x.set_data_from_numpy(np.full((1, 1), value, dtype=np.float32), binary_data=binary)
    out = httpclient.InferRequestedOutput("y", binary_data=binary)
    return float(client.infer("sh", [x], outputs=[out]).as_numpy("y")[0][0])


def values(n: int) -> list[float]:
    return [round(0.05 + 0.9 * i / (n - 1), 4) for i in range(n)]  # 0.05 .. 0.95, a third of them over 0.6


def test_floating_outputs_within_tolerance_agree_on_every_protocol(rig: GatewayRig) -> None:
    ident = shadow_of(rig, "sh", "b")
    grpc, http = grpcclient.InferenceServerClient(rig.grpc_url), httpclient.InferenceServerClient(rig.http_url)
    try:
        seen = [infer_grpc(grpc, v) for v in values(10)]
        seen += [infer_http(http, v, binary) for binary in (False, True) for v in values(10)]
    finally:
        grpc.close()
        http.close()
    assert seen == [float(np.float32(v) * 2) for v in values(10)] * 3  # the serving version's, exactly
    found = figures(rig, ident, 30)
    assert (found["pairs"], found["agreed"], found["disagreed"]) == (30, 30, 0), found
    assert found["errors"] == {"shadow": 0, "serving": 0} and found["disagreements"] == []
    assert found["latency"]["serving"]["count"] == 30 and found["latency"]["shadow"]["count"] == 30


def test_a_version_that_disagrees_is_seen_and_clients_get_only_the_serving_answers(rig: GatewayRig) -> None:
    ident = shadow_of(rig, "sh", "c")
    grpc, http = grpcclient.InferenceServerClient(rig.grpc_url), httpclient.InferenceServerClient(rig.http_url)
    try:
        seen = [infer_grpc(grpc, v) for v in values(20)] + [infer_http(http, v, True) for v in values(10)]
    finally:
        grpc.close()
        http.close()
    assert seen == [float(np.float32(v) * 2) for v in values(20) + values(10)]  # never the shadow's +0.5
    found = figures(rig, ident, 30)
    over = sum(v > 0.5 for v in values(20) + values(10))
    assert (found["pairs"], found["disagreed"], found["agreed"]) == (30, over, 30 - over), found
    first = found["disagreements"][0]
    assert (first["kind"], first["output"], first["index"], first["protocol"]) == ("value", "y", 0, "grpc")
    x = next(v for v in values(20) if v > 0.5)
    assert first["serving"] == pytest.approx(2 * x, rel=1e-6)
    assert first["shadow"] == pytest.approx(2 * x + 0.5, rel=1e-6)
    assert len(found["disagreements"]) == 5 and all("inputs" not in d for d in found["disagreements"])


def test_a_version_that_raises_on_some_inputs_counts_errors_and_no_client_fails(rig: GatewayRig) -> None:
    ident = shadow_of(rig, "sh", "d")
    grpc = grpcclient.InferenceServerClient(rig.grpc_url)
    try:
        seen = [infer_grpc(grpc, v) for v in values(30)]  # none of these raises: the serving version answers
    finally:
        grpc.close()
    assert seen == [float(np.float32(v) * 2) for v in values(30)]
    found = figures(rig, ident, 30)
    failing = sum(0.6 < v < 0.8 for v in values(30))
    assert failing > 0 and found["errors"] == {"shadow": failing, "serving": 0}, found
    assert found["disagreed"] == failing and found["agreed"] == 30 - failing
    first = found["disagreements"][0]
    assert first["kind"] == "error" and first["serving"] == "OK" and "between 0.6 and 0.8" in first["shadow"]


def test_bytes_are_compared_exactly_and_inputs_kept_only_when_asked(rig: GatewayRig) -> None:
    for keep in (False, True):
        ident = shadow_of(rig, "tx", "b", keep_inputs=keep)
        client = grpcclient.InferenceServerClient(rig.grpc_url)
        try:
            for words in (["hello", "there"], ["hello", "world"], ["wörld"]):
                t = grpcclient.InferInput("TEXT", [1, len(words)], "BYTES")
                t.set_data_from_numpy(np.array([[w.encode() for w in words]], dtype=np.object_))
                answer = client.infer("tx", [t]).as_numpy("UPPER")
                assert [a.decode() for a in answer.reshape(-1)] == [w.upper() for w in words]  # never "WORLD!"
        finally:
            client.close()
        found = figures(rig, ident, 3)
        assert (found["pairs"], found["agreed"], found["disagreed"]) == (3, 2, 1), found
        (only,) = found["disagreements"]
        assert (only["output"], only["index"], only["serving"], only["shadow"]) == ("UPPER", 1, "WORLD", "WORLD!")
        if keep:
            assert only["inputs"] == [{"name": "TEXT", "datatype": "BYTES", "shape": [1, 2], "data": ["hello", "world"],
                                       "truncated": False}]
        else:
            assert "inputs" not in only


def test_a_route_without_its_shadow_copies_nothing_more(rig: GatewayRig) -> None:
    ident = shadow_of(rig, "sh", "c")
    rig.control.update(set={"sh": Route("sh", (Target(private("sh", "a"), digest("a")),))})
    grpc = grpcclient.InferenceServerClient(rig.grpc_url)
    try:
        assert infer_grpc(grpc, 0.9) == float(np.float32(0.9) * 2)
    finally:
        grpc.close()
    assert rig.control.figures()["shadows"][ident]["copied"] == 0


def test_the_routes_file_keeps_the_shadow_but_never_an_input(rig: GatewayRig) -> None:
    shadow_of(rig, "tx", "b", keep_inputs=True)
    text = Path(rig.gateway.routes_file).read_text()
    assert '"shadow"' in text and "hello" not in text


def test_large_answers_are_compared_in_the_comparing_thread(rig: GatewayRig) -> None:
    assert 50_000 * 4 > INLINE_BYTES // 2  # each answer: the pair goes to the thread
    ident = shadow_of(rig, "big", "b")
    client = grpcclient.InferenceServerClient(rig.grpc_url)
    try:
        x = grpcclient.InferInput("INPUT0", [50_000], "FP32")
        values = np.arange(50_000, dtype=np.float32)
        x.set_data_from_numpy(values)
        for _ in range(3):
            time.sleep(1.5 / COPY_RATE)
            assert np.array_equal(client.infer("big", [x]).as_numpy("OUTPUT0"), values)  # the serving answer
    finally:
        client.close()
    found = figures(rig, ident, 3)
    assert (found["pairs"], found["disagreed"]) == (3, 3), found
    first = found["disagreements"][0]
    assert (first["index"], first["serving"], first["shadow"]) == (40000, 40000.0, 80000.0)
