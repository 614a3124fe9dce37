"""What each part of the control plane is handed of the plane: narrow, typed protocols instead of the
whole `ControlPlane` (controlplane/control_plane.py implements them; tests hand in small stand-ins).

Why: parts that reached through the plane for whatever they needed (change sets writing its
capture waits, tags reaching its fleet) made every change to the plane a change to them, and the
import circle changeset -> service. Each part names here what it uses, and nothing else.
"""

from __future__ import annotations

import threading
from typing import Protocol

from controlplane.deploy.engine import Deployer, Outcome, ProgressFn
from controlplane.deploy.servingensembles import ServingEnsembles
from controlplane.errors import SnapshotError, StoreError
from controlplane.settings.config import Settings
from controlplane.snapshot import ContentStore, Snapshot
from controlplane.source.protocol import Source
from controlplane.source.recorded import SourceGraph
from controlplane.store.records import ModelRecord, SnapshotRecord
from controlplane.store.registry import Registry


class SourcePlane(Protocol):
    """What change sets and the fleet (fleet/hostplane.py) both use of the plane: its registry, its
    content store, its source and the watcher's "look again"."""

    @property
    def registry(self) -> Registry: ...

    @property
    def store(self) -> ContentStore: ...

    @property
    def source(self) -> Source: ...

    def source_has(self, model: str) -> bool: ...

    def look_again(self, model: str, delay_s: float) -> None: ...


class SetIntake(Protocol):
    """What change sets (controlplane/intake/changeset.py) use of the intake (controlplane/intake/flow.py): the
    registry, the source (its configs, what settles, its repository-level hold and commit marker) and
    the recorded graph of it, which ensembles serve, the capture of a model's source, the decision
    inputs, and the watcher's "look again". No deployer: change sets return plans."""

    @property
    def settings(self) -> Settings: ...

    @property
    def registry(self) -> Registry: ...

    @property
    def source(self) -> Source: ...

    @property
    def serving_ensembles(self) -> ServingEnsembles: ...

    @property
    def source_graph(self) -> SourceGraph: ...

    def source_has(self, model: str) -> bool: ...

    def look_again(self, model: str, delay_s: float) -> None: ...

    def capture(self, model: str, actor: str = ..., *, settled: bool = ..., complete: bool = ...,
                members: dict[str, SnapshotRecord] | None = ...) -> SnapshotRecord: ...

    def source_changed(self, model: str, *, unknown: bool = ...) -> bool: ...

    def effective_policy(self, model: ModelRecord) -> str: ...

    def capture_failed(self, model: str, exc: SnapshotError | StoreError) -> None: ...

    def put_off(self, model: str, reason: str, delay_s: float) -> None: ...

    def capture_done(self, model: str) -> None: ...


class Counted(Protocol):
    """The pipeline's counters (captures, validations, records, ...: Prometheus counters)."""

    def add(self, name: str, amount: int = 1) -> None: ...


class WavePlane(SetIntake, Protocol):
    """What the start-up scan's batched records (controlplane/startup/record.py) use of the plane, beyond
    a change set's: a model's capture lock, the capture step alone, the pipeline's counters, the content
    store it syncs, and the deployer that deploys a model the scan recorded alone."""

    @property
    def store(self) -> ContentStore: ...

    @property
    def deployer(self) -> Deployer: ...

    @property
    def counts(self) -> Counted: ...

    def capture_lock(self, model: str) -> threading.RLock: ...

    def snapshot_source(self, model: str, *, settled: bool = ...,
                        complete: bool = ...) -> tuple[Snapshot, str | None, bool]: ...


class TagTarget(Protocol):
    """What tags (controlplane/intake/tags.py) use of their target (target/targets.py): where tags live (the
    shared registry on a fleet), how a tracked tag's digest is deployed (the usual load; on a fleet a rollout), and the
    retry book a failed move must clear."""

    def tag_registry(self) -> Registry: ...

    def deploy_tagged(self, model: str, digest: str, actor: str, progress: ProgressFn | None) -> Outcome: ...

    def forget_retry(self, model: str) -> None: ...
