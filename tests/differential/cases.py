"""The differential cases: small model repositories, valid and subtly invalid, for offline validation
and the real tritonserver to judge side by side.

A `Case` is one or more model directories (roles such as `m`, `pipe`, `a`); `target` is the one the
suite loads (an ensemble's load loads its steps). Config texts name models as `${role}`; a case's
models are written as `<case>_<role>` so every case lives in one repository. Every model is a python
model whose model.py answers any config (zeros of each output's shape and type), so only the
configuration and the files decide whether Triton loads it. `triton_loads` is what Triton 2.51 did
when the case was written: informational (the suite asks the server each time).
"""

from __future__ import annotations

import json
import shutil
import string
from collections.abc import Iterator
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
    config: str  # config.pbtxt; `${role}` names a model of the same case, `${self}` this one
    versions: tuple[int, ...] = (1,)
    files: dict[str, bytes] = field(default_factory=dict)  # extra files, relative to the model dir
    python: bool = True  # write <v>/model.py (an ensemble has only empty version dirs)


@dataclass
class Case:
    name: str
    category: str
    models: dict[str, Model]
    target: str = "m"
    triton_loads: bool | None = None
    note: str = ""

    def model_name(self, role: str) -> str:
        return f"{self.name}_{role}"

    def write(self, repo: Path) -> list[Path]:
        """Write the case's model directories into `repo`; returns them, target first."""
        names = {role: self.model_name(role) for role in self.models}
        dirs = []
        for role in [self.target] + [r for r in self.models if r != self.target]:
            model = self.models[role]
            path = repo / names[role]
            if path.exists():
                shutil.rmtree(path)
            path.mkdir(parents=True)
            text = string.Template(model.config).substitute(names, self=names[role])
            (path / "config.pbtxt").write_text(text)
            for version in model.versions:
                (path / str(version)).mkdir()
                if model.python:
                    (path / str(version) / "model.py").write_text(MODEL_PY)
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


class _Builder:
    def __init__(self) -> None:
        self.cases: list[Case] = []

    def one(self, name: str, category: str, config: str, loads: bool | None, note: str = "",
            **model_args: object) -> None:
        self.cases.append(Case(name, category, {"m": Model(config, **model_args)}, "m", loads, note))  # type: ignore[arg-type]

    def many(self, name: str, category: str, models: dict[str, Model], target: str, loads: bool | None,
             note: str = "") -> None:
        self.cases.append(Case(name, category, models, target, loads, note))


def _dims(b: _Builder) -> None:
    c = "dims"
    b.one("dims_basic", c, simple(), True)
    b.one("dims_no_batch", c, simple(mbs=0, inputs='{ name: "x" data_type: TYPE_FP32 dims: [ 3, 3 ] }',
                                     outputs='{ name: "y" data_type: TYPE_FP32 dims: [ 3, 1 ] }'), True)
    b.one("dims_variable", c, simple(mbs=0, inputs='{ name: "x" data_type: TYPE_STRING dims: [ -1 ] }'), True)
    b.one("dims_zero", c, simple(inputs='{ name: "x" data_type: TYPE_FP32 dims: [ 0 ] }'), False)
    b.one("dims_minus_two", c, simple(inputs='{ name: "x" data_type: TYPE_FP32 dims: [ -2 ] }'), False)
    b.one("dims_empty_input", c, simple(inputs='{ name: "x" data_type: TYPE_FP32 dims: [ ] }'), False)
    b.one("dims_max_batch_negative", c, simple(mbs=-1), False)
    b.one("dims_many", c, simple(inputs='{ name: "x" data_type: TYPE_FP32 dims: [ 2, 3, 4, 5 ] }'), True)
    b.one("dims_two_inputs", c, simple(inputs='{ name: "a" data_type: TYPE_FP32 dims: [ 3 ] }, '
                                              '{ name: "b" data_type: TYPE_INT32 dims: [ 1 ] }'), True)
    b.one("dims_no_type", c, simple(inputs='{ name: "x" dims: [ 3 ] }'), False)
    b.one("dims_output_no_type", c, simple(outputs='{ name: "y" dims: [ 1 ] }'), False)
    b.one("dims_empty_name", c, simple(inputs='{ name: "" data_type: TYPE_FP32 dims: [ 3 ] }'), False)
    b.one("dims_duplicate_input", c, simple(inputs='{ name: "x" data_type: TYPE_FP32 dims: [ 3 ] }, '
                                                   '{ name: "x" data_type: TYPE_FP32 dims: [ 3 ] }'), True,
          "stricter: a request cannot address both")
    b.one("dims_duplicate_output", c, simple(outputs='{ name: "y" data_type: TYPE_FP32 dims: [ 1 ] }, '
                                                     '{ name: "y" data_type: TYPE_FP32 dims: [ 1 ] }'), True,
          "stricter: a response cannot carry both")
    b.one("dims_optional_input", c, simple(inputs='{ name: "x" data_type: TYPE_FP32 dims: [ 3 ] }, '
                                                  '{ name: "z" data_type: TYPE_FP32 dims: [ 1 ] optional: true }'),
          True)


