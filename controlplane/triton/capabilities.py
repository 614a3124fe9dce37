"""What the target tritonserver can run (its backends, its GPUs, the files its host holds), checked
before a model is loaded.

Offline validation cannot know the host: a config asking for `KIND_GPU` or the `onnxruntime` backend
is valid, yet the wheel's tritonserver on a CPU-only machine refuses it (measured in
shared/TRITON_NOTES.md). Such a refusal is the environment's fault, not the content's, so it is a
`HostCapabilityError` (an `EnvironmentFault`: the deploy ends `failed`, the digest is not
quarantined, and it deploys once the model reaches a server that has what it needs).

Where the facts come from:
- a launched server: its backend directory (the launcher assembles it) and this host's GPUs
  (`/proc/driver/nvidia/gpus`, else `/dev/nvidiaN`);
- a launched server runs on this host as this user: a python model's absolute
  `EXECUTION_ENV_PATH` (an archive outside the model directory, which offline validation can only
  warn about) must exist and be readable here;
- an external server: its metrics endpoint (`triton_metrics_url`; Triton exports `nv_gpu_*` gauges,
  one `gpu_uuid` per GPU, only when it has GPUs). Its backends and its host's files are not visible
  from outside, so they are not checked before the load (Triton's refusal is recognised after it);
- a launched server's command line: whether it completes python models' configs (`auto_complete_config`;
  off with `triton_auto_complete = false`); a model whose config.pbtxt is missing or declares no
  inputs and no outputs needs that (controlplane/validation/autocomplete.py). An external server's
  flags are not visible: Triton's refusal is reported after the load;
- any server, after a failed load: Triton's own reason (`unable to find backend library for
  backend 'X'`, `has kind KIND_GPU but no GPUs are available`, `invalid or unsupported gpu id N`)
  is recognised and reported as the same error (`from_triton_reason`).
"""

from __future__ import annotations

import errno
import logging
import os
import re
import urllib.error
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controlplane.errors import HostCapabilityError
from controlplane.triton.summaries import read_metrics

log = logging.getLogger("tritonctl.capabilities")

PROC_GPUS = Path("/proc/driver/nvidia/gpus")
METRICS_TIMEOUT_S = 2.0
# Triton derives the backend from these platforms (GetBackendFromPlatform); ensembles need none.
BACKEND_OF_PLATFORM = {
    "tensorrt_plan": "tensorrt",
    "onnxruntime_onnx": "onnxruntime",
    "pytorch_libtorch": "pytorch",
    "tensorflow_graphdef": "tensorflow",
    "tensorflow_savedmodel": "tensorflow",
}
EXECUTION_ENV_PATH = "EXECUTION_ENV_PATH"
MODEL_DIRECTORY_VAR = "$$TRITON_MODEL_DIRECTORY"
_GPU_UUID = re.compile(r'^nv_gpu_\w+\{[^}]*gpu_uuid="([^"]+)"', re.MULTILINE)


def local_gpu_count(proc_gpus: Path = PROC_GPUS, dev: Path = Path("/dev")) -> int:
    """GPUs the NVIDIA driver exposes on this host (0 without the driver)."""
    try:
        return sum(1 for _ in proc_gpus.iterdir())
    except OSError:
        pass
    try:
        return sum(1 for p in dev.iterdir() if re.fullmatch(r"nvidia\d+", p.name))
    except OSError:
        return 0


def gpus_from_metrics(text: str) -> int:
    """GPUs in a Triton metrics page: distinct `gpu_uuid` labels of its `nv_gpu_*` gauges."""
    return len(set(_GPU_UUID.findall(text)))


def fetch_metrics_gpu_count(url: str, timeout_s: float = METRICS_TIMEOUT_S) -> int | None:
    """GPU count from an external tritonserver's metrics endpoint; None when it cannot be read."""
    try:
        return gpus_from_metrics(read_metrics(url, timeout_s))
    except (OSError, urllib.error.URLError, ValueError) as exc:
        log.warning("tritonserver metrics %s unreadable (%s): GPUs not checked before the load", url, exc)
        return None


