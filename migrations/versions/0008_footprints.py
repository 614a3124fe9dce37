"""footprints: each deployed digest's memory footprint, measured at load or declared by the model.

The budget (controlplane/memory/budget.py) makes room for a deploy by the footprints of what it would load and
of what is loaded; `versions` and `status -o wide` show them. One row per (model, digest): a new
measurement of the same content replaces the old one. `memory_mb` is host memory (the python backend's
stub processes' resident memory plus the server's growth during the load); `gpu_memory_mb` is per GPU,
NULL where nothing was measured or declared. `source`: measured | declared.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "footprints",
        sa.Column("model", sa.String(128), primary_key=True),
        sa.Column("digest", sa.String(64), primary_key=True),
        sa.Column("memory_mb", sa.Float(), nullable=True),
        sa.Column("gpu_memory_mb", sa.Float(), nullable=True),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("measured_at", sa.DateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("footprints")
