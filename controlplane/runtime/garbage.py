"""gc: drop the content of snapshots nobody can return to, keeping their registry rows.

Apart from controlplane.views.queries because it deletes: queries only reads. Kept are each model's active
snapshot, its tagged ones and its `keep` newest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from controlplane.documents.results import GcResult
from controlplane.errors import UsageError

if TYPE_CHECKING:
    from controlplane.snapshot import ContentStore
    from controlplane.store.registry import Registry


def collect_garbage(registry: Registry, content: ContentStore, keep: int) -> GcResult:
    """Keep each model's active snapshot, its tagged ones and its `keep` newest; drop the rest's content (not
    their rows)."""
    if keep < 0:
        raise UsageError("--keep: must be 0 or more")
    kept: set[str] = set()
    dropped: dict[str, list[str]] = {}
    tagged = {(t.model, t.digest) for t in registry.list_tags()}  # a tag never names collected content
    for model in registry.list_models():
        snaps = [s for s in registry.list_snapshots(model.name) if not s.collected]
        for index, snap in enumerate(snaps):
            if index < keep or snap.digest == model.active_digest or (model.name, snap.digest) in tagged:
                kept.add(snap.digest)
            else:
                dropped.setdefault(model.name, []).append(snap.digest)
    freed = content.gc(kept)
    for model_name, digests in dropped.items():
        registry.mark_collected(model_name, [d for d in digests if d not in kept])
    count = sum(len([d for d in ds if d not in kept]) for ds in dropped.values())
    return GcResult(snapshots_removed=count, snapshots_kept=len(kept), bytes_freed=freed)