def _reshape(b: _Builder) -> None:
    c = "reshape"
    b.one("reshape_in", c, simple(inputs='{ name: "x" data_type: TYPE_FP32 dims: [ 3 ] reshape { shape: [ 1, 3 ] } }'),
          True)
    b.one("reshape_out", c, simple(outputs='{ name: "y" data_type: TYPE_FP32 dims: [ 1, 1 ] reshape { shape: [ 1 ] } }'),  # noqa: E501
          True)
    b.one("reshape_count", c, simple(inputs='{ name: "x" data_type: TYPE_FP32 dims: [ 3 ] reshape { shape: [ 2, 2 ] } }'),  # noqa: E501
          False)
    b.one("reshape_scalar_batching", c,
          simple(inputs='{ name: "x" data_type: TYPE_FP32 dims: [ 1 ] reshape { shape: [ ] } }'), True)
    b.one("reshape_scalar_nobatch", c,
          simple(mbs=0, inputs='{ name: "x" data_type: TYPE_FP32 dims: [ 1 ] reshape { shape: [ ] } }'), False)
    b.one("reshape_variable", c,
          simple(inputs='{ name: "x" data_type: TYPE_FP32 dims: [ -1, 4 ] reshape { shape: [ -1, 2, 2 ] } }'), True)
    b.one("reshape_variable_bad", c,
          simple(inputs='{ name: "x" data_type: TYPE_FP32 dims: [ -1, 4 ] reshape { shape: [ 2, -1, 3 ] } }'), False)
    b.one("reshape_zero", c, simple(inputs='{ name: "x" data_type: TYPE_FP32 dims: [ 3 ] reshape { shape: [ 0, 3 ] } }'),  # noqa: E501
          False)


def _types(b: _Builder) -> None:
    for t in TYPES:
        short = t.removeprefix("TYPE_").lower()
        io = f'{{ name: "x" data_type: {t} dims: [ 2 ] }}'
        out = f'{{ name: "y" data_type: {t} dims: [ 2 ] }}'
        b.one(f"type_{short}", "datatypes", simple(inputs=io, outputs=out), True)
    b.one("type_invalid_name", "datatypes", simple(inputs='{ name: "x" data_type: TYPE_FLOAT dims: [ 1 ] }'), False,
          "a parse error")


