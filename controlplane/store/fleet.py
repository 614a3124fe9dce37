"""The fleet's tables in the shared registry: hosts, rollouts, per-host steps, what each host serves.

All of the fleet's SQL (controlplane.fleet calls these methods and sees dataclasses, never ORM rows):
one short transaction each. Steps are claimed with a conditional UPDATE (`pending` → `running`), so a host never runs
a step twice even if it is woken twice. `notify` wakes every host listening on `CHANNEL`.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select, text, update
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from controlplane.errors import StoreError
from controlplane.store import schema
from controlplane.store.outbox import add_audit_event
from controlplane.store.placements import PlacementStore
from controlplane.store.records import Rollout, Step, from_row
from controlplane.store.registry import AuditEntry, Registry, utcnow

CHANNEL = "tritonctl_fleet"
LOOK_PREFIX = "look "  # a notification asking the leader to look at a model's source again
OPEN_ROLLOUT = ("queued", "running", "rolling_back")
Footprint = tuple[float | None, float | None, bool]  # a host's model: memory_mb, gpu_memory_mb, evictable

# The advisory locks of controlplane.fleet.election, and how pg_locks shows who holds them.
LEADER_LOCK = 0x7472_6974  # "trit": classid 0, objid this, in pg_locks
APPLICATION_PREFIX = "tritonctl-leader:"
HOST_LOCK_CLASS = 0x7472_6968  # "trih": pg_locks classid of every live daemon's host lock (objsubid 2)

HOST_SESSIONS_QUERY = """
SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.classid = :cls AND l.objsubid = 2
"""

LEADER_QUERY = """
SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.classid = 0 AND l.objid = :key
"""


# -- the dedicated session (psycopg, autocommit) that holds the fleet's locks and LISTENs ----------

def host_lock_key(host: str) -> int:
    return zlib.crc32(host.encode()) & 0x7FFF_FFFF


def take_host_lock(conn: Any, host: str) -> bool:
    """Hold `host`'s session lock on `conn` until the session ends; False if another session holds it."""
    row = conn.execute("SELECT pg_try_advisory_lock(%s, %s)", (HOST_LOCK_CLASS, host_lock_key(host))).fetchone()
    return bool(row and row[0])


def libpq_url(url: str) -> str:
    """A SQLAlchemy URL (postgresql+psycopg://...) as a libpq connection URI."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def connect(url: str, application_name: str) -> Any:
    import psycopg

    return psycopg.connect(libpq_url(url), autocommit=True, connect_timeout=5, application_name=application_name,
                           keepalives=1, keepalives_idle=5, keepalives_interval=2, keepalives_count=3)


def try_leader_lock(conn: Any) -> bool:
    row = conn.execute("SELECT pg_try_advisory_lock(%s)", (LEADER_LOCK,)).fetchone()
    return bool(row and row[0])


def check_session(conn: Any) -> None:
    """Raises when the session (and with it every lock it held) is gone."""
    conn.execute("SELECT 1")


def listen(conn: Any) -> None:
    """Receive `notify`'s wake-ups on `conn` (read them with `conn.notifies(...)`)."""
    conn.execute(f"LISTEN {CHANNEL}")


def _step(row: schema.RolloutHost, model: str = "") -> Step:
    return from_row(Step, row, model=model, figures=json.loads(row.figures) if row.figures else None)


