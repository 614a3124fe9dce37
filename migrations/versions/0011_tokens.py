"""tokens: personal tokens of the control API, and the claimed actor beside the authenticated one.

`tokens`: one row per personal token (`tritonctl token create`): its public id (the row's key), name,
role, a slow hash of its secret (never the secret), creator, creation, expiry and revocation.
`audit_events.claimed`: what the caller declared in `x-tritonctl-actor` when it differs from the
authenticated identity in `actor` (NULL: no claim, or the same).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-10
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tokens",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("name", sa.String(64), nullable=False, unique=True),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("secret_hash", sa.String(256), nullable=False),
        sa.Column("creator", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=True),
        sa.Column("revoked_at", sa.DateTime(), nullable=True),
        sa.Column("revoked_by", sa.String(64), nullable=True),
    )
    with op.batch_alter_table("audit_events") as batch:
        batch.add_column(sa.Column("claimed", sa.String(64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("audit_events") as batch:
        batch.drop_column("claimed")
    op.drop_table("tokens")
