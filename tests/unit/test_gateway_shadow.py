"""A shadow's pieces without a server: the route's `shadow` field, the table's choice, the copy's admission,
and the comparison of two answers (controlplane/gateway/routes.py, table.py, shadow.py, compare.py).

The route table must cost a route without a shadow nothing more than before (its requests take the
single-target path, and no request of it ever asks a shadow), and a route with one must never hand a
client request to the shadow's target. The comparison must say the pair agrees only when a user would:
floats within the tolerances, everything else equal, and name what differs when it does not.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from controlplane.errors import UsageError
from controlplane.gateway import compare as c
from controlplane.gateway import protos
from controlplane.gateway import shadow as shadow_module
from controlplane.gateway.figures import Figures
from controlplane.gateway.routes import Route, RouteTable, Shadow, Target, route_from_json, route_to_json
from controlplane.gateway.shadow import COPY_BURST, COPY_IN_FLIGHT, ShadowState
from controlplane.gateway.table import LiveTable
from controlplane.gateway.wire import grpc_prefix

A, B = "a" * 64, "b" * 64
OLD, NEW = Target("m__aaaaaaaa", A, 100), Target("m__bbbbbbbb", B, 0)


def shadowed(ident: str = "0123abcd", **spec: object) -> Route:
    return Route("m", (OLD, NEW), shadow=Shadow(NEW.name, B, ident, **spec))  # type: ignore[arg-type]


def test_a_shadow_round_trips_through_json() -> None:
    route = shadowed(fraction=0.5, rtol=1e-3, atol=0.0, keep_inputs=True)
    assert route_from_json("m", json.loads(json.dumps(route_to_json(route)))) == route


@pytest.mark.parametrize("shadow, field", [
    ({"name": "m__aaaaaaaa", "digest": A, "id": "0123abcd"}, "routes.m.shadow.name"),  # the serving target
    ({"name": "m__cccccccc", "digest": "c" * 64, "id": "0123abcd"}, "routes.m.shadow.name"),  # no target
    ({"name": "m__bbbbbbbb", "digest": B, "id": "xyz"}, "routes.m.shadow.id"),
    ({"name": "m__bbbbbbbb", "digest": B, "id": "0123abcd", "fraction": 0}, "routes.m.shadow.fraction"),
    ({"name": "m__bbbbbbbb", "digest": B, "id": "0123abcd", "rtol": -1}, "routes.m.shadow.rtol"),
    ({"name": "m__bbbbbbbb", "digest": B, "id": "0123abcd", "keep_inputs": "yes"}, "routes.m.shadow.keep_inputs"),
    ({"name": "m__bbbbbbbb", "digest": B, "id": "0123abcd", "copies": 3}, "routes.m.shadow: unknown key 'copies'"),
])
def test_a_bad_shadow_is_refused_naming_its_field(shadow: dict, field: str) -> None:
    data = {"targets": [{"name": OLD.name, "digest": A, "weight": 100}, {"name": NEW.name, "digest": B, "weight": 0}],
            "shadow": shadow}
    with pytest.raises(UsageError) as raised:
        route_from_json("m", data)
    assert str(raised.value).startswith(field) and "\n" not in str(raised.value)


def test_a_route_without_a_shadow_keeps_the_single_target_path() -> None:
    """The hot path's choice for a route with no shadow is what it was: one target, no shadow to ask."""
    plain = LiveTable(RouteTable(1, {"m": Route("m", (OLD,))}), Figures()).route(b"m")
    assert plain.shadow is None and plain.single is plain.targets[0]
    split = LiveTable(RouteTable(1, {"m": Route("m", (OLD, NEW))}), Figures()).route(b"m")
    assert split.shadow is None and split.single is split.targets[0]  # a weight-0 target alone changes nothing
    with_shadow = LiveTable(RouteTable(1, {"m": shadowed()}), Figures()).route(b"m")
    assert with_shadow.single is None and with_shadow.shadow is not None
    assert {with_shadow.choose(None, None).name for _ in range(500)} == {OLD.name}  # never a client to the shadow
    assert with_shadow.choose(b"bbbb", None).name == NEW.name  # a pin still reaches it


