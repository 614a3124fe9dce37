"""Completed configs (migration 0012): what Triton serves for a content whose python model completes its
config at load (`auto_complete_config`, controlplane/validation/autocomplete.py).

The content's own config.pbtxt is partial or missing, so its recorded config (the snapshot's) is not what
serves: the deploy reads Triton's `ModelConfig` after the load and records it here with the digest
(controlplane/validation/completions.py); `versions`, `diff` and `status -o wide` show it, an ensemble over
such a step is checked against it. One row per (model, digest), replaced by a later load of the same content.
`Registry` (controlplane/store/registry.py) is a `CompletedConfigs`; each method is one short transaction.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from contextlib import AbstractContextManager

from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane.store import schema
from controlplane.store.records import CompletedConfigRecord, utcnow

Config = dict[str, object]


class CompletedConfigs:
    """The completed_configs table, over the registry's transactions."""

    def _session(self) -> AbstractContextManager[Session]:
        raise NotImplementedError  # the registry's transaction

    def record_completed_config(self, model: str, digest: str, config: Config) -> CompletedConfigRecord:
        """Record (or replace) the config Triton completed for `digest` of `model`."""
        now = utcnow()
        text = json.dumps(config, sort_keys=True)
        with self._session() as session:
            row = session.get(schema.CompletedConfig, (model, digest))
            if row is None:
                row = schema.CompletedConfig(model=model, digest=digest)
                session.add(row)
            row.config, row.recorded_at = text, now
        return CompletedConfigRecord(model, digest, json.loads(text), now)

    def completed_configs(self, models: Sequence[str] | None = None) -> dict[tuple[str, str], CompletedConfigRecord]:
        """Recorded completed configs by (model, digest), of `models` (None: every model)."""
        query = select(schema.CompletedConfig)
        if models is not None:
            query = query.where(schema.CompletedConfig.model.in_(list(models)))
        with self._session() as session:
            return {(r.model, r.digest): CompletedConfigRecord(r.model, r.digest, json.loads(r.config), r.recorded_at)
                    for r in session.scalars(query)}

    def completed_config(self, model: str, digest: str) -> CompletedConfigRecord | None:
        """The completed config of one recorded content (full digest), None when none is recorded."""
        with self._session() as session:
            row = session.get(schema.CompletedConfig, (model, digest))
            return None if row is None else CompletedConfigRecord(model, digest, json.loads(row.config),
                                                                  row.recorded_at)