def _versions(b: _Builder) -> None:
    c = "version_policy"
    b.one("policy_default", c, simple(), True, versions=(1, 2, 3))
    b.one("policy_all", c, simple("version_policy: { all { } }"), True, versions=(1, 2, 3))
    b.one("policy_latest2", c, simple("version_policy: { latest { num_versions: 2 } }"), True, versions=(1, 2, 3))
    b.one("policy_latest0", c, simple("version_policy: { latest { num_versions: 0 } }"), False, versions=(1, 2))
    b.one("policy_specific", c, simple("version_policy: { specific { versions: [ 1, 3 ] } }"), True, versions=(1, 2, 3))
    b.one("policy_specific_partly", c, simple("version_policy: { specific { versions: [ 1, 5 ] } }"), True,
          versions=(1, 2))
    b.one("policy_specific_absent", c, simple("version_policy: { specific { versions: [ 5 ] } }"), False,
          versions=(1, 2))
    b.one("policy_no_version_dir", c, simple(), False, versions=())


def _identity(b: _Builder) -> None:
    c = "identity"
    b.one("name_mismatch", c, simple().replace('name: "${self}"', 'name: "other"'), False)
    b.one("name_omitted", c, simple().replace('name: "${self}"\n', ""), True)
    b.one("backend_unknown", c, simple().replace('backend: "python"', 'backend: "nosuch"'), False)
    b.one("platform_mismatch", c, simple('platform: "onnxruntime_onnx"').replace('backend: "python"',
                                                                                'backend: "onnxruntime"'), False,
          "onnxruntime backend not installed in this server")
    b.one("default_filename_ok", c, simple('default_model_filename: "main.py"'), True, python=False,
          files={"1/main.py": MODEL_PY.encode()})
    b.one("parameters_plain", c, simple('parameters { key: "k" value { string_value: "v" } }'), True)


def _instances(b: _Builder) -> None:
    c = "instance_group"
    b.one("instances_two", c, simple(instance="instance_group [ { kind: KIND_CPU count: 2 } ]"), True)
    b.one("instances_groups", c, simple(instance="instance_group [ { kind: KIND_CPU count: 1 }, "
                                                 "{ kind: KIND_CPU count: 2 name: \"second\" } ]"), True)
    b.one("instances_none", c, simple(instance=""), True)
    b.one("instances_default_kind", c, simple(instance="instance_group [ { count: 1 } ]"), True)
    b.one("instances_model_kind", c, simple(instance="instance_group [ { kind: KIND_MODEL count: 1 } ]"), True)
    b.one("instances_count_zero", c, simple(instance="instance_group [ { kind: KIND_CPU count: 0 } ]"), True,
          "stricter: Triton silently runs 1")
    b.one("instances_count_negative", c, simple(instance="instance_group [ { kind: KIND_CPU count: -2 } ]"), True,
          "stricter: Triton silently runs 1")
    b.one("instances_cpu_gpus", c, simple(instance="instance_group [ { kind: KIND_CPU gpus: [ 0 ] } ]"), False)
    b.one("instances_gpu", c, simple(instance="instance_group [ { kind: KIND_GPU count: 1 } ]"), False,
          "no GPU on this host")


def _dynamic(b: _Builder) -> None:
    c = "dynamic_batching"
    b.one("dyn_plain", c, simple("dynamic_batching { }"), True)
    b.one("dyn_preferred", c, simple("dynamic_batching { preferred_batch_size: [ 2, 4 ] "
                                     "max_queue_delay_microseconds: 100 }"), True)
    b.one("dyn_preferred_above", c, simple("dynamic_batching { preferred_batch_size: [ 8 ] }"), False)
    b.one("dyn_preferred_zero", c, simple("dynamic_batching { preferred_batch_size: [ 0 ] }"), False)
    b.one("dyn_no_batching", c, simple("dynamic_batching { }", mbs=0), True, "stricter: nothing is ever batched")
    b.one("dyn_preserve", c, simple("dynamic_batching { preserve_ordering: true }"), True)
    b.one("dyn_priority", c, simple("dynamic_batching { priority_levels: 3 default_priority_level: 2 }"), True)
    b.one("dyn_priority_default_out", c, simple("dynamic_batching { priority_levels: 3 default_priority_level: 4 }"),
          False)
    b.one("dyn_queue_policy", c, simple("dynamic_batching { default_queue_policy { max_queue_size: 8 "
                                        "timeout_action: REJECT default_timeout_microseconds: 1000 } }"), True)
    b.one("dyn_prio_policy_ok", c, simple("dynamic_batching { priority_levels: 2 default_priority_level: 1 "
                                          "priority_queue_policy { key: 2 value { max_queue_size: 4 } } }"), True)
    b.one("dyn_prio_policy_key_above", c, simple("dynamic_batching { priority_levels: 2 default_priority_level: 1 "
                                                 "priority_queue_policy { key: 3 value { max_queue_size: 4 } } }"),
          False)
    b.one("dyn_prio_policy_key_zero", c, simple("dynamic_batching { priority_levels: 2 default_priority_level: 1 "
                                                "priority_queue_policy { key: 0 value { max_queue_size: 4 } } }"),
          False)
    b.one("dyn_prio_policy_no_levels", c, simple("dynamic_batching { priority_queue_policy { key: 1 "
                                                 "value { max_queue_size: 4 } } }"), False)


