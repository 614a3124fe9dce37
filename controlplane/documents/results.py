"""Every `--json` document the CLI prints, as data: one dataclass per shape, each with `to_json()`.

Why a module of its own: the core returns these (queries, the control plane's status / policy / pin /
gc, the fleet's verbs and views, `validate`), the API server serializes them with `to_json()`, and
cli/render.py prints the same documents (from the dataclass, or from the dict the API client
received). The shape of each document is written here once and published as a JSON Schema,
docs/schemas/<command>.schema.json (docs/json.md): a field added here is added there too
(tests/test_json_schemas.py fails otherwise); fields may be added, never removed or retyped.

Imports only the standard library, `controlplane.store.records` (stdlib-only row views) and
`controlplane.vocab` (enums), so the
CLI's client path can import it without SQLAlchemy, tritonclient or numpy.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from controlplane.base.jsontext import iso
from controlplane.vocab import SUCCEEDED, Cause

if TYPE_CHECKING:  # annotations only: `validate` loads neither the registry's records nor the events
    from controlplane.store import records

# --- load / rollback / unload ------------------------------------------------------------------------


@dataclass(frozen=True)
class Progress:
    """One step of an operation, streamed to the CLI as it happens."""

    model: str
    step: str  # a DeployStep (the fleet streams "canary HOST" / "wave N HOST" too)
    state: str  # a StepState
    message: str = ""
    digest: str = ""


@dataclass(frozen=True)
class Outcome:
    """How an operation ended (a `Result`: ok, failed, rolled_back or noop for `load`, `rollback`,
    `unload --json`; `accepted` for `load --no-wait`), and when it failed, whose fault it was (a `Cause`)."""

    model: str
    action: str
    outcome: str  # a Result
    digest: str | None
    active_digest: str | None
    message: str = ""
    duration_ms: int = 0
    steps: list[Progress] = field(default_factory=list)
    # Why a failed outcome failed: content (quarantined), environment (retried with backoff),
    # triton_unreachable (an environment fault the CLI exits 4 for), "" otherwise.
    cause: Cause = Cause.NONE

    @property
    def succeeded(self) -> bool:
        return self.outcome in SUCCEEDED

    @property
    def retried(self) -> bool:
        """Failed for the environment's fault: the control plane deploys it again later."""
        return Cause(self.cause).retried

    def to_json(self) -> dict[str, object]:
        return {
            "model": self.model,
            "action": self.action,
            "outcome": str(self.outcome),
            "digest": self.digest,
            "active_digest": self.active_digest,
            "message": self.message,
            "duration_ms": self.duration_ms,
            "cause": str(self.cause),
        }


def accepted(model: str) -> Outcome:
    """`load --no-wait`: the daemon took the request; the outcome comes later (status, audit)."""
    return Outcome(model, "load", "accepted", None, None,
                   "accepted; follow with `tritonctl status` or `tritonctl audit`")


# --- status ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VersionState:
    """One version of a model as Triton's repository index reports it."""

    version: str
    state: str
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"version": self.version, "state": self.state, "reason": self.reason}


