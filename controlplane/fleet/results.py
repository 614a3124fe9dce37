"""What the fleet's read commands print (`hosts`, `rollouts`, `status --fleet`), one frozen dataclass per
`--json` document, as controlplane/documents/results.py holds the single host's. Read by fleet/queries.py, on the
client path too (a read verb given --db-url): no server code here."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from controlplane.store.records import iso

# --- fleet: hosts, rollouts, status --fleet ------------------------------------------------------------


@dataclass(frozen=True)
class HostRow:
    """One fleet host (`hosts --json` prints a list of these)."""

    host: str
    triton_url: str
    version: str
    started_at: datetime | None
    last_heartbeat: datetime | None
    age_s: float
    alive: bool
    session: bool | None  # PostgreSQL: whether the daemon's database session is open; null elsewhere
    leader: bool

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "triton_url": self.triton_url, "version": self.version,
                "started_at": iso(self.started_at), "last_heartbeat": iso(self.last_heartbeat),
                "age_s": self.age_s, "alive": self.alive, "session": self.session, "leader": self.leader}


@dataclass(frozen=True)
class MatrixCell:
    """One model on one host in `status --fleet`."""

    digest: str | None
    state: str
    updated_at: datetime | None
    drift: bool  # the host serves something other than the fleet's target
    held: bool  # the host is held for the model (`--host H`): the fleet leaves it alone

    def to_json(self) -> dict[str, Any]:
        return {"digest": self.digest, "state": self.state, "updated_at": iso(self.updated_at),
                "drift": self.drift, "held": self.held}


@dataclass(frozen=True)
class PlacementCell:
    """Where the fleet placed an on-demand model (controlplane/fleet/placement.py): the host, its state
    (loading, loaded, idle: loaded without a lease, unloaded when idle; failed), the digest, the leases."""

    host: str
    state: str
    digest: str
    leases: int
    until: datetime | None

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "state": self.state, "digest": self.digest, "leases": self.leases,
                "until": iso(self.until)}


@dataclass
class MatrixRow:
    model: str
    target: str | None
    hosts: dict[str, MatrixCell]
    tags: tuple[str, ...] = ()  # the tags naming the target digest (controlplane/intake/tags.py)
    placement: PlacementCell | None = None  # an on-demand model: where it is placed

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "target": self.target,
                "hosts": {host: cell.to_json() for host, cell in self.hosts.items()}, "tags": list(self.tags),
                "placement": self.placement.to_json() if self.placement is not None else None}


@dataclass
class FleetMatrix:
    """`status --fleet --json`: model x host, with the fleet's target digest per model."""

    models: list[MatrixRow]

    def to_json(self) -> dict[str, Any]:
        return {"models": [row.to_json() for row in self.models]}
