"""The one path from source content to a recorded snapshot: capture → validate → record → audit.

The single-host daemon (controlplane.control_plane) and the fleet (its leader records into the shared
registry, its agents import into their own) call these functions. Whether a recorded content then
deploys is controlplane.intake.decision's `decide`, the same on every path; what differs is only where the
decided deploy goes: this host's `Deployer`, or a fleet rollout (targets.FleetStrategy). The deploy
itself (publish → load → verify → smoke → commit, or roll back) is controlplane.deploy.engine.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import replace

from controlplane.documents.validation import ValidationResult
from controlplane.snapshot import ContentStore, Snapshot
from controlplane.store.records import SnapshotContent, SnapshotRecord, SourceEntry
from controlplane.store.registry import AuditEntry, Registry
from controlplane.validation.ensemblemembers import member_problems, step_models
from controlplane.validation.modelconfig import validate_model_dir
from controlplane.vocab import ERROR, Result

log = logging.getLogger("tritonctl.intake")


def validate(registry: Registry, content: ContentStore, snapshot: Snapshot,
             members: Mapping[str, SnapshotRecord] | None = None) -> SnapshotContent:
    """Validate a captured (immutable) tree; problems name the model's files, not the store's. An
    ensemble is also checked against the step models `registry` knows, or `members` (a change set's
    new step snapshots, controlplane/intake/changeset.py)."""
    return validated(registry, snapshot, validate_model_dir(content.tree_path(snapshot.digest), name=snapshot.model),
                     members)


def validated(registry: Registry, snapshot: Snapshot, result: ValidationResult,
              members: Mapping[str, SnapshotRecord] | None = None) -> SnapshotContent:
    """`validate`, given the tree's `validate_model_dir` result (the start-up scan's capture workers
    check the tree in another process, controlplane/startup/cores.py)."""
    model = snapshot.model
    prefix = f"{snapshot.digest}/"  # the tree's name in the content store
    problems = [
        {
            "file": p.file.replace(prefix, f"{model}/", 1) if p.file.startswith(prefix) else p.file,
            "field": p.field,
            "message": p.message,
            "severity": p.severity,
        }
        for p in result.problems
    ]
    ensemble = member_problems(registry, model, result.config, members) if result.ok else []
    return SnapshotContent(snapshot.manifest_json(), result.config, result.versions, result.served_versions,
                           result.ok and not any(p["severity"] == ERROR for p in ensemble), problems + ensemble,
                           snapshot.total_bytes)


def revalidate(content: ContentStore, model: str, digest: str, recorded: SnapshotContent) -> SnapshotContent:
    """A content imported from elsewhere (a fleet host from the shared store), validated again here."""
    result = validate_model_dir(content.tree_path(digest), name=model)
    return replace(recorded, config=result.config, versions=result.versions, served_versions=result.served_versions,
                   valid=result.ok)


def source_entry(model: str, digest: str, content: SnapshotContent, signature: str | None,
                 trusted: bool = True) -> SourceEntry:
    """What the registry remembers of a model's source content: the signature it was captured at and,
    for an ensemble, its steps (the change sets' ensemble graph, controlplane/intake/changeset.py)."""
    config = content.config or {}
    steps = step_models(config) if config.get("platform") == "ensemble" else None
    return SourceEntry(model, signature, digest, steps, trusted and signature is not None)


def record(registry: Registry, model: str, digest: str, content: SnapshotContent, actor: str,
           source: SourceEntry | None = None) -> SnapshotRecord:
    """Record a content (once per content) and, the first time, audit what it is. `source`: it is
    what the model's source holds now (`source_entry`)."""
    snap, new = registry.record_content(model, digest, content, source)
    if new:
        registry.audit(_recorded(snap, actor))
    return snap


def record_many(registry: Registry, items: Sequence[tuple[str, str, SnapshotContent, SourceEntry | None]],
                actor: str) -> list[SnapshotRecord]:
    """`record` of many contents in one registry transaction, each audited as `record` audits it (the
    start-up scan, controlplane/startup/record.py)."""
    return [snap for snap, _new in registry.record_contents(items, lambda snap: _recorded(snap, actor))]


def _recorded(snap: SnapshotRecord, actor: str) -> AuditEntry:
    """The audit event of a content new to the registry (and its log line)."""
    message = "recorded" if snap.valid else f"invalid: {snap.first_error}"
    log.log(logging.INFO if snap.valid else logging.WARNING, "%s snapshot %s %s", snap.model, snap.digest[:12], message)
    return AuditEntry(actor, "snapshot", snap.model, snap.digest,
                      Result.OK.value if snap.valid else Result.INVALID.value, message)

