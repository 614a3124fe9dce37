"""The registry's tables (SQLAlchemy 2 ORM). Alembic migrations in `migrations/` create them.

Times are naive UTC datetimes everywhere. `audit_events` and `serving_log` are append-only: nothing in
the product updates or deletes their rows (gc keeps them even when snapshots go).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, Boolean, DateTime, Float, Index, Integer, String, Text, UniqueConstraint, false
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class Model(Base):
    """One model name ever seen in the source repository (or loaded through the API)."""

    __tablename__ = "models"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    policy: Mapped[str | None] = mapped_column(String(16), nullable=True)  # None: the global policy
    pinned: Mapped[bool] = mapped_column(Boolean, default=False)
    active_digest: Mapped[str | None] = mapped_column(String(64), nullable=True)
    state: Mapped[str] = mapped_column(String(16), default="new")
    last_error: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime)
    updated_at: Mapped[datetime] = mapped_column(DateTime)
    active_since: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    removed_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)


class Snapshot(Base):
    """Every distinct content a model ever had (the same content seen again maps to the same row)."""

    __tablename__ = "snapshots"
    __table_args__ = (UniqueConstraint("model", "digest", name="uq_snapshot_model_digest"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model: Mapped[str] = mapped_column(String(128), index=True)
    digest: Mapped[str] = mapped_column(String(64), index=True)
    manifest: Mapped[str] = mapped_column(Text)  # JSON, the snapshot's entries
    config: Mapped[str | None] = mapped_column(Text, nullable=True)  # JSON of the parsed config.pbtxt
    versions: Mapped[str] = mapped_column(Text, default="[]")  # JSON list of Triton version dirs
    served_versions: Mapped[str] = mapped_column(Text, default="[]")
    valid: Mapped[bool] = mapped_column(Boolean)
    problems: Mapped[str] = mapped_column(Text, default="[]")  # JSON list of problem objects
    total_bytes: Mapped[int] = mapped_column(BigInteger, default=0)  # models exceed 2 GiB
    first_seen: Mapped[datetime] = mapped_column(DateTime)
    last_seen: Mapped[datetime] = mapped_column(DateTime)
    quarantined: Mapped[bool] = mapped_column(Boolean, default=False)
    quarantine_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    collected: Mapped[bool] = mapped_column(Boolean, default=False)  # content removed by gc


class SourceSignature(Base):
    """A model's newest recorded source content: its stat signature then (`trusted` False: recorded
    within the racy window, captured again at the next start), its digest and, for an ensemble, its step
    models (migration 0007)."""

    __tablename__ = "source_signatures"
    model: Mapped[str] = mapped_column(String(128), primary_key=True)
    signature: Mapped[str | None] = mapped_column(String(64), nullable=True)
    digest: Mapped[str] = mapped_column(String(64))
    steps: Mapped[str | None] = mapped_column(Text, nullable=True)  # JSON list; None: no ensemble
    trusted: Mapped[bool] = mapped_column(Boolean, default=False)  # a start may skip it when the signature equals
    recorded_at: Mapped[datetime] = mapped_column(DateTime)


class Footprint(Base):
    """A digest's memory footprint on this host: measured at load, or declared in its config (migration 0008)."""

    __tablename__ = "footprints"
    model: Mapped[str] = mapped_column(String(128), primary_key=True)
    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    memory_mb: Mapped[float | None] = mapped_column(Float, nullable=True)
    gpu_memory_mb: Mapped[float | None] = mapped_column(Float, nullable=True)
    source: Mapped[str] = mapped_column(String(16))  # measured | declared
    measured_at: Mapped[datetime] = mapped_column(DateTime)


class CompletedConfig(Base):
    """The config Triton serves for a content its python model completes at load (migration 0012)."""

    __tablename__ = "completed_configs"
    model: Mapped[str] = mapped_column(String(128), primary_key=True)
    digest: Mapped[str] = mapped_column(String(64), primary_key=True)
    config: Mapped[str] = mapped_column(Text)  # JSON of Triton's ModelConfig, the digest stamp left out
    recorded_at: Mapped[datetime] = mapped_column(DateTime)


