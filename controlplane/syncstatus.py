"""Is what serves the source's newest content, and if not, why: `status`'s sync and sync_reason.

Pure functions over registry records (no I/O), so `status` and the deploy decision agree on what
holds a model: manual policy, a pin, an unload, or an operator's rollback (which holds until the
source changes again or an operator loads).
"""

from __future__ import annotations

import threading
from datetime import datetime

from controlplane.decision import rollback_holds
from controlplane.deploy.causes import Retry
from controlplane.store.records import DeploymentRecord, ModelRecord, SourceHead
from controlplane.vocab import SERVING_STATES, ModelState, Policy, Result, SyncState

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


def settling_reason(since_s: float | None, waits: str | None = None) -> str:
    """`sync_reason` of a model the watcher has a check pending for: the seconds since its last change
    seen (None: none since the watcher was asked to look again) and why its last capture was put off."""
    if since_s is None:
        return f"settling: {waits}" if waits else "settling: the source is looked at again shortly"
    return f"settling: last change {since_s:.1f} s ago" + (f" (last look: {waits})" if waits else "")


class InHand:
    """Models the source handed on and not handled yet ("capturing"), and those the start-up scan
    still has to handle ("start-up scan"): `status` shows them sync pending. Safe from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._handed: dict[str, int] = {}
        self._startup: set[str] = set()

    def handed_on(self, model: str) -> None:
        with self._lock:
            self._handed[model] = self._handed.get(model, 0) + 1

    def handled(self, model: str) -> None:
        with self._lock:
            left = self._handed.get(model, 0) - 1
            if left > 0:
                self._handed[model] = left
            else:
                self._handed.pop(model, None)

    def starting(self, models: set[str]) -> None:
        """The start-up scan's models (an empty set: the scan is over)."""
        with self._lock:
            self._startup = set(models)

    def started(self, model: str) -> None:
        with self._lock:
            self._startup.discard(model)

    def holds(self, model: str) -> bool:
        """Whether `model` was handed on or is the start-up scan's, and not handled yet."""
        with self._lock:
            return model in self._handed or model in self._startup

    def reasons(self, settling: dict[str, float | None], waits: dict[str, str]) -> dict[str, str]:
        """`status`'s pending reasons: what the source is settling (`settling`, with why its last capture
        was put off, `waits`), then what was handed on and is not captured yet."""
        reasons = {model: settling_reason(since, waits.get(model)) for model, since in settling.items()}
        with self._lock:
            handed, startup = list(self._handed), list(self._startup)
        for model in handed:
            reasons.setdefault(model, "capturing")
        for model in startup:
            reasons.setdefault(model, "start-up scan")
        return reasons


def track_sync(model: ModelRecord, tag: str, tag_digest: str | None, *, busy: bool = False) -> tuple[SyncState, str]:
    """(sync, sync_reason) of a model that tracks a tag (controlplane/tags.py): synced when it serves the
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
