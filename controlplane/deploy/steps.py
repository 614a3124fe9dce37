"""The deploy engine's parts below the Deployer: one operation's record (`DeployOperation`), the steps
every load takes (`TritonSteps`: publish a fresh tree, load it through the host, verify what Triton
serves, run the smoke requests) and the one sequence they run in (`BRING_UP`, run by
`TritonSteps.bring_up`) whoever brings a digest up: a model deployed alone, a rollback's or restore's
reload, a change set's staged names and switches, either crash recovery, a fleet host's step.

Why a module of its own: the Deployer (controlplane.deploy.engine) and the change-set plan runner
(controlplane.deploy.plans) both drive Triton; with the steps and their order here, each exists once,
and a new step is one entry of `BRING_UP` (docs/architecture.md "Add a deploy step").
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from controlplane.deploy.publish import ServingRepository
from controlplane.deploy.smoke import smoke_test
from controlplane.documents.results import Outcome, Progress
from controlplane.errors import SmokeError, SmokeSharedError, TritonctlError
from controlplane.snapshot import CONFIG_FILE, SMOKE_FILE, ContentStore
from controlplane.store.batches import DeploymentEnd
from controlplane.store.records import DeploymentRecord, ServingRecord, SnapshotRecord
from controlplane.store.registry import AuditEntry, Registry
from controlplane.triton.client import DIGEST_PARAMETER, IndexEntry, RequestCounts
from controlplane.triton.host import TritonHost
from controlplane.validation import completions
from controlplane.validation.modelconfig import is_ensemble_text, stamp_parameter
from controlplane.validation.smokefile import SmokeInput, load_smoke_file
from controlplane.vocab import SMOKE_FAILED, Cause, DeployStep, ModelState, RecordedStep, Result, StepState

log = logging.getLogger("tritonctl.deploy")

FAULT_ENV = "TRITONCTL_FAULT"
# test-only (TRITONCTL_FAULT): the step after which the daemon exits abruptly
FAULT_POINTS = {RecordedStep.PUBLISHED: "after_publish", RecordedStep.LOADED: "after_load",
                RecordedStep.VERIFIED: "after_verify"}


def fault_point(step: str) -> None:
    """Crash-consistency tests set TRITONCTL_FAULT=<step> to make the process die right here."""
    if os.environ.get(FAULT_ENV) == step:
        log.error("fault injection: exiting abruptly at %s", step)
        os._exit(97)


ProgressFn = Callable[[Progress], None]


@dataclass
class DeployOperation:
    """One operation on one model, from its first step to its outcome: what it deploys (`digest`),
    what served before (`previous`), its registry deployment once begun, when it started, the steps
    streamed so far. Its methods finish it (`refuse`, `skip`, `commit`, `end`, `audited`), each
    recording the ending in the registry and reporting the Outcome (`report`: metrics, retries)."""

    registry: Registry
    report: Callable[[Outcome], None]
    model: str
    digest: str | None
    previous: str | None
    actor: str
    kind: str
    progress: ProgressFn | None = None
    deployment: DeploymentRecord | None = None
    started: float = field(default_factory=time.monotonic)
    steps: list[Progress] = field(default_factory=list)

    @classmethod
    def resume(cls, registry: Registry, report: Callable[[Outcome], None],
               deployment: DeploymentRecord) -> DeployOperation:
        """The operation of a deployment a crash interrupted (crash recovery finishes it)."""
        return cls(registry, report, deployment.model, deployment.digest, deployment.previous_digest,
                   deployment.actor, deployment.kind, deployment=deployment)

    def require_digest(self) -> str:
        assert self.digest is not None, "an unload has no digest"
        return self.digest

    def emit(self, step: str, state: str, message: str = "", digest: str | None = None) -> None:
        p = Progress(self.model, str(step), str(state), message, (self.digest or "") if digest is None else digest)
        self.steps.append(p)
        log.log(logging.WARNING if p.state == StepState.FAILED else logging.DEBUG,  # the outcome line is INFO
                "%s %s %s %s %s", p.model, p.step, p.state, p.digest[:12], p.message)
        if self.progress:
            self.progress(p)

    def begin(self) -> DeploymentRecord:
        """Record the intent in the registry before Triton is touched (crash recovery reads it)."""
        self.deployment = self.registry.begin_deployment(self.model, self.kind, self.digest, self.previous,
                                                         self.actor)
        fault_point("after_intent")
        return self.deployment

    def advance(self, step: RecordedStep) -> None:
        assert self.deployment is not None
        self.registry.advance(self.deployment.id, step.value)

    # -- endings --------------------------------------------------------------------------------

    def refuse(self, message: str, cause: Cause = Cause.NONE) -> Outcome:
        """Not sent to Triton: invalid, quarantined, or an ensemble's steps missing."""
        self.registry.audit(AuditEntry(self.actor, self.kind, self.model, self.digest, Result.FAILED.value, message,
                                       ms_since(self.started)))
        self.emit(DeployStep.VALIDATE, StepState.FAILED, message)
        return self.outcome(Result.FAILED, message, self.previous, cause)

    def skip(self, message: str) -> Outcome:
        """Nothing to do: Triton already serves the digest."""
        self.registry.audit(AuditEntry(self.actor, self.kind, self.model, self.digest, Result.NOOP.value, message,
                                       ms_since(self.started)))
        self.emit(DeployStep.DEPLOY, StepState.SKIPPED, message)
        return self.outcome(Result.NOOP, message, self.previous)

    def commit(self, ready: Sequence[str], message: str) -> Outcome:
        """The digest serves, verified: it becomes the active one."""
        return self.end(Result.OK, message, state=ModelState.SERVING, active=self.require_digest(),
                        serving=self.served(ready))

    def served(self, ready: Sequence[str]) -> ServingRecord:
        """What serves once the digest is committed with its READY versions `ready`."""
        return ServingRecord(self.model, self.require_digest(), [int(v) for v in ready if v.isdigit()])

    def end(self, result: Result, message: str, *, state: str, active: str | None, error: str | None = None,
            serving: ServingRecord | None = None, cause: Cause = Cause.NONE) -> Outcome:
        """Finish the deployment (its end, what serves, the audit event: one transaction) and report it."""
        e = self.ending(result, message, state=state, error=error, serving=serving)
        self.registry.finish_deployment(e.deployment_id, outcome=e.outcome, error=e.error, audit=e.audit,
                                        serving=e.serving, model_state=e.model_state)
        return self.outcome(result, message, active, cause)

    def ending(self, result: Result, message: str, *, state: str, error: str | None = None,
               serving: ServingRecord | None = None) -> DeploymentEnd:
        """The deployment's end as `end` records it (many at once: controlplane/deploy/staged.py)."""
        assert self.deployment is not None, "end() of an operation that never began"
        d = self.deployment
        audit = AuditEntry(d.actor, d.kind, d.model, d.digest or d.previous_digest, result.value, message,
                           ms_since(self.started))
        return DeploymentEnd(d.id, result.value, error, audit, serving, str(state))

    def audited(self, result: Result, message: str, *, active: str | None) -> Outcome:
        """An operation with no deployment record (a restore): its audit event and outcome."""
        self.registry.audit(AuditEntry(self.actor, self.kind, self.model, self.digest, result.value, message,
                                       ms_since(self.started)))
        return self.outcome(result, message, active)

    def outcome(self, result: Result, message: str, active: str | None, cause: Cause = Cause.NONE) -> Outcome:
        done = Outcome(self.model, self.kind, result, self.digest, active, message, ms_since(self.started),
                       list(self.steps), cause)
        self.report(done)
        return done


