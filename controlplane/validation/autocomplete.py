"""Python models whose config Triton completes at load, and what can be said of them before their code runs.

A default tritonserver (auto-complete on) calls a python model's `TritonPythonModel.auto_complete_config`
at every load, with the config.pbtxt as written (none at all: only its name and backend), and serves what
the method returns: it may add inputs, outputs, `max_batch_size` and dynamic batching (Triton's QA models
and python_backend's `examples/auto_complete` ship without a config.pbtxt). Offline, the method is not
run: its inputs and outputs are Triton's to complete, and checked after the load, where tritonctl reads
and records the completed config (controlplane/store/completed.py). What the model's source shows is
checked here, from its syntax tree only (nothing is imported or run):

- whether `TritonPythonModel` defines the method (in its class body; a class with bases, or one
  imported from elsewhere, may have it: it is taken as defining it);
- the calls the method always makes with literal arguments (top-level statements of its body, and a
  `for` over a literal list whose body calls `add_input(x)` / `add_output(x)`), which Triton's
  `pb_utils.ModelConfig` checks against the config as written: a tensor of the same name with another
  data type or dims, or a `max_batch_size` below the config's, makes it raise and the load fail (measured
  on tritonserver 2.51); calls under a condition are left to the load;
- a statement of its body that always raises: a `raise`, or a name bound nowhere (NameError).

Measured on 2.51 too: a python model with no config.pbtxt and no such method loads with no inputs and no
outputs, so every request with a tensor fails (`expected 0 inputs but got 1`): refused here as a
stricter rule, and so is a config.pbtxt that declares neither inputs nor outputs without the method.
"""

from __future__ import annotations

import ast
import builtins
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from controlplane.triton.model_config import model_config_pb2 as mc
from controlplane.vocab import ERROR, WARNING

METHOD = "auto_complete_config"
CLASS = "TritonPythonModel"
# The field of the finding that marks a content as completed by its model at load: `completes_at_load`.
FIELD = METHOD
CHECKED_AFTER_LOAD = "completed by the model at load: inputs/outputs checked after the load"
_INPUT_KEYS = frozenset({"name", "data_type", "dims", "optional"})
_OUTPUT_KEYS = frozenset({"name", "data_type", "dims"})
_UNKNOWN = object()


@dataclass(frozen=True)
class ModelCode:
    """What a model.py's syntax tree says about `TritonPythonModel.auto_complete_config`.

    `defines`: True when the class body defines it, False when the module has the class, without it
    and without a base to inherit it from; None when the source cannot tell (a base class, the class
    imported, a syntax error). `inputs`, `outputs`, `max_batch_size`: what the method always sets with
    literal arguments. `raises`: why its body always raises, or ""."""

    defines: bool | None
    inputs: tuple[dict[str, Any], ...] = ()
    outputs: tuple[dict[str, Any], ...] = ()
    max_batch_size: int | None = None
    raises: str = ""
    bad_calls: tuple[str, ...] = field(default=())  # literal add_input/add_output calls pb_utils refuses

    @property
    def may_complete(self) -> bool:
        return self.defines is not False


class Finding(NamedTuple):
    """A problem of the completion: `file` is the model.py (relative to the model), None for config.pbtxt."""

    file: str | None
    field: str
    message: str
    severity: str = ERROR


def completes_at_load(problems: Iterable[Any]) -> bool:
    """Whether a content's problems (Problem objects or their dicts) say its model completes its config."""
    for p in problems:
        name = p.get("field") if isinstance(p, Mapping) else getattr(p, "field", None)
        if name == FIELD:
            return True
    return False


# --- reading the source ----------------------------------------------------------------------------