@dataclass
class StatusRow:
    """One model of `status --json`."""

    model: str
    state: str
    versions: list[VersionState]
    digest: str | None
    since: datetime | None
    policy: str
    pinned: bool
    drift: str | None
    drift_detail: str | None
    last_error: str | None
    removed: bool
    source_digest: str | None = None
    sync: str = ""
    sync_reason: str = ""
    next_retry_s: int | None = None
    tags: list[str] = field(default_factory=list)  # the tags on the digest that serves (controlplane/intake/tags.py)
    footprint: records.FootprintRecord | None = None  # the serving digest's footprint (memory/footprint.py)
    # policy ondemand: {"state", "leases", "until"} (controlplane/memory/ondemand.py)
    ondemand: dict[str, Any] | None = None
    # the last bake of the serving (or just rolled-back) digest (controlplane/bake/baker.py): {"state", "digest",
    # "started", "until", "requests", "failures", "failure_ratio", "latency_ms", "baseline_latency_ms", "latency_stat",
    # "reason"}
    bake: dict[str, Any] | None = None
    # the config Triton completed for the serving digest, whose model completes it at load (its auto_complete_config)
    completed_config: records.CompletedConfigRecord | None = None
    # that bake's canary steps through the gateway (controlplane/bake/canary.py): {"step", "steps", "weight",
    # "seconds_left", "state", "history"}
    canary: dict[str, Any] | None = None
    shadow: dict[str, Any] | None = None  # that bake's shadow before its first step (bake/shadow.py `to_json`)
    # what the gateway saw of the model, per digest and protocol (controlplane/gateway/figures.py): requests,
    # failures by class, latency; None without a gateway or before its first request
    traffic: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "state": self.state,
            "versions": [v.to_json() for v in self.versions],
            "digest": self.digest,
            "since": iso(self.since),
            "policy": self.policy,
            "pinned": self.pinned,
            "drift": self.drift,
            "drift_detail": self.drift_detail,
            "last_error": self.last_error,
            "removed": self.removed,
            "source_digest": self.source_digest,
            "sync": self.sync,
            "sync_reason": self.sync_reason,
            "next_retry_s": self.next_retry_s,
            "tags": list(self.tags),
            "footprint": self.footprint.to_json() if self.footprint else None,
            "ondemand": dict(self.ondemand) if self.ondemand else None,
            "bake": dict(self.bake) if self.bake else None,
            "completed_config": self.completed_config.to_json() if self.completed_config else None,
            "canary": dict(self.canary) if self.canary else None,
            "shadow": dict(self.shadow) if self.shadow else None,
            "traffic": dict(self.traffic) if self.traffic else None,
        }


@dataclass
class StatusResult:
    """`status --json`: Triton's endpoints and reachability, how the source is watched, one row per model."""

    triton_reachable: bool
    triton_url: str
    triton_http_url: str | None
    watch: dict[str, Any]  # {"mode": "inotify" | "poll" | null, "reason": str}
    models: list[StatusRow]
    # the registry (a fleet's shared one) answers; when not, since when (ISO UTC) and why: the rows are
    # what this host knows (its tritonserver, its own records, the last fleet state it read)
    registry_reachable: bool = True
    registry_unreachable_since: str | None = None
    registry_reason: str = ""
    triton_key_exposed: bool = False  # a launched tritonserver's command line (its key) is readable by other users
    # with a gateway (docs/gateway.md): where it listens and the tritonserver behind it; triton_url and
    # triton_http_url are then the gateway's, where clients send inference, as they were Triton's before
    gateway: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "triton_reachable": self.triton_reachable,
            "gateway": dict(self.gateway) if self.gateway is not None else None,
            "triton_url": self.triton_url,
            "triton_grpc_url": self.triton_url,
            "triton_http_url": self.triton_http_url,
            "registry_reachable": self.registry_reachable,
            "registry_unreachable_since": self.registry_unreachable_since,
            "registry_reason": self.registry_reason,
            "triton_key_exposed": self.triton_key_exposed,
            "watch": dict(self.watch),
            "models": [row.to_json() for row in self.models],
        }


@dataclass
class StatusPage:
    """One page of `status` (the web view's overview): the page's rows, how many models match the
    filters, which page of how many, and every state a model is in now (the state filter's choices)."""

    status: StatusResult
    total: int
    page: int
    pages: int
    states: list[str]


@dataclass(frozen=True)
class LeaseResult:
    """`ensure --json`, `lease renew|release --json` (controlplane/memory/ondemand.py): the model, the digest that
    serves, the lease and until when it holds; `loaded`: this ensure loaded it (false: found loaded)."""

    model: str
    digest: str | None
    lease: str
    until: datetime
    loaded: bool
    duration_ms: int
    released: bool = False
    host: str | None = None  # on a fleet: the host that serves it (docs/fleet.md "On-demand models")
    grpc_url: str | None = None  # that host's gateway (else tritonserver), where the client sends its inferences
    http_url: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "digest": self.digest, "lease": self.lease, "until": iso(self.until),
                "loaded": self.loaded, "duration_ms": self.duration_ms, "released": self.released,
                "host": self.host, "grpc_url": self.grpc_url, "http_url": self.http_url}


