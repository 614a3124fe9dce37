"""model_warmup checks: the warm-up requests Triton runs while it loads a model.

Triton builds each `model_warmup` sample into a real inference request during the load (core
`backend_model_instance.cc` GenerateWarmupData, then the ordinary request checks); a sample that
names an unknown input, leaves a required one out, has the wrong data type or shape, a batch above
max_batch_size, no data source, or an input_data_file missing from the model's `warmup/` directory
fails the whole load, and the client hears only "failed to load". These are the same rules, offline.
`file_size(rel)` tells the size of a file inside the model directory (None when it is not there),
so the module itself never touches the file system.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import NamedTuple

from controlplane.triton.model_config import model_config_pb2 as mc
from controlplane.vocab import ERROR, WARNING

WARMUP_DIR = "warmup"
_SIZES = {mc.TYPE_BOOL: 1, mc.TYPE_UINT8: 1, mc.TYPE_UINT16: 2, mc.TYPE_UINT32: 4, mc.TYPE_UINT64: 8,
          mc.TYPE_INT8: 1, mc.TYPE_INT16: 2, mc.TYPE_INT32: 4, mc.TYPE_INT64: 8, mc.TYPE_FP16: 2,
          mc.TYPE_FP32: 4, mc.TYPE_FP64: 8, mc.TYPE_BF16: 2}


class WarmupFinding(NamedTuple):
    field: str
    message: str
    severity: str = ERROR




def _type(data_type: int) -> str:
    return mc.DataType.Name(data_type) if data_type in mc.DataType.values() else str(data_type)


def _show(dims: object) -> str:
    return "[ " + ", ".join(str(d) for d in dims) + " ]"  # type: ignore[attr-defined]


def check_warmup(config: mc.ModelConfig, file_size: Callable[[str], int | None]) -> list[WarmupFinding]:
    """Every rule the config's model_warmup samples break, given the model directory's files."""
    return list(_check(config, file_size))


def _check(config: mc.ModelConfig, file_size: Callable[[str], int | None]) -> Iterator[WarmupFinding]:
    inputs = {io.name: io for io in config.input}
    mbs = config.max_batch_size
    for i, sample in enumerate(config.model_warmup):
        where = f"model_warmup[{i}]"
        if not sample.name:
            yield WarmupFinding(f"{where}.name", "empty: Triton's errors about this sample will not name it",
                                WARNING)
        if sample.batch_size == 0:
            continue  # Triton skips a sample of batch 0
        if mbs == 0 and sample.batch_size != 1:
            yield WarmupFinding(f"{where}.batch_size", f"is {sample.batch_size}: a model with max_batch_size 0 "
                                "takes only batch 1")
        elif mbs > 0 and sample.batch_size > mbs:
            yield WarmupFinding(f"{where}.batch_size", f"is {sample.batch_size}: above max_batch_size {mbs}")
        for name, data in sorted(sample.inputs.items()):
            field = f'{where}.inputs["{name}"]'
            io = inputs.get(name)
            if io is None:  # measured: Triton 2.51 sends it and the request does not fail
                yield WarmupFinding(field, f'"{name}" is not an input of the model '
                                    f'(inputs: {", ".join(sorted(inputs)) or "none"}): it warms nothing', WARNING)
                continue
            yield from _check_input(field, name, data, io, sample.batch_size, mbs, file_size)
        for name, io in inputs.items():
            if name not in sample.inputs and not io.optional:
                yield WarmupFinding(f"{where}.inputs", f'input "{name}" is missing: a warmup sample must give '
                                    "every required input")


def _check_input(field: str, name: str, data: mc.ModelWarmup.Input, io: mc.ModelInput, batch: int, mbs: int,
                 file_size: Callable[[str], int | None]) -> Iterator[WarmupFinding]:
    if data.data_type != io.data_type:
        yield WarmupFinding(f"{field}.data_type", f"{_type(data.data_type)}: the model's input is "
                            f"{_type(io.data_type)}")
    dims = list(data.dims)
    if any(d < 0 for d in dims):
        yield WarmupFinding(f"{field}.dims", f"{_show(dims)}: a warmup sample needs concrete dimensions, no -1")
    elif not _matches(dims, list(io.dims)):
        yield WarmupFinding(f"{field}.dims", f"{_show(dims)} does not fit the input's dims {_show(io.dims)}"
                            + (" (without the batch dimension: batch_size gives it)" if mbs > 0 else ""))
    source = data.WhichOneof("input_data_type")
    if source is None:
        yield WarmupFinding(field, "no data source: set zero_data, random_data or input_data_file")
    elif source == "input_data_file":
        rel = f"{WARMUP_DIR}/{data.input_data_file}"
        size = file_size(rel) if data.input_data_file else None
        if size is None:
            yield WarmupFinding(f"{field}.input_data_file", f'"{data.input_data_file}": no such file {rel} in '
                                "the model directory")
        elif data.data_type in _SIZES and not any(d < 0 for d in dims):
            need = math.prod(dims) * _SIZES[data.data_type]
            if size < need:
                yield WarmupFinding(f"{field}.input_data_file", f"{rel} has {size} bytes; the sample needs {need}")


def _matches(dims: list[int], want: list[int]) -> bool:
    return len(dims) == len(want) and all(w == -1 or d == w for d, w in zip(dims, want, strict=True))
