"""Plain, immutable views of registry rows: what the rest of the core and the CLI work with."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime
from typing import Any, TypeVar

from controlplane.base.clock import utcnow as utcnow  # now as the registry stores times: naive UTC
from controlplane.base.defaults import OUTCOMES as OUTCOMES  # every outcome an audit event can have
from controlplane.base.jsontext import iso as iso  # the JSON contract's time format (imported from here too)

R = TypeVar("R")
SHARED_WORD = 32  # string values up to this length are shared too (types, platforms, step names)


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def from_row(cls: type[R], row: Any, **converted: Any) -> R:
    """The record `cls` from a row whose attributes carry its field names (an ORM row, a named tuple);
    `converted` gives the fields whose stored form differs (JSON text, 0/1 flags), already converted."""
    names = _FIELD_NAMES.get(cls) or _FIELD_NAMES.setdefault(cls, tuple(f.name for f in fields(cls)))  # type: ignore[arg-type]
    values = {name: getattr(row, name) for name in names if name not in converted}
    return cls(**values, **converted)


def _jsonable(record: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in asdict(record).items():
        out[key] = iso(value) if isinstance(value, datetime) else value
    return out


def first_error(problems: list[dict[str, str]]) -> str | None:
    """The first error among validation problems, as "file: field: message" (None: no error)."""
    for problem in problems:
        if problem.get("severity") == "error":
            return ": ".join(str(problem[k]) for k in ("file", "field", "message") if problem.get(k))
    return None


@dataclass(frozen=True)
class ModelRecord:
    name: str
    policy: str | None
    pinned: bool
    active_digest: str | None
    state: str
    last_error: str | None
    active_since: datetime | None
    updated_at: datetime
    removed_at: datetime | None

    def to_json(self) -> dict[str, Any]:
        return _jsonable(self)


@dataclass(frozen=True)
class SnapshotContent:
    """What is recorded about one captured content: its manifest and what validation found.

    Built from a validation (controlplane.intake.recording); a SnapshotRecord is one too, so the fleet records
    a host's record into the shared registry, and the shared record into a host's, as it is."""

    manifest: str
    config: dict[str, Any] | None
    versions: list[int]
    served_versions: list[int]
    valid: bool
    problems: list[dict[str, str]]
    total_bytes: int


@dataclass(frozen=True, kw_only=True)
class SnapshotRecord(SnapshotContent):
    """A recorded content of a model, with what the registry knows about it since."""

    model: str
    digest: str
    first_seen: datetime
    last_seen: datetime
    quarantined: bool
    quarantine_reason: str | None
    collected: bool

    @property
    def first_error(self) -> str | None:
        return first_error(self.problems)

    def to_json(self) -> dict[str, Any]:
        data = _jsonable(self)
        data.pop("manifest")
        return {"model": data.pop("model"), "digest": data.pop("digest"), **data}


def model_record(row: Any) -> ModelRecord:
    """The record of a `models` row."""
    return from_row(ModelRecord, row, pinned=bool(row.pinned))


def _shared_words(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    return {sys.intern(k): sys.intern(v) if v.__class__ is str and len(v) <= SHARED_WORD else v for k, v in pairs}


def parsed_config(text: str) -> dict[str, Any]:
    """A recorded config's JSON, its keys and short words shared by every config read (`sys.intern`):
    the daemon holds up to `ContentMemo`'s 8,192 parsed configs, and a first start all of its deploys'
    (controlplane/deploy/staged.py); parsed plainly, each held its own copy of every key ("name",
    "data_type", ...): 29 MB for 10,000 small ensemble configs, 18 MB shared (issue 39), for 9 us of
    CPU more each."""
    config: dict[str, Any] = json.loads(text, object_pairs_hook=_shared_words)
    return config


def snapshot_record(row: Any) -> SnapshotRecord:
    """The record of a `snapshots` row (its JSON columns parsed)."""
    return from_row(SnapshotRecord, row, config=parsed_config(row.config) if row.config else None,
                    versions=json.loads(row.versions), served_versions=json.loads(row.served_versions),
                    valid=bool(row.valid), problems=json.loads(row.problems), quarantined=bool(row.quarantined),
                    collected=bool(row.collected))


@dataclass(frozen=True)
class CompletedConfigRecord:
    """The config Triton completed for a content whose python model completes it at load (its
    `auto_complete_config`), read back after a load (controlplane/store/completed.py)."""

    model: str
    digest: str
    config: dict[str, Any]
    recorded_at: datetime

    def to_json(self) -> dict[str, Any]:
        return {"config": self.config, "recorded_at": iso(self.recorded_at)}


@dataclass(frozen=True)
class FootprintRecord:
    """A digest's memory footprint (controlplane/memory/footprint.py): host MB, MB per GPU (None: unknown),
    `source` measured | declared."""

    model: str
    digest: str
    memory_mb: float | None
    gpu_memory_mb: float | None
    source: str
    measured_at: datetime

    def to_json(self) -> dict[str, Any]:
        return {"memory_mb": self.memory_mb, "gpu_memory_mb": self.gpu_memory_mb, "source": self.source,
                "measured_at": iso(self.measured_at)}


@dataclass(frozen=True)
class SourceHead:
    """The newest recorded content of a model's source (by when it was last seen there)."""

    model: str
    digest: str
    valid: bool
    first_error: str | None
    quarantined: bool
    quarantine_reason: str | None
    first_seen: datetime
    last_seen: datetime


