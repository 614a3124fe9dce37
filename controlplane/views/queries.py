"""Read-only questions to the registry and the store, answerable while the daemon is down.

versions, diff, audit (with relative times), "what served at T" and status rows. gc, which deletes, is
controlplane.runtime.garbage.
Results are the dataclasses of `controlplane.documents.results` (docs/json.md is their `to_json()`).
"""

from __future__ import annotations

import difflib
import json
from typing import TYPE_CHECKING, Any

from controlplane.bake.canary import CANARY_ACTION, histories
from controlplane.bake.warn import WARNING, warnings_by_digest
from controlplane.base.clock import now as now  # moments as text (base/clock.py)
from controlplane.base.clock import parse_time as parse_time
from controlplane.documents.results import (
    AuditResult,
    DiffResult,
    FileChange,
    FileSize,
    ServingAtResult,
    StatusRow,
    VersionRow,
    VersionsResult,
    VersionState,
)
from controlplane.errors import NotFoundError, UsageError
from controlplane.names import validate_digest, validate_model_name
from controlplane.store.records import OUTCOMES, AuditQuery, ModelRecord

if TYPE_CHECKING:  # the read commands pass a SqliteReader, which answers the same methods: no SQLAlchemy
    from controlplane.deploy.reconcile import Drift
    from controlplane.snapshot import ContentStore
    from controlplane.store.registry import Registry

TEXT_SUFFIXES = (".pbtxt", ".py", ".json", ".txt", ".md", ".yaml", ".yml", ".toml", ".cfg", ".ini")
MAX_TEXT_DIFF_BYTES = 1 << 20


def status_row(
    model: ModelRecord, policy: str, versions: list[VersionState], drift: Drift | None, reachable: bool
) -> StatusRow:
    return StatusRow(
        model=model.name,
        state=model.state,
        versions=versions,
        digest=model.active_digest,
        since=model.active_since,
        policy=policy,
        pinned=model.pinned,
        drift=drift.kind if drift else (None if reachable else "unknown"),
        drift_detail=drift.detail if drift else None,
        last_error=model.last_error,
        removed=model.removed_at is not None,
    )


def versions(registry: Registry, model: str) -> VersionsResult:
    validate_model_name(model)
    record = registry.find_model(model)
    if record is None:
        raise NotFoundError(f"model '{model}' is unknown to the registry")
    footprints = registry.footprints([model])
    completed = registry.completed_configs([model])
    warned = warnings_by_digest(registry.query_audit(AuditQuery(model=model, action="bake", outcome=WARNING,
                                                                limit=1000)))
    rollouts = histories(registry.query_audit(AuditQuery(model=model, action=CANARY_ACTION, limit=1000)))
    return VersionsResult(model, [VersionRow(snap, snap.digest == record.active_digest,
                                             footprint=footprints.get((model, snap.digest)),
                                             bake_warning=warned.get(snap.digest),
                                             completed_config=completed.get((model, snap.digest)),
                                             canary=rollouts.get(snap.digest))
                                  for snap in registry.list_snapshots(model)])


def _entries(registry: Registry, model: str, digest: str) -> tuple[str, dict[str, Any]]:
    from controlplane.snapshot import Snapshot  # only diff reads manifests: versions and audit skip the import

    snap = registry.get_snapshot(model, digest)
    parsed = Snapshot.from_manifest_json(model, snap.manifest)
    if snap.collected:
        raise NotFoundError(f"snapshot {snap.digest[:12]} of '{model}' was removed by gc")
    return snap.digest, {e.path: e for e in parsed.entries if e.kind == "file"}


def _text(content: ContentStore, sha256: str) -> list[str] | None:
    path = content.object_path(sha256)
    try:
        if path.stat().st_size > MAX_TEXT_DIFF_BYTES:
            return None
        return path.read_bytes().decode("utf-8").splitlines(keepends=True)
    except (OSError, UnicodeDecodeError):
        return None


def diff(registry: Registry, content: ContentStore, model: str, digest_a: str, digest_b: str) -> DiffResult:
    """Files added / removed / changed between two snapshots, with unified diffs of text files."""
    validate_model_name(model)
    digest_a, digest_b = validate_digest(digest_a), validate_digest(digest_b)
    full_a, a = _entries(registry, model, digest_a)
    full_b, b = _entries(registry, model, digest_b)
    added = [FileSize(p, b[p].size) for p in sorted(set(b) - set(a))]
    removed = [FileSize(p, a[p].size) for p in sorted(set(a) - set(b))]
    changed = []
    for path in sorted(set(a) & set(b)):
        if a[path].sha256 == b[path].sha256 and a[path].mode == b[path].mode:
            continue
        text_diff = None
        if path.endswith(TEXT_SUFFIXES):
            old, new = _text(content, a[path].sha256), _text(content, b[path].sha256)
            if old is not None and new is not None:
                text_diff = "".join(
                    difflib.unified_diff(old, new, f"{full_a[:12]}/{path}", f"{full_b[:12]}/{path}")
                )
        changed.append(FileChange(path, a[path].size, b[path].size, text_diff))
    return DiffResult(model, full_a, full_b, added, removed, changed,
                      completed_config_diff(registry, model, full_a, full_b))


COMPLETED_LABEL = "config completed by Triton"


def completed_config_diff(registry: Registry, model: str, a: str, b: str) -> str | None:
    """A unified diff of the configs Triton completed for contents `a` and `b` (as JSON, keys sorted): ""
    when they are the same, None when neither has one recorded (controlplane/store/completed.py)."""
    completed = registry.completed_configs([model])
    configs = [completed.get((model, digest)) for digest in (a, b)]
    if configs == [None, None]:
        return None
    old, new = ((json.dumps(c.config, indent=2, sort_keys=True) + "\n" if c else "").splitlines(keepends=True)
                for c in configs)
    return "".join(difflib.unified_diff(old, new, f"{a[:12]}/{COMPLETED_LABEL}", f"{b[:12]}/{COMPLETED_LABEL}"))


def audit(
    registry: Registry,
    *,
    model: str | None = None,
    action: str | None = None,
    outcome: str | None = None,
    actor: str | None = None,
    since: str | None = None,
    until: str | None = None,
    limit: int = 100,
) -> AuditResult:
    query = audit_query(model=model, action=action, outcome=outcome, actor=actor, since=since, until=until,
                        limit=limit)
    return AuditResult(list(registry.query_audit(query)))


def audit_query(*, model: str | None = None, action: str | None = None, outcome: str | None = None,
                actor: str | None = None, since: str | None = None, until: str | None = None,
                limit: int = 100) -> AuditQuery:
    """The audit filters checked (UsageError naming the flag) and parsed; the control API checks them with
    `--at` too, where they do not apply."""
    if model is not None:
        validate_model_name(model)
    if outcome is not None and outcome not in OUTCOMES:
        raise UsageError(f"--outcome: '{outcome}' is not one of {', '.join(OUTCOMES)}")
    if limit < 1:
        raise UsageError("--limit: must be at least 1")
    return AuditQuery(
        model=model,
        action=action,
        outcome=outcome,
        actor=actor,
        since=parse_time(since, "--since") if since else None,
        until=parse_time(until, "--until") if until else None,
        limit=limit,
    )


def serving_at(registry: Registry, when: str, models: list[str] | None = None) -> ServingAtResult:
    moment = parse_time(when, "--at")
    for name in models or []:
        validate_model_name(name)
    rows = registry.serving_at(moment, models or None)
    return ServingAtResult(moment, list(rows))
