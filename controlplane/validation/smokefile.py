"""The smoke file: a few known requests and their expected answers, checked offline.

A model may carry `<model>/smoke.json`. A deploy whose model is READY but answers these requests
wrongly (or not at all) is a failed deploy, so the deploy state machine rolls it back. The file is
checked offline here (`load_smoke_file`, one-line errors naming file and field: `validate` and the
daemon's record check it without numpy, `build=False`) and run after a deploy by
controlplane/deploy/smoke.py (`run_smoke`).

Format::

    {"requests": [
      {"version": "1",                                  # optional; "" / absent = default version
       "inputs":  [{"name": "x", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}],
       "outputs": [{"name": "y", "data": [6], "tolerance": 1e-6, "shape": [1, 1]}]}
    ]}

`data` is a flat or nested list whose element count (and, when nested, layout) matches `shape`.
BYTES data are strings, sent UTF-8 encoded; BYTES outputs compare exactly and tolerance is ignored.
Numeric outputs pass when every |got - expected| <= tolerance (default 1e-6). An output's `shape`
is optional and checked when given; without it only the values (in row-major order) are compared.
Outputs the file does not list are not checked.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # numpy is imported where arrays are built: `validate` checks a smoke file without it
    import numpy as np

from controlplane.errors import ModelConfigError, SnapshotEnvironmentError, is_environment_error

DEFAULT_TOLERANCE = 1e-6

# Triton's wire datatypes that numpy can hold (BF16 has no numpy type), with numpy's name for each.
DATATYPES: dict[str, str] = {
    "BOOL": "bool",
    "UINT8": "uint8",
    "UINT16": "uint16",
    "UINT32": "uint32",
    "UINT64": "uint64",
    "INT8": "int8",
    "INT16": "int16",
    "INT32": "int32",
    "INT64": "int64",
    "FP16": "float16",
    "FP32": "float32",
    "FP64": "float64",
    "BYTES": "object",
}
_INT_RANGES = {
    f"{'U' if unsigned else ''}INT{bits}": ((0, 2**bits - 1) if unsigned else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1))
    for bits in (8, 16, 32, 64) for unsigned in (True, False)
}

_REQUEST_KEYS = {"version", "inputs", "outputs"}
_INPUT_KEYS = {"name", "datatype", "shape", "data"}
_OUTPUT_KEYS = {"name", "data", "shape", "tolerance"}


@dataclass(frozen=True)
class SmokeInput:
    name: str
    datatype: str
    array: np.ndarray | None  # BYTES: object array of bytes (UTF-8); None when only checked


@dataclass(frozen=True)
class SmokeOutput:
    name: str
    expected: np.ndarray | None  # object array of str for BYTES outputs, float64/bool otherwise; None when only checked
    tolerance: float
    shape: tuple[int, ...] | None


@dataclass(frozen=True)
class SmokeRequest:
    inputs: tuple[SmokeInput, ...]
    outputs: tuple[SmokeOutput, ...]
    version: str = ""  # "" = the version Triton serves by default (the highest READY one)


# (model, version, inputs, output_names) -> {output name: array}; BYTES outputs may be bytes or str.


class _Bad(Exception):
    """A problem at one field; load_smoke_file turns it into a ModelConfigError."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")


# ---------------------------------------------------------------- parsing


def load_smoke_file(path: Path, label: str | None = None, build: bool = True) -> list[SmokeRequest]:
    """Parse and check `path`; raise ModelConfigError naming the file (`label`, e.g. linear/smoke.json)
    and the field at fault. `build=False` runs every check but builds no arrays (no numpy import):
    what `validate` needs."""
    path = Path(path)
    label = label or (f"{path.parent.name}/{path.name}" if path.parent.name else path.name)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        if is_environment_error(exc):  # the host's failure, not the file's: tried again (issue 58)
            raise SnapshotEnvironmentError(f"{label}: cannot read ({exc}); trying again") from exc
        raise ModelConfigError(f"{label}: cannot read: {exc}") from exc
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        where = f"line {exc.lineno} col {exc.colno}"
        raise ModelConfigError(f"{label}: invalid JSON at {where}: {exc.msg}") from exc
    try:
        return _parse_document(document, build)
    except _Bad as exc:
        raise ModelConfigError(f"{label}: {exc}") from exc


