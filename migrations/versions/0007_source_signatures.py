"""source_signatures: each model's newest recorded source content, its stat signature and its steps.

A start compares every model's stat signature (or an object store's listing signature) with the one
recorded with its newest content, and captures only the models whose signature differs or is not
`trusted` (recorded within the racy window of a change, controlplane/source/poller.py): a restart with nothing
changed reads no file (controlplane/startup/scan.py). `steps` is the ensemble's step models of that
content (JSON list; NULL: no ensemble): the change sets' ensemble graph, read in one query instead of
re-reading every source config.

Existing registries are filled from each model's newest snapshot, not trusted: their first start
after the upgrade captures every model once (the content is the same, so nothing new is recorded) and
records the signatures.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

BATCH = 500  # models per backfill batch


def _steps(config_json: str | None) -> str | None:
    try:
        config = json.loads(config_json) if config_json else None
    except ValueError:
        return None
    if not isinstance(config, dict) or config.get("platform") != "ensemble":
        return None
    names: list[str] = []
    for step in (config.get("ensemble_scheduling") or {}).get("step", []):
        name = step.get("model_name") if isinstance(step, dict) else None
        if name and name not in names:
            names.append(name)
    return json.dumps(names)


def upgrade() -> None:
    table = op.create_table(
        "source_signatures",
        sa.Column("model", sa.String(128), primary_key=True),
        sa.Column("signature", sa.String(64), nullable=True),
        sa.Column("digest", sa.String(64), nullable=False),
        sa.Column("steps", sa.Text(), nullable=True),
        sa.Column("trusted", sa.Boolean(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(), nullable=False),
    )
    # Read and written through typed columns (a SQLite DATETIME is text the DateTime type parses and
    # writes back; selected through text() it came back a str the insert refused), a batch of models at a
    # time: a large registry never sits in memory whole.
    conn = op.get_bind()
    snapshots = sa.table("snapshots", sa.column("id", sa.Integer()), sa.column("model", sa.String()),
                         sa.column("digest", sa.String()), sa.column("config", sa.Text()),
                         sa.column("last_seen", sa.DateTime()))
    after = ""
    while True:
        models = [row[0] for row in conn.execute(
            sa.select(snapshots.c.model).where(snapshots.c.model > after).distinct()
            .order_by(snapshots.c.model).limit(BATCH))]
        if not models:
            break
        heads = {}  # the last row per model is its newest content
        for model, digest, config, last_seen in conn.execute(
                sa.select(snapshots.c.model, snapshots.c.digest, snapshots.c.config, snapshots.c.last_seen)
                .where(snapshots.c.model.in_(models))
                .order_by(snapshots.c.model, snapshots.c.last_seen, snapshots.c.id)):
            heads[model] = {"model": model, "signature": None, "digest": digest, "steps": _steps(config),
                            "trusted": False, "recorded_at": last_seen}
        conn.execute(table.insert(), list(heads.values()))
        after = models[-1]


def downgrade() -> None:
    op.drop_table("source_signatures")
