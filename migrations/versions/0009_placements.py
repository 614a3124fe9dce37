"""placements: where the fleet loaded each on-demand model, the leases that hold it, each host's budget.

The leader's placement (controlplane/fleet/placement.py) weighs each host's memory budget against what it
holds: `hosts` gains the host's `memory_budget_mb` / `gpu_memory_budget_mb` (NULL: no budget, unlimited)
and its tritonserver's HTTP URL beside the gRPC one; `host_models` gains the footprint of what the host
serves (`memory_mb`, `gpu_memory_mb`, NULL: unknown) and whether its budget may evict it (`evictable`:
idle, not pinned, protected or leased). `placements`: one row per on-demand model placed on a host
(`loading`, `loaded`, `failed`); `fleet_leases`: the leases taken through any host, renewed and released
through any host, honoured by the host the model is placed on.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("hosts") as batch:
        batch.add_column(sa.Column("http_url", sa.String(256), nullable=False, server_default=""))
        batch.add_column(sa.Column("memory_budget_mb", sa.Float(), nullable=True))
        batch.add_column(sa.Column("gpu_memory_budget_mb", sa.Float(), nullable=True))
    with op.batch_alter_table("host_models") as batch:
        batch.add_column(sa.Column("memory_mb", sa.Float(), nullable=True))
        batch.add_column(sa.Column("gpu_memory_mb", sa.Float(), nullable=True))
        batch.add_column(sa.Column("evictable", sa.Boolean(), nullable=False, server_default=sa.false()))
    op.create_table(
        "placements",
        sa.Column("model", sa.String(128), primary_key=True),
        sa.Column("host", sa.String(128), nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("memory_mb", sa.Float(), nullable=True),
        sa.Column("gpu_memory_mb", sa.Float(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
    )
    op.create_table(
        "fleet_leases",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("until", sa.DateTime(), nullable=False),
        sa.Column("actor", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
    )
    op.create_index("ix_fleet_leases_model", "fleet_leases", ["model"])


def downgrade() -> None:
    op.drop_index("ix_fleet_leases_model", "fleet_leases")
    op.drop_table("fleet_leases")
    op.drop_table("placements")
    with op.batch_alter_table("host_models") as batch:
        batch.drop_column("evictable")
        batch.drop_column("gpu_memory_mb")
        batch.drop_column("memory_mb")
    with op.batch_alter_table("hosts") as batch:
        batch.drop_column("gpu_memory_budget_mb")
        batch.drop_column("memory_budget_mb")
        batch.drop_column("http_url")
