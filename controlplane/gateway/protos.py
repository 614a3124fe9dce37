"""Triton's generated protobuf modules (`grpc_service_pb2`, `model_config_pb2`) without tritonclient.grpc.

`from tritonclient.grpc import service_pb2` first runs tritonclient/grpc/__init__.py, which imports grpc,
numpy and ml_dtypes: seconds of start-up and tens of MB the gateway does not need (it speaks HTTP/2
itself). The two generated files are loaded here by path and registered under their usual names, so a
process that imports tritonclient.grpc later finds them there and nothing is defined twice; the one
import line of service_pb2 that names the package is given the loaded model_config_pb2 instead.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

PACKAGE = "tritonclient.grpc"
_IMPORT = "from tritonclient.grpc import model_config_pb2 as model__config__pb2"


def _directory() -> Path:
    spec = importlib.util.find_spec("tritonclient")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("tritonclient is not installed")
    return Path(list(spec.submodule_search_locations)[0]) / "grpc"


def _load(name: str, source_edit: dict[str, Any] | None = None) -> ModuleType:
    qualified = f"{PACKAGE}.{name}"
    if qualified in sys.modules:
        return sys.modules[qualified]
    path = _directory() / f"{name}.py"
    module = ModuleType(qualified)
    module.__file__ = str(path)
    text = path.read_text()
    if source_edit:
        if _IMPORT not in text:
            raise ImportError(f"{path}: its import of model_config_pb2 is not the one expected")
        text = text.replace(_IMPORT, "")
        module.__dict__.update(source_edit)
    sys.modules[qualified] = module
    try:
        exec(compile(text, str(path), "exec"), module.__dict__)  # noqa: S102 - tritonclient's generated code
    except BaseException:
        del sys.modules[qualified]
        raise
    return module


def model_config_pb2() -> Any:
    return _load("model_config_pb2")


def service_pb2() -> Any:
    return _load("service_pb2", {"model__config__pb2": model_config_pb2()})