def _parse_document(document: object, build: bool) -> list[SmokeRequest]:
    if not isinstance(document, dict):
        raise _Bad("(top level)", "expected an object with a 'requests' list")
    _no_unknown_keys("(top level)", document, {"requests"})
    requests = document.get("requests")
    if not isinstance(requests, list) or not requests:
        raise _Bad("requests", "expected a non-empty list")
    return [_parse_request(f"requests[{i}]", item, build) for i, item in enumerate(requests)]


def _parse_request(field: str, item: object, build: bool) -> SmokeRequest:
    if not isinstance(item, dict):
        raise _Bad(field, "expected an object")
    _no_unknown_keys(field, item, _REQUEST_KEYS)
    version = _parse_version(f"{field}.version", item.get("version", ""))
    raw_inputs = item.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise _Bad(f"{field}.inputs", "expected a non-empty list")
    inputs = tuple(_parse_input(f"{field}.inputs[{i}]", x, build) for i, x in enumerate(raw_inputs))
    _unique_names(f"{field}.inputs", [x.name for x in inputs])
    raw_outputs = item.get("outputs", [])
    if not isinstance(raw_outputs, list):
        raise _Bad(f"{field}.outputs", "expected a list")
    outputs = tuple(_parse_output(f"{field}.outputs[{i}]", x, build) for i, x in enumerate(raw_outputs))
    _unique_names(f"{field}.outputs", [x.name for x in outputs])
    return SmokeRequest(inputs=inputs, outputs=outputs, version=version)


def _parse_version(field: str, value: object) -> str:
    if isinstance(value, bool):
        raise _Bad(field, f"expected a version number, got {value!r}")
    if isinstance(value, int) and value >= 1:
        return str(value)
    if isinstance(value, str) and (value == "" or (value.isdigit() and int(value) >= 1)):
        return value
    raise _Bad(field, f'expected a version number such as "1", got {value!r}')


def _parse_input(field: str, item: object, build: bool) -> SmokeInput:
    if not isinstance(item, dict):
        raise _Bad(field, "expected an object")
    _no_unknown_keys(field, item, _INPUT_KEYS)
    name = _parse_name(f"{field}.name", item.get("name"))
    datatype = item.get("datatype")
    if not isinstance(datatype, str) or datatype not in DATATYPES:
        known = ", ".join(DATATYPES)
        raise _Bad(f"{field}.datatype", f"unknown datatype {datatype!r} (one of {known})")
    if "shape" not in item:
        raise _Bad(f"{field}.shape", "missing")
    shape = _parse_shape(f"{field}.shape", item["shape"])
    if "data" not in item:
        raise _Bad(f"{field}.data", "missing")
    array = _parse_data(f"{field}.data", item["data"], datatype, shape, build)
    return SmokeInput(name=name, datatype=datatype, array=array)


def _parse_output(field: str, item: object, build: bool) -> SmokeOutput:
    if not isinstance(item, dict):
        raise _Bad(field, "expected an object")
    _no_unknown_keys(field, item, _OUTPUT_KEYS)
    name = _parse_name(f"{field}.name", item.get("name"))
    shape = _parse_shape(f"{field}.shape", item["shape"]) if "shape" in item else None
    tolerance = item.get("tolerance", DEFAULT_TOLERANCE)
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not tolerance >= 0:
        raise _Bad(f"{field}.tolerance", f"expected a number >= 0, got {tolerance!r}")
    if "data" not in item:
        raise _Bad(f"{field}.data", "missing")
    expected = _parse_expected(f"{field}.data", item["data"], shape, build)
    return SmokeOutput(name=name, expected=expected, tolerance=float(tolerance), shape=shape)


def _parse_name(field: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise _Bad(field, f"expected a non-empty string, got {value!r}")
    return value


def _parse_shape(field: str, value: object) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in value
    ):
        raise _Bad(field, f"expected a list of integers >= 0, got {value!r}")
    return tuple(value)