def read_code(source: str) -> ModelCode:
    """The `ModelCode` of one model.py's text."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return ModelCode(None)  # content.py reports the syntax error
    cls = None
    imported = False
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == CLASS:
            cls = node
        elif isinstance(node, ast.ImportFrom) and any(a.name in (CLASS, "*") for a in node.names):
            imported = True
    if cls is None:
        return ModelCode(None if imported else False)
    method = None
    for item in cls.body:
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == METHOD:
            method = item
        elif isinstance(item, (ast.Assign, ast.AnnAssign)) and METHOD in _stored_names(item):
            return ModelCode(True)  # bound some other way: nothing literal to read
    if method is None:
        inherits = any(not (isinstance(b, ast.Name) and b.id == "object") for b in cls.bases)
        return ModelCode(None if inherits else False)
    return _read_method(method, _bound_names(tree))


def _stored_names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _bound_names(tree: ast.Module) -> set[str] | None:
    """Every name the module binds anywhere (assignments, imports, definitions, parameters); None when a
    star import or a `global` trick makes that unknowable."""
    names: set[str] = set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    return None
                names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        elif isinstance(node, (ast.MatchAs, ast.MatchStar)) and node.name:
            names.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            names.add(node.rest)
    return names


def _literal(node: ast.AST, env: Mapping[str, Any]) -> Any:
    if isinstance(node, ast.Name):
        return env.get(node.id, _UNKNOWN)
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _UNKNOWN


def _call_on(node: ast.AST, param: str) -> tuple[str, list[ast.expr]] | None:
    """(method, args) of a statement `param.method(args)`."""
    if not isinstance(node, ast.Expr) or not isinstance(node.value, ast.Call):
        return None
    func = node.value.func
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == param:
        return func.attr, list(node.value.args)
    return None


class _Calls:
    """The literal calls one method body always makes."""

    def __init__(self) -> None:
        self.inputs: list[dict[str, Any]] = []
        self.outputs: list[dict[str, Any]] = []
        self.max_batch_size: int | None = None
        self.bad: list[str] = []

    def add(self, method: str, value: Any) -> None:
        if method == "set_max_batch_size":
            if isinstance(value, int) and not isinstance(value, bool):
                self.max_batch_size = value
            return
        if method not in ("add_input", "add_output") or not isinstance(value, dict):
            return
        kind = "input" if method == "add_input" else "output"
        allowed = _INPUT_KEYS if kind == "input" else _OUTPUT_KEYS
        name = value.get("name")
        extra = sorted(str(k) for k in value if k not in allowed)
        missing = [k for k in ("name", "data_type", "dims") if k not in value]
        data_type = value.get("data_type")
        if extra:
            self.bad.append(f'{method} of {kind} "{name}" has {", ".join(extra)}: only '
                            f'{", ".join(sorted(allowed))} are taken')
        elif missing:
            self.bad.append(f'{method} of {kind} "{name}" lacks {", ".join(missing)}')
        elif not isinstance(data_type, str) or data_type not in mc.DataType.keys() or data_type == "TYPE_INVALID":
            self.bad.append(f'{method} of {kind} "{name}" has data_type {data_type!r}: not a Triton data type '
                            "(e.g. TYPE_FP32)")
        else:
            (self.inputs if kind == "input" else self.outputs).append(value)


def _read_method(method: ast.FunctionDef | ast.AsyncFunctionDef, bound: set[str] | None) -> ModelCode:
    params = [a.arg for a in method.args.posonlyargs + method.args.args]
    classmethod_ = any(isinstance(d, ast.Name) and d.id == "classmethod" for d in method.decorator_list)
    param = params[1 if classmethod_ else 0] if len(params) > (1 if classmethod_ else 0) else None
    local = _stored_names(method) | set(params) | {n.arg for n in ast.walk(method) if isinstance(n, ast.arg)}
    env: dict[str, Any] = {}
    calls = _Calls()
    raises = "" if _returns(method) else "it has no return statement: it returns None, not the ModelConfig given"
    for stmt in method.body:
        if isinstance(stmt, ast.Return):
            if stmt.value is None or isinstance(stmt.value, ast.Constant):
                raises = raises or f"`{_short(stmt)}` returns no ModelConfig"
            break
        if isinstance(stmt, ast.Raise):
            raises = f"`{_short(stmt)}` always raises"
            break
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Name) and bound is not None \
                and stmt.value.id not in bound and stmt.value.id not in local:
            raises = f"name '{stmt.value.id}' is not defined (NameError)"
            break
        if isinstance(stmt, ast.Assign):
            targets = [t.id for t in stmt.targets if isinstance(t, ast.Name)]
            value = _literal(stmt.value, env)
            for name in _stored_names(stmt):
                env.pop(name, None)
            if len(targets) == len(stmt.targets) and value is not _UNKNOWN:
                env.update({name: value for name in targets})
            continue
        if param is None:
            continue
        call = _call_on(stmt, param)
        if call is not None and len(call[1]) == 1:
            calls.add(call[0], _literal(call[1][0], env))
        elif isinstance(stmt, ast.For) and isinstance(stmt.target, ast.Name) and not stmt.orelse:
            items = _literal(stmt.iter, env)
            if isinstance(items, (list, tuple)):
                for inner in stmt.body:
                    loop_call = _call_on(inner, param)
                    if loop_call and len(loop_call[1]) == 1 and isinstance(loop_call[1][0], ast.Name) \
                            and loop_call[1][0].id == stmt.target.id:
                        for item in items:
                            calls.add(loop_call[0], item)
            for name in _stored_names(stmt):
                env.pop(name, None)
        else:
            for name in _stored_names(stmt):
                env.pop(name, None)
    return ModelCode(True, tuple(calls.inputs), tuple(calls.outputs), calls.max_batch_size, raises, tuple(calls.bad))


def _returns(method: ast.AST) -> bool:
    """Whether the method has a return statement of its own (not one of a function nested in it)."""
    stack = list(ast.iter_child_nodes(method))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Return):
            return True
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            stack.extend(ast.iter_child_nodes(node))
    return False


def _short(node: ast.AST) -> str:
    text = " ".join(ast.unparse(node).split())
    return text if len(text) <= 60 else text[:57] + "..."


# --- the findings ------------------------------------------------------------------------------------


def check_completion(config: mc.ModelConfig | None, codes: Mapping[str, ModelCode]) -> list[Finding]:
    """The findings of a python model whose served versions' model.py files (`codes`, by path relative to
    the model) are read; `config` is its config.pbtxt, None when it has none."""
    return list(_findings(config, codes))


def _findings(config: mc.ModelConfig | None, codes: Mapping[str, ModelCode]) -> Iterator[Finding]:
    completing = [rel for rel, code in codes.items() if code.may_complete]
    without = [rel for rel, code in codes.items() if not code.may_complete]
    if not completing:
        if config is None and without:
            yield Finding(None, "config.pbtxt", f"missing, and {without[0]} defines no {METHOD}: Triton loads the "
                          "model with no inputs and no outputs, so every request with a tensor fails")
        elif config is not None and without and not config.input and not config.output:
            yield Finding(None, "input", f"none, and no output: {without[0]} defines no {METHOD} to add them: "
                          "Triton loads the model with no inputs and no outputs, so every request with a tensor fails")
        return
    rel = completing[0]
    unsure = "" if codes[rel].defines else f"; {rel} does not define it: TritonPythonModel may inherit it"
    if config is None:
        why = "no config.pbtxt"
    elif not config.input and not config.output:
        why = "config.pbtxt declares no input or output"
    else:
        why = "it may add to config.pbtxt's inputs, outputs and max_batch_size"
    yield Finding(rel, FIELD, f"{CHECKED_AFTER_LOAD} ({why}{unsure})", WARNING)
    for rel_path, code in codes.items():
        if code.raises:
            yield Finding(rel_path, FIELD, f"{code.raises}: Triton refuses the load")
        for bad in code.bad_calls:
            yield Finding(rel_path, FIELD, f"{bad}: Triton refuses the load")
        if config is not None:
            yield from _conflicts(config, rel_path, code)


def _conflicts(config: mc.ModelConfig, rel: str, code: ModelCode) -> Iterator[Finding]:
    """What pb_utils.ModelConfig raises for (measured on 2.51): a tensor the config declares with another
    data type or dims than the method adds, a max_batch_size above the one the method sets."""
    for kind, declared, added in (("input", config.input, code.inputs), ("output", config.output, code.outputs)):
        by_name = {io.name: (i, io) for i, io in enumerate(declared)}
        for tensor in added:
            name = str(tensor["name"])
            if name not in by_name:
                continue
            i, io = by_name[name]
            written = mc.DataType.Name(io.data_type)
            if io.data_type != mc.TYPE_INVALID and written != tensor["data_type"]:
                yield Finding(None, f"{kind}[{i}].data_type", f'{written}, but {rel}\'s {METHOD} adds "{name}" '
                              f"as {tensor['data_type']}: Triton refuses the load")
            dims = _dims(tensor["dims"])
            if list(io.dims) and dims is not None and list(io.dims) != dims:
                yield Finding(None, f"{kind}[{i}].dims", f'{_show(io.dims)}, but {rel}\'s {METHOD} adds "{name}" '
                              f"with dims {_show(dims)}: Triton refuses the load")
    if code.max_batch_size is not None and config.max_batch_size > code.max_batch_size:
        yield Finding(None, "max_batch_size", f"{config.max_batch_size}, above the {code.max_batch_size} that "
                      f"{rel}'s {METHOD} sets: Triton refuses the load")


def _dims(value: Any) -> list[int] | None:
    if isinstance(value, (list, tuple)) and all(isinstance(d, int) and not isinstance(d, bool) for d in value):
        return [int(d) for d in value]
    return None


def _show(dims: Iterable[int]) -> str:
    return "[ " + ", ".join(str(d) for d in dims) + " ]"
