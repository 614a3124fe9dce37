"""The start-up scan's recording: many changed models captured and validated in parallel, then recorded
in one registry transaction per batch; only what then needs more than a record goes model by model.

Why: a first start recorded each model through the watcher's path (change-set grouping, capture,
validate, record, decide), one registry transaction per step: 71 ms a model under load, 711 s at 10,000
models (issue 26). Here every model the start found new or changed (controlplane/startup/scan.py) is
captured and validated exactly as the watcher's path does (`ControlPlane.snapshot_source`,
`intake.validate`: every snapshot validated), then up to `BATCH` of them are recorded, each with its
source signature and its audit event, in one transaction (`intake.record_many`). Recorded before
anything deploys, as always.

Then each model's deploy decision is the usual `decide`, from the registry read once per batch. A model
that may deploy alone - no ensemble over it, and each of its steps known, unchanged and owed nothing -
goes to the Deployer directly (`Wave.deploy`), under its capture lock and only if its source still holds
what was recorded. Everything else - a capture that failed or waits, a change set, a model following a
tag, a quarantined content, a model the watcher meanwhile handed on - takes the watcher's own path
(`Wave.settle`), which decides and reports exactly as before.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Executor
from contextlib import ExitStack
from dataclasses import dataclass, field

from controlplane.documents.validation import ValidationResult
from controlplane.errors import StoreError, TritonctlError
from controlplane.intake import recording as intake
from controlplane.intake.decision import Rule, decide
from controlplane.names import validate_model_name
from controlplane.ports import WavePlane
from controlplane.source.protocol import Captured as SourceCaptured
from controlplane.startup.cores import Cores
from controlplane.store.records import ModelRecord, SnapshotContent, SnapshotRecord, SourceEntry
from controlplane.store.registry import Registry
from controlplane.validation.ensemblemembers import step_models
from controlplane.vocab import SERVING_STATES, WATCHER_ACTOR, ModelState, Policy

log = logging.getLogger("tritonctl.startrecord")

BATCH = 500  # models recorded per registry transaction
GROUP = 8  # models per capture worker's task (controlplane/startup/cores.py)


@dataclass
class Wave:
    """What became of a wave of the start-up scan's models."""

    recorded: list[str] = field(default_factory=list)  # recorded; their policy deploys nothing now
    deploy: list[tuple[str, str]] = field(default_factory=list)  # recorded, (model, digest) to deploy alone
    settle: list[str] = field(default_factory=list)  # the watcher's path, model by model


Captured = tuple[str, str, SnapshotContent, SourceEntry]


def record_wave(plane: WavePlane, names: Sequence[str], pool: Executor, batch: int = BATCH,
                staged: Mapping[str, SnapshotRecord] | None = None) -> Wave:
    """Capture, validate and record `names` (models that may load at once: no one an ensemble over
    another of them), in batches; decide each one's deploy (see the module docstring). `staged`: step
    models whose deploy a launching tritonserver's start-up loads first (controlplane/startup/bulk.py):
    an ensemble over them may deploy alone too."""
    out = Wave()
    if plane.source.repository_held() or plane.source.repository_marked():
        out.settle = list(names)  # a repository-level hold or commit marker: its own rules, per model
        return out
    steps = StepMembers(plane.registry)  # the steps of this wave's ensembles recorded in an earlier wave
    travels = bool(names) and plane.source.capture_job(names[0]) is not None  # a directory's captures do
    with Cores(plane.store, len(names) if travels else 0) as cores:
        if cores.active:
            log.info("start-up scan: capturing %d models in %d worker processes", len(names), cores.workers)
        _record_batches(plane, names, cores.threads or pool, cores, batch, steps, out, staged or {})
    if names:
        log.info("start-up scan: %d models recorded in batches (%d to deploy alone), %d model by model",
                 len(names) - len(out.settle), len(out.deploy), len(out.settle))
    return out


