"""The building blocks of the differential cases: a `Case` of model directories, and config helpers.

A `Case` is one or more model directories (roles such as `m`, `pipe`, `a`); `target` is the one the
suite loads (an ensemble's load loads its steps). Config texts name models as `${role}`; a case's
models are written as `<case>_<role>` so every case lives in one repository; `${outside}` names a
directory next to the repository (not in it) that holds the case's `outside` files, for paths a
config gives absolutely. Every model is a python model whose model.py answers any config (zeros of
each output's shape and type), so only the configuration and the files decide whether Triton loads
it. `triton_loads` is what Triton 2.51 did when the case was written: informational (the suite asks
the server each time).
"""

from __future__ import annotations

import shutil
import string
from dataclasses import dataclass, field
from pathlib import Path

MODEL_PY = '''import json

import numpy as np
import triton_python_backend_utils as pb_utils

_TYPES = {"TYPE_BOOL": np.bool_, "TYPE_UINT8": np.uint8, "TYPE_UINT16": np.uint16, "TYPE_UINT32": np.uint32,
          "TYPE_UINT64": np.uint64, "TYPE_INT8": np.int8, "TYPE_INT16": np.int16, "TYPE_INT32": np.int32,
          "TYPE_INT64": np.int64, "TYPE_FP16": np.float16, "TYPE_FP32": np.float32, "TYPE_FP64": np.float64,
          "TYPE_STRING": np.object_}


class TritonPythonModel:
    """Answers any config: zeros of each output's shape and type (batch taken from the first input)."""

    def initialize(self, args):
        self.config = json.loads(args["model_config"])

    def execute(self, requests):
        responses = []
        batching = int(self.config.get("max_batch_size", 0)) > 0
        for request in requests:
            batch = 1
            for io in self.config.get("input", []):
                tensor = pb_utils.get_input_tensor_by_name(request, io["name"])
                if tensor is not None and batching:
                    batch = tensor.as_numpy().shape[0]
                    break
            outputs = []
            for io in self.config.get("output", []):
                dims = [int(d) if int(d) > 0 else 1 for d in io.get("dims", [])]
                shape = ([batch] if batching else []) + dims
                dtype = _TYPES.get(io["data_type"], np.float32)
                value = np.full(shape, b"", dtype=np.object_) if dtype is np.object_ else np.zeros(shape, dtype)
                outputs.append(pb_utils.Tensor(io["name"], value))
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
'''

TYPES = ("TYPE_BOOL", "TYPE_UINT8", "TYPE_UINT16", "TYPE_UINT32", "TYPE_UINT64", "TYPE_INT8", "TYPE_INT16",
         "TYPE_INT32", "TYPE_INT64", "TYPE_FP16", "TYPE_FP32", "TYPE_FP64", "TYPE_STRING")


@dataclass
class Model:
    config: str | None  # config.pbtxt (None: none); `${role}` names a model of the same case, `${self}` this one
    versions: tuple[int, ...] = (1,)
    files: dict[str, bytes] = field(default_factory=dict)  # extra files, relative to the model dir
    python: bool = True  # write <v>/model.py (an ensemble has only empty version dirs)
    code: str = MODEL_PY  # what <v>/model.py holds (cases_autocomplete: an auto_complete_config)


@dataclass
class Case:
    name: str
    category: str
    models: dict[str, Model]
    target: str = "m"
    triton_loads: bool | None = None
    note: str = ""
    outside: dict[str, bytes] = field(default_factory=dict)  # files under ${outside}, not in the repository

    def model_name(self, role: str) -> str:
        return f"{self.name}_{role}"

    def outside_dir(self, repo: Path) -> Path:
        return repo.parent / "outside" / self.name

    def write(self, repo: Path) -> list[Path]:
        """Write the case's model directories into `repo` (and its `outside` files next to it);
        returns the model directories, target first."""
        names = {role: self.model_name(role) for role in self.models}
        outside = self.outside_dir(repo)
        for rel, data in self.outside.items():
            (outside / rel).parent.mkdir(parents=True, exist_ok=True)
            (outside / rel).write_bytes(data)
        dirs = []
        for role in [self.target] + [r for r in self.models if r != self.target]:
            model = self.models[role]
            path = repo / names[role]
            if path.exists():
                shutil.rmtree(path)
            path.mkdir(parents=True)
            if model.config is not None:
                text = string.Template(model.config).substitute(names, self=names[role], outside=outside)
                (path / "config.pbtxt").write_text(text)
            for version in model.versions:
                (path / str(version)).mkdir()
                if model.python:
                    (path / str(version) / "model.py").write_text(model.code)
            for rel, data in model.files.items():
                (path / rel).parent.mkdir(parents=True, exist_ok=True)
                (path / rel).write_bytes(data)
            dirs.append(path)
        return dirs


def simple(body: str = "", *, mbs: int = 4, inputs: str | None = None, outputs: str | None = None,
           instance: str = "instance_group [ { kind: KIND_CPU count: 1 } ]") -> str:
    """A python model config (x FP32 [3] -> y FP32 [1] unless given), `body` appended."""
    inputs = inputs if inputs is not None else '{ name: "x" data_type: TYPE_FP32 dims: [ 3 ] }'
    outputs = outputs if outputs is not None else '{ name: "y" data_type: TYPE_FP32 dims: [ 1 ] }'
    return (f'name: "${{self}}"\nbackend: "python"\nmax_batch_size: {mbs}\ninput [ {inputs} ]\n'
            f"output [ {outputs} ]\n{instance}\n{body}\n")


class Builder:
    """Collects cases; `one` for a single model (role `m`), `many` for several."""

    def __init__(self) -> None:
        self.cases: list[Case] = []

    def one(self, name: str, category: str, config: str | None, loads: bool | None, note: str = "",
            outside: dict[str, bytes] | None = None, **model_args: object) -> None:
        model = Model(config, **model_args)  # type: ignore[arg-type]
        self.cases.append(Case(name, category, {"m": model}, "m", loads, note, dict(outside or {})))

    def many(self, name: str, category: str, models: dict[str, Model], target: str, loads: bool | None,
             note: str = "") -> None:
        self.cases.append(Case(name, category, models, target, loads, note))