def test_a_shadow_keeps_its_figures_across_route_updates_and_a_new_id_starts_afresh() -> None:
    figures = Figures()
    first = LiveTable(RouteTable(1, {"m": shadowed("0123abcd")}), figures).route(b"m").shadow
    assert first is not None
    first.pairs = 7
    again = LiveTable(RouteTable(2, {"m": shadowed("0123abcd", fraction=0.5)}), figures).route(b"m").shadow
    assert again is first and again.pairs == 7 and again.spec.fraction == 0.5
    fresh = LiveTable(RouteTable(3, {"m": shadowed("4567cdef")}), figures).route(b"m").shadow
    assert fresh is not first and fresh is not None and fresh.pairs == 0
    assert set(figures.to_json()["shadows"]) == {"0123abcd", "4567cdef"}


def test_copies_are_admitted_by_fraction_rate_and_in_flight(monkeypatch: pytest.MonkeyPatch) -> None:
    state = ShadowState("m", Shadow(NEW.name, B, "0123abcd"))
    admitted = []
    for _ in range(100):  # at once: the bucket's burst, then the rate
        pair = state.pair(None, "grpc")
        if pair is not None:
            admitted.append(pair)
            state.in_flight -= 1  # compared at once
    assert COPY_BURST - 1 <= len(admitted) <= COPY_BURST + 2 and state.skipped["rate"] == 100 - len(admitted)
    monkeypatch.setattr(shadow_module, "COPY_BURST", 1e9)  # below: the rate never limits
    state = ShadowState("m", Shadow(NEW.name, B, "0123abcd"))
    busy = [state.pair(None, "grpc") for _ in range(COPY_IN_FLIGHT + 5)]
    assert sum(p is not None for p in busy) == COPY_IN_FLIGHT and state.skipped["busy"] == 5
    state = ShadowState("m", Shadow(NEW.name, B, "0123abcd", fraction=0.25))
    taken = 0
    for _ in range(2000):
        pair = state.pair(None, "grpc")
        if pair is not None:
            taken += 1
            state.in_flight -= 1
    assert 380 <= taken <= 620


# -- comparing answers -----------------------------------------------------------------------------

def grpc_answer(outputs: dict[str, tuple[str, list[int], np.ndarray]]) -> bytes:
    pb = protos.service_pb2()
    response = pb.ModelInferResponse(model_name="m__aaaaaaaa")
    for name, (datatype, shape, values) in outputs.items():
        response.outputs.add(name=name, datatype=datatype, shape=shape)
        if datatype == "BYTES":
            response.raw_output_contents.append(b"".join(struct.pack("<I", len(v)) + v for v in values))
        else:
            response.raw_output_contents.append(values.tobytes())
    body = response.SerializeToString()
    return grpc_prefix(len(body)) + body


def verdict(serving: bytes, shadow: bytes, rtol: float = 1e-5, atol: float = 1e-8) -> tuple[str, dict | None]:
    return c.compare(c.grpc_answer(True, "", serving), c.grpc_answer(True, "", shadow), rtol, atol)


def test_floats_agree_within_the_tolerances_and_nan_equals_nan() -> None:
    x = np.array([1.0, 2.0, np.nan, 1e-9], dtype=np.float32)
    near = np.array([1.000001, 2.0, np.nan, 0.0], dtype=np.float32)
    assert verdict(grpc_answer({"y": ("FP32", [4], x)}), grpc_answer({"y": ("FP32", [4], near)})) == ("agreed", None)
    far = np.array([1.0, 2.1, np.nan, 0.0], dtype=np.float32)
    outcome, found = verdict(grpc_answer({"y": ("FP32", [4], x)}), grpc_answer({"y": ("FP32", [4], far)}))
    assert outcome == "disagreed" and found is not None
    assert (found["kind"], found["output"], found["index"], found["serving"]) == ("value", "y", 1, 2.0)
    assert found["shadow"] == pytest.approx(2.1)
    loose = verdict(grpc_answer({"y": ("FP32", [4], x)}), grpc_answer({"y": ("FP32", [4], far)}), rtol=0.1)
    assert loose == ("agreed", None)


