"""One method per operation of the running control plane (load, unload, rollback, status, policy...).

`ControlPlane` wires the adapters together (registry, content store, serving repository, Triton
client, deployer) and is what the control API and the daemon's loop call. It decides; the API only
translates and the CLI only renders. Read-only history queries that work without the daemon live in
`controlplane.views.queries`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from controlplane.base.bounds import check_duration
from controlplane.deploy.engine import Outcome, ProgressFn
from controlplane.deploy.reconcile import Drift
from controlplane.documents.results import (
    AuditResult,
    DiffResult,
    GcResult,
    HoldResult,
    LeaseResult,
    PinResult,
    PolicyResult,
    ServingAtResult,
    StatusPage,
    StatusResult,
    TagResult,
    TagsResult,
    VersionsResult,
)
from controlplane.errors import NotFoundError, SnapshotError, StoreError, TritonctlError, UsageError
from controlplane.intake import tags
from controlplane.intake.decision import decide
from controlplane.intake.inhand import InHand
from controlplane.names import is_private_name, validate_digest, validate_model_name
from controlplane.outcomes.counters import PipelineCounts
from controlplane.parts import HostParts
from controlplane.runtime import garbage
from controlplane.settings.canarysteps import parse_steps
from controlplane.settings.config import Settings
from controlplane.snapshot import Snapshot
from controlplane.source.protocol import Source
from controlplane.source.recorded import SourceGraph
from controlplane.store.health import RegistryHealth
from controlplane.store.records import AuditRecord, ModelRecord, SnapshotRecord
from controlplane.store.registry import AuditEntry, Registry
from controlplane.target.targets import FleetStrategy, HostTarget, Target, recorded_digest
from controlplane.triton.client import RequestCounts
from controlplane.views import queries
from controlplane.views.status import StatusView
from controlplane.vocab import SERVING_STATES, WATCHER_ACTOR, Policy

if TYPE_CHECKING:
    pass

log = logging.getLogger("tritonctl.plane")

SYSTEM_ACTOR = "tritonctl"


class ControlPlane:
    """The running control plane: every operation the daemon offers."""

    def __init__(self, parts: HostParts, target: Callable[[ControlPlane], Target] | None = None) -> None:
        """`parts`: this host's, built and wired by controlplane/parts.py; `target`: where the verbs' changes
        go (with --fleet, daemon.py builds a targets.FleetTarget; default this host alone, a
        targets.HostTarget). The plane builds its target and its `status` view, nothing else."""
        self.parts = parts
        self.settings = parts.settings
        self.live = parts.live
        self.registry = parts.registry
        self.store = parts.content
        self.serving = parts.serving
        self.triton = parts.triton
        self.counters = parts.counters
        self.retries = parts.retries
        self.restores = parts.restores
        self.outcomes = parts.outcomes
        self.served_view = parts.served_view
        self.serving_ensembles = parts.serving_ensembles
        self.leases = parts.leases
        self.guard = parts.guard
        self.deployer = parts.deployer
        self.ondemand = parts.ondemand
        self.intake = parts.intake
        self.reconciler = parts.reconciler
        self.baker = parts.baker
        self.http_url = parts.http_url
        self.webhooks = parts.webhooks
        # where the verbs' changes go, chosen once by the daemon (controlplane/target/targets.py)
        self.target: Target = target(self) if target else HostTarget(
            parts.registry, parts.deployer, parts.intake.changesets, parts.ondemand, parts.retries,
            capture=parts.intake.source_content, converge=parts.intake.converge, policy_of=parts.live.policy_of)
        # `status` rows (controlplane/views/status.py)
        self.status_view = StatusView(parts.registry, parts.triton, parts.served_view, parts.deployer, parts.intake,
                                      parts.retries, parts.restores, parts.ondemand, parts.baker,
                                      tag_registry=self.target.tag_registry, http_url=parts.http_url,
                                      gateway=parts.gateway, traffic=parts.traffic)

    @property
    def fleet(self) -> FleetStrategy | None:
        """The fleet this daemon is a member of (--fleet), else None: the web view and the fleet routes
        read its shared registry."""
        return self.target.fleet

    def reconfigure(self, settings: Settings) -> None:
        """SIGHUP: the settings that change without a restart (policy, settle window, ...) apply from now."""
        self.settings = settings
        self.live.set(settings)

    # -- the intake (controlplane/intake/flow.py): the watcher's path, and the parts the fleet and the
    # start-up scan use (fleet/hostplane.HostPlane, ports.WavePlane) -------------------------------------

    def handle_settled(self, model: str, *, complete: bool = False) -> Outcome | None:
        """The watcher saw `model` settle: the intake records it and plans; this host's target runs the plan."""
        with self.intake.settled(model, complete=complete) as planned:
            return self.target.run(planned, WATCHER_ACTOR) if planned is not None else None

    @property
    def source(self) -> Source:
        return self.intake.source

    @property
    def source_graph(self) -> SourceGraph:
        return self.intake.source_graph

    @property
    def counts(self) -> PipelineCounts:
        return self.intake.counts

    @property
    def in_hand(self) -> InHand:
        return self.intake.in_hand

    def capture_lock(self, model: str) -> threading.RLock:
        return self.intake.capture_lock(model)

    def effective_policy(self, model: ModelRecord) -> str:
        return self.live.policy_of(model)

    @property
    def triton_key_exposed(self) -> bool:
        """The daemon launched tritonserver and other local users can read its command line (its key)."""
        return self.status_view.key_exposed

    @triton_key_exposed.setter
    def triton_key_exposed(self, exposed: bool) -> None:
        self.status_view.key_exposed = exposed

    def capture(self, model: str, actor: str = WATCHER_ACTOR, *, settled: bool = True, complete: bool = False,
                members: dict[str, SnapshotRecord] | None = None) -> SnapshotRecord:
        return self.intake.capture(model, actor, settled=settled, complete=complete, members=members)

    def snapshot_source(self, model: str, *, settled: bool = True,
                        complete: bool = False) -> tuple[Snapshot, str | None, bool]:
        return self.intake.snapshot_source(model, settled=settled, complete=complete)

    def source_changed(self, model: str, *, unknown: bool = True) -> bool:
        return self.intake.source_changed(model, unknown=unknown)

    def source_has(self, model: str) -> bool:
        return self.intake.source_has(model)

    def capture_failed(self, model: str, exc: SnapshotError | StoreError) -> None:
        self.intake.capture_failed(model, exc)

    def put_off(self, model: str, reason: str, delay_s: float) -> None:
        self.intake.put_off(model, reason, delay_s)

    def capture_done(self, model: str) -> None:
        self.intake.capture_done(model)

    def look_again(self, model: str, delay_s: float) -> None:
        self.intake.look_again(model, delay_s)

    def due_retries(self) -> list[str]:
        """The models whose environment-fault retry is due now, each taken (RetryBook.take_due)."""
        return [retry.model for retry in self.retries.take_due()]

    def retry(self, model: str) -> Outcome | None:
        """Deploy again what failed for an environment fault, unless something now holds the model."""
        retry = self.retries.get(model)
        if retry is None:
            return None
        current = self.registry.find_model(model)
        try:
            snap = self.registry.get_snapshot(model, retry.digest)
        except TritonctlError:
            snap = None
        if current is None or snap is None or not decide(current, snap, policy=Policy.AUTO, chosen=True).deploys:
            self.retries.clear(model)
            return None
        log.info("%s: retry %d of %s (%s)", model, retry.attempt, retry.digest[:12], retry.reason)
        return self.deployer.deploy(model, retry.digest, SYSTEM_ACTOR)

    # -- operations -----------------------------------------------------------------------------

    def load(
        self, model: str, actor: str, digest: str = "", force: bool = False, progress: ProgressFn | None = None,
        host: str = "", bake_s: float | None = None, steps: Sequence[int | str] | None = None,
        shadow_s: float | None = None,
    ) -> Outcome:
        """`bake_s`: this deploy's own bake (`load --bake 5m`; 0: none), else the daemon's `bake_s`; `steps`: its
        own canary steps (`load --steps [5, 100]`), else the model's or the daemon's `canary_steps`; `shadow_s`:
        its own shadow before the first step (`load --shadow 5m`; 0: none), else the daemon's `shadow_s`."""
        validate_model_name(model)
        for flag, seconds in (("--bake", bake_s), ("--shadow", shadow_s)):
            if seconds is not None:
                try:
                    check_duration(seconds)
                except ValueError as exc:
                    raise UsageError(f"{flag}: {seconds!r}: {exc}") from None
        try:
            canary = parse_steps(list(steps)) if steps is not None else None
        except ValueError as exc:
            raise UsageError(f"--steps: {exc}") from None
        if digest:
            target = recorded_digest(self.registry, model, validate_digest(digest))
        else:
            target = self.intake.source_content(model, actor)
        self.baker.ask(model, bake_s, canary, shadow_s)
        try:
            return self.target.load(model, target, actor, force, progress, host)
        except BaseException:
            self.baker.ask(model, None)  # refused before any deploy: the next deploy bakes as configured
            raise

    def promote(self, model: str, actor: str) -> dict[str, Any]:
        """`tritonctl promote MODEL`: the bake in progress ends `passed` now (controlplane/bake/baker.py)."""
        validate_model_name(model)
        return self.baker.promote(model, actor)

    def abort(self, model: str, actor: str) -> dict[str, Any]:
        """`tritonctl abort MODEL`: the canary (or bake) in progress ends as a crossed limit ends it, by `actor`:
        every request back on the previous digest at once, the deploy `rolled_back` (controlplane/bake/baker.py)."""
        validate_model_name(model)
        return self.baker.abort(model, actor)

    def load_set(self, models: list[str], actor: str, force: bool = False,
                 progress: ProgressFn | None = None) -> Outcome:
        """`tritonctl load a b pipe`: the named models as one change set (controlplane/intake/changeset.py)."""
        if len(models) == 1:
            return self.load(models[0], actor, force=force, progress=progress)
        return self.target.load_set(models, actor, force, progress)

    def unload(self, model: str, actor: str, dependents: bool = False, progress: ProgressFn | None = None,
               force: bool = False, host: str = "") -> Outcome:
        validate_model_name(model)
        return self.target.unload(model, actor, dependents, progress, force, host)

    def rollback(self, model: str, actor: str, to: str = "", progress: ProgressFn | None = None,
                 force: bool = False, host: str = "") -> Outcome:
        validate_model_name(model)
        return self.target.rollback(model, actor, validate_digest(to) if to else None, progress, force, host)

    def set_policy(self, model: str, policy: str, actor: str, host: str = "") -> PolicyResult:
        validate_model_name(model)
        if policy.startswith(tags.TRACK_PREFIX):
            tags.refuse_host(policy, host)
            return self.target.set_track(model, policy, actor, host)
        if policy not in ("auto", "manual", "ondemand", "inherit"):
            raise UsageError(f"policy '{policy}': expected auto, manual, ondemand, inherit or track:TAG")
        if not host:
            tags.untrack(self.target, model)
        return self.target.set_policy(model, policy, actor, host)

    # -- this host alone (the fleet's fleet/hostplane.HostPlane) -------------------------------------

    def ensure(self, model: str, for_s: float, actor: str, progress: ProgressFn | None = None) -> LeaseResult:
        """Load `model` (or find it loaded) and hold it with a lease for `for_s` seconds
        (controlplane/memory/ondemand.py); on a fleet an on-demand model is placed on one host with room
        (docs/fleet.md "On-demand models")."""
        return self.target.ensure(model, for_s, actor, progress)

    def renew_lease(self, model: str, lease: str, for_s: float) -> LeaseResult:
        return self.target.renew_lease(model, lease, for_s)

    def release_lease(self, model: str, lease: str) -> LeaseResult:
        return self.target.release_lease(model, lease)

    def ensure_here(self, model: str, for_s: float, actor: str, digest: str | None = None) -> LeaseResult:
        """On this host alone (a fleet's placement, or a model the fleet rolls out everywhere)."""
        return self.ondemand.ensure(model, for_s, actor, digest=digest)

    def renew_here(self, model: str, lease: str, for_s: float) -> LeaseResult:
        return self.ondemand.renew(model, lease, for_s)

    def release_here(self, model: str, lease: str) -> LeaseResult:
        return self.ondemand.release(model, lease)

    def holdings_here(self) -> dict[str, tuple[float | None, float | None, bool]]:
        """What this host's loaded models hold (model → memory_mb, gpu_memory_mb, evictable): the fleet's
        placement weighs it against this host's budget. Evictable: not pinned, protected, leased or busy."""
        known = self.registry.footprints()
        spared = self.guard.spared()
        held = {}
        for m in self.registry.list_models(states=SERVING_STATES):
            if not m.active_digest:
                continue
            found = known.get((m.name, m.active_digest))
            evictable = not (spared(m) or self.leases.held(m.name) or self.deployer.lock(m.name).locked())
            held[m.name] = (found.memory_mb if found else None, found.gpu_memory_mb if found else None, evictable)
        return held

    def deploy_here(self, model: str, digest: str, actor: str, *, force: bool = False,
                    kind: str = "deploy") -> Outcome:
        return self.deployer.deploy(model, digest, actor, force=force, kind=kind)

    # a fleet's canary wave on this host (controlplane/fleet/bake.py): the leader judges, this host follows
    def canary_first(self, model: str, digest: str, weight: int) -> None:
        self.baker.rollouts.fleet_first(model, digest, weight)

    def canary_weight(self, model: str, digest: str, weight: int) -> bool:
        return self.baker.rollouts.fleet_weight(model, digest, weight)

    def canary_done(self, model: str, digest: str) -> None:
        self.baker.rollouts.fleet_done(model, digest)

    def bake_counts(self, model: str, digest: str) -> dict[tuple[str, str], RequestCounts]:
        """This host's figures of `digest` of `model` for a fleet bake: its gateway's (what clients got, error
        responses failed), else its tritonserver's counts of the model."""
        traffic = self.baker.rollouts.traffic
        if traffic is None:
            return self.triton.request_counts(model)
        counts = traffic.counts(model).get(digest)
        if counts is None:
            return {}
        return {("gateway", digest): RequestCounts(counts.successes, counts.failures, int(counts.latency_s * 1e9))}

    def rollback_here(self, model: str, actor: str, to: str | None, progress: ProgressFn | None) -> Outcome:
        return self.deployer.rollback(model, actor, to, progress)

    def unload_here(self, model: str, actor: str, dependents: bool = False,
                    progress: ProgressFn | None = None) -> Outcome:
        return self.deployer.unload(model, actor, dependents, progress)

    def deploy_set(self, records: dict[str, SnapshotRecord], actor: str, *, force: bool = False) -> Outcome:
        with self.intake.changesets.one_at_a_time:
            return self.deployer.run(self.intake.changesets.plan_records(records, force=force), actor)

    def repository_held(self) -> bool:
        return self.source.repository_held()

    def still_settling(self, models: Sequence[str]) -> list[str]:
        return self.intake.changesets.still_settling(models)

    # -- tags (controlplane/intake/tags.py; the plane is its ports.TagTarget) -------------------------------

    def tag_registry(self) -> Registry:
        """Where tags live: the shared registry on a fleet, this host's otherwise."""
        return self.target.tag_registry()

    def deploy_tagged(self, model: str, digest: str, actor: str, progress: ProgressFn | None) -> Outcome:
        """A tracked tag's digest, deployed the usual way; on a fleet as a rollout (canary, waves)."""
        return self.target.deploy_tagged(model, digest, actor, progress)

    def forget_retry(self, model: str) -> None:
        self.retries.clear(model)

    def set_pin(self, model: str, pinned: bool, actor: str, host: str = "") -> PinResult | HoldResult:
        validate_model_name(model)
        return self.target.set_pin(model, pinned, actor, host)

    def gc(self, keep: int, actor: str) -> GcResult:
        result = garbage.collect_garbage(self.registry, self.store, keep)
        self.registry.audit(
            AuditEntry(actor, "gc", None, None, "ok",
                       f"removed {result.snapshots_removed} snapshots, freed {result.bytes_freed} bytes")
        )
        return result

    # -- state ----------------------------------------------------------------------------------

    def status(self, models: list[str] | None = None) -> StatusResult:
        return self.status_view.status(models)

    def status_page(self, *, state: str = "", sync: str = "", name: str = "", page: int = 1,
                    size: int = 100) -> StatusPage:
        return self.status_view.status_page(state=state, sync=sync, name=name, page=page, size=size)

    def inference_urls(self) -> tuple[str, str | None]:
        """Where clients send inference to this host: its gateway's gRPC and HTTP addresses, else its
        tritonserver's (views/status.py; a fleet host's heartbeat advertises them)."""
        return self.status_view.inference_urls()

    def registry_outage(self) -> RegistryHealth | None:
        return self.status_view.registry_outage()

    def reconcile(self) -> list[Drift]:
        """Compare desired and actual; restore what should serve; finish interrupted deployments."""
        return self.reconciler.reconcile()

    def preloaded(self, models: Sequence[str]) -> None:
        """A tritonserver was launched with these models loading in its own start-up (outcomes/reconciler.py)."""
        self.reconciler.preloaded(models)

    def load_parallelism(self) -> int:
        return self.settings.load_parallelism

    def restart_suspected(self) -> bool:
        return self.reconciler.restart_suspected()

    @property
    def sentinel(self) -> str | None:
        """A model seen READY: supervision asks Triton for it (restart_suspected)."""
        return self.reconciler.sentinel

    # -- reads (the API's GET routes; the CLI's read commands query the registry itself, daemon or not) ------

    def versions(self, model: str) -> VersionsResult:
        validate_model_name(model)
        return tags.annotate_versions(tags.tag_registry(self.target), model, queries.versions(self.registry, model))

    def audit(self, **filters: Any) -> AuditResult:
        return queries.audit(self.registry, **filters)

    def serving_at(self, at: str, model: str | None = None) -> ServingAtResult:
        result = queries.serving_at(self.registry, at, [model] if model else None)
        return tags.annotate_serving_at(tags.tag_registry(self.target), result, model)

    def tag_listing(self, model: str | None = None, at: str | None = None) -> TagsResult:
        return tags.listing(tags.tag_registry(self.target), model, at)

    def diff(self, model: str, ref_a: str, ref_b: str) -> DiffResult:
        validate_model_name(model)
        digest_a, digest_b = (tags.resolve_ref(tags.tag_registry(self.target), model, ref) for ref in (ref_a, ref_b))
        return queries.diff(self.registry, self.store, model, digest_a, digest_b)

    def tag_digest(self, model: str, name: str) -> str:
        """The digest tag NAME of MODEL points to (`load --tag`, `rollback --to-tag`)."""
        return tags.tag_digest(tags.tag_registry(self.target), model, name)

    def move_tag(self, model: str, name: str, ref: str, actor: str, progress: ProgressFn | None = None,
                 delete: bool = False) -> TagResult:
        return tags.move(self.target, model, name, ref, actor, progress, delete=delete)

    # -- the event stream (controlplane/api/stream.py) ---------------------------------------------

    def events_after(self, after_id: int, limit: int = 500) -> list[AuditRecord]:
        return self.registry.events_after(after_id, limit)

    def last_event_id(self) -> int:
        return self.registry.last_event_id()

    def activity(self) -> dict[str, tuple[str, str]]:
        """Models settling (or being captured) or deploying right now: model -> (state, reason). In memory only:
        the event stream samples it often."""
        settling = self.in_hand.reasons(self.source.settling(), dict(self.intake.capture_waits))
        now = {model: ("settling", reason) for model, reason in settling.items()}
        for model in self.deployer.busy_models():
            now[model] = ("deploying", "an operation is in progress")
        return {model: value for model, value in now.items() if not is_private_name(model)}

    def model_state(self, model: str) -> str:
        """The registry's state word of a model (serving, degraded, failed, unloaded, new; removed)."""
        record = self.registry.find_model(model)
        if record is None:
            return "unknown"
        return "removed" if record.removed_at is not None else record.state

    def quarantined(self, model: str, digest: str) -> bool:
        try:
            return bool(self.registry.get_snapshot(model, digest).quarantined)
        except (NotFoundError, StoreError):
            return False
