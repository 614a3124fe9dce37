"""completed configs: the config Triton serves for a content its python model completes at load.

A python model with no config.pbtxt, or a partial one, whose `auto_complete_config` declares its inputs,
outputs and max_batch_size, serves the config Triton completed, not the one in its files. The deploy reads
it back after the load (`ModelConfig`) and records it here, one row per (model, digest), replaced by a
later load of the same content; `versions`, `diff` and `status -o wide` show it, and an ensemble over such
a step is checked against it (docs/validation.md "Configs completed at load"). `config`: the JSON of
Triton's ModelConfig, without tritonctl's digest stamp.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "completed_configs",
        sa.Column("model", sa.String(128), primary_key=True),
        sa.Column("digest", sa.String(64), primary_key=True),
        sa.Column("config", sa.Text(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("completed_configs")