def _layout(field: str, data: object) -> tuple[tuple[int, ...], list[object]]:
    """The nested-list shape of `data` and its leaves in row-major order; rejects ragged lists."""
    if not isinstance(data, list):
        raise _Bad(field, f"expected a list, got {type(data).__name__}")

    def walk(node: object, depth: int, dims: list[int], leaves: list[object]) -> None:
        if isinstance(node, list):
            if depth == len(dims):
                if leaves and depth > 0:
                    raise _Bad(field, "ragged nested lists")
                dims.append(len(node))
            elif dims[depth] != len(node):
                raise _Bad(field, "ragged nested lists")
            for child in node:
                walk(child, depth + 1, dims, leaves)
        else:
            if depth != len(dims):
                raise _Bad(field, "ragged nested lists")
            leaves.append(node)

    dims: list[int] = []
    leaves: list[object] = []
    walk(data, 0, dims, leaves)
    return tuple(dims), leaves


def _check_layout(field: str, layout: tuple[int, ...], count: int, shape: tuple[int, ...]) -> None:
    wanted = math.prod(shape)
    if len(layout) > 1 and layout != shape:
        raise _Bad(field, f"nested data has shape {list(layout)} but shape is {list(shape)}")
    if count != wanted:
        raise _Bad(field, f"{count} values do not fill shape {list(shape)} ({wanted} values)")


def _parse_data(field: str, data: object, datatype: str, shape: tuple[int, ...], build: bool) -> np.ndarray | None:
    layout, leaves = _layout(field, data)
    _check_layout(field, layout, len(leaves), shape)
    if datatype == "BYTES":
        encoded: list[bytes] = []
        for i, leaf in enumerate(leaves):
            if not isinstance(leaf, str):
                raise _Bad(field, f"value {i}: BYTES data must be strings, got {leaf!r}")
            encoded.append(leaf.encode("utf-8"))
        if not build:
            return None
        import numpy as np

        array = np.empty(len(encoded), dtype=np.object_)
        array[:] = encoded
        return array.reshape(shape)
    for i, leaf in enumerate(leaves):
        if datatype == "BOOL":
            if not isinstance(leaf, bool):
                raise _Bad(field, f"value {i}: BOOL data must be true/false, got {leaf!r}")
        elif isinstance(leaf, bool) or not isinstance(leaf, (int, float)):
            raise _Bad(field, f"value {i}: {datatype} data must be numbers, got {leaf!r}")
        elif datatype in _INT_RANGES:
            low, high = _INT_RANGES[datatype]
            if not (isinstance(leaf, int) or float(leaf).is_integer()) or not low <= leaf <= high:
                raise _Bad(field, f"value {i}: {leaf!r} is not a {datatype}")
    if not build:
        return None
    import numpy as np

    return np.array(leaves, dtype=DATATYPES[datatype]).reshape(shape)


def _parse_expected(field: str, data: object, shape: tuple[int, ...] | None, build: bool) -> np.ndarray | None:
    layout, leaves = _layout(field, data)
    if shape is not None:
        _check_layout(field, layout, len(leaves), shape)
    target = shape if shape is not None else layout
    if leaves and all(isinstance(leaf, str) for leaf in leaves):
        kind = "object"
    elif all(isinstance(leaf, bool) for leaf in leaves):
        kind = "bool"
    else:
        for i, leaf in enumerate(leaves):
            if isinstance(leaf, bool) or not isinstance(leaf, (int, float)):
                raise _Bad(field, f"value {i}: expected all numbers, all booleans or all strings, got {leaf!r}")
        kind = "float64"
    if not build:
        return None
    import numpy as np

    return np.array(leaves, dtype=kind).reshape(target)


def _no_unknown_keys(field: str, item: dict[str, object], allowed: set[str]) -> None:
    unknown = sorted(set(item) - allowed)
    if unknown:
        where = f"{field}.{unknown[0]}" if not field.startswith("(") else unknown[0]
        raise _Bad(where, f"unknown field (allowed: {', '.join(sorted(allowed))})")


def _unique_names(field: str, names: list[str]) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise _Bad(field, f"name {name!r} appears twice")
        seen.add(name)
