"""The field-by-field checks behind `controlplane.validation.modelconfig.validate_model_dir`.

Triton rejects a bad config.pbtxt only when it loads it, and then often with nothing but "failed to
poll from model repository" (the reason stays in the server log). These checks repeat, offline and
without a server, the rules of Triton's own `ValidateModelConfig` / `ValidateIOShape` (core
`model_config_utils.cc`) that a user can break, each as a one-line finding naming the field. They are
pure functions of a parsed `ModelConfig`: no file system, no I/O, so the daemon and the CLI share them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple

from controlplane.settings.modelparams import MODEL_PARAMETERS, PARAMETER_PREFIX, STAMPED_PARAMETERS, model_parameter
from controlplane.triton.model_config import model_config_pb2 as mc
from controlplane.validation.ensembles import check_ensemble_graph
from controlplane.vocab import ERROR, WARNING

KNOWN_BACKENDS = frozenset(
    {"python", "onnxruntime", "tensorrt", "pytorch", "tensorflow", "openvino", "fil", "dali",
     "identity", "repeat", "square", "vllm", "tensorrtllm"}
)
KNOWN_PLATFORMS = frozenset(
    {"ensemble", "tensorrt_plan", "onnxruntime_onnx", "pytorch_libtorch", "tensorflow_graphdef",
     "tensorflow_savedmodel"}
)
ENSEMBLE = "ensemble"
# Triton checks the platform only for these backends (GetBackendTypeFromPlatform); others take any.
_PLATFORMS_OF_BACKEND = {
    "tensorrt": {"tensorrt_plan"},
    "onnxruntime": {"onnxruntime_onnx"},
    "pytorch": {"pytorch_libtorch"},
    "tensorflow": {"tensorflow_graphdef", "tensorflow_savedmodel"},
}
WILDCARD = -1


class Finding(NamedTuple):
    """One problem in config.pbtxt: `field` is a path such as `input[0].dims`."""

    field: str
    message: str
    severity: str = ERROR


def check_config(
    config: mc.ModelConfig, explicit: Any, model_name: str, inferred: tuple[str, str] | None = None
) -> list[Finding]:
    """Every rule a parsed config breaks. `explicit` is the same text parsed into a schema twin
    that records which scalars were written (proto3 cannot tell `count: 0` from no count), or None.
    `inferred` is (backend, evidence) when Triton would fill in a missing backend from the files.
    """
    findings: list[Finding] = []
    findings += _check_identity(config, model_name, inferred)
    if config.max_batch_size < 0:
        findings.append(Finding("max_batch_size", f"is {config.max_batch_size}: must be >= 0"))
    findings += _check_io(config)
    findings += _check_batching(config)
    findings += _check_instance_groups(config, explicit)
    findings += _check_sequence_controls(config)
    findings += _check_batch_inputs(config)
    findings += [Finding(f.field, f.message, f.severity) for f in check_ensemble_graph(config, model_name)]
    findings += _check_tritonctl_parameters(config)
    return findings


def _check_tritonctl_parameters(config: mc.ModelConfig) -> Iterator[Finding]:
    """The model's own `tritonctl.*` parameters (its bake, `tritonctl.bake_s` ..., docs/bake.md; its declared
    footprint): Triton ignores them, so a bad one would quietly bake or budget the model on the daemon's
    defaults, and one out of range (controlplane/base/bounds.py) must never reach a bake; a key tritonctl does
    not read is a typo, warned of."""
    for name in config.parameters:
        if not name.startswith(PARAMETER_PREFIX):
            continue
        key = name[len(PARAMETER_PREFIX):]
        if key in STAMPED_PARAMETERS:
            continue
        field = f'parameters["{name}"]'
        if key not in MODEL_PARAMETERS:
            yield Finding(field, f"tritonctl reads no such parameter (it reads "
                                 f"{', '.join(PARAMETER_PREFIX + k for k in MODEL_PARAMETERS)}): ignored", WARNING)
            continue
        try:
            model_parameter({name: config.parameters[name].string_value}, key)
        except ValueError as exc:
            yield Finding(field, str(exc).partition(": ")[2])


def _check_identity(config: mc.ModelConfig, model_name: str, inferred: tuple[str, str] | None) -> Iterator[Finding]:
    if config.name and config.name != model_name:
        yield Finding("name", f'"{config.name}" does not match the directory name "{model_name}"')
    backend, platform = config.backend, config.platform
    if not backend and not platform and inferred:
        yield Finding("backend", f'not set: Triton infers "{inferred[0]}" from {inferred[1]}; write it out', WARNING)
    elif not backend and not platform:
        yield Finding("backend", 'neither backend nor platform is set, and no model file to infer one from '
                      '(e.g. backend: "python" with 1/model.py)')
    if backend and backend not in KNOWN_BACKENDS:
        yield Finding("backend", f'unknown backend "{backend}" (known: {_names(KNOWN_BACKENDS)})')
    if platform and platform not in KNOWN_PLATFORMS:
        yield Finding("platform", f'unknown platform "{platform}" (known: {_names(KNOWN_PLATFORMS)})')
    if platform == ENSEMBLE:
        if backend:
            yield Finding("backend", f'is "{backend}": an ensemble must leave backend empty')
        if not config.HasField("ensemble_scheduling"):
            yield Finding("ensemble_scheduling", 'missing: required by platform "ensemble"')
        elif not config.ensemble_scheduling.step:
            yield Finding("ensemble_scheduling.step", "empty: an ensemble needs at least one step")
        for i, step in enumerate(config.ensemble_scheduling.step):
            if not step.model_name:
                yield Finding(f"ensemble_scheduling.step[{i}].model_name", "empty")
        if config.instance_group:
            yield Finding("instance_group", "must not be set for an ensemble")
    elif config.HasField("ensemble_scheduling"):
        yield Finding("ensemble_scheduling", f'is set but platform is "{platform}", not "ensemble"')
    allowed = _PLATFORMS_OF_BACKEND.get(backend)
    if allowed and platform and platform not in allowed:
        yield Finding("platform", f'"{platform}" does not go with backend "{backend}"')
    filename = config.default_model_filename
    if filename and ("/" in filename or filename in (".", "..")):
        yield Finding("default_model_filename", f'"{filename}" must be a plain file name')


def _check_io(config: mc.ModelConfig) -> Iterator[Finding]:
    for kind, tensors in (("input", config.input), ("output", config.output)):
        seen: dict[str, int] = {}
        for i, io in enumerate(tensors):
            where = f"{kind}[{i}]"
            if not io.name:
                yield Finding(f"{where}.name", f"empty: every {kind} needs a name")
            elif io.name in seen:
                first = f"{kind}[{seen[io.name]}]"
                yield Finding(f"{where}.name", f'duplicate {kind} name "{io.name}" (also {first})')
            else:
                seen[io.name] = i
            if io.data_type == mc.TYPE_INVALID:
                yield Finding(f"{where}.data_type", "missing (TYPE_INVALID): set e.g. TYPE_FP32")
            yield from _check_shape(io, where, config.max_batch_size)
            if io.is_shape_tensor and config.platform != "tensorrt_plan":
                yield Finding(f"{where}.is_shape_tensor", "shape tensors need platform tensorrt_plan")
            layout = io.format if kind == "input" else 0
            if layout in (mc.ModelInput.FORMAT_NHWC, mc.ModelInput.FORMAT_NCHW) and len(io.dims) != 3:
                yield Finding(f"{where}.dims", f"format {mc.ModelInput.Format.Name(layout)} needs 3 dims")


def _bad_dims(dims: Sequence[int]) -> list[int]:
    return [d for d in dims if d < 1 and d != WILDCARD]


def _check_shape(io: Any, where: str, max_batch_size: int) -> Iterator[Finding]:
    dims = list(io.dims)
    if not dims:
        yield Finding(f"{where}.dims", "empty: give the shape, e.g. [ 3 ], or [ -1 ] for any length")
    elif _bad_dims(dims):
        yield Finding(f"{where}.dims", f"{_show(dims)}: each dimension must be >= 1, or -1 for any size")
    if not io.HasField("reshape"):
        return
    shape = list(io.reshape.shape)
    if not shape and max_batch_size == 0:
        yield Finding(f"{where}.reshape", "empty reshape needs max_batch_size > 0 (no scalar tensors)")
        return
    if _bad_dims(shape):
        yield Finding(f"{where}.reshape", f"{_show(shape)}: each dimension must be >= 1, or -1")
        return
    if dims and not _bad_dims(dims) and not _same_elements(dims, shape):
        yield Finding(f"{where}.reshape", f"{_show(shape)} holds other element counts than {_show(dims)}")


def _same_elements(dims: list[int], shape: list[int]) -> bool:
    """Triton's rule: equal element counts; with -1, equal counts between the variable dimensions."""
    if not shape:
        return _count(dims) == 1
    if WILDCARD not in dims and WILDCARD not in shape:
        return _count(dims) == _count(shape)
    return _segments(dims) == _segments(shape)


