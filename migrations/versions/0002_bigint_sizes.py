"""Snapshot sizes as 64-bit integers: a model over 2 GiB overflowed PostgreSQL's 32-bit INTEGER.

(SQLite stores every INTEGER in up to 8 bytes, so there it only changes the declared type.)

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("snapshots") as batch:
        batch.alter_column("total_bytes", existing_type=sa.Integer(), type_=sa.BigInteger(),
                           existing_nullable=False)


def downgrade() -> None:
    with op.batch_alter_table("snapshots") as batch:
        batch.alter_column("total_bytes", existing_type=sa.BigInteger(), type_=sa.Integer(),
                           existing_nullable=False)
