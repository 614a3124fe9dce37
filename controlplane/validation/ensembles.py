"""Ensemble checks, within one config and across the repository.

Triton validates an ensemble only when it loads it, against the configs of the models its steps
name (core `ensemble_utils.cc` ValidateEnsembleConfig, `model_config_utils.cc`
ValidateEnsembleSchedulingConfig), and most of its refusals reach the client as nothing but "failed
to poll from model repository". These checks repeat those rules offline:

- `check_ensemble_graph(config)`: what the ensemble's own config.pbtxt decides (every ensemble input
  used, every ensemble output produced exactly once, every step input produced by someone, no
  cycle, no step naming the ensemble itself);
- `check_ensemble_members(config, lookup)`: what needs the step models' configs (each step model
  present and serving the requested version, every map key an input/output of the step, every
  required step input mapped, data types and shapes consistent along the graph, the ensemble's
  max_batch_size not above a batching step's).

`lookup(name)` returns a `StepModel` (parsed config + the versions it serves) or None when the model is
not there; a finding about a missing or unserved member carries `environment=True`: whether it is
the content's fault depends on where it is deployed (the daemon records it as an EnvironmentFault).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from google.protobuf import json_format

from controlplane.triton.model_config import model_config_pb2 as mc
from controlplane.vocab import ERROR, WARNING

ENSEMBLE = "ensemble"
LATEST = -1


class EnsembleFinding(NamedTuple):
    """One problem of an ensemble's config: `field` is a path such as `ensemble_scheduling.step[0]`."""

    field: str
    message: str
    severity: str = ERROR
    environment: bool = False  # a step model missing or not serving: not a fault of the content


@dataclass(frozen=True)
class StepModel:
    """A step model as the ensemble sees it: its (complete) config and the versions it serves."""

    config: mc.ModelConfig | None  # None: present, but its config.pbtxt does not parse (reported there)
    served_versions: Sequence[int]
    # its config is completed by its model at load and no completed config is recorded yet: `config` is
    # only what its files declare (controlplane/validation/completions.py)
    pending: bool = False


Lookup = Callable[[str], "StepModel | None"]


def as_config(config: mc.ModelConfig | Mapping[str, Any]) -> mc.ModelConfig:
    """A parsed ModelConfig from either the message or its JSON dict (as the registry stores it)."""
    if isinstance(config, mc.ModelConfig):
        return config
    return json_format.ParseDict(dict(config), mc.ModelConfig(), ignore_unknown_fields=True)


def is_ensemble(config: mc.ModelConfig) -> bool:
    return config.platform == ENSEMBLE


def step_field(i: int) -> str:
    return f"ensemble_scheduling.step[{i}]"


def check_ensemble_graph(config: mc.ModelConfig, model_name: str) -> list[EnsembleFinding]:
    """The rules an ensemble's own config decides, without its step models."""
    if not is_ensemble(config) or not config.HasField("ensemble_scheduling"):
        return []
    return list(_graph(config, model_name))


def _graph(config: mc.ModelConfig, model_name: str) -> Iterator[EnsembleFinding]:
    steps = config.ensemble_scheduling.step
    inputs = [io.name for io in config.input]
    outputs = [io.name for io in config.output]
    producers: dict[str, list[int]] = {}
    consumers: dict[str, list[int]] = {}
    for i, step in enumerate(steps):
        if step.model_name == (config.name or model_name):
            yield EnsembleFinding(f"{step_field(i)}.model_name", f'"{step.model_name}" is the ensemble itself')
        for tensor in step.output_map.values():
            producers.setdefault(tensor, []).append(i)
        for tensor in step.input_map.values():
            consumers.setdefault(tensor, []).append(i)
    for tensor, who in sorted(producers.items()):
        if len(who) > 1:
            where = ", ".join(f"step[{i}]" for i in who)
            yield EnsembleFinding("ensemble_scheduling", f'ensemble tensor "{tensor}" is produced by more than '
                                  f"one step ({where}): an output map may name it only once")
        if tensor in inputs:
            yield EnsembleFinding("ensemble_scheduling", f'ensemble tensor "{tensor}" is an ensemble input and '
                                  f"also produced by step[{who[0]}]")
    for name in inputs:
        if name not in consumers:
            yield EnsembleFinding("input", f'ensemble input "{name}" is not used by any step\'s input_map')
    for name in outputs:
        if name not in producers:
            yield EnsembleFinding("output", f'ensemble output "{name}" is not produced by any step\'s output_map')
    for tensor, who in sorted(consumers.items()):
        if tensor not in producers and tensor not in inputs:
            yield EnsembleFinding(f"{step_field(who[0])}.input_map", f'ensemble tensor "{tensor}" is neither an '
                                  "ensemble input nor produced by any step")
    cycle = _cycle(steps)
    if cycle:
        path = " -> ".join(f"step[{i}]" for i in cycle)
        yield EnsembleFinding("ensemble_scheduling", f"steps form a cycle ({path}): a step needs its own output")


def _cycle(steps: Sequence[Any]) -> list[int]:
    """One cycle among the steps (step j follows step i when j reads a tensor i writes), or []."""
    writers: dict[str, list[int]] = {}
    for i, step in enumerate(steps):
        for tensor in step.output_map.values():
            writers.setdefault(tensor, []).append(i)
    after = {i: sorted({w for t in step.input_map.values() for w in writers.get(t, [])})
             for i, step in enumerate(steps)}
    state: dict[int, int] = {}
    stack: list[int] = []

    def visit(i: int) -> list[int]:
        state[i] = 1
        stack.append(i)
        for j in after[i]:
            if state.get(j) == 1:
                return stack[stack.index(j):] + [j]
            if j not in state and (found := visit(j)):
                return found
        stack.pop()
        state[i] = 2
        return []

    for i in after:
        if i not in state and (found := visit(i)):
            return found
    return []


