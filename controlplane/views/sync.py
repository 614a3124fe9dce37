"""Is what serves the source's newest content, and if not, why: `status`'s sync and sync_reason.

Pure functions over registry records (no I/O), so `status` and the deploy decision agree on what
holds a model: manual policy, a pin, an unload, or an operator's rollback (which holds until the
source changes again or an operator loads).
"""

from __future__ import annotations

from datetime import datetime

from controlplane.deploy.causes import Retry
from controlplane.intake.decision import rollback_holds
from controlplane.store.records import DeploymentRecord, ModelRecord, SourceHead
from controlplane.vocab import SERVING_STATES, SMOKE_FAILED, ModelState, Policy, Result, SyncState

SYNC_STATES = tuple(state.value for state in SyncState)


def _short(digest: str | None) -> str:
    return (digest or "none")[:12]


def _clock(moment: datetime | None) -> str:
    return f"{moment:%Y-%m-%d %H:%M}Z" if moment is not None else "?"


def sync_state(
    model: ModelRecord,
    policy: str,
    head: SourceHead | None,
    last: DeploymentRecord | None,
    *,
    busy: bool = False,
    retry: Retry | None = None,
    settling: str | None = None,
) -> tuple[SyncState, str]:
    """(sync, sync_reason) for one model; the reason is one line an operator can act on.

    `busy`: a deploy runs now; `retry`: an environment fault's backoff; `settling`: the source is
    changing or its content is being captured (the watcher's reason, `settling_reason`)."""
    name = model.name
    serves = f"{_short(model.active_digest)} serves" if model.active_digest else "nothing serves"
    if model.removed_at is not None:
        return SyncState.REMOVED, f"removed from the source at {_clock(model.removed_at)}; {serves}"
    if busy:
        return SyncState.PENDING, "a deploy or capture is in progress"
    if settling:  # the source is changing, or its new content is being captured
        return SyncState.PENDING, settling
    if retry is not None:
        return SyncState.PENDING, (f"last {retry.action} of {_short(retry.digest)} failed ({retry.reason}); "
                           f"next retry in {retry.seconds_left()} s")
    if head is None:
        return SyncState.PENDING, "the source's content is not recorded yet"
    if not needs_last_deployment(model, head):  # synced: one rule, the one `status` reads deployments by
        note = "; degraded: " + (model.last_error or "") if model.state == ModelState.DEGRADED else ""
        return SyncState.SYNCED, f"serving the source's newest content {_short(head.digest)}{note}"
    if not head.valid:
        return SyncState.INVALID, f"source content {_short(head.digest)} is invalid: {head.first_error}; {serves}"
    if head.quarantined and (head.quarantine_reason or "").startswith(SMOKE_FAILED):  # its content validates
        return SyncState.HELD, (f"{_short(head.digest)}: {head.quarantine_reason}; `tritonctl load {name} --force` "
                                f"tries it again; {serves}")
    if head.quarantined:
        return SyncState.INVALID, (f"source content {_short(head.digest)} is quarantined: {head.quarantine_reason}; "
                                   f"{serves}")
    if policy == Policy.ONDEMAND:  # standby until ensured (controlplane/memory/ondemand.py), or loaded on an older one
        return SyncState.HELD, f"policy ondemand; `tritonctl ensure {name}` loads {_short(head.digest)}"
    if model.state == ModelState.UNLOADED:
        by = f" by {last.actor}" if last is not None and last.kind == "unload" else ""
        return SyncState.HELD, f"unloaded{by}; `tritonctl load {name}` serves {_short(head.digest)}"
    if rollback_holds(last, head.first_seen):
        assert last is not None
        return SyncState.HELD, (f"rolled back by {last.actor} at {_clock(last.finished_at)}; deploys on the next "
                                f"change or `tritonctl load {name}`")
    if model.pinned:
        return SyncState.HELD, (f"pinned to {_short(model.active_digest)}; `tritonctl unpin {name}` deploys "
                                f"{_short(head.digest)}")
    if policy != Policy.AUTO:
        return SyncState.HELD, f"policy {policy}; `tritonctl load {name}` deploys {_short(head.digest)}"
    if last is not None and last.outcome == Result.FAILED and last.digest == head.digest:
        return SyncState.HELD, f"last deploy failed: {last.error}; `tritonctl load {name}` retries"
    return SyncState.PENDING, f"{_short(head.digest)} is waiting to be deployed"


def needs_last_deployment(model: ModelRecord, head: SourceHead | None) -> bool:
    """Whether `sync_state` can look at the model's last deployment: not when it serves the source's
    newest content (synced), so `status` of 10,000 synced models reads no deployment at all."""
    return not (head is not None and head.digest == model.active_digest and model.state in SERVING_STATES)


def track_sync(model: ModelRecord, tag: str, tag_digest: str | None, *, busy: bool = False) -> tuple[SyncState, str]:
    """(sync, sync_reason) of a model that tracks a tag (controlplane/intake/tags.py): synced when it serves the
    tag's digest, held when pinned (or unloaded), pending while the tag's digest is being deployed."""
    name = model.name
    if model.removed_at is not None:
        return SyncState.REMOVED, f"removed from the source at {_clock(model.removed_at)}"
    if busy:
        return SyncState.PENDING, "a deploy or capture is in progress"
    if tag_digest is None:
        return SyncState.HELD, f"tracks tag {tag}, which does not exist; `tritonctl tag {name} {tag} DIGEST` sets it"
    if tag_digest == model.active_digest and model.state in SERVING_STATES:
        return SyncState.SYNCED, f"serving tag {tag} ({_short(tag_digest)})"
    if model.pinned:
        return SyncState.HELD, f"pinned to {_short(model.active_digest)}; tag {tag} is at {_short(tag_digest)}"
    if model.state == ModelState.UNLOADED:
        return SyncState.HELD, f"unloaded; `tritonctl load {name} --tag {tag}` serves {_short(tag_digest)}"
    return SyncState.PENDING, f"tag {tag} is at {_short(tag_digest)}, waiting to be deployed"
