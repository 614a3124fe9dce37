"""Fleet tables: hosts, rollouts, per-host rollout steps, what each host serves.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "hosts",
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("triton_url", sa.String(256), nullable=False),
        sa.Column("version", sa.String(32), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("last_heartbeat", sa.DateTime(), nullable=False),
    )
    op.create_table(
        "rollouts",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("previous_digest", sa.String(64), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("actor", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
    )
    op.create_index("ix_rollouts_model_state", "rollouts", ["model", "state"])
    op.create_table(
        "rollout_hosts",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("rollout_id", sa.Integer(), nullable=False),
        sa.Column("host", sa.String(128), nullable=False),
        sa.Column("wave", sa.Integer(), nullable=False),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("digest", sa.String(64), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=True),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column("message", sa.Text(), nullable=False),
    )
    op.create_index("ix_rollout_hosts_rollout", "rollout_hosts", ["rollout_id"])
    op.create_index("ix_rollout_hosts_host", "rollout_hosts", ["host", "state"])
    op.create_table(
        "host_models",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("host", sa.String(128), nullable=False),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("digest", sa.String(64), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.UniqueConstraint("host", "model", name="uq_host_model"),
    )


def downgrade() -> None:
    op.drop_table("host_models")
    op.drop_table("rollout_hosts")
    op.drop_table("rollouts")
    op.drop_table("hosts")