class TritonPort(Protocol):
    """What the state machine asks of Triton (TritonClient; a stand-in in unit tests)."""

    url: str

    def load(self, model: str, timeout_s: float | None = None) -> None: ...

    def unload(self, model: str, dependents: bool = False) -> None: ...

    def index(self) -> list[IndexEntry]: ...

    def ready_versions(self, model: str) -> list[str]: ...

    def served_digest(self, model: str) -> str | None: ...

    def served_config(self, model: str) -> dict[str, Any]: ...

    def infer(self, model: str, version: str, inputs: Sequence[tuple[str, str, np.ndarray]],
              output_names: Sequence[str], timeout_s: float | None = None) -> dict[str, np.ndarray]: ...

    def request_counts(self, model: str) -> dict[tuple[str, str], RequestCounts]: ...


class LoadGuard(Protocol):
    """Asked around every load (controlplane/memory/budget.py's MemoryGuard): a model's deploy or restore, and each
    load of a change set (controlplane/deploy/plans.py; `name`: a step staged under its private name).
    `admit` makes room or raises an EnvironmentFault (the load is refused, `failed`, retried); `settle`
    measures what loaded."""

    def admit(self, model: str, digest: str, config: Any, previous: str | None, name: str | None = None) -> Any: ...

    def settle(self, ticket: Any, loaded: bool) -> None: ...