@dataclass(frozen=True)
class SourceEntry:
    """A model's newest recorded source content as a start compares it (controlplane/startup/scan.py)."""

    model: str
    signature: str | None  # the stat or listing signature it was captured at (None: unknown)
    digest: str
    steps: list[str] | None  # an ensemble's step models; None: no ensemble
    trusted: bool = True  # False: recorded within the racy window; the next start captures it again


@dataclass(frozen=True)
class DeploymentRecord:
    id: int
    model: str
    kind: str
    digest: str | None
    previous_digest: str | None
    step: str
    actor: str
    started_at: datetime
    finished_at: datetime | None
    outcome: str | None
    error: str | None

    def to_json(self) -> dict[str, Any]:
        return _jsonable(self)


@dataclass(frozen=True)
class AuditRecord:
    id: int
    time: datetime
    actor: str
    action: str
    model: str | None
    digest: str | None
    outcome: str
    duration_ms: int | None
    message: str
    host: str = ""
    claimed: str | None = None  # what the caller declared, when it differs from `actor` (migration 0011)

    def to_json(self) -> dict[str, Any]:
        return _jsonable(self)


@dataclass(frozen=True)
class ServingRecord:
    model: str
    digest: str | None
    versions: list[int] = field(default_factory=list)
    since: datetime | None = None
    host: str = ""

    def to_json(self) -> dict[str, Any]:
        return _jsonable(self)


@dataclass(frozen=True)
class AuditQuery:
    """The filters of `tritonctl audit` (every given one must match), newest first, at most `limit`."""

    model: str | None = None
    action: str | None = None
    outcome: str | None = None
    actor: str | None = None
    since: datetime | None = None
    until: datetime | None = None
    limit: int = 100


@dataclass(frozen=True)
class TagRecord:
    """Where a model's tag points (now, or at a time `tags --at T` asked about)."""

    model: str
    name: str
    digest: str
    moved_by: str
    moved_at: datetime

    def to_json(self) -> dict[str, Any]:
        return _jsonable(self)


@dataclass(frozen=True)
class Step:
    """One host's step of a fleet rollout (wave 0 is the canary set)."""

    id: int
    rollout_id: int
    host: str
    wave: int
    action: str
    digest: str | None
    state: str
    message: str
    model: str = ""
    started_at: datetime | None = None
    finished_at: datetime | None = None
    figures: dict[str, Any] | None = None  # a bake step's figures so far (controlplane/fleet/bake.py)

    def to_json(self) -> dict[str, Any]:
        return _jsonable(self)


@dataclass(frozen=True)
class Rollout:
    """One rollout of a digest ("" : an unload) over the fleet, with its per-host steps (`rollouts --json`
    prints a list of these, newest first)."""

    id: int
    model: str
    digest: str
    previous_digest: str | None
    state: str  # queued | running | rolling_back | done | rolled_back
    actor: str
    created_at: datetime
    finished_at: datetime | None
    error: str | None
    steps: list[Step]
    bake: dict[str, Any] | None = None  # the pooled bake of its last baked wave (controlplane/fleet/bake.py)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "model": self.model, "digest": self.digest, "previous_digest": self.previous_digest,
                "state": self.state, "actor": self.actor, "created_at": iso(self.created_at),
                "finished_at": iso(self.finished_at), "error": self.error,
                "steps": [step.to_json() for step in self.steps], "bake": self.bake}


@dataclass(frozen=True)
class DeliveryRecord:
    """One event sent (or to be sent) to one webhook (`tritonctl webhooks --json` prints a list of these).

    `id` is the `X-Tritonctl-Delivery` header, the same on every retry; `state` pending | delivered |
    failed; `status_code` and `answer` are the receiver's last answer (or why there was none)."""

    id: str
    event_id: int
    action: str
    model: str | None
    url: str
    state: str
    attempts: int
    created_at: datetime
    next_attempt_at: datetime | None
    last_attempt_at: datetime | None
    finished_at: datetime | None
    status_code: int | None
    answer: str

    def to_json(self) -> dict[str, Any]:
        return _jsonable(self)


class Actor(str):
    """An authenticated identity (`token:alice`, `uid:1000(alice)`, `oidc:alice@example.com`) as the actor
    string every verb already passes down, carrying what the caller declared (`x-tritonctl-actor`) when
    that differs: `claimed`. Being a str, it goes through every layer unchanged; the audit entries built
    from it keep the claim beside the actor (`AuditEntry.claimed`), never as the actor."""

    claimed: str | None

    def __new__(cls, identity: str, claimed: str | None = None) -> Actor:
        actor = super().__new__(cls, identity)
        actor.claimed = claimed or None
        return actor


@dataclass(frozen=True)
class AuditEntry:
    """An audit event to append (the registry stamps the time). `claimed`: the actor's claim, taken from an
    `Actor` when not given."""

    actor: str
    action: str
    model: str | None
    digest: str | None
    outcome: str
    message: str = ""
    duration_ms: int | None = None
    claimed: str | None = None

    def __post_init__(self) -> None:
        if self.claimed is None and getattr(self.actor, "claimed", None):
            object.__setattr__(self, "claimed", self.actor.claimed)  # type: ignore[attr-defined]
        object.__setattr__(self, "actor", str(self.actor))  # a plain str from here on (journals, pickles)


@dataclass(frozen=True)
class TokenRecord:
    """A personal token as `token list` shows it: never its secret nor its hash."""

    name: str
    role: str
    creator: str
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None = None
    revoked_by: str | None = None

    def to_json(self) -> dict[str, Any]:
        return _jsonable(self)