_SEQ_IN = '{ name: "x" data_type: TYPE_FP32 dims: [ 3 ] }'


def _control(name: str, kind: str, body: str) -> str:
    return f'{{ name: "{name}" control [ {{ kind: {kind} {body} }} ] }}'


def _seq(controls: str, strategy: str = "") -> str:
    return f"sequence_batching {{ {strategy} control_input [ {controls} ] }}"


def _sequence(b: _Builder) -> None:
    c = "sequence_batching"
    start = _control("START", "CONTROL_SEQUENCE_START", "int32_false_true: [ 0, 1 ]")
    ready = _control("READY", "CONTROL_SEQUENCE_READY", "int32_false_true: [ 0, 1 ]")
    end = _control("END", "CONTROL_SEQUENCE_END", "bool_false_true: [ false, true ]")
    corr = _control("CORRID", "CONTROL_SEQUENCE_CORRID", "data_type: TYPE_UINT64")
    b.one("seq_plain", c, simple("sequence_batching { }"), True)
    b.one("seq_direct", c, simple(_seq(f"{start}, {ready}", "direct { }")), True)
    b.one("seq_oldest", c, simple(_seq(f"{start}, {ready}, {end}, {corr}",
                                       "oldest { max_candidate_sequences: 4 preferred_batch_size: [ 2 ] }")), True)
    b.one("seq_oldest_pref_above", c, simple(_seq(start, "oldest { max_candidate_sequences: 4 "
                                                         "preferred_batch_size: [ 8 ] }")), False)
    b.one("seq_fp32_control", c, simple(_seq(_control("S", "CONTROL_SEQUENCE_START", "fp32_false_true: [ 0, 1 ]"))),
          True)
    b.one("seq_no_bool_values", c, simple(_seq(_control("S", "CONTROL_SEQUENCE_START", ""))), False)
    b.one("seq_three_values", c, simple(_seq(_control("S", "CONTROL_SEQUENCE_START", "int32_false_true: [ 0, 1, 2 ]"))),
          False)
    b.one("seq_one_value", c, simple(_seq(_control("S", "CONTROL_SEQUENCE_READY", "int32_false_true: [ 1 ]"))), False)
    b.one("seq_two_kinds_values", c, simple(_seq(_control("S", "CONTROL_SEQUENCE_END", "int32_false_true: [ 0, 1 ] "
                                                                                      "fp32_false_true: [ 0, 1 ]"))),
          False)
    b.one("seq_corrid_no_type", c, simple(_seq(_control("C", "CONTROL_SEQUENCE_CORRID", ""))), False)
    b.one("seq_corrid_fp32", c, simple(_seq(_control("C", "CONTROL_SEQUENCE_CORRID", "data_type: TYPE_FP32"))), False)
    b.one("seq_corrid_string", c, simple(_seq(_control("C", "CONTROL_SEQUENCE_CORRID", "data_type: TYPE_STRING"))),
          True)
    b.one("seq_start_twice", c, simple(_seq(f"{start}, " + _control("S2", "CONTROL_SEQUENCE_START",
                                                                     "int32_false_true: [ 0, 1 ]"))), False)
    b.one("seq_no_name", c, simple(_seq(_control("", "CONTROL_SEQUENCE_START", "int32_false_true: [ 0, 1 ]"))), False)
    b.one("seq_start_with_type", c, simple(_seq(_control("S", "CONTROL_SEQUENCE_START",
                                                         "int32_false_true: [ 0, 1 ] data_type: TYPE_INT32"))), None)
    b.one("seq_idle", c, simple("sequence_batching { max_sequence_idle_microseconds: 5000000 }"), True)
    b.one("seq_nobatch", c, simple(_seq(start), mbs=0), True)


