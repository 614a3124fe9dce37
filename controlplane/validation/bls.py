"""The models a python model calls by name inside Triton (BLS: `pb_utils.InferenceRequest(model_name=...)`).

Why: a BLS call goes from the model's stub to Triton's core by model name, past the gateway, so it reaches
the name Triton has loaded. Through the gateway every digest is loaded under a private name
(controlplane/deploy/aliases.py); a model another model calls by BLS must also answer to its own name
there, so the deploy engine serves such a callee in place under its own name (controlplane/deploy/routed.py).
Read from the model's source with `ast` (nothing is imported or run): the string literal given as
`model_name`, by keyword or as the first argument, of every `InferenceRequest(...)` call. A name computed at
run time cannot be seen here; docs/gateway.md says so.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

MAX_SOURCE_BYTES = 4 << 20  # a python file larger than this is not read for calls


def _literal(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def calls_in(source: str) -> set[str]:
    """The model names `source` passes to `InferenceRequest` as literals."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return set()
    found: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        if name != "InferenceRequest":
            continue
        literal = next((_literal(k.value) for k in node.keywords if k.arg == "model_name"), None)
        if literal is None and node.args:
            literal = _literal(node.args[0])
        if literal:
            found.add(literal)
    return found


def bls_callees(tree: Path) -> set[str]:
    """The models the python files of a model's tree call by BLS (its own name excluded by the caller)."""
    found: set[str] = set()
    for dirpath, dirnames, filenames in os.walk(tree):
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        for filename in filenames:
            if not filename.endswith(".py"):
                continue
            path = Path(dirpath) / filename
            try:
                if path.stat().st_size > MAX_SOURCE_BYTES:
                    continue
                found |= calls_in(path.read_text(errors="replace"))
            except OSError:
                continue
    return found