class FleetStore:
    def __init__(self, registry: Registry) -> None:
        self.registry = registry

    @contextmanager
    def session(self) -> Iterator[Session]:
        with self.registry.session() as session:
            yield session

    def notify(self, session: Session, payload: str) -> None:
        if self.registry.engine.dialect.name == "postgresql":
            session.execute(text("SELECT pg_notify(:channel, :payload)"), {"channel": CHANNEL, "payload": payload})

    def ask_leader_to_look(self, model: str) -> None:
        """Tell whichever daemon leads to look at `model`'s source again (an operator lifted what held
        it: unpin, policy auto), as the single host's watcher would (fleet/member.py's LISTEN)."""
        with self.session() as session:
            self.notify(session, f"{LOOK_PREFIX}{model}")

    # -- hosts ----------------------------------------------------------------------------------

    def heartbeat(self, host: str, triton_url: str, version: str, started_at: datetime, *, http_url: str = "",
                  budgets: tuple[float | None, float | None] = (None, None)) -> None:
        """`budgets`: the host's memory_budget_mb and gpu_memory_budget_mb (None: none), which placement reads."""
        with self.session() as session:
            row = session.get(schema.FleetHost, host)
            now = utcnow()
            if row is None:
                row = schema.FleetHost(name=host, triton_url=triton_url, version=version,
                                       started_at=started_at, last_heartbeat=now)
                session.add(row)
            else:
                row.triton_url, row.version, row.last_heartbeat = triton_url, version, now
                if row.started_at != started_at:
                    row.started_at = started_at
            if (row.http_url, row.memory_budget_mb, row.gpu_memory_budget_mb) != (http_url, *budgets):
                row.http_url, (row.memory_budget_mb, row.gpu_memory_budget_mb) = http_url, budgets

    def leader(self) -> str | None:
        if self.registry.engine.dialect.name != "postgresql":
            return None
        with self.session() as session:
            names = session.scalars(text(LEADER_QUERY), {"key": LEADER_LOCK}).all()
        for name in names:
            if name and name.startswith(APPLICATION_PREFIX):
                return str(name[len(APPLICATION_PREFIX):])
        return None

    def _with_session(self) -> set[str] | None:
        """Hosts whose daemon holds its session lock now (None: not PostgreSQL, heartbeats only)."""
        if self.registry.engine.dialect.name != "postgresql":
            return None
        with self.session() as session:
            names = session.scalars(text(HOST_SESSIONS_QUERY), {"cls": HOST_LOCK_CLASS}).all()
        return {str(n[len(APPLICATION_PREFIX):]) for n in names if n and n.startswith(APPLICATION_PREFIX)}

    def hosts(self, timeout_s: float = 10.0) -> list[dict[str, Any]]:
        leader = self.leader()
        live = set(self.live_hosts(timeout_s))
        sessions = self._with_session()
        now = utcnow()
        with self.session() as session:
            rows = session.scalars(select(schema.FleetHost).order_by(schema.FleetHost.name)).all()
            return [
                {"host": r.name, "triton_url": r.triton_url, "version": r.version, "started_at": r.started_at,
                 "last_heartbeat": r.last_heartbeat, "age_s": round((now - r.last_heartbeat).total_seconds(), 1),
                 "alive": r.name in live, "session": None if sessions is None else r.name in sessions,
                 "leader": r.name == leader}
                for r in rows
            ]

    def live_hosts(self, timeout_s: float, by_session: bool = True) -> list[str]:
        """Hosts that heartbeat within `timeout_s` and (PostgreSQL) whose daemon's session is alive:
        a daemon that dies is dead as soon as PostgreSQL sees its connection close. `by_session` False:
        by heartbeat alone (after a database outage, while every daemon opens its session again)."""
        cutoff = utcnow() - timedelta(seconds=timeout_s)
        with self.session() as session:
            recent = list(session.scalars(select(schema.FleetHost.name).where(schema.FleetHost.last_heartbeat >= cutoff)
                                          .order_by(schema.FleetHost.name)))
        sessions = self._with_session() if by_session else None
        return recent if sessions is None else [h for h in recent if h in sessions]

    # -- the fleet's target per model ---------------------------------------------------------------

    def targets(self) -> dict[str, str]:
        """Model → the digest the whole fleet should serve (the last rollout that completed)."""
        with self.session() as session:
            rows = session.execute(select(schema.Model.name, schema.Model.active_digest)).all()
            return {name: digest for name, digest in rows if digest}

    def set_target(self, session: Session, model: str, digest: str) -> None:
        row = session.scalar(select(schema.Model).where(schema.Model.name == model))
        now = utcnow()
        if row is None:
            row = schema.Model(name=model, pinned=False, state="serving", created_at=now, updated_at=now)
            session.add(row)
        if not digest:  # a fleet-wide unload is done: nothing is the target
            row.active_digest, row.state, row.updated_at, row.last_error = None, "unloaded", now, None
            return
        if row.active_digest != digest:
            row.active_since = now
        row.active_digest, row.state, row.updated_at, row.last_error = digest, "serving", now, None

    # -- rollouts -------------------------------------------------------------------------------

    def open_rollout(self, model: str) -> int | None:
        """The oldest open rollout of the model."""
        with self.session() as session:
            return session.scalar(select(schema.Rollout.id).where(schema.Rollout.model == model,
                                                                  schema.Rollout.state.in_(OPEN_ROLLOUT))
                                  .order_by(schema.Rollout.id).limit(1))

    def create_rollout(self, model: str, digest: str, previous: str | None, actor: str,
                       waves: list[list[str]]) -> int:
        """Queue a rollout; it runs at once unless another one of the model is still open."""
        return self.create_rollouts([(model, digest, previous)], actor, waves)[0]

    def create_rollouts(self, rollouts: Sequence[tuple[str, str, str | None]], actor: str,
                        waves: list[list[str]]) -> list[int]:
        """Queue (model, digest, previous) rollouts in one transaction, in order: a change set's rollouts
        reach the hosts' claims all at once (an agent that saw only a set's first step would deploy it
        alone, beside the old ensemble over it)."""
        now = utcnow()
        ids: list[int] = []
        with self.session() as session:
            for model, digest, previous in rollouts:
                busy = session.scalar(select(schema.Rollout.id).where(schema.Rollout.model == model,
                                                                      schema.Rollout.state.in_(OPEN_ROLLOUT))
                                      .limit(1))
                row = schema.Rollout(model=model, digest=digest, previous_digest=previous, actor=actor,
                                     state="queued" if busy else "running", created_at=now, updated_at=now)
                session.add(row)
                session.flush()
                for wave, hosts in enumerate(waves):
                    for host in hosts:
                        session.add(schema.RolloutHost(rollout_id=row.id, host=host, wave=wave, action="deploy",
                                                       digest=digest, state="pending" if wave == 0 and not busy
                                                       else "waiting", message=""))
                ids.append(row.id)
                self.notify(session, f"rollout {row.id}")
        return ids

    def rollouts(self, states: tuple[str, ...] = OPEN_ROLLOUT, limit: int = 50) -> list[Rollout]:
        with self.session() as session:
            rows = session.scalars(select(schema.Rollout).where(schema.Rollout.state.in_(states))
                                   .order_by(schema.Rollout.id.desc()).limit(limit)).all()
            return [self._rollout(session, r) for r in rows]

    def rollout(self, rollout_id: int) -> Rollout:
        with self.session() as session:
            row = session.get(schema.Rollout, rollout_id)
            if row is None:
                raise StoreError(f"rollout {rollout_id} is unknown")
            return self._rollout(session, row)

    def _rollout(self, session: Session, r: schema.Rollout) -> Rollout:
        steps = session.scalars(select(schema.RolloutHost).where(schema.RolloutHost.rollout_id == r.id)
                                .order_by(schema.RolloutHost.id)).all()
        return from_row(Rollout, r, steps=[_step(s, r.model) for s in steps],
                        bake=json.loads(r.bake) if r.bake else None)

    def set_rollout(self, rollout_id: int, state: str | None, error: str | None = None, *,
                    target: tuple[str, str] | None = None, audit: AuditEntry | None = None,
                    host: str = "", bake: dict[str, Any] | None = None) -> None:
        """Set a rollout's state (None: kept); in the same transaction the fleet's target, an audit event
        (by `host`) and its pooled bake document (controlplane/fleet/bake.py)."""
        now = utcnow()
        with self.session() as session:
            row = session.get(schema.Rollout, rollout_id)
            if row is None:
                return
            if bake is not None:
                row.bake = json.dumps(bake)
            if state is not None:
                row.state, row.updated_at = state, now
                if state not in OPEN_ROLLOUT:
                    row.finished_at = now
            if error is not None:
                row.error = error
            if target is not None:
                self.set_target(session, *target)
            if audit is not None:
                add_audit_event(session, audit, host, now, self.registry.outbox)
            if state is not None or audit is not None:  # a bake's figures alone wake nobody
                self.notify(session, f"rollout {rollout_id} {state or 'bake'}")

    def transition(self, rollout_id: int, from_state: str, to_state: str, error: str | None = None) -> bool:
        """Move a rollout from one state to the next; False when someone else (a former leader) already did."""
        values: dict[str, Any] = {"state": to_state, "updated_at": utcnow()}
        if error is not None:
            values["error"] = error
        with self.session() as session:
            moved = _rowcount(session.execute(update(schema.Rollout).where(schema.Rollout.id == rollout_id,
                                                                           schema.Rollout.state == from_state)
                                              .values(**values)))
            self.notify(session, f"rollout {rollout_id} {to_state}")
            return moved == 1

    def set_steps(self, rollout_id: int, from_states: tuple[str, ...], to_state: str, wave: int | None = None,
                  message: str | None = None, action: str | None = None) -> int:
        stmt = (update(schema.RolloutHost)
                .where(schema.RolloutHost.rollout_id == rollout_id, schema.RolloutHost.state.in_(from_states)))
        if wave is not None:
            stmt = stmt.where(schema.RolloutHost.wave == wave)
        if action is not None:
            stmt = stmt.where(schema.RolloutHost.action == action)
        values: dict[str, Any] = {"state": to_state}
        if message is not None:
            values["message"] = message
        if to_state in ("ok", "failed", "skipped"):
            values["finished_at"] = utcnow()
        with self.session() as session:
            count = _rowcount(session.execute(stmt.values(**values)))
            self.notify(session, f"rollout {rollout_id}")
            return int(count or 0)

    def requeue_running(self, host: str) -> int:
        """At start: this host's steps left `running` by a crash go back to `pending` (deploys are idempotent)."""
        with self.session() as session:
            count = _rowcount(session.execute(update(schema.RolloutHost)
                                              .where(schema.RolloutHost.host == host,
                                                     schema.RolloutHost.state == "running")
                                              .values(state="pending")))
            return int(count or 0)

    def skip_step(self, step_id: int, message: str) -> None:
        with self.session() as session:
            session.execute(update(schema.RolloutHost)
                            .where(schema.RolloutHost.id == step_id,
                                   schema.RolloutHost.state.in_(("waiting", "pending", "running")))
                            .values(state="skipped", finished_at=utcnow(), message=message))

    def add_rollback_steps(self, rollout_id: int, hosts: list[str], digest: str | None, wave: int) -> None:
        with self.session() as session:
            for host in hosts:
                session.add(schema.RolloutHost(rollout_id=rollout_id, host=host, wave=wave, action="rollback",
                                               digest=digest, state="pending", message=""))
            self.notify(session, f"rollout {rollout_id} rollback")

    # -- a wave's bake (controlplane/fleet/bake.py) -------------------------------------------------

    def add_bake_steps(self, rollout_id: int, hosts: list[str], digest: str, wave: int, bake: dict[str, Any]) -> None:
        """The hosts of `wave` that took `digest` bake it (each its own step, claimed by that host), and the
        rollout's bake document begins; one transaction."""
        with self.session() as session:
            for host in hosts:
                session.add(schema.RolloutHost(rollout_id=rollout_id, host=host, wave=wave, action="bake",
                                               digest=digest, state="pending", message=""))
            row = session.get(schema.Rollout, rollout_id)
            if row is not None:
                row.bake, row.updated_at = json.dumps(bake), utcnow()
            self.notify(session, f"rollout {rollout_id} bake")

    def served_before(self, rollout: Rollout) -> bool:
        """Whether an earlier rollout of the same model and digest completed: the fleet served it before
        (a rollback returns to such a digest: it does not bake again)."""
        with self.session() as session:
            return session.scalar(select(schema.Rollout.id).where(
                schema.Rollout.model == rollout.model, schema.Rollout.digest == rollout.digest,
                schema.Rollout.state == "done", schema.Rollout.id < rollout.id).limit(1)) is not None

    def set_figures(self, step_id: int, figures: dict[str, Any]) -> bool:
        """A host's bake figures so far, on its step while it still runs; False once the leader ended it."""
        with self.session() as session:
            return _rowcount(session.execute(update(schema.RolloutHost)
                                             .where(schema.RolloutHost.id == step_id,
                                                    schema.RolloutHost.state == "running")
                                             .values(figures=json.dumps(figures)))) == 1

    def claim(self, host: str) -> list[Step]:
        """This host's pending steps, now marked running (by this caller only)."""
        with self.session() as session:
            rows = session.execute(
                select(schema.RolloutHost, schema.Rollout.model)
                .join(schema.Rollout, schema.Rollout.id == schema.RolloutHost.rollout_id)
                .where(schema.RolloutHost.host == host, schema.RolloutHost.state == "pending")
                .order_by(schema.RolloutHost.id)).all()
            claimed = []
            for step, model in rows:
                done = _rowcount(session.execute(update(schema.RolloutHost)
                                                 .where(schema.RolloutHost.id == step.id,
                                                        schema.RolloutHost.state == "pending")
                                                 .values(state="running", started_at=utcnow())))
                if done:
                    claimed.append(_step(step, model))
            return claimed

    def finish_step(self, step: Step, state: str, message: str, *, host: str, serving: str | None,
                    audit: AuditEntry, at: datetime | None = None) -> bool:
        """A host's step ends: its state, what the host serves now, the serving log and the audit event.
        `at`: when it ended, for a record written late (controlplane/fleet/journal.py): written once, so
        an entry whose audit event (host, time, action, model) is already there writes nothing (False)."""
        now = at or utcnow()
        with self.session() as session:
            if at is not None and session.scalar(select(schema.AuditEvent.id).where(
                    schema.AuditEvent.host == host, schema.AuditEvent.time == at,
                    schema.AuditEvent.action == audit.action, schema.AuditEvent.model == audit.model).limit(1)):
                return False
            row = session.get(schema.RolloutHost, step.id)
            if row is not None and (at is None or row.state in ("waiting", "pending", "running")):
                row.state, row.message, row.finished_at = state, " ".join(message.split()), now
            self._set_host_model(session, host, step.model, serving,
                                 "serving" if serving else ("unloaded" if state == "ok" else "failed"), now)
            add_audit_event(session, audit, host, now, self.registry.outbox)
            self.notify(session, f"step {step.id} {state}")
        return True

    # -- what each host serves ------------------------------------------------------------------

    def _set_host_model(self, session: Session, host: str, model: str, digest: str | None, state: str,
                        now: datetime, footprint: Footprint | None = None) -> None:
        row = session.scalar(select(schema.HostModel).where(schema.HostModel.host == host,
                                                            schema.HostModel.model == model))
        if row is None:
            row = schema.HostModel(host=host, model=model, digest=digest, state=state, updated_at=now)
            session.add(row)
            session.flush()
        elif (row.digest, row.state) != (digest, state):
            row.digest, row.state, row.updated_at = digest, state, now
        if footprint is not None and (row.memory_mb, row.gpu_memory_mb, row.evictable) != footprint:
            row.memory_mb, row.gpu_memory_mb, row.evictable = footprint
        last = session.scalar(select(schema.ServingLog.digest).where(schema.ServingLog.model == model,
                                                                     schema.ServingLog.host == host)
                              .order_by(schema.ServingLog.time.desc(), schema.ServingLog.id.desc()).limit(1))
        if digest is not None and last != digest:
            session.add(schema.ServingLog(time=now, model=model, digest=digest, versions="[]", host=host))

    def report(self, host: str, serving: dict[str, tuple[str | None, str]],
               footprints: dict[str, Footprint] | None = None) -> None:
        """The host's own view (model → (digest, state)), refreshed periodically; `footprints`: model →
        (memory_mb, gpu_memory_mb, evictable) of what it holds, which placement weighs against its budget."""
        now = utcnow()
        with self.session() as session:
            for model, (digest, state) in serving.items():
                self._set_host_model(session, host, model, digest, state, now, (footprints or {}).get(model))

    def held_digests(self) -> list[tuple[str, str, str, str]]:
        """(model, host, digest, state) of every host's model that holds a digest, in that order."""
        with self.session() as session:
            rows = session.execute(select(schema.HostModel.model, schema.HostModel.host, schema.HostModel.digest,
                                          schema.HostModel.state).where(schema.HostModel.digest.is_not(None))
                                   .order_by(schema.HostModel.model, schema.HostModel.host)).all()
        return [(str(m), str(h), str(d), str(s)) for m, h, d, s in rows]

    def matrix(self) -> dict[str, Any]:
        """Model × host: digest, state and drift from the fleet's target."""
        targets = self.targets()
        with self.session() as session:
            rows = session.scalars(select(schema.HostModel).order_by(schema.HostModel.model,
                                                                     schema.HostModel.host)).all()
            models: dict[str, dict[str, Any]] = {}
            for r in rows:
                entry = models.setdefault(r.model, {"model": r.model, "target": targets.get(r.model), "hosts": {}})
                entry["hosts"][r.host] = {"digest": r.digest, "state": r.state, "updated_at": r.updated_at,
                                          "drift": r.digest != targets.get(r.model), "held": r.state == "held"}
            for model, digest in targets.items():
                models.setdefault(model, {"model": model, "target": digest, "hosts": {}})
        placed = PlacementStore(self.registry).view()
        for model in placed:
            models.setdefault(model, {"model": model, "target": targets.get(model), "hosts": {}})
        for model, entry in models.items():
            entry["placement"] = placed.get(model)
        return {"models": [models[m] for m in sorted(models)]}


def _rowcount(result: Any) -> int:
    """Rows an UPDATE matched (a CursorResult's rowcount)."""
    return int(getattr(result, "rowcount", 0) or 0)


def audit_event(actor: str, action: str, model: str | None, digest: str | None, outcome: str, message: str,
                duration_ms: int | None = None) -> AuditEntry:
    return AuditEntry(actor, action, model, digest, outcome, message, duration_ms)