@dataclass(frozen=True)
class Capabilities:
    """What one tritonserver offers; None means unknown (that check is skipped). `host_files`: the
    server's host is this one (a launched server), so paths a config names can be checked here."""

    url: str
    backends: frozenset[str] | None
    gpus: int | None
    host_files: bool = False
    auto_complete: bool | None = None  # whether it completes python models' configs (None: unknown)


def model_backend(config: Mapping[str, Any]) -> str | None:
    """The backend a parsed config (MessageToDict form) needs; None for an ensemble or when unset."""
    backend = str(config.get("backend") or "")
    if backend:
        return backend
    return BACKEND_OF_PLATFORM.get(str(config.get("platform") or ""))


def _gpus_word(n: int) -> str:
    return f"{n} GPU" if n == 1 else f"{n} GPUs"


def execution_env_path(config: Mapping[str, Any]) -> str | None:
    """A python model's `EXECUTION_ENV_PATH` when it lies outside the model directory (an absolute
    path on the serving host), else None: one under `$$TRITON_MODEL_DIRECTORY` is validated offline."""
    if model_backend(config) != "python":
        return None
    parameter = (config.get("parameters") or {}).get(EXECUTION_ENV_PATH) or {}
    value = str(parameter.get("string_value") or "")
    return value if os.path.isabs(value) else None


def _unreadable(path: str) -> str | None:
    """Why the tritonserver (this user, this host) cannot read `path`; None when it can."""
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            return "does not exist"
        return f"cannot be read ({exc.strerror})"
    if not os.access(path, os.R_OK):
        return "is not readable"
    return None


def check_host_files(config: Mapping[str, Any], caps: Capabilities) -> None:
    """Raise HostCapabilityError when a launched server's host lacks the absolute
    `EXECUTION_ENV_PATH` the config names (Triton would refuse the load)."""
    path = execution_env_path(config)
    if path is None or not caps.host_files:
        return
    why = _unreadable(path)
    if why:
        raise HostCapabilityError(
            f'config.pbtxt: parameters["{EXECUTION_ENV_PATH}"]: "{path}" {why} on the host of the '
            f"tritonserver at {caps.url}"
        )


def needs_completion(config: Mapping[str, Any], model_dir: Path | None) -> bool:
    """Whether a valid python model serves only once its auto_complete_config completed its config: it has no
    config.pbtxt, or one that declares no inputs and no outputs (validation refuses that without the method)."""
    if model_backend(config) != "python" or model_dir is None:
        return False
    return not (model_dir / "config.pbtxt").is_file() or not (config.get("input") or config.get("output"))


def check_completion(config: Mapping[str, Any], caps: Capabilities, model_dir: Path | None) -> None:
    """Raise HostCapabilityError when the config needs completing and the server does not complete configs."""
    if caps.auto_complete is False and needs_completion(config, model_dir):
        raise HostCapabilityError(
            "config.pbtxt: missing or without inputs and outputs: completed only by the model's "
            f"auto_complete_config, and the tritonserver at {caps.url} runs with --disable-auto-complete-config "
            "(triton_auto_complete = false)"
        )


def check(config: Mapping[str, Any] | None, caps: Capabilities, model_dir: Path | None = None) -> None:
    """Raise HostCapabilityError when `caps` lacks a backend, a GPU, a host file or the config completion that
    `config` needs."""
    if not config:
        return
    check_host_files(config, caps)
    check_completion(config, caps, model_dir)
    backend = model_backend(config)
    if backend and caps.backends is not None and backend not in caps.backends:
        # Triton also takes a backend shipped inside the model directory (libtriton_<name>.so).
        shipped = model_dir is not None and any(model_dir.glob(f"*/libtriton_{backend}.so"))
        if not shipped:
            raise HostCapabilityError(
                f"backend '{backend}' is not installed in this tritonserver ({caps.url}; "
                f"it has {', '.join(sorted(caps.backends)) or 'none'})"
            )
    if caps.gpus is None:
        return
    for index, group in enumerate(config.get("instance_group") or []):
        if group.get("kind") != "KIND_GPU":
            continue
        wanted = [int(g) for g in group.get("gpus") or []]
        missing = [g for g in wanted if g >= caps.gpus]
        if missing:
            raise HostCapabilityError(
                f"instance_group[{index}] needs GPU {', '.join(map(str, missing))}; "
                f"the tritonserver at {caps.url} has {_gpus_word(caps.gpus)}"
            )
        if not wanted and caps.gpus == 0:
            raise HostCapabilityError(
                f"instance_group[{index}] needs a GPU (KIND_GPU); the tritonserver at {caps.url} has 0 GPUs"
            )


