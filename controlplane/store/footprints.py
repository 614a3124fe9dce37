"""Footprints (migration 0008): the memory each (model, digest) took when it loaded, measured by
controlplane/memory/footprint.py, read by the memory budget, `status` and the fleet's placement.
`Registry` (controlplane/store/registry.py) is a `Footprints`; each method is one short transaction of
the registry's (`_session`).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager

from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane.store import schema
from controlplane.store.records import FootprintRecord, utcnow


class Footprints:
    """The footprints table, over the registry's transactions."""

    def _session(self) -> AbstractContextManager[Session]:
        raise NotImplementedError  # the registry's transaction

    def record_footprint(self, model: str, digest: str, memory_mb: float | None, gpu_memory_mb: float | None,
                         source: str) -> FootprintRecord:
        """Record (or replace) the footprint of `digest` of `model`."""
        now = utcnow()
        with self._session() as session:
            row = session.get(schema.Footprint, (model, digest))
            if row is None:
                row = schema.Footprint(model=model, digest=digest)
                session.add(row)
            row.memory_mb, row.gpu_memory_mb, row.source, row.measured_at = memory_mb, gpu_memory_mb, source, now
        return FootprintRecord(model, digest, memory_mb, gpu_memory_mb, source, now)

    def footprints(self, models: Sequence[str] | None = None) -> dict[tuple[str, str], FootprintRecord]:
        """Recorded footprints by (model, digest), of `models` (None: every model)."""
        query = select(schema.Footprint)
        if models is not None:
            query = query.where(schema.Footprint.model.in_(list(models)))
        with self._session() as session:
            return {(r.model, r.digest): FootprintRecord(r.model, r.digest, r.memory_mb, r.gpu_memory_mb, r.source,
                                                         r.measured_at)
                    for r in session.scalars(query)}
