"""The web view's Fleet page data: hosts × models (each cell the digest served, held or drifting) and the
rollouts with their waves, read from the fleet's shared registry as `hosts`, `status --fleet` and
`rollouts` read it (controlplane/fleet/queries.py), so the page says what those commands print.

Kept apart from pages.py because it is the only part of the view that reads the shared registry, and
the only one a daemon without --fleet does not have. `stamp` is the fleet's part of the live check:
it changes when a cell, a host's liveness or leadership, or a rollout's step changes, not on every
heartbeat.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from controlplane.fleet import queries as fleet_queries
from controlplane.store.registry import Registry

ROLLOUT_LIMIT = 20

# A cell's word (colour repeats it): the host serves the fleet's target; it is held (an operator acted
# on it alone: the fleet leaves it alone); it serves something else; or it serves nothing of the model.
TARGET, HELD, DRIFTING, NOTHING = "target", "held", "drifting", "nothing"


@dataclass
class Cell:
    digest: str | None
    word: str
    state: str
    updated_at: str | None


@dataclass
class Wave:
    action: str  # deploy | bake | rollback
    number: int  # 0 is the canary wave
    steps: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class FleetView:
    hosts: list[dict[str, Any]]
    names: list[str]  # the columns: every host known to the fleet, or seen in a cell
    rows: list[dict[str, Any]]  # model, target, tags, cells (host -> Cell)
    rollouts: list[dict[str, Any]]  # each with "waves": list[Wave]

    def stamp(self) -> str:
        hosts = [{k: v for k, v in h.items() if k not in ("age_s", "last_heartbeat")} for h in self.hosts]
        cells = [(r["model"], r["target"], {h: (c.digest, c.word, c.state) for h, c in r["cells"].items()})
                 for r in self.rows]
        rollouts = [(r["id"], r["state"], [(s["id"], s["state"]) for s in r["steps"]]) for r in self.rollouts]
        body = json.dumps([hosts, cells, rollouts], sort_keys=True, default=str)
        return hashlib.sha256(body.encode()).hexdigest()[:16]


def cell_word(cell: dict[str, Any]) -> str:
    if cell["held"]:
        return HELD
    if not cell["digest"]:
        return NOTHING
    return DRIFTING if cell["drift"] else TARGET


def waves(steps: list[dict[str, Any]]) -> list[Wave]:
    """A rollout's steps grouped by action and wave, in the order they ran (deploy waves, then rollback)."""
    grouped: dict[tuple[str, int], Wave] = {}
    for step in sorted(steps, key=lambda s: (s["action"] == "rollback", s["wave"], s["action"] == "bake", s["host"])):
        grouped.setdefault((step["action"], step["wave"]), Wave(step["action"], step["wave"])).steps.append(step)
    return list(grouped.values())


def read(shared: Registry, rollout_limit: int = ROLLOUT_LIMIT) -> FleetView:
    hosts = [row.to_json() for row in fleet_queries.hosts(shared)]
    matrix = fleet_queries.matrix(shared).to_json()["models"]
    names = sorted({h["host"] for h in hosts} | {h for row in matrix for h in row["hosts"]})
    rows = [{"model": row["model"], "target": row["target"], "tags": row["tags"],
             "cells": {host: Cell(cell["digest"], cell_word(cell), cell["state"], cell["updated_at"])
                       for host, cell in row["hosts"].items()}} for row in matrix]
    rollouts = []
    for rollout in fleet_queries.rollouts(shared, True, rollout_limit):
        document = rollout.to_json()
        document["waves"] = waves(document["steps"])
        rollouts.append(document)
    return FleetView(hosts, names, rows, rollouts)