class Deployment(Base):
    """One deploy, rollback or unload, its step recorded before each step is taken."""

    __tablename__ = "deployments"
    __table_args__ = (Index("ix_deployments_open", "finished_at"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model: Mapped[str] = mapped_column(String(128), index=True)
    kind: Mapped[str] = mapped_column(String(16))  # deploy | rollback | unload
    digest: Mapped[str | None] = mapped_column(String(64), nullable=True)
    previous_digest: Mapped[str | None] = mapped_column(String(64), nullable=True)
    step: Mapped[str] = mapped_column(String(24))
    actor: Mapped[str] = mapped_column(String(64))
    started_at: Mapped[datetime] = mapped_column(DateTime)
    updated_at: Mapped[datetime] = mapped_column(DateTime)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    outcome: Mapped[str | None] = mapped_column(String(16), nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)


class AuditEvent(Base):
    """Append-only log of every action: who, what, which model and digest, outcome, how long."""

    __tablename__ = "audit_events"
    __table_args__ = (
        Index("ix_audit_model_time", "model", "time"),
        Index("ix_audit_time", "time"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    time: Mapped[datetime] = mapped_column(DateTime)
    actor: Mapped[str] = mapped_column(String(64))
    action: Mapped[str] = mapped_column(String(32))
    model: Mapped[str | None] = mapped_column(String(128), nullable=True)
    digest: Mapped[str | None] = mapped_column(String(64), nullable=True)
    outcome: Mapped[str] = mapped_column(String(16))
    duration_ms: Mapped[int | None] = mapped_column(Integer, nullable=True)
    message: Mapped[str] = mapped_column(Text, default="")
    host: Mapped[str] = mapped_column(String(128), default="")
    # who the caller said they were (x-tritonctl-actor) when that differs from the authenticated actor
    claimed: Mapped[str | None] = mapped_column(String(64), nullable=True)  # migration 0011


class Token(Base):
    """A personal token of the control API (controlplane/api/tokens.py; migration 0011): only a slow hash
    of its secret is kept; `id` is the token's public part, which finds its row."""

    __tablename__ = "tokens"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    role: Mapped[str] = mapped_column(String(16))
    secret_hash: Mapped[str] = mapped_column(String(256))  # scrypt$N$r$p$salt$hash
    creator: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime)
    expires_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)  # None: never
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    revoked_by: Mapped[str | None] = mapped_column(String(64), nullable=True)


class ServingLog(Base):
    """Append-only: from `time` on, `model` served `digest` (None: nothing). Answers `audit --at T`."""

    __tablename__ = "serving_log"
    __table_args__ = (
        Index("ix_serving_model_time", "model", "time"),
        Index("ix_serving_model_host_time", "model", "host", "time"),  # audit --at T (migration 0004)
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    time: Mapped[datetime] = mapped_column(DateTime)
    model: Mapped[str] = mapped_column(String(128))
    digest: Mapped[str | None] = mapped_column(String(64), nullable=True)
    versions: Mapped[str] = mapped_column(Text, default="[]")
    host: Mapped[str] = mapped_column(String(128), default="")


class Tag(Base):
    """Where a model's tag (`stable`, `canary`) points now (controlplane/intake/tags.py; migration 0005)."""

    __tablename__ = "tags"
    __table_args__ = (UniqueConstraint("model", "name", name="uq_tag_model_name"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model: Mapped[str] = mapped_column(String(128))
    name: Mapped[str] = mapped_column(String(63))
    digest: Mapped[str] = mapped_column(String(64))
    moved_by: Mapped[str] = mapped_column(String(64))
    moved_at: Mapped[datetime] = mapped_column(DateTime)


class TagMove(Base):
    """Append-only: every tag move, deletion (new_digest None) and failed move; answers `tags --at T`."""

    __tablename__ = "tag_moves"
    __table_args__ = (
        Index("ix_tag_moves_model_name_time", "model", "name", "time"),
        Index("ix_tag_moves_time", "time"),
    )
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    time: Mapped[datetime] = mapped_column(DateTime)
    model: Mapped[str] = mapped_column(String(128))
    name: Mapped[str] = mapped_column(String(63))
    old_digest: Mapped[str | None] = mapped_column(String(64), nullable=True)
    new_digest: Mapped[str | None] = mapped_column(String(64), nullable=True)  # where the tag points after
    attempted_digest: Mapped[str | None] = mapped_column(String(64), nullable=True)  # a failed move's target
    actor: Mapped[str] = mapped_column(String(64))
    outcome: Mapped[str] = mapped_column(String(16))  # ok | failed
    message: Mapped[str] = mapped_column(Text, default="")
    host: Mapped[str] = mapped_column(String(128), default="")


class TagTrack(Base):
    """A model that serves whatever one of its tags names (`policy MODEL track:NAME`; models.policy: track)."""

    __tablename__ = "tag_tracks"
    model: Mapped[str] = mapped_column(String(128), primary_key=True)
    tag: Mapped[str] = mapped_column(String(63))
    set_by: Mapped[str] = mapped_column(String(64))
    set_at: Mapped[datetime] = mapped_column(DateTime)


# -- fleet (tables used only when daemons share a PostgreSQL registry; see docs/fleet.md) ---------


class FleetHost(Base):
    """One daemon of a fleet: its name, its tritonserver and when it last said it is alive."""

    __tablename__ = "hosts"
    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    triton_url: Mapped[str] = mapped_column(String(256), default="")
    version: Mapped[str] = mapped_column(String(32), default="")
    started_at: Mapped[datetime] = mapped_column(DateTime)
    last_heartbeat: Mapped[datetime] = mapped_column(DateTime)
    http_url: Mapped[str] = mapped_column(String(256), default="", server_default="")  # migration 0009
    memory_budget_mb: Mapped[float | None] = mapped_column(Float, nullable=True)  # None: no budget
    gpu_memory_budget_mb: Mapped[float | None] = mapped_column(Float, nullable=True)


class Rollout(Base):
    """One digest going to the fleet: canary first, then waves; rolled back everywhere on a failure."""

    __tablename__ = "rollouts"
    __table_args__ = (Index("ix_rollouts_model_state", "model", "state"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model: Mapped[str] = mapped_column(String(128))
    digest: Mapped[str] = mapped_column(String(64))
    previous_digest: Mapped[str | None] = mapped_column(String(64), nullable=True)
    state: Mapped[str] = mapped_column(String(16))  # queued | running | rolling_back | done | rolled_back
    actor: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime)
    updated_at: Mapped[datetime] = mapped_column(DateTime)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    bake: Mapped[str | None] = mapped_column(Text, nullable=True)  # the pooled bake, JSON (migration 0010)


class RolloutHost(Base):
    """One host's step of a rollout (wave 0 is the canary set); `action` rollback undoes a deploy."""

    __tablename__ = "rollout_hosts"
    __table_args__ = (Index("ix_rollout_hosts_rollout", "rollout_id"), Index("ix_rollout_hosts_host", "host", "state"))
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    rollout_id: Mapped[int] = mapped_column(Integer)
    host: Mapped[str] = mapped_column(String(128))
    wave: Mapped[int] = mapped_column(Integer)
    action: Mapped[str] = mapped_column(String(16))  # deploy | rollback | bake
    digest: Mapped[str | None] = mapped_column(String(64), nullable=True)
    state: Mapped[str] = mapped_column(String(16))  # waiting | pending | running | ok | failed | skipped
    started_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    message: Mapped[str] = mapped_column(Text, default="")
    figures: Mapped[str | None] = mapped_column(Text, nullable=True)  # a bake step's figures, JSON (migration 0010)


class HostModel(Base):
    """What one host serves for one model right now (its own registry's view, reported to the fleet)."""

    __tablename__ = "host_models"
    __table_args__ = (UniqueConstraint("host", "model", name="uq_host_model"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    host: Mapped[str] = mapped_column(String(128))
    model: Mapped[str] = mapped_column(String(128))
    digest: Mapped[str | None] = mapped_column(String(64), nullable=True)
    state: Mapped[str] = mapped_column(String(16))
    updated_at: Mapped[datetime] = mapped_column(DateTime)
    memory_mb: Mapped[float | None] = mapped_column(Float, nullable=True)  # its footprint there (migration 0009)
    gpu_memory_mb: Mapped[float | None] = mapped_column(Float, nullable=True)
    evictable: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())  # idle, unprotected


class Placement(Base):
    """Where the fleet loaded an on-demand model (controlplane/fleet/placement.py; migration 0009)."""

    __tablename__ = "placements"
    model: Mapped[str] = mapped_column(String(128), primary_key=True)
    host: Mapped[str] = mapped_column(String(128))
    digest: Mapped[str] = mapped_column(String(64))
    state: Mapped[str] = mapped_column(String(16))  # loading | loaded | failed
    message: Mapped[str] = mapped_column(Text, default="")
    memory_mb: Mapped[float | None] = mapped_column(Float, nullable=True)  # the estimate it was placed by
    gpu_memory_mb: Mapped[float | None] = mapped_column(Float, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime)
    updated_at: Mapped[datetime] = mapped_column(DateTime)


class FleetLease(Base):
    """A lease taken through any host of a fleet; the host the model is placed on honours it."""

    __tablename__ = "fleet_leases"
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    model: Mapped[str] = mapped_column(String(128), index=True)
    until: Mapped[datetime] = mapped_column(DateTime)
    actor: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(DateTime)


# -- webhooks (controlplane/webhooks; migration 0006) ---------------------------------------------


class WebhookOutbox(Base):
    """One row per audit event, added in the event's transaction; the delivery worker fans it out."""

    __tablename__ = "webhook_outbox"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    audit_id: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(DateTime)


class WebhookDelivery(Base):
    """One event to one webhook: its id (X-Tritonctl-Delivery), the exact body, attempts, last answer."""

    __tablename__ = "webhook_deliveries"
    __table_args__ = (
        Index("ix_webhook_deliveries_lane", "state", "url", "model", "audit_id"),
        Index("ix_webhook_deliveries_created", "created_at"),
    )
    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    audit_id: Mapped[int] = mapped_column(Integer)
    action: Mapped[str] = mapped_column(String(32))
    model: Mapped[str | None] = mapped_column(String(128), nullable=True)
    url: Mapped[str] = mapped_column(String(2048))
    body: Mapped[str] = mapped_column(Text)
    state: Mapped[str] = mapped_column(String(16))  # pending | delivered | failed
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime] = mapped_column(DateTime)
    next_attempt_at: Mapped[datetime] = mapped_column(DateTime)
    retry_until: Mapped[datetime] = mapped_column(DateTime)  # failed when an attempt after this fails
    last_attempt_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime, nullable=True)
    status_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    answer: Mapped[str] = mapped_column(Text, default="")  # the receiver's answer (or the error), cut short
