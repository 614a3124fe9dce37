"""What the fleet uses of its host's own control plane (controlplane.control_plane.ControlPlane).

The fleet sits beside the service in the layers (neither imports the other; the daemon wires them),
so it names what it needs as a Protocol instead of taking `Any`: the host's local registry, content
store and deployer, its Triton, where its clients send inference (its gateway, else its Triton), its
source (controlplane/source/protocol.py), the shared capture pipeline and the watcher's "look again later".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from controlplane.deploy.engine import Outcome, ProgressFn
from controlplane.documents.results import LeaseResult
from controlplane.ports import SourcePlane, TagTarget
from controlplane.store.records import SnapshotRecord
from controlplane.triton.client import RequestCounts


class TritonAddress(Protocol):
    @property
    def url(self) -> str: ...

    def request_counts(self, model: str) -> dict[tuple[str, str], RequestCounts]: ...  # a fleet bake's figures


class HostPlane(TagTarget, SourcePlane, Protocol):
    """The host's registry, content store, source and "look again" (ports.SourcePlane), its tags
    (ports.TagTarget), and what follows."""

    @property
    def triton(self) -> TritonAddress: ...

    def inference_urls(self) -> tuple[str, str | None]: ...  # where its clients send inference: (gRPC, HTTP)

    def capture(self, model: str, actor: str = ..., *, settled: bool = ...,
                members: dict[str, SnapshotRecord] | None = ...) -> SnapshotRecord: ...

    # this host alone (a rollout step, converge, an operator's `--host` action)
    def deploy_here(self, model: str, digest: str, actor: str, *, force: bool = ...,
                    kind: str = ...) -> Outcome: ...

    def rollback_here(self, model: str, actor: str, to: str | None, progress: ProgressFn | None) -> Outcome: ...

    def unload_here(self, model: str, actor: str, dependents: bool = ...,
                    progress: ProgressFn | None = ...) -> Outcome: ...

    def deploy_set(self, records: dict[str, SnapshotRecord], actor: str, *, force: bool = ...) -> Outcome: ...

    # a canary wave on this host (controlplane/fleet/bake.py): the first weight of a step's deploy, the next
    # ones the leader sets, the end; the figures the host writes on its bake step
    def canary_first(self, model: str, digest: str, weight: int) -> None: ...

    def canary_weight(self, model: str, digest: str, weight: int) -> bool: ...

    def canary_done(self, model: str, digest: str) -> None: ...

    def bake_counts(self, model: str, digest: str) -> dict[tuple[str, str], RequestCounts]: ...

    # on-demand models on this host alone (a fleet's placement: controlplane/fleet/ondemand.py)
    def ensure_here(self, model: str, for_s: float, actor: str, digest: str | None = ...) -> LeaseResult: ...

    def renew_here(self, model: str, lease: str, for_s: float) -> LeaseResult: ...

    def release_here(self, model: str, lease: str) -> LeaseResult: ...

    def holdings_here(self) -> dict[str, tuple[float | None, float | None, bool]]: ...

    # the change sets' view of the source (controlplane/intake/changeset.py)
    def repository_held(self) -> bool: ...

    def still_settling(self, models: Sequence[str]) -> list[str]: ...
