"""Webhooks: an outbox written with each audit event, and one delivery row per (event, webhook).

`webhook_outbox` gets one row per audit event IN THE SAME TRANSACTION as the event
(controlplane/store/outbox.py), so an event the registry recorded is never missed by the webhooks, even
when the daemon dies right after. The delivery worker (controlplane/webhooks/worker.py) turns each
outbox row into `webhook_deliveries` rows, one per webhook configured to receive its action, and deletes
the outbox row, in one transaction. A delivery keeps its id (the `X-Tritonctl-Delivery` header), the
exact body it sends and signs, its attempts and the receiver's last answer; it ends `delivered` or, after
24 h of retries, `failed`. ix_webhook_deliveries_lane finds the oldest open delivery of each
(url, model) lane: deliveries go out in order per model.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def _drop_leftovers() -> None:
    """An upgrade by an earlier tritonctl that failed in 0007 left these tables behind with the registry
    still at 0005 (its migrations did not run in a transaction: SQLite's driver committed each CREATE
    TABLE). Empty, they are that upgrade's leftovers (nothing writes them below 0006): drop them and
    create them again. With rows they are something else: left alone, the CREATE fails and says so."""
    conn = op.get_bind()
    tables = set(sa.inspect(conn).get_table_names())
    for name in ("webhook_deliveries", "webhook_outbox"):
        if name in tables and conn.execute(sa.text(f"SELECT count(*) FROM {name}")).scalar_one() == 0:
            op.drop_table(name)  # its indexes go with it


def upgrade() -> None:
    _drop_leftovers()
    op.create_table(
        "webhook_outbox",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("audit_id", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
    )
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("audit_id", sa.Integer(), nullable=False),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("model", sa.String(128), nullable=True),
        sa.Column("url", sa.String(2048), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(), nullable=False),
        sa.Column("retry_until", sa.DateTime(), nullable=False),
        sa.Column("last_attempt_at", sa.DateTime(), nullable=True),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("answer", sa.Text(), nullable=False),
    )
    op.create_index("ix_webhook_deliveries_lane", "webhook_deliveries", ["state", "url", "model", "audit_id"])
    op.create_index("ix_webhook_deliveries_created", "webhook_deliveries", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_webhook_deliveries_created", table_name="webhook_deliveries")
    op.drop_index("ix_webhook_deliveries_lane", table_name="webhook_deliveries")
    op.drop_table("webhook_deliveries")
    op.drop_table("webhook_outbox")
