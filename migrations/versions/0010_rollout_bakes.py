"""rollout bakes: a fleet rollout's wave bakes on the figures its hosts read from their own tritonservers.

`rollout_hosts.figures`: a host's bake step's figures so far (JSON: requests, failures, success,
success_ns), written by that host while it bakes; `rollouts.bake`: the leader's pooled bake of the
rollout's last baked wave (JSON, the document `tritonctl rollouts --json` shows; NULL: never baked).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("rollout_hosts") as batch:
        batch.add_column(sa.Column("figures", sa.Text(), nullable=True))
    with op.batch_alter_table("rollouts") as batch:
        batch.add_column(sa.Column("bake", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("rollouts") as batch:
        batch.drop_column("bake")
    with op.batch_alter_table("rollout_hosts") as batch:
        batch.drop_column("figures")
