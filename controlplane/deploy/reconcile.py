"""Pure planning: the registry's desired state against what Triton actually serves. No I/O here.

The daemon gathers the inputs (registry models, Triton's index, served digests), calls `plan`, then
acts on the result: restore what should serve and does not, report drift. A model that already serves
the right digest gets no action, because calling load on it again could make Triton reload it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from controlplane.store.records import ModelRecord
from controlplane.triton.client import IndexEntry
from controlplane.vocab import SERVING_STATES


@dataclass(frozen=True)
class Drift:
    """A difference between desired and actual; `kind` is missing, wrong_digest or unmanaged."""

    model: str
    kind: str
    detail: str

    def to_json(self) -> dict[str, str]:
        return {"model": self.model, "kind": self.kind, "detail": self.detail}


@dataclass(frozen=True)
class Plan:
    restore: list[tuple[str, str]]  # (model, digest) to publish fresh and load
    drift: list[Drift]


def ready_models(index: Iterable[IndexEntry]) -> set[str]:
    return {entry.name for entry in index if entry.state == "READY"}


def plan(
    models: Iterable[ModelRecord],
    index: Iterable[IndexEntry],
    served_digests: Mapping[str, str | None],
    busy: Iterable[str] = (),
) -> Plan:
    """Decide what to restore and which drift to report.

    `served_digests` maps each READY model to the digest stamped in the config Triton serves.
    `busy` models (a deploy in flight) are left alone this round.
    """
    index = list(index)
    ready = ready_models(index)
    busy_set = set(busy)
    desired = {m.name: m for m in models if m.state in SERVING_STATES and m.active_digest}
    restore: list[tuple[str, str]] = []
    drift: list[Drift] = []
    for name, model in sorted(desired.items()):
        if name in busy_set:
            continue
        digest = model.active_digest
        assert digest is not None
        if name not in ready:
            drift.append(Drift(name, "missing", f"should serve {digest[:12]}, Triton has it not READY"))
            restore.append((name, digest))
            continue
        served = served_digests.get(name)
        if served != digest:
            drift.append(
                Drift(name, "wrong_digest", f"Triton serves {(served or 'unstamped')[:12]}, should serve {digest[:12]}")
            )
            restore.append((name, digest))
    for name in sorted(ready - set(desired) - busy_set):
        drift.append(Drift(name, "unmanaged", "loaded in Triton but not deployed by tritonctl"))
    return Plan(restore=restore, drift=drift)