def _batch_input(b: _Builder) -> None:
    c = "batch_input"
    b.one("bi_ok", c, simple("batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: \"n\" data_type: TYPE_FP32 "
                             "source_input: \"x\" } ]"), True)
    b.one("bi_unknown_source", c, simple("batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: \"n\" "
                                         "data_type: TYPE_FP32 source_input: \"nosuch\" } ]"), False)
    b.one("bi_no_source", c, simple("batch_input [ { kind: BATCH_ACCUMULATED_ELEMENT_COUNT target_name: \"n\" "
                                    "data_type: TYPE_FP32 } ]"), False)
    b.one("bi_two_sources", c, simple("batch_input [ { kind: BATCH_ITEM_SHAPE target_name: \"n\" data_type: TYPE_FP32 "
                                      "source_input: [ \"x\", \"x\" ] } ]"), None)
    b.one("bi_max_shape", c, simple("batch_input [ { kind: BATCH_MAX_ELEMENT_COUNT_AS_SHAPE target_name: \"n\" "
                                    "data_type: TYPE_INT32 source_input: \"x\" } ]"), True)
    b.one("bi_no_target", c, simple("batch_input [ { kind: BATCH_ELEMENT_COUNT data_type: TYPE_FP32 "
                                    "source_input: \"x\" } ]"), None)


def _warm(inputs: str, batch: int = 1, name: str = "w", count: str = "") -> str:
    return f'model_warmup [ {{ name: "{name}" batch_size: {batch} {count} inputs [ {inputs} ] }} ]'


def _wi(name: str, dtype: str, dims: str, source: str) -> str:
    return f'{{ key: "{name}" value {{ data_type: {dtype} dims: [ {dims} ] {source} }} }}'