# --- policy, pin / unpin, gc, db upgrade --------------------------------------------------------------


@dataclass(frozen=True)
class PolicyResult:
    """`policy --json`. On a fleet `fleet` is true; with `--host H`, `host` and `held` are set."""

    model: str
    policy: str
    inherited: bool
    fleet: bool = False
    host: str = ""
    tag: str = ""  # `track:NAME`: the tag followed, and the digest it names
    digest: str | None = None

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"model": self.model}
        if self.host:
            data["host"] = self.host
        data.update(policy=self.policy, inherited=self.inherited)
        if self.host:
            data["held"] = True
        if self.fleet:
            data["fleet"] = True
        if self.tag:
            data.update(tag=self.tag, digest=self.digest)
        return data


@dataclass(frozen=True)
class PinResult:
    """`pin --json` / `unpin --json`. On a fleet `fleet` is true."""

    model: str
    pinned: bool
    digest: str | None
    fleet: bool = False

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"model": self.model, "pinned": self.pinned, "digest": self.digest}
        if self.fleet:
            data["fleet"] = True
        return data


@dataclass(frozen=True)
class HoldResult:
    """`pin --host H --json` / `unpin --host H --json`: host H held (or released) for the model."""

    model: str
    host: str
    held: bool
    digest: str | None

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "host": self.host, "held": self.held, "digest": self.digest}


@dataclass(frozen=True)
class GcResult:
    """`gc --json`: snapshots whose content was removed, snapshots kept, bytes freed."""

    snapshots_removed: int
    snapshots_kept: int
    bytes_freed: int

    def to_json(self) -> dict[str, int]:
        return {"snapshots_removed": self.snapshots_removed, "snapshots_kept": self.snapshots_kept,
                "bytes_freed": self.bytes_freed}


@dataclass(frozen=True)
class MigrationRow:
    """One migration `db upgrade` ran (or, --dry-run, would run): its revision and title."""

    revision: str
    title: str


@dataclass(frozen=True)
class DbUpgradeResult:
    """`db upgrade --json`: the schema revision before (null: a new registry) and after (--dry-run: the
    one it would reach), the migrations run (would run), the copy of a SQLite registry taken first."""

    before: str | None
    after: str
    migrations: list[MigrationRow] = field(default_factory=list)
    backup: str | None = None
    dry_run: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"from": self.before, "to": self.after,
                "migrations": [{"revision": m.revision, "title": m.title} for m in self.migrations],
                "backup": self.backup, "dry_run": self.dry_run}


# --- history: versions, diff, audit, audit --at ---------------------------------------------------------


@dataclass(frozen=True)
class VersionRow:
    """One distinct content of a model (`versions --json` prints a list of these)."""

    snapshot: records.SnapshotRecord
    active: bool
    tags: tuple[str, ...] = ()  # the tags naming this digest (controlplane/intake/tags.py)
    footprint: records.FootprintRecord | None = None  # its footprint on this host (memory/footprint.py)
    bake_warning: str | None = None  # its bake's warning: load time or footprint against the previous digest's
    # what Triton completed at a load, for a content whose model completes its config (its auto_complete_config)
    completed_config: records.CompletedConfigRecord | None = None
    # its last canary rollout (controlplane/bake/canary.py histories): {"weights", "state", "reason"}
    canary: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        data = self.snapshot.to_json()
        data["active"] = self.active
        data["first_error"] = self.snapshot.first_error
        data["tags"] = list(self.tags)
        data["footprint"] = self.footprint.to_json() if self.footprint else None
        data["bake_warning"] = self.bake_warning
        data["completed_config"] = self.completed_config.to_json() if self.completed_config else None
        data["canary"] = dict(self.canary) if self.canary else None
        return data


@dataclass
class VersionsResult:
    """`versions --json`: a list, newest first."""

    model: str
    versions: list[VersionRow]

    def __iter__(self) -> Iterator[VersionRow]:
        return iter(self.versions)

    def __len__(self) -> int:
        return len(self.versions)

    def to_json(self) -> list[dict[str, Any]]:
        return [row.to_json() for row in self.versions]