_TRITON_BACKEND = re.compile(r"unable to find backend library for backend '([^']+)'")
_TRITON_NO_GPU = re.compile(r"instance group (\S+) of model \S+ has kind KIND_GPU but no GPUs are available")
_TRITON_GPU_ID = re.compile(r"instance group (\S+) of model \S+ specifies invalid or unsupported gpu id (\d+)")


def from_triton_reason(reason: str, url: str) -> HostCapabilityError | None:
    """Triton's own words for a missing backend or GPU, as the error tritonctl raises for them."""
    if match := _TRITON_BACKEND.search(reason):
        return HostCapabilityError(f"backend '{match.group(1)}' is not installed in this tritonserver ({url})")
    if match := _TRITON_NO_GPU.search(reason):
        return HostCapabilityError(
            f"instance_group {match.group(1)} needs a GPU (KIND_GPU); the tritonserver at {url} has 0 GPUs"
        )
    if match := _TRITON_GPU_ID.search(reason):
        return HostCapabilityError(
            f"instance_group {match.group(1)} needs GPU {match.group(2)}; the tritonserver at {url} does not "
            "have it"
        )
    return None


@dataclass
class HostProbe:
    """Answers "what can the target tritonserver run" for the deployer, from what tritonctl knows."""

    url: str
    backend_dir: Path | None = None  # a launched server's --backend-directory
    local: bool = False  # launched here: count this host's GPUs
    metrics_url: str | None = None  # an external server's metrics endpoint
    auto_complete: Callable[[], bool | None] = lambda: None  # a launched server's: read from its command line

    def capabilities(self) -> Capabilities:
        backends: frozenset[str] | None = None
        if self.backend_dir is not None:
            try:
                backends = frozenset(p.name for p in self.backend_dir.iterdir() if p.is_dir())
            except OSError:
                backends = None
        gpus: int | None = None
        if self.local:
            gpus = local_gpu_count()
        elif self.metrics_url:
            gpus = fetch_metrics_gpu_count(self.metrics_url)
        return Capabilities(self.url, backends, gpus, host_files=self.local, auto_complete=self.auto_complete())

    def check(self, config: Mapping[str, Any] | None, model_dir: Path | None = None) -> None:
        check(config, self.capabilities(), model_dir)


def probe_for(url: str, server: Any, metrics_url: str | None) -> HostProbe:
    """The probe for the daemon's tritonserver: `server` is its launched TritonServer, or None."""
    backend_dir = getattr(server, "backend_dir", None) if server is not None else None
    completes = getattr(server, "auto_completes", None)
    return HostProbe(url, backend_dir=backend_dir, local=server is not None, metrics_url=metrics_url,
                     auto_complete=completes if callable(completes) else lambda: None)


def describe(caps: Capabilities) -> str:
    """One line for logs: what the server offers."""
    backends = ", ".join(sorted(caps.backends)) if caps.backends is not None else "unknown"
    gpus = str(caps.gpus) if caps.gpus is not None else "unknown"
    files = "checked" if caps.host_files else "not checkable"
    completes = {True: "on", False: "off", None: "unknown"}[caps.auto_complete]
    return f"tritonserver {caps.url}: backends {backends}; GPUs {gpus}; host files {files}; auto-complete {completes}"


__all__ = [
    "Capabilities",
    "HostProbe",
    "check",
    "check_completion",
    "check_host_files",
    "describe",
    "execution_env_path",
    "fetch_metrics_gpu_count",
    "from_triton_reason",
    "gpus_from_metrics",
    "local_gpu_count",
    "model_backend",
    "needs_completion",
    "probe_for",
]