def _warmup(b: _Builder) -> None:
    c = "model_warmup"
    z = "zero_data: true"
    fp32_file = {"warmup/x.bin": b"\0" * 12}
    b.one("warm_zero", c, simple(_warm(_wi("x", "TYPE_FP32", "3", z))), True)
    b.one("warm_random_batch", c, simple(_warm(_wi("x", "TYPE_FP32", "3", "random_data: true"), batch=4)), True)
    b.one("warm_file", c, simple(_warm(_wi("x", "TYPE_FP32", "3", 'input_data_file: "x.bin"'))), True,
          files=fp32_file)
    b.one("warm_file_missing", c, simple(_warm(_wi("x", "TYPE_FP32", "3", 'input_data_file: "x.bin"'))), False)
    b.one("warm_file_short", c, simple(_warm(_wi("x", "TYPE_FP32", "3", 'input_data_file: "x.bin"'))), False,
          files={"warmup/x.bin": b"\0" * 4})
    b.one("warm_file_at_root", c, simple(_warm(_wi("x", "TYPE_FP32", "3", 'input_data_file: "x.bin"'))), False,
          files={"x.bin": b"\0" * 12})
    b.one("warm_wrong_type", c, simple(_warm(_wi("x", "TYPE_INT32", "3", z))), False)
    b.one("warm_wrong_dims", c, simple(_warm(_wi("x", "TYPE_FP32", "4", z))), False)
    b.one("warm_batch_in_dims", c, simple(_warm(_wi("x", "TYPE_FP32", "1, 3", z))), False)
    b.one("warm_unknown_input", c, simple(_warm(_wi("z", "TYPE_FP32", "3", z))), False)
    b.one("warm_extra_input", c, simple(_warm(_wi("x", "TYPE_FP32", "3", z) + ", " + _wi("z", "TYPE_FP32", "3", z))),
          False)
    b.one("warm_missing_input", c, simple(_warm(_wi("a", "TYPE_FP32", "3", z)),
                                          inputs='{ name: "a" data_type: TYPE_FP32 dims: [ 3 ] }, '
                                                 '{ name: "b" data_type: TYPE_FP32 dims: [ 3 ] }'), False)
    b.one("warm_batch_above", c, simple(_warm(_wi("x", "TYPE_FP32", "3", z), batch=8)), False)
    b.one("warm_batch_zero", c, simple(_warm(_wi("x", "TYPE_FP32", "3", z), batch=0)), True)
    b.one("warm_no_source", c, simple(_warm(_wi("x", "TYPE_FP32", "3", ""))), False)
    b.one("warm_variable_dims", c, simple(_warm(_wi("x", "TYPE_FP32", "-1", z)),
                                          inputs='{ name: "x" data_type: TYPE_FP32 dims: [ -1 ] }'), False)
    b.one("warm_variable_given", c, simple(_warm(_wi("x", "TYPE_FP32", "5", z)),
                                           inputs='{ name: "x" data_type: TYPE_FP32 dims: [ -1 ] }'), True)
    b.one("warm_nobatch", c, simple(_warm(_wi("x", "TYPE_FP32", "3, 3", z)), mbs=0,
                                    inputs='{ name: "x" data_type: TYPE_FP32 dims: [ 3, 3 ] }'), True)
    b.one("warm_nobatch_batch2", c, simple(_warm(_wi("x", "TYPE_FP32", "3, 3", z), batch=2), mbs=0,
                                           inputs='{ name: "x" data_type: TYPE_FP32 dims: [ 3, 3 ] }'), False)
    b.one("warm_string", c, simple(_warm(_wi("x", "TYPE_STRING", "2", z)),
                                   inputs='{ name: "x" data_type: TYPE_STRING dims: [ 2 ] }'), True)
    b.one("warm_count", c, simple(_warm(_wi("x", "TYPE_FP32", "3", z), count="count: 3")), True)
    b.one("warm_no_name", c, simple(_warm(_wi("x", "TYPE_FP32", "3", z), name="")), None)
    b.one("warm_reshape", c, simple(_warm(_wi("x", "TYPE_FP32", "3", z)),
                                    inputs='{ name: "x" data_type: TYPE_FP32 dims: [ 3 ] reshape { shape: [ 1, 3 ] } }'),  # noqa: E501
          True)
    b.one("warm_optional_left_out", c, simple(_warm(_wi("x", "TYPE_FP32", "3", z)),
                                              inputs='{ name: "x" data_type: TYPE_FP32 dims: [ 3 ] }, '
                                                     '{ name: "o" data_type: TYPE_FP32 dims: [ 1 ] optional: true }'),
          True)
    b.one("warm_two_samples", c, simple('model_warmup [ { name: "a" batch_size: 1 inputs '
                                        + _wi("x", "TYPE_FP32", "3", z)
                                        + ' }, { name: "b" batch_size: 2 inputs '
                                        + _wi("x", "TYPE_FP64", "3", z) + " } ]"), False)


