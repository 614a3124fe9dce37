"""Configs Triton completes at load, over the registry: which recorded contents have one, what Triton
completed for them, and the record of it after a load.

A python model whose `auto_complete_config` completes its config (controlplane/validation/autocomplete.py)
serves a config its files do not hold: offline validation says so with a warning and leaves its inputs and
outputs to the load. After the load, the deploy reads what Triton serves (`ModelConfig`) and records it with
the digest (`record`, controlplane/store/completed.py); from then on that is the model's config for what
needs it: an ensemble's checks over the step (`step_config`), `versions`, `diff` and `status -o wide`.
Whether a content completes at load never changes (its digest names its files), so it is kept in the
registry's memo; a completed config is kept there once recorded.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from controlplane.errors import TritonctlError
from controlplane.store.registry import Registry
from controlplane.validation.autocomplete import completes_at_load

log = logging.getLogger("tritonctl.deploy")

DIGEST_PARAMETER = "tritonctl.digest"  # the stamp a publish writes (controlplane/triton/client.py)


class ServedConfig(Protocol):
    def served_config(self, model: str) -> dict[str, Any]: ...


def completes(registry: Registry, model: str, digest: str) -> bool:
    """Whether the recorded content `digest` of `model` (full digest) completes its config at load."""
    def read() -> tuple[bool, bool]:
        snap = registry.get_snapshot(model, digest)
        return completes_at_load(snap.problems), snap.digest == digest

    return bool(registry.contents.get(("completes", model, digest), read))


def completed_config(registry: Registry, model: str, digest: str) -> dict[str, Any] | None:
    """The config Triton completed for the content, None until a load recorded one."""
    def read() -> tuple[dict[str, Any] | None, bool]:
        record = registry.completed_config(model, digest)
        return (record.config if record is not None else None), record is not None

    value: dict[str, Any] | None = registry.contents.get(("completed", model, digest), read)
    return value


def as_recorded(served: dict[str, Any], model: str) -> dict[str, Any]:
    """Triton's served config as it is recorded: under the model's own name (a change set's private
    name left out), without tritonctl's digest stamp (it names the row already)."""
    config = dict(served)
    config["name"] = model
    parameters = dict(config.get("parameters") or {})
    parameters.pop(DIGEST_PARAMETER, None)
    if parameters:
        config["parameters"] = parameters
    else:
        config.pop("parameters", None)
    return config


def record(registry: Registry, triton: ServedConfig, model: str, digest: str, served_as: str | None = None) -> bool:
    """After a verified load: the config Triton serves under `served_as` (default `model`), recorded for a
    content that completes at load; returns whether it recorded one. A failure to read or record it is
    logged, never the load's: what serves was verified already."""
    if not completes(registry, model, digest):
        return False
    try:
        config = as_recorded(triton.served_config(served_as or model), model)
        registry.record_completed_config(model, digest, config)
    except TritonctlError as exc:
        log.warning("%s %s: the config Triton completed was not recorded: %s", model, digest[:12], exc)
        return False
    registry.contents.forget(("completed", model, digest))
    return True
