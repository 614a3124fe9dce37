"""Read-only fleet views for the CLI (`hosts`, `rollouts`, `status --fleet`): plain JSON-able dicts."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from controlplane.fleet.store import OPEN_ROLLOUT, FleetStore
from controlplane.store.records import iso
from controlplane.store.registry import Registry


def _json(value: Any) -> Any:
    if isinstance(value, datetime):
        return iso(value)
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json(v) for v in value]
    return value


def hosts(registry: Registry, timeout_s: float = 10.0) -> list[dict[str, Any]]:
    return [_json(row) for row in FleetStore(registry).hosts(timeout_s)]


def rollouts(registry: Registry, all_states: bool = True, limit: int = 20) -> list[dict[str, Any]]:
    states = OPEN_ROLLOUT + ("done", "rolled_back") if all_states else OPEN_ROLLOUT
    return [_json(r.to_json()) for r in FleetStore(registry).rollouts(states, limit)]


def matrix(registry: Registry) -> dict[str, Any]:
    return dict(_json(FleetStore(registry).matrix()))
