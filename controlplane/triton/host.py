"""The deployer's view of its tritonserver beyond the gRPC calls: can it run this model, and why
did a load fail.

`TritonHost` joins the capability probe (controlplane/triton/capabilities.py) and the load
explainer (controlplane/triton/serverlog.py) behind two calls the deployer makes: `check` before a
model is published and loaded, `load` around the load itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controlplane.errors import TritonError, TritonTimeoutError, TritonUnavailableError
from controlplane.triton.capabilities import HostProbe, check_completion, from_triton_reason, probe_for
from controlplane.triton.client import TritonClient
from controlplane.triton.serverlog import LoadExplainer


@dataclass
class TritonHost:
    probe: HostProbe
    explainer: LoadExplainer
    server_pid: Callable[[], int | None] = lambda: None  # a launched server's pid (footprints); None: external

    def check(self, config: Mapping[str, Any] | None, model_dir: Path | None = None) -> None:
        """Raise HostCapabilityError when the server lacks a backend or GPU the model needs."""
        self.probe.check(config, model_dir)

    def check_completion(self, config: Mapping[str, Any] | None, model_dir: Path | None = None) -> None:
        """Only the config-completion part of `check`: it needs no running server (a first start's deploys,
        published before their tritonserver is launched, take it; the rest comes from the load's reason)."""
        if config:
            check_completion(config, self.probe.capabilities(), model_dir)

    def load(self, model: str, load: Callable[[], None]) -> None:
        """Run `load`; on Triton's refusal, raise it with Triton's real reason in the message (a
        HostCapabilityError when that reason is a missing backend or GPU)."""
        cursor = self.explainer.start()
        try:
            load()
        except (TritonUnavailableError, TritonTimeoutError):
            raise
        except TritonError as exc:
            message = self.explainer.explain(model, exc.message, cursor)
            fault = from_triton_reason(message, self.probe.url)
            if fault is not None:
                raise fault from exc
            if message != exc.message:
                raise type(exc)(message, exc.status) from exc
            raise


def index_reason(client: TritonClient) -> Callable[[str], str]:
    """The repository index's reason for a model (what an external server tells without its log)."""

    def reason(model: str) -> str:
        return next((e.reason for e in client.index() if e.name == model and e.reason), "")

    return reason


def host_for(client: TritonClient, server: Any, *, metrics_url: str | None, log_path: Path | None) -> TritonHost:
    """The host of the daemon's tritonserver: `server` is the launched TritonServer, or None; for an
    external server `log_path` is its log file (setting `triton_log_path`) when tritonctl can read it."""
    launched_log = getattr(server, "log_path", None) if server is not None else None
    explainer = LoadExplainer(launched_log or log_path, index_reason(client))
    return TritonHost(probe_for(client.url, server, metrics_url), explainer,
                      server_pid=lambda: getattr(server, "pid", None) if server is not None else None)
