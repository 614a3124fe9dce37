"""serving_log index on (model, host, time): `audit --at T` seeks each (model, host)'s last change.

The `--at` statement groups the serving log by (model, host) (a fleet logs one row per host) and, for
each pair, finds the last change at or before T. With only (model, time) SQLite listed the pairs through
a temporary b-tree over a full index scan; (model, host, time) gives both the distinct pairs and each
seek straight from the index.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_serving_model_host_time", "serving_log", ["model", "host", "time"])


def downgrade() -> None:
    op.drop_index("ix_serving_model_host_time", table_name="serving_log")