class NoBudget:
    """The LoadGuard of a Deployer without footprints or a memory budget: admits every load."""

    def admit(self, model: str, digest: str, config: Any, previous: str | None, name: str | None = None) -> None:
        return None

    def settle(self, ticket: Any, loaded: bool) -> None:
        return None


class VerifyError(TritonctlError):
    """Triton answered OK but does not serve what was published."""


def admission(snap: SnapshotRecord, *, force: bool, where: str) -> str | None:
    """Why a recorded content is not sent on (to Triton; the fleet: to its hosts), or None: invalid
    content never, quarantined content only with force."""
    if not snap.valid:
        return f"invalid, not sent to {where}: {snap.first_error}"
    if snap.quarantined and not force:
        return f"digest {snap.digest[:12]} is quarantined ({snap.quarantine_reason}); use --force to retry"
    return None


def stamp_digest(digest: str) -> Callable[[str], str]:
    """The config text's rewrite at publish: stamped with the digest (`stamp_parameter`)."""
    def stamp(text: str) -> str:
        if DIGEST_PARAMETER in text:  # stamped before (or named in a comment): replaced in the parsed config
            return stamp_parameter(text, DIGEST_PARAMETER, digest)
        # not stamped: the stamp is appended to the text as it is, as `stamp_parameter` appends a new key,
        # without parsing the whole config in pure-Python protobuf first (70 % of a publish's CPU at 2,000)
        separator = "" if not text or text.endswith("\n") else "\n"
        return text + separator + stamp_parameter("", DIGEST_PARAMETER, digest)

    return stamp


@dataclass
class BringUp:
    """One digest brought up under one name: what the steps of `BRING_UP` read, and what each leaves
    for the next (the published tree, the READY versions).

    `name`: the name Triton serves it under (default the model's; a change set's private step name);
    `stamp`: what the served config must carry (default the digest; a change set's interim stamp);
    `rewrite`: the config text's rewrite at publish (default: stamped with the digest);
    `reload`: content that served here before, loaded again (a rollback's or a restore's reload): not
    checked against the host or smoke-tested again."""

    model: str
    digest: str
    config: dict[str, Any] | None
    served_versions: Sequence[int]
    name: str | None = None
    stamp: str | None = None
    rewrite: Callable[[str], str] | None = None
    reload: bool = False
    timeout_s: float | None = None
    tree: Path | None = None
    ready: list[str] = field(default_factory=list)
    indexed: list[str] | None = None  # its READY versions, read from a repository index just taken
    sync: bool = True  # False: its publish's link swap is made durable later, with many (deploy/staged.py)

    @property
    def served_as(self) -> str:
        return self.name or self.model


@dataclass(frozen=True)
class Step:
    """One step of bringing a digest up. `take` runs it and returns its progress message; `word`: how it
    is streamed (None: not streamed); `recorded`: written to the operation's deployment once taken, so
    crash recovery knows it was reached; `applies`: whether this bring-up takes it (default: every one)."""

    name: str
    take: Callable[[TritonSteps, BringUp], str]
    word: DeployStep | None = None
    recorded: RecordedStep | None = None
    applies: Callable[[BringUp], bool] | None = None


def _check(steps: TritonSteps, b: BringUp) -> str:
    steps.check(b.config, b.digest)
    return ""


def _publish(steps: TritonSteps, b: BringUp) -> str:
    b.tree = steps.publish(b.model, b.digest, b.rewrite, name=b.name, sync=b.sync)
    return str(b.tree)


def _load(steps: TritonSteps, b: BringUp) -> str:
    steps.load(b.served_as, b.timeout_s)
    return ""


def _verify(steps: TritonSteps, b: BringUp) -> str:
    b.ready = steps.verify(b.served_as, b.stamp or b.digest, b.served_versions, b.indexed)
    completed = steps.record_completion(b)
    return f"READY versions {', '.join(b.ready)}" + ("; config completed by Triton, recorded" if completed else "")