def _count(dims: Iterable[int]) -> int:
    return math.prod(dims)


def _segments(dims: list[int]) -> list[int]:
    counts, current = [], 1
    for d in dims:
        if d == WILDCARD:
            counts.append(current)
            current = 1
        else:
            current *= d
    counts.append(current)
    return counts


def _check_batching(config: mc.ModelConfig) -> Iterator[Finding]:
    mbs = config.max_batch_size
    if config.HasField("dynamic_batching"):
        db = config.dynamic_batching
        if mbs == 0:
            yield Finding("dynamic_batching", "is set but max_batch_size is 0: nothing can be batched")
        yield from _check_preferred("dynamic_batching", db.preferred_batch_size, mbs)
        if db.priority_levels and not 1 <= db.default_priority_level <= db.priority_levels:
            yield Finding(
                "dynamic_batching.default_priority_level",
                f"is {db.default_priority_level}: must be in [1, {db.priority_levels}]",
            )
        for level in sorted(db.priority_queue_policy):
            if not db.priority_levels:
                yield Finding("dynamic_batching.priority_queue_policy", f"key {level}: priority_levels is 0, "
                              "so Triton ignores every priority queue policy", WARNING)
            elif not 1 <= level <= db.priority_levels:
                yield Finding("dynamic_batching.priority_queue_policy",
                              f"key {level} is not a priority level: must be in [1, {db.priority_levels}]")
    if config.HasField("sequence_batching") and config.sequence_batching.HasField("oldest"):
        yield from _check_preferred(
            "sequence_batching.oldest", config.sequence_batching.oldest.preferred_batch_size, mbs
        )


