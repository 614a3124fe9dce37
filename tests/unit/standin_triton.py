"""A stand-in for `TritonClient` in unit tests of the deploy state machine (no tritonserver).

It implements only what `controlplane.deploy.engine` calls (load, unload, index, ready_versions,
served_digest, infer) and behaves like Triton in explicit mode as far as the state machine can see:
a load serves the tree `serving/MODEL` points at (its stamped digest, its numeric version folders),
an unload serves nothing. Each failure the state machine must handle is scripted: `load_script`
(an exception, "ignore" for a load Triton accepts but does not apply, or None for a normal load per
call), `unready` versions, `answers` for smoke requests, `unreachable`. The end-to-end tests keep
using the real server; this is for covering every branch quickly.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from google.protobuf import json_format

from controlplane.deploy.publish import ServingRepository
from controlplane.errors import TritonError, TritonUnavailableError
from controlplane.triton.client import DIGEST_PARAMETER, IndexEntry, RequestCounts
from controlplane.validation.modelconfig import parse_config_text

_DIGEST = re.compile(r'key: "' + re.escape(DIGEST_PARAMETER) + r'"\s*value\s*{\s*string_value: "([^"]+)"')
_GEN = re.compile(r'key: "gen" value { string_value: "(\d+)" }')


@dataclass
class Served:
    digest: str | None
    versions: list[str]
    gen: float
    state: str = "READY"
    config: str = ""


@dataclass
class StandinTriton:
    serving: ServingRepository
    url: str = "standin:0"
    load_script: list[BaseException | str | None] = field(default_factory=list)
    unload_error: BaseException | None = None
    unready: set[str] = field(default_factory=set)  # versions that never become READY
    answers: dict[str, float] = field(default_factory=dict)  # model -> what infer answers (default: its gen)
    unreachable: bool = False
    models: dict[str, Served] = field(default_factory=dict)
    calls: list[tuple[str, str, float | None]] = field(default_factory=list)  # (call, model, timeout)
    served_requests: dict[str, list[int]] = field(default_factory=dict)  # model -> [successes, failures]

    def _check(self) -> None:
        if self.unreachable:
            raise TritonUnavailableError("failed to connect to all addresses: connection refused", "UNAVAILABLE")

    def load(self, model: str, timeout_s: float | None = None) -> None:
        self.calls.append(("load", model, timeout_s))
        self._check()
        action = self.load_script.pop(0) if self.load_script else None
        if isinstance(action, BaseException):
            raise action
        if action == "ignore":  # Triton kept what it served (e.g. a re-point to an old tree)
            return
        tree = self.serving.current(model)
        if tree is None:
            raise TritonError(f"failed to load '{model}': no model directory", "INTERNAL")
        text = (tree / "config.pbtxt").read_text()
        digest = _DIGEST.search(text)
        gen = _GEN.search(text)
        versions = sorted(p.name for p in tree.iterdir() if p.is_dir() and p.name.isdigit())
        self.models[model] = Served(digest.group(1) if digest else None, versions,
                                    float(gen.group(1)) if gen else 0.0, config=text)

    def unload(self, model: str, dependents: bool = False) -> None:
        self.calls.append(("unload", model, None))
        self._check()
        if self.unload_error is not None:
            raise self.unload_error
        self.models.pop(model, None)

    def index(self) -> list[IndexEntry]:
        self._check()
        return [IndexEntry(name, v, "UNAVAILABLE" if v in self.unready else s.state, "")
                for name, s in sorted(self.models.items()) for v in s.versions]

    def ready_versions(self, model: str) -> list[str]:
        return [e.version for e in self.index() if e.name == model and e.state == "READY"]

    def served_digest(self, model: str) -> str | None:
        self._check()
        served = self.models.get(model)
        return served.digest if served is not None else None

    def served_config(self, model: str) -> dict[str, Any]:
        """The served config as Triton's JSON (what the change-set recovery reads)."""
        self._check()
        served = self.models.get(model)
        if served is None:
            raise TritonError(f"model '{model}' is not loaded", "NOT_FOUND")
        return dict(json_format.MessageToDict(parse_config_text(served.config, "config.pbtxt"),
                                              preserving_proto_field_name=True))

    def infer(self, model: str, version: str, inputs: Sequence[tuple[str, str, np.ndarray]],
              output_names: Sequence[str], timeout_s: float | None = None) -> dict[str, np.ndarray]:
        self._check()
        served = self.models[model]
        value = self.answers.get(model, served.gen)
        x = inputs[0][2]
        self.served_requests.setdefault(model, [0, 0])[0] += 1
        return {name: np.full_like(x, value, dtype=np.float32) for name in output_names}

    def request_counts(self, model: str) -> dict[tuple[str, str], RequestCounts]:
        """Triton's statistics as the smoke test reads them: each infer counted (the stand-in never fails one)."""
        self._check()
        success, failure = self.served_requests.get(model, [0, 0])
        return {(model, "1"): RequestCounts(success, failure, 0)}
