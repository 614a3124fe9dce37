"""How much memory a loaded model holds: measured at load, or declared by the model.

Why: a memory budget (controlplane/memory/budget.py) can only make room by what each model costs, and Triton
does not say it for the python backend: `get_inference_statistics` carries no `memory_usage` for
python models (measured on 2.51; Triton reports per-model memory only for some backends). Each python
instance is its own `triton_python_backend_stub` process, though, whose command line names the
model's `model.py` (`.../<model>/<version>/model.py`), the server's pid and the instance name
(`<model>_<group>_<n>`). So a footprint is the resident memory (VmRSS) of the stub processes a load
started, plus the server's own growth during the load (never below zero); on a GPU host, with NVML
(the `nvidia-ml-py` package), the GPU memory those processes hold, per GPU. Where nothing can be
measured (an external tritonserver on another host, a backend without stubs) a model may declare its
footprint in its config: `parameters { key: "tritonctl.footprint_mb" value { string_value: "100" } }`
and `tritonctl.gpu_footprint_mb`; a measurement wins over a declaration.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controlplane.names import public_of
from controlplane.settings.modelparams import model_parameter
from controlplane.vocab import MEMORY_KINDS

STUB = "triton_python_backend_stub"
DECLARED_MB = "footprint_mb"  # `tritonctl.footprint_mb` (settings/modelparams.py MODEL_PARAMETERS)
DECLARED_GPU_MB = "gpu_footprint_mb"
MEASURED = "measured"
DECLARED = "declared"
MB = 1024 * 1024


@dataclass(frozen=True)
class Footprint:
    """Host memory in MB and GPU memory in MB per GPU (None: unknown), and where they come from."""

    memory_mb: float | None
    gpu_memory_mb: float | None
    source: str


def _parameter(config: Mapping[str, Any] | None, key: str) -> float | None:
    """A declared footprint in MB, or None where none is declared or it is not a number from 0 to 1 PiB
    (controlplane/base/bounds.py; validation refuses such a config, this read is for what was recorded before)."""
    try:
        return model_parameter((config or {}).get("parameters") or {}, key)  # type: ignore[no-any-return]
    except ValueError:
        return None


def declared(config: Mapping[str, Any] | None) -> Footprint | None:
    """The footprint a model's parsed config declares (`tritonctl.footprint_mb`, `tritonctl.gpu_footprint_mb`)."""
    memory, gpu = _parameter(config, DECLARED_MB), _parameter(config, DECLARED_GPU_MB)
    if memory is None and gpu is None:
        return None
    return Footprint(memory, gpu, DECLARED)


def estimate(stated: Sequence[Any], known: Iterable[Any]) -> dict[str, float]:
    """What a load will hold before it is measured, per kind (`memory_mb`, `gpu_memory_mb`): the first of
    `stated` (best first; None entries skipped: a measurement of this content, of the model, a declaration)
    that names it, else the median of every `known` footprint that names it, else 0. A host's budget
    (controlplane/memory/budget.py) and the fleet's placement (controlplane/fleet/ondemand.py) both ask it."""
    everyone = list(known)
    need: dict[str, float] = {}
    for key in MEMORY_KINDS:
        value = next((v for v in (getattr(s, key) for s in stated if s is not None) if v is not None), None)
        if value is None:
            values = [v for v in (getattr(r, key) for r in everyone) if v is not None]
            value = statistics.median(values) if values else 0.0
        need[key] = float(value)
    return need


def rss_mb(pid: int) -> float:
    """Resident memory of `pid` in MB (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0.0


def _cmdline(pid: str) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def stub_pids(model: str, server_pid: int | None = None) -> set[int]:
    """The python backend stub processes serving `model` (of the server `server_pid`, when known): loaded
    under that name, or, for a public name, under any of its digests' private names (with a gateway)."""
    found: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        argv = _cmdline(entry)
        if len(argv) < 9 or not argv[0].endswith(STUB):
            continue
        loaded = Path(argv[1]).parent.parent.name  # <repository>/<the name Triton loaded it under>/<version>/model.py
        if model not in (loaded, public_of(loaded)):  # `model` by that name, or any digest of it (gateway)
            continue
        if server_pid is not None and argv[5] != str(server_pid):
            continue
        found.add(int(entry))
    return found


def gpu_mb_by_pid(pids: Iterable[int]) -> float | None:
    """The most GPU memory `pids` hold together on any one GPU (MB), through NVML; None without NVML or GPUs."""
    wanted = set(pids)
    try:
        import pynvml  # type: ignore[import-not-found]  # nvidia-ml-py: only where GPUs exist
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        try:
            most = 0.0
            for index in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                used = sum((p.usedGpuMemory or 0) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
                           if p.pid in wanted)
                most = max(most, used / MB)
            return most
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - NVML present without a driver: nothing measured
        return None


@dataclass
class Baseline:
    """What ran before a load: the model's stubs then (a reload's old instances) and the server's memory."""

    model: str
    stubs: set[int] = field(default_factory=set)
    server_mb: float = 0.0


class Meter:
    """Measures a load: `before` it, `measure` once the model is READY."""

    def __init__(self, server_pid: Callable[[], int | None] | None = None) -> None:
        self.server_pid = server_pid or (lambda: None)

    def before(self, model: str) -> Baseline:
        pid = self.server_pid()
        return Baseline(model, stub_pids(model, pid), rss_mb(pid) if pid else 0.0)

    def measure(self, baseline: Baseline) -> Footprint | None:
        """The footprint of what the load started; None when no stub process of it is visible here."""
        pid = self.server_pid()
        new = stub_pids(baseline.model, pid) - baseline.stubs
        if not new:
            return None
        growth = max(0.0, rss_mb(pid) - baseline.server_mb) if pid else 0.0
        memory = sum(rss_mb(p) for p in new) + growth
        return Footprint(round(memory, 1), gpu_mb_by_pid(new), MEASURED)
