"""One method per operation of the running control plane (load, unload, rollback, status, policy...).

`ControlPlane` wires the adapters together (registry, content store, serving repository, Triton
client, deployer) and is what the control API and the daemon's loop call. It decides; the API only
translates and the CLI only renders. Read-only history queries that work without the daemon live in
`controlplane.queries`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controlplane import queries
from controlplane.config import Settings
from controlplane.deploy import Deployer, Outcome, ProgressFn
from controlplane.errors import NotFoundError, ObjectStoreError, SnapshotError, StoreError, TritonctlError, UsageError
from controlplane.modelconfig import validate_model_dir
from controlplane.names import validate_digest, validate_model_name
from controlplane.publish import ServingRepository
from controlplane.reconcile import SERVING_STATES, Drift, plan
from controlplane.snapshot import ContentStore
from controlplane.store.records import ModelRecord, SnapshotRecord
from controlplane.store.registry import AuditEntry, Registry
from controlplane.triton.client import IndexEntry, TritonClient

log = logging.getLogger("tritonctl.service")

SYSTEM_ACTOR = "tritonctl"
WATCHER_ACTOR = "watcher"


@dataclass
class Counters:
    """What the daemon tells systemd and metrics about itself."""

    last_action: str = "starting"
    triton_reachable: bool = False
    drift: tuple[Drift, ...] = ()


class ControlPlane:
    """The running control plane: every operation the daemon offers."""

    def __init__(
        self,
        settings: Settings,
        registry: Registry,
        store: ContentStore,
        serving: ServingRepository,
        triton: TritonClient,
        on_outcome: Callable[[Outcome], None] | None = None,
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.store = store
        self.serving = serving
        self.triton = triton
        self.counters = Counters()
        self._extra_on_outcome = on_outcome
        self.deployer = Deployer(
            registry, store, serving, triton, load_timeout_s=settings.load_timeout_s, on_outcome=self._note_outcome
        )
        self._capture_locks: dict[str, threading.RLock] = {}
        self._guard = threading.Lock()
        self.reschedule: Callable[[str, float], None] | None = None  # set by the daemon (watcher)
        self.source: Any = None  # an S3Source when the repository is s3:// (set by the daemon)
        # Set by the daemon with --fleet: `load` rolls the digest out to every host (docs/fleet.md).
        self.fleet_load: Callable[[str, str, str, bool, ProgressFn | None], Outcome] | None = None

    def _note_outcome(self, outcome: Outcome) -> None:
        self.counters.last_action = f"{outcome.action} {outcome.model}: {outcome.outcome}"
        if self._extra_on_outcome:
            self._extra_on_outcome(outcome)

    def _capture_lock(self, model: str) -> threading.RLock:
        """Serializes a model's capture-and-decide pipeline, so two settled events for the same
        content cannot both decide to deploy it (the second sees the first's outcome)."""
        with self._guard:
            return self._capture_locks.setdefault(model, threading.RLock())

    def effective_policy(self, model: ModelRecord) -> str:
        return model.policy or self.settings.policy

    # -- snapshots ------------------------------------------------------------------------------

    def capture(self, model: str, actor: str = WATCHER_ACTOR, *, settled: bool = True) -> SnapshotRecord:
        """Snapshot the model's source now, validate the immutable tree, record it (once per content).

        `settled` (the watcher's captures): refuse, as "still changing", a source that changed within
        the settle window, measured now, not when the watcher fired (the capture may run later, when
        the writer has begun its next edit). `tritonctl load` asks for what is there now."""
        validate_model_name(model)
        if self.settings.repository is None and self.source is None:
            raise UsageError("the daemon has no source repository (--repository)")
        with self._capture_lock(model):
            if self.source is not None:  # object storage: same rules, listed instead of stat'ed
                snapshot = self.source.capture(model, self.store, settled=settled)
            else:
                assert self.settings.repository is not None
                snapshot = self.store.capture(self.settings.repository / model, model,
                                              commit_marker=self.settings.commit_marker,
                                              quiet_s=self.settings.settle_s if settled else 0.0)
            tree = self.store.tree_path(snapshot.digest)
            result = validate_model_dir(tree, name=model)
            prefix = f"{tree.name}/"
            problems = [
                {
                    "file": p.file.replace(prefix, f"{model}/", 1) if p.file.startswith(prefix) else p.file,
                    "field": p.field,
                    "message": p.message,
                    "severity": p.severity,
                }
                for p in result.problems
            ]
            record, new = self.registry.record_snapshot(
                model,
                snapshot.digest,
                snapshot.manifest_json(),
                config=result.config,
                versions=result.versions,
                served_versions=result.served_versions,
                valid=result.ok,
                problems=problems,
                total_bytes=snapshot.total_bytes,
            )
        if new:
            message = "recorded" if record.valid else f"invalid: {record.first_error}"
            self.registry.audit(
                AuditEntry(actor, "snapshot", model, record.digest, "ok" if record.valid else "invalid", message)
            )
            log.info("%s snapshot %s %s", model, record.digest[:12], message)
        return record

    def handle_settled(self, model: str) -> Outcome | None:
        """The watcher saw `model` settle: record what it now holds; deploy it if policy says so."""
        try:
            validate_model_name(model)
        except UsageError as exc:
            self.registry.audit(AuditEntry(WATCHER_ACTOR, "snapshot", None, None, "invalid", str(exc)))
            return None
        if not self.source_has(model):
            existing = self.registry.find_model(model)
            if existing is not None and existing.removed_at is None:
                self.registry.update_model(model, removed_at=queries.now())
                self.registry.audit(
                    AuditEntry(WATCHER_ACTOR, "remove", model, existing.active_digest, "ok",
                               "removed from the source repository; what serves keeps serving")
                )
            return None
        with self._capture_lock(model):
            return self._capture_and_decide(model)

    def source_has(self, model: str) -> bool:
        """Whether the source repository (a directory or object storage) holds `model` now."""
        if self.source is not None:
            return bool(self.source.exists(model))
        assert self.settings.repository is not None
        return (self.settings.repository / model).is_dir()

    def _capture_and_decide(self, model: str) -> Outcome | None:
        try:
            record = self.capture(model)
        except (StoreError, ObjectStoreError) as exc:
            # The registry or object storage is busy or unreachable: nothing was recorded; try again later.
            log.error("%s: %s; retrying after the settle window", model, exc)
            if self.reschedule:
                self.reschedule(model, max(self.settings.settle_s, 1.0))
            return None
        except SnapshotError as exc:
            text = str(exc)
            if ("still changing" in text or "on hold" in text or "awaiting" in text) and self.reschedule:
                log.info("%s: %s; retrying after the settle window", model, text)
                self.reschedule(model, self.settings.settle_s)
            else:
                self.registry.audit(AuditEntry(WATCHER_ACTOR, "snapshot", model, None, "failed", text))
            return None
        current = self.registry.ensure_model(model)
        if current.removed_at is not None:
            self.registry.update_model(model, removed_at=None)
        if (
            self.effective_policy(current) != "auto"
            or current.pinned
            or current.state == "unloaded"
            or not record.valid
            or record.quarantined
            or record.digest == current.active_digest
        ):
            return None
        return self.deployer.deploy(model, record.digest, WATCHER_ACTOR)

    # -- operations -----------------------------------------------------------------------------

    def load(
        self, model: str, actor: str, digest: str = "", force: bool = False, progress: ProgressFn | None = None
    ) -> Outcome:
        validate_model_name(model)
        if digest:
            digest = validate_digest(digest)
            target = self.registry.get_snapshot(model, digest).digest
        else:
            target = self.capture(model, actor, settled=False).digest
        current = self.registry.find_model(model)
        if current is not None and current.pinned and target != current.active_digest and not force:
            raise UsageError(f"model '{model}' is pinned to {str(current.active_digest)[:12]}; unpin it or use --force")
        if self.fleet_load is not None:
            return self.fleet_load(model, target, actor, force, progress)
        return self.deployer.deploy(model, target, actor, force=force, progress=progress)

    def unload(self, model: str, actor: str, dependents: bool = False, progress: ProgressFn | None = None) -> Outcome:
        validate_model_name(model)
        return self.deployer.unload(model, actor, dependents, progress)

    def rollback(self, model: str, actor: str, to: str = "", progress: ProgressFn | None = None) -> Outcome:
        validate_model_name(model)
        if to:
            to = validate_digest(to)
        return self.deployer.rollback(model, actor, to or None, progress)

    def set_policy(self, model: str, policy: str, actor: str) -> dict[str, Any]:
        validate_model_name(model)
        if policy not in ("auto", "manual", "inherit"):
            raise UsageError(f"policy '{policy}': expected auto, manual or inherit")
        record = self.registry.update_model(model, policy=None if policy == "inherit" else policy)
        self.registry.audit(AuditEntry(actor, "policy", model, record.active_digest, "ok", f"policy {policy}"))
        return {"model": model, "policy": self.effective_policy(record), "inherited": record.policy is None}

    def set_pin(self, model: str, pinned: bool, actor: str) -> dict[str, Any]:
        validate_model_name(model)
        existing = self.registry.find_model(model)
        if existing is None:
            raise NotFoundError(f"model '{model}' is unknown to the registry")
        if pinned and not existing.active_digest:
            raise UsageError(f"model '{model}' serves nothing to pin")
        record = self.registry.update_model(model, pinned=pinned)
        action = "pin" if pinned else "unpin"
        self.registry.audit(AuditEntry(actor, action, model, record.active_digest, "ok", f"{action}ned"))
        return {"model": model, "pinned": pinned, "digest": record.active_digest}

    def gc(self, keep: int, actor: str) -> dict[str, Any]:
        result = queries.collect_garbage(self.registry, self.store, keep)
        self.registry.audit(
            AuditEntry(actor, "gc", None, None, "ok",
                       f"removed {result['snapshots_removed']} snapshots, freed {result['bytes_freed']} bytes")
        )
        return result

    # -- state ----------------------------------------------------------------------------------

    def _triton_view(self) -> tuple[list[IndexEntry], dict[str, str | None]]:
        index = self.triton.index()
        served: dict[str, str | None] = {}
        for name in sorted({e.name for e in index if e.state == "READY"}):
            try:
                served[name] = self.triton.served_digest(name)
            except TritonctlError:
                served[name] = None
        return index, served

    def status(self, models: list[str] | None = None) -> dict[str, Any]:
        for name in models or []:
            validate_model_name(name)
        everything = records = self.registry.list_models()
        if models:
            known = {m.name for m in records}
            for name in models:
                if name not in known:
                    raise NotFoundError(f"model '{name}' is unknown to the registry")
            records = [m for m in records if m.name in models]
        try:
            index, served = self._triton_view()
            reachable = True
        except TritonctlError:
            index, served, reachable = [], {}, False
        drift = {d.model: d for d in plan(everything, index, served).drift} if reachable else {}
        rows = []
        for model in records:
            versions = [
                {"version": e.version, "state": e.state, "reason": e.reason} for e in index if e.name == model.name
            ]
            rows.append(
                queries.status_row(model, self.effective_policy(model), versions, drift.get(model.name), reachable)
            )
        return {"triton_reachable": reachable, "triton_url": self.triton.url, "models": rows}

    def reconcile(self) -> list[Drift]:
        """Compare desired and actual; restore what should serve; finish interrupted deployments."""
        if not self.triton.server_live():
            self.counters.triton_reachable = False
            return []
        self.counters.triton_reachable = True
        for deployment in self.registry.open_deployments():
            if self.deployer.lock(deployment.model).locked():
                continue  # in flight in this process, not interrupted
            outcome = self.deployer.recover(deployment)
            log.warning("%s: recovered interrupted %s: %s", deployment.model, deployment.kind, outcome.message)
        busy = self.deployer.busy_models()
        index, served = self._triton_view()
        # plan() looks only at models meant to serve: do not list every model of the repository
        result = plan(self.registry.list_models(states=SERVING_STATES), index, served, busy)
        for model, digest in result.restore:
            outcome = self.deployer.restore(model, digest, "reconcile: Triton did not serve it")
            log.warning("%s: %s", model, outcome.message)
        self.counters.drift = tuple(d for d in result.drift if d.kind == "unmanaged")
        return result.drift

    def snapshot_path(self, model: str, digest: str) -> Path:
        return self.store.tree_path(self.registry.get_snapshot(model, digest).digest)