@dataclass(frozen=True)
class FileSize:
    path: str
    size: int

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "size": self.size}


@dataclass(frozen=True)
class FileChange:
    path: str
    size_a: int
    size_b: int
    diff: str | None  # a unified diff of a text file; null for binary or large files

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "size_a": self.size_a, "size_b": self.size_b, "diff": self.diff}


@dataclass
class DiffResult:
    """`diff --json`: files added, removed and changed between snapshots `a` and `b` (full digests)."""

    model: str
    a: str
    b: str
    added: list[FileSize]
    removed: list[FileSize]
    changed: list[FileChange]
    # a unified diff of the configs Triton completed for `a` and `b` (a model that completes its config at
    # load: what serves is not its config.pbtxt); "" when they are the same, None when neither has one
    completed_config_diff: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "a": self.a, "b": self.b, "added": [f.to_json() for f in self.added],
                "removed": [f.to_json() for f in self.removed], "changed": [f.to_json() for f in self.changed],
                "completed_config_diff": self.completed_config_diff}


@dataclass
class AuditResult:
    """`audit --json`: a list of events, newest first."""

    events: list[records.AuditRecord]

    def __iter__(self) -> Iterator[records.AuditRecord]:
        return iter(self.events)

    def __len__(self) -> int:
        return len(self.events)

    def to_json(self) -> list[dict[str, Any]]:
        from controlplane.documents.events import event_document

        return [event_document(event) for event in self.events]  # the webhook body and SSE data too


@dataclass
class WebhookDeliveriesResult:
    """`webhooks --json`: deliveries, newest first (pending, delivered, failed with the receiver's answer)."""

    deliveries: list[records.DeliveryRecord]

    def __iter__(self) -> Iterator[records.DeliveryRecord]:
        return iter(self.deliveries)

    def __len__(self) -> int:
        return len(self.deliveries)

    def to_json(self) -> list[dict[str, Any]]:
        return [delivery.to_json() for delivery in self.deliveries]


@dataclass
class ServingAtResult:
    """`audit --at T --json`: what each model (on a fleet: each model and host) served at `at`."""

    at: datetime
    models: list[records.ServingRecord]
    tags: dict[tuple[str, str | None], list[str]] = field(default_factory=dict)  # (model, digest) -> tags at `at`

    def to_json(self) -> dict[str, Any]:
        return {"at": iso(self.at), "models": [{**row.to_json(), "tags": self.tags.get((row.model, row.digest), [])}
                                               for row in self.models]}


# --- tags (controlplane/intake/tags.py) -------------------------------------------------------------------------


@dataclass
class TagsResult:
    """`tags [MODEL] [--at T] --json`: where each tag points (at T, when asked), who moved it there and when."""

    at: datetime | None
    tags: list[records.TagRecord]

    def to_json(self) -> dict[str, Any]:
        return {"at": iso(self.at), "tags": [row.to_json() for row in self.tags]}


@dataclass
class TagResult:
    """`tag MODEL NAME [DIGEST] --json`: one tag move or deletion (`digest`: where the tag points now; after a
    failed move of a tracked tag, what still serves)."""

    model: str
    tag: str
    outcome: str
    digest: str | None
    old_digest: str | None
    active_digest: str | None
    deployed: bool
    message: str

    @property
    def succeeded(self) -> bool:
        return self.outcome in ("ok", "noop")

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "tag": self.tag, "outcome": self.outcome, "digest": self.digest,
                "old_digest": self.old_digest, "active_digest": self.active_digest, "deployed": self.deployed,
                "message": self.message}


# `rollouts --json`: the fleet store's own rows (controlplane/store/records.py), one definition; read
# from there when first asked for (PEP 562), so `validate` does not load the registry's records.
if TYPE_CHECKING:
    RolloutRow = records.Rollout
    RolloutStepRow = records.Step


def __getattr__(name: str) -> Any:
    if name in ("RolloutRow", "RolloutStepRow"):
        from controlplane.store import records

        return records.Rollout if name == "RolloutRow" else records.Step
    raise AttributeError(f"module 'controlplane.documents.results' has no attribute {name!r}")
