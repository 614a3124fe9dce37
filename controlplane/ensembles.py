"""Which models an ensemble needs, read from its recorded config (the ensemble_scheduling steps).

`load` of an ensemble loads the members it needs first, in step order; `unload --dependents` also
unloads the members no other loaded ensemble uses; unloading a member a serving ensemble needs is
refused without --force. The decisions live in `controlplane.service`; this only reads configs.
"""

from __future__ import annotations

from typing import Any


def members(config: dict[str, Any] | None) -> list[str]:
    """The ensemble's composing models in step order, each once; [] for a model that is no ensemble."""
    if not config or config.get("platform") != "ensemble":
        return []
    names: list[str] = []
    for step in (config.get("ensemble_scheduling") or {}).get("step", []):
        name = step.get("model_name")
        if name and name not in names:
            names.append(name)
    return names