def _record_batches(plane: WavePlane, names: Sequence[str], pool: Executor, cores: Cores, batch: int,
                    steps: StepMembers, out: Wave, staged: Mapping[str, SnapshotRecord]) -> None:
    for start in range(0, len(names), batch):
        chunk = names[start:start + batch]
        captured: list[Captured] = []
        if cores.active:
            groups = [chunk[i:i + GROUP] for i in range(0, len(chunk), GROUP)]
            results = [c for group in pool.map(lambda g: _captured_group(plane, g, steps, cores), groups)
                       for c in group]
        else:
            results = list(pool.map(lambda n: _captured(plane, n, steps), chunk))
        for name, result in zip(chunk, results, strict=True):
            if result is None:
                out.settle.append(name)
            else:
                captured.append(result)
        if not captured:
            continue
        try:
            plane.store.sync()  # the objects captured durable before any is recorded
        except OSError as exc:
            log.warning("start-up scan: syncing the content store failed (%s); one by one", exc)
            out.settle.extend(name for name, *_ in captured)
            continue
        try:
            records = intake.record_many(plane.registry, captured, WATCHER_ACTOR)
        except StoreError as exc:  # the per-model path reports it and looks again
            log.warning("start-up scan: recording %d models at once failed (%s); one by one", len(captured), exc)
            out.settle.extend(name for name, *_ in captured)
            continue
        plane.counts.add("records", len(records))
        for (*_, entry), record in zip(captured, records, strict=True):
            plane.source_graph.recorded(entry)
            plane.capture_done(record.model)
        _decide(plane, records, out, staged)


class StepMembers(Mapping[str, SnapshotRecord]):
    """The step models' contents an ensemble is validated against (`intake.validate`'s `members`),
    each read from the registry once per wave instead of twice per ensemble: its serving content, else
    its newest valid one (controlplane/validation/ensemblemembers.py `_member`). A step the registry cannot say
    is left to the registry itself."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self._known: dict[str, SnapshotRecord | None] = {}
        self._lock = threading.Lock()

    def __bool__(self) -> bool:
        return True  # looked up even while empty: it fills on demand

    def __getitem__(self, name: str) -> SnapshotRecord:
        with self._lock:
            if name not in self._known:
                self._known[name] = self._read(name)
            found = self._known[name]
        if found is None:
            raise KeyError(name)
        return found

    def _read(self, name: str) -> SnapshotRecord | None:
        record = self.registry.find_model(name)
        if record is None or record.removed_at is not None:
            return None
        if record.active_digest and record.state in SERVING_STATES:
            snap = self.registry.get_snapshot(name, record.active_digest)
            return snap if snap.config is not None else None
        return next((s for s in self.registry.list_snapshots(name) if s.valid and s.config is not None), None)

    def __iter__(self) -> Iterator[str]:
        with self._lock:
            return iter([k for k, v in self._known.items() if v is not None])

    def __len__(self) -> int:
        with self._lock:
            return sum(1 for v in self._known.values() if v is not None)


def _captured(plane: WavePlane, name: str, steps: StepMembers) -> Captured | None:
    """`name`'s source captured and validated as the watcher's capture does; None: the per-model path
    must look at it (an invalid name, no directory, a capture that fails or must wait)."""
    try:
        if not _capturable(plane, name):
            return None
        with plane.capture_lock(name), plane.store.deferred_sync():
            snapshot, signature, trusted = plane.snapshot_source(name)
            plane.counts.add("validations")
            content = intake.validate(plane.registry, plane.store, snapshot, steps)
        return name, snapshot.digest, content, intake.source_entry(name, snapshot.digest, content, signature, trusted)
    except (TritonctlError, OSError):
        return None
    except Exception:  # noqa: BLE001 - one model's bug must not stop the others' start-up: its own path says
        log.exception("unexpected error capturing %s at start-up", name)
        return None


def _capturable(plane: WavePlane, name: str) -> bool:
    validate_model_name(name)
    return plane.source_has(name)


def _captured_group(plane: WavePlane, names: Sequence[str], steps: StepMembers, cores: Cores) -> list[Captured | None]:
    """`_captured` of a few models of a local repository, captured and validated by one capture worker
    (one message each way, not one per model: controlplane/startup/cores.py) while the daemon holds
    their capture locks (taken in name order: no other thread holds two)."""
    todo = []
    for name in names:
        try:
            if _capturable(plane, name):
                todo.append(name)
        except (TritonctlError, OSError):
            continue
    with ExitStack() as held:
        for name in sorted(todo):
            held.enter_context(plane.capture_lock(name))
        jobs = [plane.source.capture_job(name) for name in todo]
        done = cores.capture_many([job for job in jobs if job is not None]) if None not in jobs else None
    if done is None:  # no worker could: captured here
        return [_captured(plane, name, steps) for name in names]
    plane.counts.add("captures", len(todo))
    found = dict(zip(todo, done, strict=True))
    return [_content(plane, name, found[name], steps) if found.get(name) else None for name in names]


def _content(plane: WavePlane, name: str, done: tuple[SourceCaptured, ValidationResult] | None,
             steps: StepMembers) -> Captured | None:
    """A worker's capture and validation of `name`, checked against the registry's steps."""
    if done is None:
        return None
    (snapshot, signature, trusted), result = done
    plane.counts.add("validations")
    try:
        content = intake.validated(plane.registry, snapshot, result, steps)
    except (TritonctlError, OSError):
        return None
    except Exception:  # noqa: BLE001 - as in `_captured`
        log.exception("unexpected error checking %s at start-up", name)
        return None
    return name, snapshot.digest, content, intake.source_entry(name, snapshot.digest, content, signature, trusted)


def _decide(plane: WavePlane, records: list[SnapshotRecord], out: Wave,
            staged: Mapping[str, SnapshotRecord]) -> None:
    """Each recorded model: done, deployed alone, or handed to the watcher's path."""
    names = [r.model for r in records]
    wanted = {*names, *(step for r in records for step in step_models(r.config))}
    models = {m.name: m for m in plane.registry.list_models(names=sorted(wanted))}
    last = plane.registry.last_deployments(names)
    serving = plane.serving_ensembles.get()
    serving_over: dict[str, set[str]] = {}
    for ensemble, steps in serving.items():
        for step in steps:
            serving_over.setdefault(step, set()).add(ensemble)
    pending = plane.source.settling()
    for record in records:
        model = models.get(record.model)
        if (model is None or model.removed_at is not None or record.model in pending
                or not _alone(plane, record, models, serving, serving_over, pending, staged)):
            out.settle.append(record.model)
            continue
        decision = decide(model, record, policy=plane.effective_policy(model), last=last.get(record.model))
        if decision.rule in (Rule.TRACKS_TAG, Rule.QUARANTINED):
            out.settle.append(record.model)  # following a tag, or said once in the audit: its own path
        elif decision.deploys:
            out.deploy.append((record.model, record.digest))
        else:
            out.recorded.append(record.model)