def _check_preferred(where: str, sizes: Sequence[int], mbs: int) -> Iterator[Finding]:
    for i, size in enumerate(sizes):
        field = f"{where}.preferred_batch_size[{i}]"
        if size < 1:
            yield Finding(field, f"is {size}: must be >= 1")
        elif size > mbs:
            yield Finding(field, f"is {size}: above max_batch_size {mbs}")


def _check_instance_groups(config: mc.ModelConfig, explicit: Any) -> Iterator[Finding]:
    for i, group in enumerate(config.instance_group):
        where = f"instance_group[{i}]"
        written = explicit is not None and explicit.instance_group[i].HasField("count")
        if group.count < 0 or (group.count == 0 and written):
            yield Finding(f"{where}.count", f"is {group.count}: must be >= 1 (Triton would silently run 1)")
        if group.kind == mc.ModelInstanceGroup.KIND_CPU and group.gpus:
            yield Finding(f"{where}.gpus", "KIND_CPU must not list GPUs")
        if group.kind == mc.ModelInstanceGroup.KIND_GPU:
            yield Finding(f"{where}.kind", "KIND_GPU needs a GPU on the serving host", WARNING)


_BOOL_CONTROLS = frozenset({mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_START,
                            mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_READY,
                            mc.ModelSequenceBatching.Control.CONTROL_SEQUENCE_END})
_CORRID_TYPES = frozenset({mc.TYPE_UINT64, mc.TYPE_INT64, mc.TYPE_UINT32, mc.TYPE_INT32, mc.TYPE_STRING})


