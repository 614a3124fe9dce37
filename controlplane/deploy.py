"""The per-model deploy / rollback / unload state machine.

One operation at a time per model (different models deploy concurrently). Every step is recorded in
the registry before it is taken, so a crash leaves a deployment that `recover` can finish or roll
back. A deploy is: publish a fresh tree → load → verify every served version READY and the served
config carrying the new digest → smoke requests → commit. On any failure the last good snapshot is
published as a fresh tree and loaded again (Triton ignores a re-point to an old tree; see
shared/TRITON_NOTES.md). When the content is at fault (controlplane.faults) the failing digest is
quarantined and the outcome is `rolled_back`; an environment fault ends `failed`, unquarantined, and
the control plane retries it later.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from controlplane.ensemblemembers import require_members
from controlplane.errors import (
    DeployError,
    EnvironmentFault,
    ModelConfigError,
    NotFoundError,
    SnapshotError,
    TritonctlError,
    TritonError,
    TritonTimeoutError,
    TritonUnavailableError,
)
from controlplane.faults import environment_cause
from controlplane.modelconfig import stamp_parameter
from controlplane.publish import ServingRepository
from controlplane.results import Outcome, Progress  # the operation's result: one definition, in results
from controlplane.smoke import SmokeInput, load_smoke_file, run_smoke
from controlplane.snapshot import ContentStore
from controlplane.store.records import DeploymentRecord, ServingRecord, SnapshotRecord
from controlplane.store.registry import AuditEntry, Registry
from controlplane.triton.client import DIGEST_PARAMETER, TritonClient
from controlplane.triton.host import TritonHost

log = logging.getLogger("tritonctl.deploy")

SMOKE_FILE = "smoke.json"
FAULT_ENV = "TRITONCTL_FAULT"
# After a load outlived its deadline, the rollback's load queues behind it in Triton: give it this long
# on top of the usual deadline before calling the rollback failed (reconcile retries it later anyway).
ROLLBACK_GRACE_S = 60.0  # test-only: names a step at which the daemon exits abruptly


def fault_point(step: str) -> None:
    """Crash-consistency tests set TRITONCTL_FAULT=<step> to make the process die right here."""
    if os.environ.get(FAULT_ENV) == step:
        log.error("fault injection: exiting abruptly at %s", step)
        os._exit(97)


ProgressFn = Callable[[Progress], None]


class VerifyError(TritonctlError):
    """Triton answered OK but does not serve what was published."""


def stamp_digest(digest: str) -> Callable[[str], str]:
    return lambda text: stamp_parameter(text, DIGEST_PARAMETER, digest)


class Deployer:
    """Drives one Triton through deploys, rollbacks and unloads, recording each step."""

    def __init__(
        self,
        registry: Registry,
        store: ContentStore,
        serving: ServingRepository,
        triton: TritonClient,
        *,
        load_timeout_s: float = 120.0,
        on_outcome: Callable[[Outcome], None] | None = None,
    ) -> None:
        self.registry = registry
        self.store = store
        self.serving = serving
        self.triton = triton
        self.load_timeout_s = load_timeout_s
        self.on_outcome = on_outcome
        self.host: TritonHost | None = None  # set by the daemon: capability checks, Triton's real reasons
        self._locks: dict[str, threading.Lock] = {}
        self._locks_guard = threading.Lock()

    def lock(self, model: str) -> threading.Lock:
        with self._locks_guard:
            return self._locks.setdefault(model, threading.Lock())

    def busy_models(self) -> list[str]:
        """Models with an operation in progress in this process."""
        with self._locks_guard:
            return sorted(model for model, lock in self._locks.items() if lock.locked())

    # -- the steps ------------------------------------------------------------------------------

    def _publish(self, model: str, digest: str) -> Path:
        snapshot = self.store.load(model, digest)
        return self.serving.publish(snapshot, self.store, stamp_digest(digest))

    def _verify(self, model: str, digest: str, served_versions: Sequence[int]) -> list[str]:
        ready = self.triton.ready_versions(model)
        missing = [str(v) for v in served_versions if str(v) not in ready]
        if missing:
            raise VerifyError(f"'{model}': version(s) {', '.join(missing)} not READY after load (ready: {ready})")
        served = self.triton.served_digest(model)
        if served != digest:
            raise VerifyError(
                f"'{model}': Triton serves digest {(served or 'none')[:12]}, not {digest[:12]} (load ignored)"
            )
        return ready

    def _smoke(self, model: str, tree: Path) -> None:
        path = tree / SMOKE_FILE
        if not path.exists():
            return
        requests = load_smoke_file(path, label=f"{model}/{SMOKE_FILE}")  # not the store path

        def infer(
            name: str, version: str, inputs: Sequence[SmokeInput], outputs: Sequence[str]
        ) -> dict[str, np.ndarray]:
            tensors = [(i.name, i.datatype, i.array) for i in inputs if i.array is not None]  # built: never None
            return self.triton.infer(name, version, tensors, outputs)

        failures = run_smoke(model, requests, infer)
        if failures:
            raise VerifyError(f"smoke: {failures[0]}" + (f" (+{len(failures) - 1} more)" if len(failures) > 1 else ""))

    def _load_verified(self, model: str, digest: str, served_versions: Sequence[int], emit: ProgressFn,
                       deployment: DeploymentRecord | None, load_timeout_s: float | None = None
                       ) -> tuple[Path, list[str]]:
        emit(Progress(model, "publish", "start", digest=digest))
        tree = self._publish(model, digest)
        if deployment:
            self.registry.advance(deployment.id, "published")
            fault_point("after_publish")
        emit(Progress(model, "publish", "ok", str(tree), digest))
        emit(Progress(model, "load", "start", digest=digest))

        def load() -> None:
            self.triton.load(model, load_timeout_s or self.load_timeout_s)

        self.host.load(model, load) if self.host else load()
        if deployment:
            self.registry.advance(deployment.id, "loaded")
            fault_point("after_load")
        emit(Progress(model, "load", "ok", digest=digest))
        emit(Progress(model, "verify", "start", digest=digest))
        ready = self._verify(model, digest, served_versions)
        if deployment:
            self.registry.advance(deployment.id, "verified")
            fault_point("after_verify")
        emit(Progress(model, "verify", "ok", f"READY versions {', '.join(ready)}", digest))
        return tree, ready

    # -- operations -----------------------------------------------------------------------------

    def deploy(
        self,
        model: str,
        digest: str,
        actor: str,
        *,
        force: bool = False,
        kind: str = "deploy",
        progress: ProgressFn | None = None,
    ) -> Outcome:
        """Deploy a recorded snapshot; roll back to the last good one on any failure."""
        with self.lock(model):
            return self._deploy_locked(model, digest, actor, force=force, kind=kind, progress=progress)

    def _deploy_locked(
        self, model: str, digest: str, actor: str, *, force: bool, kind: str, progress: ProgressFn | None
    ) -> Outcome:
        started = time.monotonic()
        steps: list[Progress] = []

        def emit(p: Progress) -> None:
            steps.append(p)
            log.info("%s %s %s %s %s", p.model, p.step, p.state, p.digest[:12], p.message)
            if progress:
                progress(p)

        snap = self.registry.get_snapshot(model, digest)
        digest = snap.digest
        current = self.registry.ensure_model(model)
        previous = current.active_digest if current.state in ("serving", "degraded") else None

        def finish_without_triton(outcome: str, message: str, cause: str = "") -> Outcome:
            self.registry.audit(AuditEntry(actor, kind, model, digest, outcome, message, _ms(started)))
            emit(Progress(model, "validate" if outcome == "failed" else "deploy", "failed" if outcome == "failed"
                          else "skipped", message, digest))
            return self._outcome(model, kind, outcome, digest, previous, message, started, steps, cause)

        emit(Progress(model, "validate", "start", digest=digest))
        if not snap.valid:
            return finish_without_triton("failed", f"invalid, not sent to Triton: {snap.first_error}")
        if snap.quarantined and not force:
            return finish_without_triton(
                "failed", f"digest {digest[:12]} is quarantined ({snap.quarantine_reason}); use --force to retry"
            )
        try:
            require_members(self.registry, snap)
        except EnvironmentFault as exc:  # an ensemble whose steps this daemon lacks yet: retried
            return finish_without_triton("failed", str(exc), "environment")
        except ModelConfigError as exc:  # an ensemble that does not fit the steps this daemon serves
            return finish_without_triton("failed", str(exc), "content")
        emit(Progress(model, "validate", "ok", digest=digest))
        if previous == digest and not force and self._serves(model, digest):
            return finish_without_triton("noop", f"already serving {digest[:12]}")

        deployment = self.registry.begin_deployment(model, kind, digest, previous, actor)
        fault_point("after_intent")
        try:
            if self.host:  # a backend or GPU the server lacks: found before anything is published
                self.host.check(snap.config, self.store.tree_path(digest))
            tree, ready = self._load_verified(model, digest, snap.served_versions, emit, deployment)
            emit(Progress(model, "smoke", "start", digest=digest))
            self._smoke(model, tree)
            emit(Progress(model, "smoke", "ok", digest=digest))
        except (TritonError, VerifyError, SnapshotError, TritonctlError) as exc:
            return self._recover_from_failure(deployment, snap, previous, exc, emit, started, steps)
        fault_point("before_commit")
        message = f"serving {digest[:12]} (versions {', '.join(ready)})"
        emit(Progress(model, "commit", "start", message, digest))
        outcome = self._end(deployment, "ok", message, None, "serving", digest, started, steps,
                            serving=ServingRecord(model, digest, [int(v) for v in ready if v.isdigit()]))
        if snap.quarantined:
            self.registry.set_quarantine(model, digest, None)
        self.serving.prune(model)
        emit(Progress(model, "commit", "ok", message, digest))
        return outcome

    def _serves(self, model: str, digest: str) -> bool:
        try:
            return self.triton.served_digest(model) == digest and bool(self.triton.ready_versions(model))
        except TritonctlError:
            return False

    def _recover_from_failure(
        self,
        deployment: DeploymentRecord,
        snap: SnapshotRecord,
        previous: str | None,
        exc: Exception,
        emit: ProgressFn,
        started: float,
        steps: list[Progress],
    ) -> Outcome:
        model, digest = snap.model, snap.digest
        error = str(exc)
        emit(Progress(model, deployment.step if deployment.step != "intent" else "deploy", "failed", error, digest))
        self.registry.advance(deployment.id, "rolling_back")
        fault_point("mid_rollback")
        environment = environment_cause(exc)
        if isinstance(exc, TritonUnavailableError):
            # Not the content's fault: no quarantine. Put the serving repository back to what the
            # registry says serves; reconcile loads it when Triton is back.
            if previous:
                self._publish(model, previous)
            message = f"tritonserver unreachable: {error}" if isinstance(exc, TritonUnavailableError) else error
            return self._end(deployment, "failed", message, message, "serving" if previous else "failed",
                             previous, started, steps, cause="triton_unreachable")
        if environment is None:
            self.registry.set_quarantine(model, digest, error)
        else:
            # Not the content's fault (docs/operations.md "Failed deploys"): never quarantined, retried.
            error = f"{environment}: {error}"
        cause = "environment" if environment else "content"
        if previous:
            emit(Progress(model, "rollback", "start", f"restoring {previous[:12]}", previous))
            try:
                prev_snap = self.registry.get_snapshot(model, previous)
                # Triton cannot cancel a load that outlived our deadline; it finishes it before it
                # takes ours, so the rollback's load gets room for both.
                timeout = self.load_timeout_s + ROLLBACK_GRACE_S if isinstance(exc, TritonTimeoutError) else None
                self._load_verified(model, previous, prev_snap.served_versions, emit, None, timeout)
            except TritonctlError as rollback_exc:
                message = f"{error}; rollback to {previous[:12]} failed: {rollback_exc}"
                emit(Progress(model, "rollback", "failed", str(rollback_exc), previous))
                return self._end(deployment, "failed", message, message, "degraded", previous, started, steps,
                                 cause=cause)
            message = f"rolled back to {previous[:12]}: {error}"
            self.serving.prune(model)
            emit(Progress(model, "rollback", "ok", message, previous))
            return self._end(deployment, "failed" if environment else "rolled_back", message, error, "serving",
                             previous, started, steps, cause=cause)
        self._take_out(model)
        return self._end(deployment, "failed", f"failed, nothing to roll back to: {error}", error, "failed", None,
                         started, steps, serving=ServingRecord(model, None, []), cause=cause)

    def _take_out(self, model: str) -> None:
        """Nothing good to return to: take the broken model out of Triton and the serving repository."""
        try:
            self.triton.unload(model)
        except TritonctlError as exc:
            log.warning("%s: unload of a model with no good version: %s", model, exc)
        self.serving.unpublish(model)

    def _end(
        self,
        deployment: DeploymentRecord,
        outcome: str,
        message: str,
        error: str | None,
        state: str,
        active: str | None,
        started: float,
        steps: list[Progress],
        serving: ServingRecord | None = None,
        cause: str = "",
    ) -> Outcome:
        """Finish a deployment (its end, what serves, the audit event: one transaction) and report it."""
        audit = AuditEntry(deployment.actor, deployment.kind, deployment.model,
                           deployment.digest or deployment.previous_digest, outcome, message, _ms(started))
        self.registry.finish_deployment(deployment.id, outcome=outcome, error=error, audit=audit, serving=serving,
                                        model_state=state)
        return self._outcome(deployment.model, deployment.kind, outcome, deployment.digest, active, message,
                             started, steps, cause)

    def unload(self, model: str, actor: str, dependents: bool = False, progress: ProgressFn | None = None) -> Outcome:
        with self.lock(model):
            started = time.monotonic()
            current = self.registry.get_model(model)
            deployment = self.registry.begin_deployment(model, "unload", None, current.active_digest, actor)
            try:
                self.triton.unload(model, dependents)
            except TritonctlError as exc:
                cause = "triton_unreachable" if isinstance(exc, TritonUnavailableError) else ""
                return self._end(deployment, "failed", str(exc), str(exc), current.state, current.active_digest,
                                 started, [], cause=cause)
            self.serving.unpublish(model)
            if progress:
                progress(Progress(model, "unload", "ok", "unloaded"))
            return self._end(deployment, "ok", "unloaded", None, "unloaded", None, started, [],
                             serving=ServingRecord(model, None, []))

    def previous_good(self, model: str) -> str:
        """The last digest that served before the active one (valid, not quarantined, not collected)."""
        current = self.registry.get_model(model)
        for entry in self.registry.serving_history(model, limit=200):
            if entry.digest is None or entry.digest == current.active_digest:
                continue
            snap = self.registry.get_snapshot(model, entry.digest)
            if snap.valid and not snap.quarantined and not snap.collected:
                return snap.digest
        raise NotFoundError(f"model '{model}' has no previous good version to roll back to")

    def rollback(self, model: str, actor: str, to: str | None = None, progress: ProgressFn | None = None) -> Outcome:
        target = self.registry.get_snapshot(model, to).digest if to else self.previous_good(model)
        return self.deploy(model, target, actor, force=to is not None, kind="rollback", progress=progress)

    def restore(self, model: str, digest: str, reason: str) -> Outcome:
        """Make Triton serve the registry's active digest again (reconcile, crash recovery)."""
        with self.lock(model):
            started = time.monotonic()
            snap = self.registry.get_snapshot(model, digest)
            try:
                self._load_verified(model, digest, snap.served_versions, lambda p: None, None)
            except TritonctlError as exc:
                message = f"restore of {digest[:12]} failed ({reason}): {exc}"
                self.registry.audit(AuditEntry("tritonctl", "restore", model, digest, "failed", message, _ms(started)))
                self.registry.update_model(model, last_error=message)
                return self._outcome(model, "restore", "failed", digest, digest, message, started, [])
            message = f"restored {digest[:12]} ({reason})"
            self.registry.audit(AuditEntry("tritonctl", "restore", model, digest, "ok", message, _ms(started)))
            if self.registry.get_model(model).state == "degraded":
                self.registry.update_model(model, state="serving")
            self.serving.prune(model)
            return self._outcome(model, "restore", "ok", digest, digest, message, started, [])

    def drain(self, model: str, bound_s: float | None = None) -> bool:
        """Wait until Triton runs no load or unload of `model` (one a killed daemon may have left).

        A first load or an unload shows as LOADING / UNLOADING in the repository index. A reload of
        a READY model shows READY throughout (measured), so the index cannot tell it; but Triton runs
        one load of a model at a time, so a load of the tree `serving/` already points at queues
        behind it, then loads nothing (the tree is unchanged and pre-compiled) — or finishes the
        interrupted publish → load, which is what the interrupted deploy wanted. Nothing is re-pointed
        here. The bound is the rollback's after a load deadline: the load deadline plus
        ROLLBACK_GRACE_S. Returns False when a load was still running at the bound.
        """
        bound = bound_s if bound_s is not None else self.load_timeout_s + ROLLBACK_GRACE_S
        deadline = time.monotonic() + bound
        while any(e.name == model and e.state in ("LOADING", "UNLOADING") for e in self.triton.index()):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
        if self.serving.current(model) is None:
            return True
        try:
            self.triton.load(model, max(1.0, deadline - time.monotonic()))
        except TritonTimeoutError:
            return False
        except TritonUnavailableError:
            raise
        except TritonctlError as exc:  # the interrupted content does not load: decided from what serves
            log.warning("%s: load of the interrupted tree after restart: %s", model, exc)
        return True

    def _serves_verified(self, model: str, digest: str, smoke: bool) -> list[str] | None:
        """READY versions when Triton serves `digest` as recorded (and its smoke passes), else None."""
        try:
            snap = self.registry.get_snapshot(model, digest)
            ready = self._verify(model, digest, snap.served_versions)
            tree = self.serving.current(model)
            if tree is None or digest not in (tree / "config.pbtxt").read_text(errors="replace"):
                return None  # Triton serves it, but serving/ points elsewhere: publish it again
            if smoke:
                self._smoke(model, tree)
            return ready
        except OSError:
            return None
        except TritonctlError as exc:
            log.info("%s: %s does not serve as recorded: %s", model, digest[:12], exc)
            return None

    def recover(self, deployment: DeploymentRecord) -> Outcome | None:
        """Finish, roll forward or roll back a deployment a crash interrupted.

        First `drain` (never re-point `serving/` under a load Triton may still run: its python stub
        would import one tree's code under the other's config); then decide from what Triton serves:
        the interrupted digest READY, verified and smoke-tested is committed (rolled forward); else
        the previous one is restored (without a reload when it already serves). None: Triton still
        ran a load at the bound; the deployment stays open and the next reconcile tries again.
        """
        with self.lock(deployment.model):
            started = time.monotonic()
            model, previous, digest = deployment.model, deployment.previous_digest, deployment.digest
            reason = f"interrupted at step '{deployment.step}' by a daemon stop"
            if not self.drain(model):
                log.warning("%s: Triton still loads it after the bound; recovery waits for the next round", model)
                return None
            if deployment.kind == "unload":
                self._take_out(model)
                return self._end(deployment, "ok", f"finished after restart; {reason}", None, "unloaded", None,
                                 started, [], serving=ServingRecord(model, None, []))
            if digest and deployment.step != "rolling_back":
                ready = self._serves_verified(model, digest, smoke=True)
                if ready is not None:
                    message = f"rolled forward: serving {digest[:12]} (versions {', '.join(ready)}); {reason}"
                    outcome = self._end(deployment, "ok", message, None, "serving", digest, started, [],
                                        serving=ServingRecord(model, digest, [int(v) for v in ready if v.isdigit()]))
                    self.serving.prune(model)
                    return outcome
            if previous:
                if self._serves_verified(model, previous, smoke=False) is None:
                    snap = self.registry.get_snapshot(model, previous)
                    try:
                        self._load_verified(model, previous, snap.served_versions, lambda p: None, None)
                    except TritonctlError as exc:
                        message = f"{reason}; restoring {previous[:12]} failed: {exc}"
                        return self._end(deployment, "failed", message, message, "degraded", previous, started, [])
                self.serving.prune(model)
                return self._end(deployment, "rolled_back", f"rolled back to {previous[:12]}: {reason}", reason,
                                 "serving", previous, started, [])
            self._take_out(model)
            return self._end(deployment, "failed", f"failed: {reason} (no previous version)", reason, "failed", None,
                             started, [], serving=ServingRecord(model, None, []))

    def _outcome(self, model: str, action: str, outcome: str, digest: str | None, active: str | None,
                 message: str, started: float, steps: list[Progress], cause: str = "") -> Outcome:
        result = Outcome(model, action, outcome, digest, active, message, _ms(started), list(steps), cause)
        if self.on_outcome:
            self.on_outcome(result)
        return result


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


def raise_for(outcome: Outcome) -> Outcome:
    """For callers that want an exception: DeployError unless the outcome succeeded."""
    if not outcome.succeeded:
        raise DeployError(f"{outcome.model}: {outcome.message}", outcome.outcome)
    return outcome
