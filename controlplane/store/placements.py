"""The fleet's on-demand tables: where each on-demand model is placed, and the leases taken through any host.

Why a module of its own: placement is one decision at a time across the fleet. `place` reads every live
host's budget and holdings, lets the caller decide (controlplane/fleet/placement.py, a pure function)
and records the placement and the caller's lease in ONE transaction under a PostgreSQL transaction
advisory lock (`pg_advisory_xact_lock(PLACEMENT_LOCK)`): two ensures through two hosts at the same moment
never place one model twice, nor two models into the same free room. Leases live in `fleet_leases` so
they are renewed and released through any host; the host a model is placed on reads them
(controlplane/fleet/ondemand.py) and holds its local lease for as long as one is active.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, select, text, update
from sqlalchemy.orm import Session

from controlplane.store import schema
from controlplane.store.outbox import add_audit_event
from controlplane.store.registry import AuditEntry, Registry, utcnow
from controlplane.vocab import GPU, MEMORY, SERVING_STATES

PLACEMENT_LOCK = 0x7472_706C  # "trpl": one placement decision at a time, fleet-wide
PLACE_PREFIX = "place "  # the notification that wakes the host a model was placed on
OPEN_PLACEMENT = ("loading", "loaded")


@dataclass(frozen=True)
class PlacementRow:
    model: str
    host: str
    digest: str
    state: str  # loading | loaded | failed
    message: str
    memory_mb: float | None
    gpu_memory_mb: float | None
    updated_at: datetime


@dataclass(frozen=True)
class ReportedFootprint:
    """What a host reported one model's content to hold (MB; None: not measured there)."""

    model: str
    digest: str | None
    memory_mb: float | None
    gpu_memory_mb: float | None


@dataclass(frozen=True)
class Room:
    """A live host's budgets and holdings as the fleet tables know them: (model, memory, gpu, evictable)."""

    host: str
    memory_budget_mb: float | None
    gpu_memory_budget_mb: float | None
    holdings: list[tuple[str, float, float, bool]]


Decide = Callable[[list[Room], list[str]], tuple[str, str]]  # (rooms, hosts that have it) → (host, message)


def _row(r: schema.Placement) -> PlacementRow:
    return PlacementRow(r.model, r.host, r.digest, r.state, r.message, r.memory_mb, r.gpu_memory_mb, r.updated_at)


