"""Initial registry: models, snapshots, deployments, audit events, serving log.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "models",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(128), nullable=False, unique=True),
        sa.Column("policy", sa.String(16), nullable=True),
        sa.Column("pinned", sa.Boolean(), nullable=False),
        sa.Column("active_digest", sa.String(64), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.Column("active_since", sa.DateTime(), nullable=True),
        sa.Column("removed_at", sa.DateTime(), nullable=True),
    )
    op.create_table(
        "snapshots",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("manifest", sa.Text(), nullable=False),
        sa.Column("config", sa.Text(), nullable=True),
        sa.Column("versions", sa.Text(), nullable=False),
        sa.Column("served_versions", sa.Text(), nullable=False),
        sa.Column("valid", sa.Boolean(), nullable=False),
        sa.Column("problems", sa.Text(), nullable=False),
        sa.Column("total_bytes", sa.Integer(), nullable=False),
        sa.Column("first_seen", sa.DateTime(), nullable=False),
        sa.Column("last_seen", sa.DateTime(), nullable=False),
        sa.Column("quarantined", sa.Boolean(), nullable=False),
        sa.Column("quarantine_reason", sa.Text(), nullable=True),
        sa.Column("collected", sa.Boolean(), nullable=False),
        sa.UniqueConstraint("model", "digest", name="uq_snapshot_model_digest"),
    )
    op.create_index("ix_snapshots_model", "snapshots", ["model"])
    op.create_index("ix_snapshots_digest", "snapshots", ["digest"])
    op.create_table(
        "deployments",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("digest", sa.String(64), nullable=True),
        sa.Column("previous_digest", sa.String(64), nullable=True),
        sa.Column("step", sa.String(24), nullable=False),
        sa.Column("actor", sa.String(64), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column("outcome", sa.String(16), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
    )
    op.create_index("ix_deployments_model", "deployments", ["model"])
    op.create_index("ix_deployments_open", "deployments", ["finished_at"])
    op.create_table(
        "audit_events",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("time", sa.DateTime(), nullable=False),
        sa.Column("actor", sa.String(64), nullable=False),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("model", sa.String(128), nullable=True),
        sa.Column("digest", sa.String(64), nullable=True),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("duration_ms", sa.Integer(), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("host", sa.String(128), nullable=False),
    )
    op.create_index("ix_audit_model_time", "audit_events", ["model", "time"])
    op.create_index("ix_audit_time", "audit_events", ["time"])
    op.create_table(
        "serving_log",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("time", sa.DateTime(), nullable=False),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("digest", sa.String(64), nullable=True),
        sa.Column("versions", sa.Text(), nullable=False),
        sa.Column("host", sa.String(128), nullable=False),
    )
    op.create_index("ix_serving_model_time", "serving_log", ["model", "time"])


def downgrade() -> None:
    op.drop_table("serving_log")
    op.drop_table("audit_events")
    op.drop_table("deployments")
    op.drop_table("snapshots")
    op.drop_table("models")