def _smoke(steps: TritonSteps, b: BringUp) -> str:
    if b.tree is None:
        raise VerifyError(f"'{b.served_as}': no published tree to smoke-test")
    steps.smoke(b.served_as, b.tree, label=b.model)
    return ""


def _fresh(b: BringUp) -> bool:
    return not b.reload


# The steps that bring a digest up, in order: the one list every path runs (TritonSteps.bring_up).
BRING_UP: tuple[Step, ...] = (
    Step("check", _check, applies=_fresh),  # a backend or GPU the host lacks: before anything is published
    Step("publish", _publish, DeployStep.PUBLISH, RecordedStep.PUBLISHED),
    Step("load", _load, DeployStep.LOAD, RecordedStep.LOADED),
    Step("verify", _verify, DeployStep.VERIFY, RecordedStep.VERIFIED),
    Step("smoke", _smoke, DeployStep.SMOKE, applies=_fresh),
)

Reached = Callable[[RecordedStep], None]
Emit = Callable[[DeployStep, StepState, str], None]


class TritonSteps:
    """The steps of every load on this host, for a public name or a change set's private one."""

    def __init__(self, content: ContentStore, serving: ServingRepository, triton: TritonPort,
                 host: TritonHost | None, load_timeout_s: float, registry: Registry | None = None) -> None:
        self.store = content
        self.serving = serving
        self.triton = triton
        self.host = host  # capability checks and Triton's real reasons (None: a plain client)
        self.load_timeout_s = load_timeout_s
        self.registry = registry  # where the configs Triton completes are recorded (None: not recorded)
        self._ensemble_loads = threading.Lock()  # ensembles go to Triton one at a time (`_bookkeeping_only`)

    def bring_up(self, b: BringUp, *, reached: Reached | None = None, emit: Emit | None = None,
                 start: str | None = None, stop: str | None = None) -> BringUp:
        """Take the steps of `BRING_UP` that apply to `b`, in order, from the one named `start` (a
        recovery checks what already serves from "verify" on) up to the one named `stop` (not taken: a
        first start publishes before the launching tritonserver loads). `reached` is told each recorded step once
        taken (the operation's deployment advances); `emit` streams each step's start and end. A step's
        failure raises (TritonctlError): the caller decides what to undo."""
        sequence = BRING_UP
        names = [step.name for step in sequence]
        sequence = sequence[names.index(start) if start is not None else 0:
                            names.index(stop) if stop is not None else len(sequence)]
        for step in sequence:
            if step.applies is not None and not step.applies(b):
                continue
            if emit is not None and step.word is not None:
                emit(step.word, StepState.START, "")
            message = step.take(self, b)
            if reached is not None and step.recorded is not None:
                reached(step.recorded)
            if emit is not None and step.word is not None:
                emit(step.word, StepState.OK, message)
        return b

    def publish(self, model: str, digest: str, rewrite: Callable[[str], str] | None = None,
                name: str | None = None, sync: bool = True) -> Path:
        """A fresh tree of `digest` under `name` (default: the model's), its config stamped with the
        digest, or rewritten by `rewrite` (which stamps what it likes); `sync`: ServingRepository.publish."""
        snapshot = self.store.load(model, digest)
        return self.serving.publish(snapshot, self.store, rewrite or stamp_digest(digest), name=name, sync=sync)

    def check(self, config: dict[str, Any] | None, digest: str) -> None:
        """A backend or GPU this host lacks: found before anything is published (HostCapabilityError)."""
        if self.host:
            self.host.check(config, self.store.tree_path(digest))

    def check_completion(self, config: dict[str, Any] | None, digest: str) -> None:
        """`check`'s config-completion part alone (a first start's deploys, before their tritonserver runs)."""
        if self.host:
            self.host.check_completion(config, self.store.tree_path(digest))

    def load(self, name: str, timeout_s: float | None = None) -> None:
        """Load `name` through the host, which turns Triton's bare failures into their real reasons."""
        def load() -> None:
            if self._bookkeeping_only(name):
                with self._ensemble_loads:
                    self.triton.load(name, timeout_s or self.load_timeout_s)
            else:
                self.triton.load(name, timeout_s or self.load_timeout_s)

        self.host.load(name, load) if self.host else load()

    def _bookkeeping_only(self, name: str) -> bool:
        """Whether `name`'s published tree is an ensemble: its load in Triton is bookkeeping alone (no
        backend, no process), which Triton does slower for requests sent together than one at a time
        (1,000 ensembles: 34 s one request at a time, 51 s four at once; docs/benchmarks.md)."""
        tree = self.serving.current(name)
        try:
            return tree is not None and is_ensemble_text((tree / CONFIG_FILE).read_text(errors="replace"))
        except OSError:
            return False

    def verify(self, name: str, stamp: str, served_versions: Sequence[int],
               indexed: Sequence[str] | None = None) -> list[str]:
        """Every served version READY and the served config stamped `stamp`; the READY versions
        (`indexed`: as a repository index just taken says, not asked of Triton again)."""
        ready = list(indexed) if indexed is not None else self.triton.ready_versions(name)
        missing = [str(v) for v in served_versions if str(v) not in ready]
        if missing or not ready:
            raise VerifyError(f"'{name}': version(s) {', '.join(missing) or '?'} not READY after load (ready: {ready})")
        served = self.triton.served_digest(name)
        if served != stamp:
            raise VerifyError(
                f"'{name}': Triton serves digest {(served or 'none')[:20]}, not {stamp[:20]} (load ignored)"
            )
        return ready

    def record_completion(self, b: BringUp) -> bool:
        """After `verify`: for a content whose model completes its config at load, the config Triton serves,
        recorded with the digest (controlplane/validation/completions.py); whether it recorded one."""
        config = b.config or {}
        if self.registry is None or config.get("backend", "python") != "python" or config.get("platform"):
            return False  # only a python model completes its config (an ensemble, most of a big start, never)
        return completions.record(self.registry, self.triton, b.model, b.digest, b.served_as)

    def smoke(self, name: str, tree: Path, label: str | None = None) -> None:
        """The tree's smoke requests against `name` (`label`: the model the file is shown under)."""
        path = tree / SMOKE_FILE
        if not path.exists():
            return
        requests = load_smoke_file(path, label=f"{label or name}/{SMOKE_FILE}")  # not the store path

        def infer(
            model: str, version: str, inputs: Sequence[SmokeInput], outputs: Sequence[str]
        ) -> dict[str, np.ndarray]:
            tensors = [(i.name, i.datatype, i.array) for i in inputs if i.array is not None]  # built: never None
            return self.triton.infer(model, version, tensors, outputs)

        def as_loaded(_shown: str, version: str, inputs: Sequence[SmokeInput],
                      outputs: Sequence[str]) -> dict[str, np.ndarray]:
            return infer(name, version, inputs, outputs)

        def counts() -> tuple[int, int] | None:
            try:
                figures = self.triton.request_counts(name).values()
            except TritonctlError:
                return None
            return sum(c.success for c in figures), sum(c.failure for c in figures)

        # its messages name the model as its operator knows it (`label`), not a private name Triton loads it under
        result = smoke_test(label or name, requests, as_loaded, counts)
        if result.failures:
            more = f" (+{len(result.failures) - 1} more)" if len(result.failures) > 1 else ""
            if result.shared:  # nobody's proven fault (controlplane/deploy/smoke.py): retried, never quarantined
                raise SmokeSharedError(f"smoke: {result.failures[0]}{more}")
            raise SmokeError(f"{SMOKE_FAILED}{result.failures[0]}{more}")

    def take_out(self, name: str) -> None:
        """Unload `name` and remove its serving entry (errors logged: nothing good is left to serve)."""
        try:
            self.triton.unload(name)
        except TritonctlError as exc:
            log.warning("%s: unload: %s", name, exc)
        try:
            self.serving.unpublish(name)
        except (OSError, TritonctlError) as exc:
            log.warning("%s: unpublish: %s", name, exc)


def ms_since(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


@dataclass
class Staged:
    """A deploy staged up to its load, the launching tritonserver's start-up (deploy/staged.py `stage_many`)."""

    op: DeployOperation
    snap: SnapshotRecord
    bring_up: BringUp
    lock: threading.Lock
    ticket: Any

    @property
    def model(self) -> str:
        return self.op.model