def _files(b: _Builder) -> None:
    b.one("label_ok", "label_filename", simple(outputs='{ name: "y" data_type: TYPE_FP32 dims: [ 1 ] '
                                                       'label_filename: "labels.txt" }'), True,
          files={"labels.txt": b"neg\npos\n"})
    b.one("label_missing", "label_filename", simple(outputs='{ name: "y" data_type: TYPE_FP32 dims: [ 1 ] '
                                                            'label_filename: "labels.txt" }'), False)
    b.one("label_in_version", "label_filename", simple(outputs='{ name: "y" data_type: TYPE_FP32 dims: [ 1 ] '
                                                               'label_filename: "labels.txt" }'), False,
          files={"1/labels.txt": b"neg\npos\n"})
    env = 'parameters { key: "EXECUTION_ENV_PATH" value { string_value: "$$$$TRITON_MODEL_DIRECTORY/env.tar.gz" } }'
    b.one("env_missing", "execution_env", simple(env), False)
    b.one("env_missing_abs", "execution_env", simple(env.replace("$$$$TRITON_MODEL_DIRECTORY", "/nonexistent")),
          False, "outside the model: validation warns only (host-dependent)")


def _pipe(a_in: str = "x", a_out: str = "y", b_in: str = "y", b_out: str = "z", *, mbs: int = 4,
          in_type: str = "TYPE_FP32", in_dims: str = "3", out_type: str = "TYPE_FP32", out_dims: str = "1", extra_steps: str = "",  # noqa: E501
          version: int = -1, inputs: str | None = None, outputs: str | None = None, b_step: bool = True) -> str:
    inputs = inputs or f'{{ name: "x" data_type: {in_type} dims: [ {in_dims} ] }}'
    outputs = outputs or f'{{ name: "z" data_type: {out_type} dims: [ {out_dims} ] }}'
    steps = (f'{{ model_name: "${{a}}" model_version: {version} input_map {{ key: "x" value: "{a_in}" }} '
             f'output_map {{ key: "y" value: "{a_out}" }} }}')
    if b_step:
        steps += (f', {{ model_name: "${{b}}" model_version: -1 input_map {{ key: "y" value: "{b_in}" }} '
                  f'output_map {{ key: "z" value: "{b_out}" }} }}')
    steps += extra_steps
    return (f'name: "${{self}}"\nplatform: "ensemble"\nmax_batch_size: {mbs}\ninput [ {inputs} ]\n'
            f"output [ {outputs} ]\nensemble_scheduling {{ step [ {steps} ] }}\n")


def _ab(a_mbs: int = 4, b_mbs: int = 4, **kw: object) -> dict[str, Model]:
    """Steps a (x FP32 [3] -> y FP32 [1]) and b (y FP32 [1] -> z FP32 [1])."""
    a = Model(simple(mbs=a_mbs), **kw)  # type: ignore[arg-type]
    b = Model(simple(mbs=b_mbs, inputs='{ name: "y" data_type: TYPE_FP32 dims: [ 1 ] }',
                     outputs='{ name: "z" data_type: TYPE_FP32 dims: [ 1 ] }'))
    return {"a": a, "b": b}


