"""A shadow's pair of answers decoded and compared: does the new version answer as the serving one does?

The gateway relays tensors without decoding them; a shadow (controlplane/gateway/shadow.py) needs them
decoded, but only for the requests it copied, and only once both answers are in (the client got its own):
a small pair on the event loop, a large one in the shadow's comparing thread (shadow.py `INLINE_BYTES`).
Both protocols' answers become `Answer`s: gRPC `ModelInferResponse` bytes (decoded with tritonclient's
generated class, protos.py: the `raw_output_contents`, else the typed `contents`), HTTP/REST JSON with or
without the binary tensor extension (`Inference-Header-Content-Length`, each output's
`binary_data_size`). `compare` then says how the pair stands:

- one side failed and the other did not: `shadow_error` or `serving_error` (both failed: they agree);
- output names, then each output's datatype and shape, must be equal;
- BYTES, BOOL and integer outputs equal element by element; FP16, BF16, FP32 and FP64 within
  `|shadow - serving| <= atol + rtol * |serving|` (numpy's `isclose` with the serving answer as the
  reference; NaN equals NaN).

A disagreement names what differs: the output, the first index (row-major, flattened) and both values.
`grpc_inputs` and `http_inputs` decode a request's inputs the same way, for the first disagreements of a shadow with
`keep_inputs`. numpy is imported on the first comparison (the gateway starts without it).
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from typing import Any

from controlplane.gateway import protos

KEPT_VALUES = 64  # of each input kept with a disagreement
TEXT_MAX = 200  # characters of a BYTES value or an error shown
FLOATS = frozenset({"FP16", "BF16", "FP32", "FP64"})
_DTYPES = {"BOOL": "?", "UINT8": "<u1", "UINT16": "<u2", "UINT32": "<u4", "UINT64": "<u8", "INT8": "<i1",
           "INT16": "<i2", "INT32": "<i4", "INT64": "<i8", "FP16": "<f2", "FP32": "<f4", "FP64": "<f8",
           "BF16": "<u2"}
_CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
             "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
             "UINT32": "uint_contents", "UINT64": "uint64_contents", "FP32": "fp32_contents",
             "FP64": "fp64_contents", "BYTES": "bytes_contents"}


class Unreadable(Exception):
    """An answer the comparison cannot decode (counted apart, never a disagreement)."""


@dataclass
class Tensor:
    datatype: str
    shape: tuple[int, ...]
    values: Any  # a flat numpy array (BYTES: of Python bytes objects)


@dataclass
class Answer:
    ok: bool
    error: str = ""  # the failed side's status and message
    outputs: dict[str, Tensor] | None = None


def _np() -> Any:
    import numpy  # noqa: PLC0415 - imported by the first comparison only (docs/gateway.md "Shadow")

    return numpy


def _bytes_elements(raw: bytes) -> list[bytes]:
    """BYTES tensor data as Triton writes it: each element a 4-byte little-endian length, then its bytes."""
    out, i, n = [], 0, len(raw)
    while i < n:
        if i + 4 > n:
            raise Unreadable("a BYTES element cut short")
        (length,) = struct.unpack_from("<I", raw, i)
        i += 4
        if i + length > n:
            raise Unreadable("a BYTES element longer than its tensor")
        out.append(raw[i : i + length])
        i += length
    return out


def from_raw(datatype: str, shape: tuple[int, ...], raw: bytes) -> Tensor:
    np = _np()
    if datatype == "BYTES":
        return Tensor(datatype, shape, np.array(_bytes_elements(raw), dtype=object))
    dtype = _DTYPES.get(datatype)
    if dtype is None:
        raise Unreadable(f"datatype {datatype!r}")
    size = np.dtype(dtype).itemsize
    if len(raw) % size:
        raise Unreadable(f"{len(raw)} bytes are not whole {datatype} elements")
    values = np.frombuffer(raw, dtype=dtype)
    if datatype == "BF16":
        values = (values.astype(np.uint32) << 16).view(np.float32)
    return Tensor(datatype, shape, values)


def from_list(datatype: str, shape: tuple[int, ...], data: Any) -> Tensor:
    """A tensor given as a (nested) list: HTTP JSON's `data`, or gRPC's typed contents."""
    np = _np()
    flat = _flatten(data)
    if datatype == "BYTES":
        return Tensor(datatype, shape, np.array([v.encode() if isinstance(v, str) else bytes(v) for v in flat],
                                                dtype=object))
    dtype = _DTYPES.get(datatype)
    if dtype is None:
        raise Unreadable(f"datatype {datatype!r}")
    try:
        values = np.array(flat, dtype=np.float32 if datatype == "BF16" else dtype)
    except (TypeError, ValueError, OverflowError) as exc:
        raise Unreadable(f"{datatype} data: {exc}") from None
    return Tensor(datatype, shape, values)


def _flatten(data: Any) -> list[Any]:
    if not isinstance(data, list):
        return [data]
    out: list[Any] = []
    for item in data:
        out.extend(_flatten(item) if isinstance(item, list) else (item,))
    return out


# -- gRPC ------------------------------------------------------------------------------------------

def _message(framed: bytes) -> bytes:
    """The protobuf bytes of one uncompressed gRPC message (its 5-byte prefix checked)."""
    if len(framed) < 5 or framed[0] != 0 or int.from_bytes(framed[1:5], "big") != len(framed) - 5:
        raise Unreadable("not one uncompressed gRPC message")
    return framed[5:]


def _tensors(items: Any, raw: Any) -> dict[str, Tensor]:
    out: dict[str, Tensor] = {}
    for i, item in enumerate(items):
        shape = tuple(int(d) for d in item.shape)
        if i < len(raw):
            out[item.name] = from_raw(item.datatype, shape, bytes(raw[i]))
        else:
            field = _CONTENTS.get(item.datatype)
            if field is None:
                raise Unreadable(f"{item.datatype} output {item.name!r} without raw contents")
            out[item.name] = from_list(item.datatype, shape, list(getattr(item.contents, field)))
    return out


def grpc_answer(ok: bool, error: str, framed: bytes) -> Answer:
    if not ok:
        return Answer(False, error)
    pb = protos.service_pb2()
    try:
        response = pb.ModelInferResponse.FromString(_message(framed))
    except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError and friends
        raise Unreadable(f"ModelInferResponse: {exc}") from None
    return Answer(True, "", _tensors(response.outputs, response.raw_output_contents))


def grpc_inputs(framed: bytes) -> list[dict[str, Any]]:
    pb = protos.service_pb2()
    try:
        request = pb.ModelInferRequest.FromString(_message(framed))
        return [_kept(name, t) for name, t in _tensors(request.inputs, request.raw_input_contents).items()]
    except Exception as exc:  # noqa: BLE001 - inputs are shown as far as they can be read
        return [{"error": f"the request's inputs could not be read: {str(exc)[:TEXT_MAX]}"}]


# -- HTTP/REST -------------------------------------------------------------------------------------

def _http_tensors(items: Any, binary: bytes) -> dict[str, Tensor]:
    if not isinstance(items, list):
        raise Unreadable("no list of tensors")
    out: dict[str, Tensor] = {}
    at = 0
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise Unreadable("a tensor without a name")
        datatype, shape = str(item.get("datatype", "")), tuple(int(d) for d in item.get("shape") or ())
        size = (item.get("parameters") or {}).get("binary_data_size")
        if isinstance(size, int) and not isinstance(size, bool):
            if at + size > len(binary):
                raise Unreadable(f"tensor {item['name']!r}: binary data past the body's end")
            out[item["name"]] = from_raw(datatype, shape, binary[at : at + size])
            at += size
        elif "data" in item:
            out[item["name"]] = from_list(datatype, shape, item["data"])
        else:
            raise Unreadable(f"tensor {item['name']!r} has no data (shared memory?)")
    return out


def _http_json(body: bytes, json_len: int | None) -> tuple[Any, bytes]:
    head, rest = (body[:json_len], body[json_len:]) if json_len is not None else (body, b"")
    try:
        return json.loads(head), rest
    except ValueError as exc:
        raise Unreadable(f"not JSON: {exc}") from None


def http_answer(status: int, body: bytes, json_len: int | None) -> Answer:
    if status != 200:
        try:
            message = json.loads(body).get("error", "")
        except (ValueError, AttributeError):
            message = body[:TEXT_MAX].decode("utf-8", "replace")
        return Answer(False, f"HTTP {status}: {str(message)[:TEXT_MAX]}")
    document, binary = _http_json(body, json_len)
    if not isinstance(document, dict):
        raise Unreadable("the answer is not a JSON object")
    return Answer(True, "", _http_tensors(document.get("outputs"), binary))


def http_inputs(body: bytes, json_len: int | None) -> list[dict[str, Any]]:
    try:
        document, binary = _http_json(body, json_len)
        return [_kept(name, t) for name, t in _http_tensors(document.get("inputs"), binary).items()]
    except Exception as exc:  # noqa: BLE001 - inputs are shown as far as they can be read
        return [{"error": f"the request's inputs could not be read: {str(exc)[:TEXT_MAX]}"}]


# -- the comparison --------------------------------------------------------------------------------

def shown(value: Any) -> Any:
    """One element as JSON shows it: a number (a non-finite float as text), a bool, text."""
    if isinstance(value, (bytes, bytearray)):
        text = bytes(value).decode("utf-8", "replace")
        return text if len(text) <= TEXT_MAX else text[:TEXT_MAX] + "…"
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def _kept(name: str, tensor: Tensor) -> dict[str, Any]:
    values = tensor.values
    return {"name": name, "datatype": tensor.datatype, "shape": list(tensor.shape),
            "data": [shown(v) for v in values[:KEPT_VALUES]], "truncated": len(values) > KEPT_VALUES}


def compare(serving: Answer, shadow: Answer, rtol: float, atol: float) -> tuple[str, dict[str, Any] | None]:
    """(outcome, the disagreement): `agreed` (None), `disagreed`, `shadow_error` or `serving_error`."""
    if not serving.ok or not shadow.ok:
        if not serving.ok and not shadow.ok:
            return "agreed", None
        if serving.ok:
            return "shadow_error", {"kind": "error", "serving": "OK", "shadow": shadow.error[:TEXT_MAX]}
        return "serving_error", {"kind": "error", "serving": serving.error[:TEXT_MAX], "shadow": "OK"}
    ours, theirs = serving.outputs or {}, shadow.outputs or {}
    if set(ours) != set(theirs):
        return "disagreed", {"kind": "outputs", "serving": sorted(ours), "shadow": sorted(theirs)}
    for name in sorted(ours):
        a, b = ours[name], theirs[name]
        if a.datatype != b.datatype:
            return "disagreed", {"kind": "datatype", "output": name, "serving": a.datatype, "shadow": b.datatype}
        if a.shape != b.shape or len(a.values) != len(b.values):
            return "disagreed", {"kind": "shape", "output": name, "serving": list(a.shape), "shadow": list(b.shape)}
        index = first_difference(a, b, rtol, atol)
        if index is not None:
            return "disagreed", {"kind": "value", "output": name, "index": index,
                                 "serving": shown(a.values[index]), "shadow": shown(b.values[index])}
    return "agreed", None


def first_difference(serving: Tensor, shadow: Tensor, rtol: float, atol: float) -> int | None:
    """The first flat index where the two differ beyond the tolerances (floats) or at all; None: equal."""
    np = _np()
    a, b = serving.values, shadow.values
    if not len(a) or (a.dtype == b.dtype and np.array_equal(a, b)):  # the usual case: the same values
        return None
    if serving.datatype in FLOATS:
        same = np.isclose(b.astype(np.float64), a.astype(np.float64), rtol=rtol, atol=atol, equal_nan=True)
    elif serving.datatype == "BYTES":
        same = np.fromiter((x == y for x, y in zip(a, b, strict=True)), dtype=bool, count=len(a))
    else:
        same = a == b
    if bool(same.all()):
        return None
    return int(np.argmin(same))