class PlacementStore:
    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    def _notify(self, session: Session, payload: str) -> None:
        if self.registry.engine.dialect.name == "postgresql":
            session.execute(text("SELECT pg_notify('tritonctl_fleet', :payload)"), {"payload": payload})

    def _lock(self, session: Session) -> None:
        if self.registry.engine.dialect.name == "postgresql":
            session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": PLACEMENT_LOCK})

    # -- the decision --------------------------------------------------------------------------------

    def rooms(self, session: Session, live: Iterable[str], exclude: str) -> list[Room]:
        """Every live host's budgets and what it holds: its reported serving models, then the models
        placed on it that it has not reported serving yet (counted at the footprint they were placed by)."""
        names = sorted(set(live))
        hosts = {h.name: h for h in session.scalars(select(schema.FleetHost).where(schema.FleetHost.name.in_(names)))}
        held: dict[str, dict[str, tuple[str, float, float, bool]]] = {name: {} for name in hosts}
        for r in session.scalars(select(schema.HostModel).where(schema.HostModel.host.in_(names),
                                                                schema.HostModel.state.in_(SERVING_STATES))):
            if r.model != exclude and r.host in held:
                held[r.host][r.model] = (r.model, r.memory_mb or 0.0, r.gpu_memory_mb or 0.0, bool(r.evictable))
        for p in session.scalars(select(schema.Placement).where(schema.Placement.state.in_(OPEN_PLACEMENT))):
            if p.model != exclude and p.host in held and p.model not in held[p.host]:
                held[p.host][p.model] = (p.model, p.memory_mb or 0.0, p.gpu_memory_mb or 0.0, False)
        return [Room(name, hosts[name].memory_budget_mb, hosts[name].gpu_memory_budget_mb, list(held[name].values()))
                for name in sorted(hosts)]

    def place(self, model: str, digest: str, need: dict[str, float], live: list[str], decide: Decide,
              lease: tuple[str, datetime, str], through: str) -> tuple[PlacementRow, bool]:
        """Find or make `model`'s placement and record `lease` (id, until, actor) on it, in one transaction
        under the fleet's placement lock. True when this call asked a host to load (a new placement, or
        newer content on the placed host); False when the model is placed, loading or loaded, already."""
        now = utcnow()
        with self.registry.session() as session:
            self._lock(session)
            row = session.get(schema.Placement, model)
            asked = False
            if row is not None and row.state in (*OPEN_PLACEMENT, "idle") and row.host in live:
                if row.state == "idle" or (row.digest != digest and row.state == "loaded"):
                    # idle (its host may be unloading it) or newer content: its host ensures it again
                    row.digest, row.state, row.updated_at = digest, "loading", now
                    asked = True
            else:
                has_it = [r.host for r in session.scalars(
                    select(schema.HostModel).where(schema.HostModel.model == model,
                                                   schema.HostModel.state.in_(SERVING_STATES),
                                                   schema.HostModel.digest == digest)
                    .order_by(schema.HostModel.host)) if r.host in live]
                host, message = decide(self.rooms(session, live, model), has_it)
                if row is None:
                    row = schema.Placement(model=model, created_at=now)
                    session.add(row)
                row.host, row.digest, row.state, row.message, row.updated_at = host, digest, "loading", message, now
                row.memory_mb, row.gpu_memory_mb = need.get(MEMORY), need.get(GPU)
                add_audit_event(session, AuditEntry(lease[2], "place", model, digest, "ok", message), through, now,
                                self.registry.outbox)
                asked = True
            session.add(schema.FleetLease(id=lease[0], model=model, until=lease[1], actor=lease[2][:64],
                                          created_at=now))
            session.flush()
            placed = _row(row)
            self._notify(session, f"{PLACE_PREFIX}{model}")
        return placed, asked

    def urls(self, host: str) -> tuple[str | None, str | None]:
        """Where a host's clients send inference, its gRPC and HTTP URLs as its heartbeat records them (its
        gateway's, its tritonserver's without one)."""
        with self.registry.session() as session:
            row = session.get(schema.FleetHost, host)
            return (row.triton_url or None, row.http_url or None) if row is not None else (None, None)

    def get(self, model: str) -> PlacementRow | None:
        with self.registry.session() as session:
            row = session.get(schema.Placement, model)
            return _row(row) if row is not None else None

    def on_host(self, host: str) -> list[PlacementRow]:
        with self.registry.session() as session:
            return [_row(r) for r in session.scalars(select(schema.Placement).where(schema.Placement.host == host)
                                                     .order_by(schema.Placement.model))]

    def mark(self, model: str, host: str, digest: str, state: str, message: str) -> bool:
        """The placed host's word on a load: `loaded` or `failed` (only while the row still asks it of it)."""
        with self.registry.session() as session:
            moved = session.execute(update(schema.Placement)
                                    .where(schema.Placement.model == model, schema.Placement.host == host,
                                           schema.Placement.digest == digest, schema.Placement.state == "loading")
                                    .values(state=state, message=" ".join(message.split()), updated_at=utcnow()))
            self._notify(session, f"{PLACE_PREFIX}{model} {state}")
            return bool(getattr(moved, "rowcount", 0))

    def idle_if_unleased(self, model: str, host: str) -> bool:
        """`loaded` → `idle` when no lease of the model is active, under the placement lock (an ensure that
        just leased it is either seen here, or finds it idle and asks its host again)."""
        with self.registry.session() as session:
            self._lock(session)
            active = session.scalar(select(func.count()).select_from(schema.FleetLease)
                                    .where(schema.FleetLease.model == model, schema.FleetLease.until > utcnow()))
            if active:
                return False
            moved = session.execute(update(schema.Placement)
                                    .where(schema.Placement.model == model, schema.Placement.host == host,
                                           schema.Placement.state == "loaded")
                                    .values(state="idle", updated_at=utcnow()))
            return bool(getattr(moved, "rowcount", 0))

    def reported_footprints(self) -> list[ReportedFootprint]:
        """Every host's reported footprints, newest first."""
        with self.registry.session() as session:
            rows = session.execute(select(schema.HostModel.model, schema.HostModel.digest, schema.HostModel.memory_mb,
                                          schema.HostModel.gpu_memory_mb)
                                   .where(schema.HostModel.memory_mb.is_not(None))
                                   .order_by(schema.HostModel.updated_at.desc())).all()
            return [ReportedFootprint(m, d, mem, gpu) for m, d, mem, gpu in rows]

    def forget(self, model: str, host: str, audit: AuditEntry | None = None, states: tuple[str, ...] = ()) -> bool:
        """The placement is over (the host unloaded it, or its load failed): the next ensure places again."""
        with self.registry.session() as session:
            stmt = delete(schema.Placement).where(schema.Placement.model == model, schema.Placement.host == host)
            if states:
                stmt = stmt.where(schema.Placement.state.in_(states))
            gone = bool(getattr(session.execute(stmt), "rowcount", 0))
            if gone and audit is not None:
                add_audit_event(session, audit, host, utcnow(), self.registry.outbox)
            return gone

    # -- leases ----------------------------------------------------------------------------------------

    def renew(self, model: str, lease_id: str, until: datetime) -> bool:
        with self.registry.session() as session:
            moved = session.execute(update(schema.FleetLease)
                                    .where(schema.FleetLease.id == lease_id, schema.FleetLease.model == model,
                                           schema.FleetLease.until > utcnow())
                                    .values(until=until))
            self._notify(session, f"{PLACE_PREFIX}{model} lease")
            return bool(getattr(moved, "rowcount", 0))

    def release(self, model: str, lease_id: str) -> datetime | None:
        """Drop an active lease; its until, or None when there is no such active lease."""
        with self.registry.session() as session:
            row = session.get(schema.FleetLease, lease_id)
            if row is None or row.model != model or row.until <= utcnow():
                return None
            until = row.until
            session.delete(row)
            self._notify(session, f"{PLACE_PREFIX}{model} lease")
            return until

    def lease_ends(self, models: Iterable[str]) -> dict[str, tuple[int, datetime]]:
        """model → (active leases, until when the last one holds), for models with an active lease."""
        names = list(models)
        if not names:
            return {}
        with self.registry.session() as session:
            rows = session.execute(select(schema.FleetLease.model, func.count(), func.max(schema.FleetLease.until))
                                   .where(schema.FleetLease.model.in_(names), schema.FleetLease.until > utcnow())
                                   .group_by(schema.FleetLease.model)).all()
            return {model: (int(count), until) for model, count, until in rows}

    def expire(self, models: Iterable[str]) -> list[tuple[str, str, str]]:
        """Delete the expired leases of `models`: (lease id, model, actor) of each, to audit."""
        names = list(models)
        if not names:
            return []
        with self.registry.session() as session:
            gone = session.scalars(select(schema.FleetLease).where(schema.FleetLease.model.in_(names),
                                                                   schema.FleetLease.until <= utcnow())).all()
            out = [(g.id, g.model, g.actor) for g in gone]
            for g in gone:
                session.delete(g)
            return out

    def view(self) -> dict[str, dict[str, Any]]:
        """`status --fleet`: model → {host, state, digest, leases, until} of every placement."""
        with self.registry.session() as session:
            rows = session.scalars(select(schema.Placement).order_by(schema.Placement.model)).all()
            placed = [_row(r) for r in rows]
        ends = self.lease_ends(p.model for p in placed)
        return {p.model: {"host": p.host, "state": p.state, "digest": p.digest,
                          "leases": ends[p.model][0] if p.model in ends else 0,
                          "until": ends[p.model][1] if p.model in ends else None}
                for p in placed}