def test_integers_and_bytes_must_be_equal() -> None:
    ints = np.array([1, 2, 3], dtype=np.int64)
    close = np.array([1, 2, 4], dtype=np.int64)
    outcome, found = verdict(grpc_answer({"k": ("INT64", [3], ints)}), grpc_answer({"k": ("INT64", [3], close)}),
                             rtol=1.0, atol=5.0)  # tolerances are for floats only
    assert outcome == "disagreed" and found is not None
    assert (found["index"], found["serving"], found["shadow"]) == (2, 3, 4)
    words = [b"caf\xc3\xa9", b"x"]
    same = grpc_answer({"w": ("BYTES", [2], words)})  # type: ignore[dict-item]
    assert verdict(same, grpc_answer({"w": ("BYTES", [2], [b"caf\xc3\xa9", b"x"])}))[0] == "agreed"  # type: ignore[dict-item]
    outcome, found = verdict(same, grpc_answer({"w": ("BYTES", [2], [b"cafe", b"x"])}))  # type: ignore[dict-item]
    assert outcome == "disagreed" and found is not None and (found["serving"], found["shadow"]) == ("café", "cafe")


def test_names_datatypes_and_shapes_must_match() -> None:
    x = np.zeros(2, dtype=np.float32)
    assert verdict(grpc_answer({"y": ("FP32", [2], x)}), grpc_answer({"z": ("FP32", [2], x)}))[1] == \
        {"kind": "outputs", "serving": ["y"], "shadow": ["z"]}
    wider = grpc_answer({"y": ("FP64", [2], x.astype(np.float64))})
    assert verdict(grpc_answer({"y": ("FP32", [2], x)}), wider)[1] == \
        {"kind": "datatype", "output": "y", "serving": "FP32", "shadow": "FP64"}
    assert verdict(grpc_answer({"y": ("FP32", [2], x)}), grpc_answer({"y": ("FP32", [1, 2], x)}))[1] == \
        {"kind": "shape", "output": "y", "serving": [2], "shadow": [1, 2]}


def test_one_side_failing_is_an_error_of_that_side() -> None:
    ok = c.grpc_answer(True, "", grpc_answer({"y": ("FP32", [1], np.zeros(1, dtype=np.float32))}))
    failed = c.grpc_answer(False, "INTERNAL: boom", b"")
    assert c.compare(ok, failed, 0, 0) == \
        ("shadow_error", {"kind": "error", "serving": "OK", "shadow": "INTERNAL: boom"})
    assert c.compare(failed, ok, 0, 0)[0] == "serving_error"
    assert c.compare(failed, failed, 0, 0) == ("agreed", None)


def test_http_answers_json_and_binary_decode_alike() -> None:
    values = np.array([0.5, 1.5], dtype=np.float32)
    as_json = json.dumps({"outputs": [{"name": "y", "datatype": "FP32", "shape": [2], "data": [0.5, 1.5]}]}).encode()
    head = json.dumps({"outputs": [{"name": "y", "datatype": "FP32", "shape": [2],
                                    "parameters": {"binary_data_size": 8}}]}).encode()
    binary = c.http_answer(200, head + values.tobytes(), len(head))
    assert c.compare(c.http_answer(200, as_json, None), binary, 0, 0) == ("agreed", None)
    error = c.http_answer(500, b'{"error":"Failed to process the request(s)"}', None)
    assert not error.ok and "Failed to process" in error.error
    with pytest.raises(c.Unreadable):
        c.http_answer(200, head + b"\0", len(head))  # the binary part is cut short


def test_bf16_and_fp16_decode_to_their_values() -> None:
    bf16 = np.array([1.5, -2.0], dtype=np.float32).view(np.uint32) >> 16
    tensor = c.from_raw("BF16", (2,), bf16.astype(np.uint16).tobytes())
    assert list(tensor.values) == [1.5, -2.0]
    assert list(c.from_raw("FP16", (1,), np.array([0.25], dtype=np.float16).tobytes()).values) == [0.25]


def test_inputs_are_shown_cut_to_their_first_values() -> None:
    pb = protos.service_pb2()
    request = pb.ModelInferRequest(model_name="m")
    request.inputs.add(name="x", datatype="INT32", shape=[100])
    request.raw_input_contents.append(np.arange(100, dtype=np.int32).tobytes())
    body = request.SerializeToString()
    (shown,) = c.grpc_inputs(grpc_prefix(len(body)) + body)
    assert shown["name"] == "x" and shown["shape"] == [100] and shown["truncated"] is True
    assert shown["data"] == list(range(c.KEPT_VALUES))
