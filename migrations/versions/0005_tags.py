"""Tags: named versions of a model (`stable`, `canary`), the history of every tag move, tracked tags.

`tags` holds where each tag points now (one row per model and name). `tag_moves` is append-only: every
move, deletion and failed move, with the digest before and after; `tags MODEL --at T` seeks each
(model, name)'s last move at or before T through ix_tag_moves_model_name_time. `tag_tracks` names the
tag a model follows (`policy MODEL track:NAME`; its `models.policy` then reads `track`). A table, not a
column of `models`, so code reading `models` at an older revision keeps working.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tags",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("moved_by", sa.String(64), nullable=False),
        sa.Column("moved_at", sa.DateTime(), nullable=False),
        sa.UniqueConstraint("model", "name", name="uq_tag_model_name"),
    )
    op.create_table(
        "tag_moves",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("time", sa.DateTime(), nullable=False),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("name", sa.String(63), nullable=False),
        sa.Column("old_digest", sa.String(64), nullable=True),
        sa.Column("new_digest", sa.String(64), nullable=True),
        sa.Column("attempted_digest", sa.String(64), nullable=True),
        sa.Column("actor", sa.String(64), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("host", sa.String(128), nullable=False),
    )
    op.create_index("ix_tag_moves_model_name_time", "tag_moves", ["model", "name", "time"])
    op.create_index("ix_tag_moves_time", "tag_moves", ["time"])
    op.create_table(
        "tag_tracks",
        sa.Column("model", sa.String(128), primary_key=True),
        sa.Column("tag", sa.String(63), nullable=False),
        sa.Column("set_by", sa.String(64), nullable=False),
        sa.Column("set_at", sa.DateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("tag_tracks")
    op.drop_index("ix_tag_moves_time", table_name="tag_moves")
    op.drop_index("ix_tag_moves_model_name_time", table_name="tag_moves")
    op.drop_table("tag_moves")
    op.drop_table("tags")