# --- across the repository -----------------------------------------------------------------------


class _Node(NamedTuple):
    owner: str
    data_type: int
    dims: tuple[int, ...]
    full_dims: tuple[int, ...]


def _node(owner: str, batching: bool, data_type: int, dims: Sequence[int]) -> _Node:
    dims = tuple(dims)
    return _Node(owner, data_type, dims, ((-1,) + dims) if batching else dims)


def _same_dims(a: Sequence[int], b: Sequence[int]) -> bool:
    """Triton's CompareDimsWithWildcard: same rank, each dimension equal or -1 on either side."""
    return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b, strict=True))


def _type(data_type: int) -> str:
    return mc.DataType.Name(data_type) if data_type in mc.DataType.values() else str(data_type)


def _shape(dims: Sequence[int]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def _consistent(tensor: str, a: _Node, b: _Node) -> str | None:
    if a.data_type != b.data_type:
        return (f'ensemble tensor "{tensor}": data type {_type(a.data_type)} from {a.owner} but '
                f"{_type(b.data_type)} from {b.owner}")
    if not _same_dims(a.dims, b.dims) and not _same_dims(a.full_dims, b.full_dims):
        return (f'ensemble tensor "{tensor}": shape {_shape(a.full_dims)} from {a.owner} but '
                f"{_shape(b.full_dims)} from {b.owner}")
    return None


def check_ensemble_members(config: mc.ModelConfig, model_name: str, lookup: Lookup) -> list[EnsembleFinding]:
    """The rules that need the step models: `lookup(name)` gives each one's config and served versions."""
    if not is_ensemble(config) or not config.HasField("ensemble_scheduling"):
        return []
    return list(_members(config, config.name or model_name, lookup))


def _members(config: mc.ModelConfig, name: str, lookup: Lookup) -> Iterator[EnsembleFinding]:
    batching = config.max_batch_size > 0
    owner = f'ensemble "{name}"'
    tensors: dict[str, _Node] = {}
    for io in list(config.input) + list(config.output):
        dims = io.reshape.shape if io.HasField("reshape") else io.dims
        tensors.setdefault(io.name, _node(owner, batching, io.data_type, dims))
    for i, step in enumerate(config.ensemble_scheduling.step):
        where = step_field(i)
        if not step.model_name or step.model_name == name:
            continue  # check_config / the graph check report these
        member = lookup(step.model_name)
        if member is None:
            yield EnsembleFinding(f"{where}.model_name", f'step model "{step.model_name}" is not in the '
                                  "repository", environment=True)
            continue
        if member.config is None:
            continue
        served = sorted(member.served_versions)
        if not served:
            yield EnsembleFinding(f"{where}.model_name", f'step model "{step.model_name}" serves no version',
                                  environment=True)
            continue
        if step.model_version != LATEST and step.model_version not in served:
            yield EnsembleFinding(f"{where}.model_version", f'{step.model_version}: step model '
                                  f'"{step.model_name}" serves only version(s) {", ".join(map(str, served))}',
                                  environment=True)
            continue
        if member.pending:
            yield EnsembleFinding(f"{where}.model_name", f'step model "{step.model_name}" completes its config at '
                                  "load (auto_complete_config): its inputs and outputs are checked against this "
                                  "ensemble once it has loaded", WARNING)
            continue
        yield from _step(config, where, step, member.config, tensors)


def _step(config: mc.ModelConfig, where: str, step: Any, member: mc.ModelConfig,
          tensors: dict[str, _Node]) -> Iterator[EnsembleFinding]:
    step_name = step.model_name
    mbs = member.max_batch_size
    if mbs != 0 and mbs < config.max_batch_size:
        yield EnsembleFinding("max_batch_size", f'{config.max_batch_size} is above step model "{step_name}"\'s '
                              f"max_batch_size {mbs}")
    batching = mbs > 0
    yield from _map(f"{where}.input_map", "input", step_name, step.input_map, member.input, batching, tensors)
    for io in member.input:
        if io.name not in step.input_map and not io.optional:
            yield EnsembleFinding(f"{where}.input_map", f'input "{io.name}" of "{step_name}" is not mapped '
                                  "to any ensemble tensor")
    yield from _map(f"{where}.output_map", "output", step_name, step.output_map, member.output, batching, tensors)


def _map(where: str, kind: str, step_name: str, mapping: Any, member_tensors: Any, batching: bool,
         tensors: dict[str, _Node]) -> Iterator[EnsembleFinding]:
    """One direction of a step's map (`kind` input or output): each key must be a tensor of that kind
    of the step model, and the ensemble tensor it names must agree with it."""
    known = {io.name: io for io in member_tensors}
    for key, tensor in sorted(mapping.items()):
        io = known.get(key)
        if io is None:
            yield EnsembleFinding(where, f'key "{key}" is not an {kind} of "{step_name}" '
                                  f'({kind}s: {", ".join(sorted(known)) or "none"})')
            continue
        yield from _merge(tensors, tensor, _node(f'model "{step_name}"', batching, io.data_type, io.dims), where)


def _merge(tensors: dict[str, _Node], tensor: str, node: _Node, where: str) -> Iterator[EnsembleFinding]:
    known = tensors.get(tensor)
    if known is None:
        tensors[tensor] = node
        return
    problem = _consistent(tensor, known, node)
    if problem:
        yield EnsembleFinding(where, problem)