def _check_sequence_controls(config: mc.ModelConfig) -> Iterator[Finding]:
    """What Triton's sequence batcher requires of each control (core GetBooleanSequenceControlProperties /
    GetTypedSequenceControlProperties): START, READY and END give exactly one of int32_false_true,
    fp32_false_true, bool_false_true with 2 values; CORRID gives a data_type of an integer or string
    type; no kind twice."""
    if not config.HasField("sequence_batching"):
        return
    Control = mc.ModelSequenceBatching.Control
    seen: dict[int, str] = {}
    for i, control_input in enumerate(config.sequence_batching.control_input):
        where = f"sequence_batching.control_input[{i}]"
        if not control_input.name:
            yield Finding(f"{where}.name", "empty: every control input needs a name")
        for j, control in enumerate(control_input.control):
            field = f"{where}.control[{j}]"
            kind = Control.Kind.Name(control.kind)
            if control.kind in seen:
                yield Finding(f"{field}.kind", f"{kind} is given twice (also {seen[control.kind]})")
            seen.setdefault(control.kind, field)
            pairs = [(n, list(v)) for n, v in (("int32_false_true", control.int32_false_true),
                                                ("fp32_false_true", control.fp32_false_true),
                                                ("bool_false_true", control.bool_false_true)) if v]
            if control.kind in _BOOL_CONTROLS:
                if len(pairs) != 1:
                    yield Finding(field, f"{kind} needs exactly one of int32_false_true, fp32_false_true, "
                                  f"bool_false_true (has {len(pairs)})")
                elif len(pairs[0][1]) != 2:
                    yield Finding(f"{field}.{pairs[0][0]}", f"has {len(pairs[0][1])} values: needs 2 [false, true]")
            elif control.kind == Control.CONTROL_SEQUENCE_CORRID:
                if pairs:
                    yield Finding(f"{field}.{pairs[0][0]}", f"{kind} takes only data_type")
                if control.data_type not in _CORRID_TYPES:
                    yield Finding(f"{field}.data_type", f"{kind} needs data_type TYPE_UINT64, TYPE_INT64, "
                                  "TYPE_UINT32, TYPE_INT32 or TYPE_STRING")


# Measured on tritonserver 2.51, every kind against every data type: only these two load ("batch input
# data type must be TYPE_INT32 or TYPE_FP32").
_BATCH_INPUT_TYPES = (mc.TYPE_INT32, mc.TYPE_FP32)


def _check_batch_inputs(config: mc.ModelConfig) -> Iterator[Finding]:
    """batch_input entries: a target name, TYPE_INT32 or TYPE_FP32, and exactly one source input that
    is an input of the model."""
    inputs = {io.name for io in config.input}
    for i, batch_input in enumerate(config.batch_input):
        where = f"batch_input[{i}]"
        if not batch_input.target_name:
            yield Finding(f"{where}.target_name", "empty: the model cannot ask for this batch input by name", WARNING)
        if batch_input.data_type not in _BATCH_INPUT_TYPES:
            yield Finding(f"{where}.data_type", f"is {mc.DataType.Name(batch_input.data_type)}: a batch input must be "
                          "TYPE_INT32 or TYPE_FP32")
        if len(batch_input.source_input) != 1:
            yield Finding(f"{where}.source_input", f"has {len(batch_input.source_input)} names: "
                          f"{mc.BatchInput.Kind.Name(batch_input.kind)} takes exactly 1")
        for source in batch_input.source_input:
            if source not in inputs:
                yield Finding(f"{where}.source_input", f'"{source}" is not an input of the model '
                              f'(inputs: {", ".join(sorted(inputs)) or "none"})')


def check_version_policy(config: mc.ModelConfig, available: Sequence[int]) -> list[Finding]:
    """Policies that serve nothing (errors: Triton refuses the load) or name absent versions."""
    policy = config.version_policy
    which = policy.WhichOneof("policy_choice") if config.HasField("version_policy") else None
    if which == "latest" and policy.latest.num_versions < 1:
        return [Finding("version_policy.latest.num_versions", "is 0: serves no version; use >= 1")]
    if which != "specific":
        return []
    field = "version_policy.specific.versions"
    wanted = sorted(set(policy.specific.versions))
    if not wanted:
        return [Finding(field, "empty: serves no version")]
    if not available:
        return []  # "no version directory" already says it
    absent = [v for v in wanted if v not in available]
    present = ", ".join(map(str, sorted(available)))
    if len(absent) == len(wanted):
        return [Finding(field, f"names only absent versions {_show(absent)} (present: {present}): "
                        "Triton refuses to load")]
    if absent:
        served = ", ".join(str(v) for v in wanted if v in available)
        return [Finding(field, f"versions {_show(absent)} absent (present: {present}); "
                        f"Triton serves only {served}", WARNING)]
    return []


def _names(values: Iterable[str]) -> str:
    return ", ".join(sorted(values))


def _show(values: Iterable[int]) -> str:
    return "[ " + ", ".join(str(v) for v in values) + " ]"
