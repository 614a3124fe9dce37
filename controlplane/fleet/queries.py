"""Read-only fleet views for the CLI (`hosts`, `rollouts`, `status --fleet`): the dataclasses of
`controlplane.documents.results`, built from the fleet store's rows."""

from __future__ import annotations

from controlplane.documents.results import RolloutRow
from controlplane.fleet.results import FleetMatrix, HostRow, MatrixCell, MatrixRow, PlacementCell
from controlplane.intake.tags import by_digest
from controlplane.store.fleet import OPEN_ROLLOUT, FleetStore
from controlplane.store.registry import Registry


def hosts(registry: Registry, timeout_s: float = 10.0) -> list[HostRow]:
    return [HostRow(**row) for row in FleetStore(registry).hosts(timeout_s)]


def rollouts(registry: Registry, all_states: bool = True, limit: int = 20) -> list[RolloutRow]:
    states = OPEN_ROLLOUT + ("done", "rolled_back") if all_states else OPEN_ROLLOUT
    return list(FleetStore(registry).rollouts(states, limit))


def matrix(registry: Registry) -> FleetMatrix:
    """Model x host, each model with the tags of the fleet's target digest (tags live in the shared registry)."""
    tagged = by_digest(registry.list_tags())
    return FleetMatrix([MatrixRow(row["model"], row["target"], {host: MatrixCell(**cell) for host, cell in
                                                                 row["hosts"].items()},
                                  tuple(tagged.get((row["model"], row["target"]), [])),
                                  PlacementCell(**row["placement"]) if row["placement"] else None)
                        for row in FleetStore(registry).matrix()["models"]])
