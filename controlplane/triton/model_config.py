"""Triton's model configuration schema (`model_config_pb2`) without the rest of tritonclient.grpc.

`from tritonclient.grpc import model_config_pb2` first runs tritonclient/grpc/__init__.py, which imports
grpc, numpy and ml_dtypes: about 0.3-0.4 s that `tritonctl validate` of one model does not need. This
module loads the generated file on its own and registers it under its usual name, so a later import of
tritonclient.grpc (the daemon's Triton client) finds it there and nothing is defined twice.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

MODULE = "tritonclient.grpc.model_config_pb2"


def _load() -> ModuleType:
    if MODULE in sys.modules:
        return sys.modules[MODULE]
    package = importlib.util.find_spec("tritonclient")  # finds the package without importing tritonclient.grpc
    if package is None or not package.submodule_search_locations:
        raise ImportError("tritonclient is not installed")
    path = Path(list(package.submodule_search_locations)[0]) / "grpc" / "model_config_pb2.py"
    spec = importlib.util.spec_from_file_location(MODULE, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[MODULE]
        raise
    return module


if TYPE_CHECKING:  # type checkers see the real module (.importlinter names this type-only edge)
    from tritonclient.grpc import model_config_pb2
else:
    model_config_pb2 = _load()
