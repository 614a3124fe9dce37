"""Checks of a model's files beyond config.pbtxt that the daemon would otherwise meet only in Triton:
every `.py` file compiles, and `smoke.json` parses with inputs and outputs that the config declares
with the same data types.

Called from `modelconfig.validate_model_dir`, the one function that both `tritonctl validate` and the
daemon's capture run before anything reaches Triton. Problems name source-relative paths
(`linear/1/model.py:12: invalid syntax`), never the content store's.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from controlplane.documents.validation import Problem
from controlplane.errors import ModelConfigError, SnapshotEnvironmentError, is_environment_error
from controlplane.snapshot.layout import SMOKE_FILE
from controlplane.vocab import ERROR

MAX_PY_BYTES = 8 << 20  # larger .py files are left to Triton


def _python_files(root: str) -> list[str]:
    found = []
    for directory, dirs, files in os.walk(root, onerror=_host_failed):  # does not follow directory symlinks
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                found.append(os.path.relpath(os.path.join(directory, name), root))
    return found


def _host_failed(exc: OSError) -> None:
    """A file the host failed to read (out of descriptors, an I/O error) is not judged: the capture is
    tried again (issue 58)."""
    if is_environment_error(exc):
        raise SnapshotEnvironmentError(f"cannot read {exc.filename or 'a file'} ({exc.strerror}); trying again") \
            from exc


def compile_problems(root: str, label: str) -> list[tuple[str, str]]:
    """(file:line, message) for each .py file under `root` that is not valid Python."""
    out = []
    for rel in _python_files(root):
        path = os.path.join(root, rel)
        try:
            if os.path.islink(path) or os.path.getsize(path) > MAX_PY_BYTES:
                continue
            with open(path, "rb") as handle:
                source = handle.read()
        except OSError as exc:
            _host_failed(exc)
            continue  # unreadable files are reported by the tree walk
        shown = f"{label}/{rel}"
        try:
            compile(source, shown, "exec", dont_inherit=True)
        except SyntaxError as exc:
            out.append((f"{shown}:{exc.lineno or 0}", exc.msg or "invalid syntax"))
        except ValueError as exc:  # null bytes
            out.append((shown, str(exc)))
    return out


def _tensors(config: dict[str, Any] | None, key: str) -> dict[str, str]:
    return {t.get("name", ""): str(t.get("data_type", "")).removeprefix("TYPE_") for t in (config or {}).get(key, [])}


def smoke_problems(root: str, label: str, config: dict[str, Any] | None) -> list[tuple[str, str]]:
    """(file, message) for a smoke.json that does not parse or asks for tensors the config lacks."""
    path = Path(root) / SMOKE_FILE
    if not path.is_file():
        return []
    from controlplane.validation.smokefile import load_smoke_file

    shown = f"{label}/{SMOKE_FILE}"
    try:
        requests = load_smoke_file(path, label=shown, build=False)  # every check, no arrays: no numpy
    except ModelConfigError as exc:
        return [(shown, str(exc).removeprefix(f"{shown}: "))]
    if config is None:
        return []
    inputs, outputs = _tensors(config, "input"), _tensors(config, "output")
    out = []
    for i, request in enumerate(requests):
        for tensor in request.inputs:
            expected = inputs.get(tensor.name)
            if expected is None:
                out.append((shown, f"requests[{i}].inputs: '{tensor.name}' is not an input of the config "
                                   f"({', '.join(inputs) or 'none'})"))
            elif expected != ("BYTES" if tensor.datatype == "BYTES" else tensor.datatype) and not (
                    expected == "STRING" and tensor.datatype == "BYTES"):
                out.append((shown, f"requests[{i}].inputs: '{tensor.name}' is {tensor.datatype}, the config "
                                   f"says TYPE_{expected}"))
        for output in request.outputs:
            if output.name not in outputs:
                out.append((shown, f"requests[{i}].outputs: '{output.name}' is not an output of the config "
                                   f"({', '.join(outputs) or 'none'})"))
    return out


def content_problems(root: str, label: str, config: dict[str, Any] | None) -> list[Problem]:
    return [Problem(where, "", message, ERROR) for where, message in
            [*compile_problems(root, label), *smoke_problems(root, label, config)]]