def _ensembles(b: _Builder) -> None:
    c = "ensemble"
    ens = {"python": False}

    def add(name: str, pipe: str, loads: bool | None, note: str = "", **ab: object) -> None:
        b.many(name, c, {"pipe": Model(pipe, **ens), **_ab(**ab)}, "pipe", loads, note)  # type: ignore[arg-type]

    add("ens_ok", _pipe(), True)
    add("ens_one_step", _pipe(a_out="z", b_step=False, out_type="TYPE_FP32"), True)
    add("ens_bad_input_key", _pipe().replace('input_map { key: "x"', 'input_map { key: "nosuch"', 1), False)
    add("ens_bad_output_key", _pipe().replace('output_map { key: "y"', 'output_map { key: "nosuch"', 1), False)
    add("ens_unmapped_step_input", _pipe().replace('input_map { key: "y" value: "y" } ', "", 1), False)
    add("ens_type_mismatch", _pipe(in_type="TYPE_INT32"), False)
    add("ens_shape_mismatch", _pipe(in_dims="4"), False)
    add("ens_out_type_mismatch", _pipe(out_type="TYPE_FP64"), False)
    add("ens_wildcard_shape", _pipe(in_dims="-1"), True)
    add("ens_missing_step", _pipe().replace('"${b}"', '"nosuchmodel"'), False)
    add("ens_step_version_absent", _pipe(version=2), False)
    add("ens_step_version_served", _pipe(version=2), True, versions=(1, 2))
    add("ens_step_version_unserved", _pipe(version=1), False, versions=(1, 2))
    add("ens_mbs_above_step", _pipe(mbs=8), False)
    add("ens_mbs_below_step", _pipe(mbs=2), True)
    add("ens_nobatch_step", _pipe(mbs=0, in_dims="-1, 3", out_dims="-1, 1"), None, a_mbs=0, b_mbs=0)
    add("ens_unused_input", _pipe(inputs='{ name: "x" data_type: TYPE_FP32 dims: [ 3 ] }, '
                                         '{ name: "unused" data_type: TYPE_FP32 dims: [ 1 ] }'), False)
    add("ens_output_unproduced", _pipe(outputs='{ name: "z" data_type: TYPE_FP32 dims: [ 1 ] }, '
                                               '{ name: "w" data_type: TYPE_FP32 dims: [ 1 ] }'), False)
    add("ens_output_twice", _pipe(extra_steps=', { model_name: "${b}" model_version: -1 input_map { key: "y" '
                                              'value: "y" } output_map { key: "z" value: "z" } }'), False)
    add("ens_dangling_tensor", _pipe(b_in="nowhere"), False)
    add("ens_cycle", _pipe(a_in="x", extra_steps=', { model_name: "${a}" model_version: -1 input_map { key: "x" '
                                                  'value: "loop" } output_map { key: "y" value: "loop" } }'), False)
    add("ens_self_step", _pipe().replace('"${b}"', '"${pipe}"'), False)
    add("ens_step_output_unused", _pipe(), True)
    add("ens_with_instance_group", _pipe() + "instance_group [ { kind: KIND_CPU } ]\n", False)
    add("ens_no_scheduling", _pipe().split("ensemble_scheduling")[0], False)
    add("ens_invalid_member", _pipe(), False, b_mbs=-1)
    add("ens_fanout", _pipe(extra_steps=', { model_name: "${b}" model_version: -1 input_map { key: "y" value: "y" } '
                                        'output_map { key: "z" value: "z2" } }',
                            outputs='{ name: "z" data_type: TYPE_FP32 dims: [ 1 ] }, '
                                    '{ name: "z2" data_type: TYPE_FP32 dims: [ 1 ] }'), True)
    add("ens_reshape_output", _pipe(outputs='{ name: "z" data_type: TYPE_FP32 dims: [ 1, 1 ] reshape { shape: [ 1 ] } }'),  # noqa: E501
        True)


def _parse(b: _Builder) -> None:
    c = "parse"
    b.one("parse_unknown_field", c, simple("max_batchsize: 4"), False)
    b.one("parse_missing_brace", c, simple().replace("] }", "]", 1), False)
    b.one("parse_json", c, json.dumps({"name": "x"}), False)
    b.one("parse_string_dims", c, simple(inputs='{ name: "x" data_type: TYPE_FP32 dims: [ "3" ] }'), False)


_GROUPS = (_dims, _reshape, _types, _versions, _identity, _instances, _dynamic, _sequence, _batch_input, _warmup,
           _files, _ensembles, _parse)


def all_cases() -> list[Case]:
    b = _Builder()
    for group in _GROUPS:
        group(b)
    names = [c.name for c in b.cases]
    assert len(names) == len(set(names)), "duplicate case names"
    return b.cases


def categories(cases: list[Case]) -> Iterator[str]:
    yield from dict.fromkeys(c.category for c in cases)