def _alone(plane: WavePlane, record: SnapshotRecord, models: dict[str, ModelRecord],
           serving: dict[str, list[str]], serving_over: dict[str, set[str]],
           pending: dict[str, float | None], staged: Mapping[str, SnapshotRecord]) -> bool:
    """Whether the watcher's change-set grouping would take `record`'s model alone: no ensemble (recorded
    or serving) over it, and every step it names known, not settling, unchanged since recorded, and
    owed no deploy by auto policy (controlplane/intake/changeset.py, `ChangeSets.group`)."""
    name = record.model
    if plane.source_graph.ensembles_over(name) or serving_over.get(name):
        return False
    for step in {*step_models(record.config), *serving.get(name, [])}:
        current = models.get(step)
        if current is None or step in pending or plane.source_changed(step):
            return False
        if _owed(plane, current) and not (step in staged and _staged_newest(plane, staged[step])):
            return False
    return True


def _owed(plane: WavePlane, model: ModelRecord) -> bool:
    """Auto policy may deploy `model` and it does not serve its newest recorded content."""
    if plane.effective_policy(model) != Policy.AUTO or model.pinned or model.state == ModelState.UNLOADED:
        return False
    entry = plane.source_graph.entry(model.name)
    return not (model.state in SERVING_STATES and model.active_digest
                and (entry is None or entry.digest == model.active_digest))


def _staged_newest(plane: WavePlane, snap: SnapshotRecord) -> bool:
    """A staged step deploys its newest recorded content."""
    entry = plane.source_graph.entry(snap.model)
    return entry is not None and entry.digest == snap.digest


def deploy_alone(plane: WavePlane, model: str, digest: str) -> bool:
    """Deploy a model `record_wave` recorded, under its capture lock, if its source still holds that
    content (the watcher may have handed on a newer one meanwhile). False: it did not; the caller hands
    it to the watcher's path."""
    with plane.capture_lock(model):
        entry = plane.source_graph.entry(model)
        if entry is None or entry.digest != digest or plane.source_changed(model, unknown=False):
            return False
        plane.deployer.deploy(model, digest, WATCHER_ACTOR)
        return True
