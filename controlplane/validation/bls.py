"""The models a python model calls by name inside Triton (BLS: `pb_utils.InferenceRequest(model_name=...)`).

Why: a BLS call goes from the model's stub to Triton's core by model name, past the gateway, so it reaches
the name Triton has loaded. Through the gateway every digest is loaded under a private name
(controlplane/deploy/aliases.py); a model another model calls by BLS must also answer to its own name
there, so the deploy engine serves such a callee in place under its own name (controlplane/deploy/routed.py).
Read from the model's source with `ast` (nothing is imported or run): the string literal given as
`model_name`, by keyword or as the first argument, of every `InferenceRequest(...)` call. A name computed at
run time cannot be seen there: the calling model may declare its callees in its config, `parameters { key:
"tritonctl.bls_callees" value { string_value: "add_sub,tokenizer" } }`; without that declaration every model
may be its callee, and every model is then served under its own name (docs/gateway.md).
"""

from __future__ import annotations

import ast
import os
from pathlib import Path
from typing import Any

MAX_SOURCE_BYTES = 4 << 20  # a python file larger than this is not read for calls


def _literal(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


DYNAMIC = "*"  # a call whose model name is computed at run time: any model may be called


def calls_in(source: str) -> set[str]:
    """The model names `source` passes to `InferenceRequest` as literals; `DYNAMIC` among them when a call's
    name is computed at run time (the model may call any model)."""
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
        given = next((k.value for k in node.keywords if k.arg == "model_name"), None)
        if given is None and node.args:
            given = node.args[0]
        if given is not None:
            found.add(_literal(given) or DYNAMIC)
    return found


CALLEES_PARAMETER = "tritonctl.bls_callees"


def declared_callees(config: dict[str, Any] | None) -> set[str]:
    """The models a config declares it calls by BLS (`tritonctl.bls_callees`, comma-separated)."""
    value = ((config or {}).get("parameters") or {}).get(CALLEES_PARAMETER)
    text = value.get("string_value", "") if isinstance(value, dict) else value if isinstance(value, str) else ""
    return {name.strip() for name in text.split(",") if name.strip()}


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
