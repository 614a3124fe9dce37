"""One method per operation of the running control plane (load, unload, rollback, status, policy...).

`ControlPlane` wires the adapters together (registry, content store, serving repository, Triton
client, deployer) and is what the control API and the daemon's loop call. It decides; the API only
translates and the CLI only renders. Read-only history queries that work without the daemon live in
`controlplane.queries`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from controlplane import garbage, intake, queries, tags
from controlplane.bake import BAKES_FILE, Baker
from controlplane.changeset import ChangeSets
from controlplane.config import Settings
from controlplane.counters import Counters, PipelineCounts
from controlplane.decision import Rule, Verdict, decide, decide_capture
from controlplane.deploy.causes import Retry, RetryBook
from controlplane.deploy.engine import Deployer, Outcome, ProgressFn
from controlplane.deploy.plans import ACTION as CHANGESET
from controlplane.deploy.publish import ServingRepository
from controlplane.deploy.reconcile import Drift, plan
from controlplane.errors import NotFoundError, ObjectStoreError, SnapshotError, StoreError, TritonctlError, UsageError
from controlplane.memory.budget import Hooks, MemoryGuard
from controlplane.memory.footprint import Meter
from controlplane.memory.leases import LeaseBook
from controlplane.memory.ondemand import OnDemand
from controlplane.names import is_private_name, validate_digest, validate_model_name
from controlplane.outcomes import Outcomes
from controlplane.reconciler import Reconciler
from controlplane.results import (
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
    VersionState,
)
from controlplane.servedview import ServedView
from controlplane.servingensembles import ServingEnsembles
from controlplane.snapshot import ContentStore, Snapshot
from controlplane.source.protocol import NoSource, Source
from controlplane.source.recorded import SourceGraph
from controlplane.store.health import RegistryHealth
from controlplane.store.records import AuditRecord, DeploymentRecord, ModelRecord, SnapshotRecord, SourceHead, iso
from controlplane.store.registry import AuditEntry, AuditQuery, Registry
from controlplane.syncstatus import InHand, needs_last_deployment, sync_state, track_sync
from controlplane.targets import FleetStrategy, HostTarget, Target, recorded_digest
from controlplane.triton.client import TritonClient
from controlplane.triton.host import TritonHost
from controlplane.vocab import CAPTURE_REFUSED, SERVING_STATES, WATCHER_ACTOR, Cause, Policy, Result, SyncState

if TYPE_CHECKING:
    from controlplane.webhooks import Webhooks

log = logging.getLogger("tritonctl.plane")

SYSTEM_ACTOR = "tritonctl"
LASTS_BY_NAME = 500  # `status`: up to this many models not in sync have their last deployments read by name


@dataclass
class _SyncInputs:
    """What `sync` is derived from (controlplane/syncstatus.py), read once for many models."""

    heads: dict[str, SourceHead]
    lasts: dict[str, DeploymentRecord]
    busy: set[str]
    settling: dict[str, str]
    tagged: dict[tuple[str, str], list[str]]
    tracks: dict[str, str]
    retries: dict[str, Retry]
    restores: dict[str, Retry]


class ControlPlane:
    """The running control plane: every operation the daemon offers."""

    def __init__(
        self,
        settings: Settings,
        registry: Registry,
        store: ContentStore,
        serving: ServingRepository,
        triton: TritonClient,
        outcomes: Outcomes | None = None,
        *,
        source: Source | None = None,
        host: TritonHost | None = None,
        http_url: str | None = None,
        webhooks: Webhooks | None = None,
        target: Callable[[ControlPlane], Target] | None = None,
    ) -> None:
        """`outcomes`: where every finished operation is reported (the plane subscribes its own bookkeeping
        first; the daemon then subscribes what reports it); `source`: where models come from
        (controlplane/source/protocol.py: a directory, s3://; default none);
        `host`: capability checks and Triton's real reasons; `http_url`: a launched tritonserver's HTTP URL;
        `target`: where the verbs' changes go, built with the plane (with --fleet, daemon.py builds a
        targets.FleetTarget; default this host alone, a targets.HostTarget); `webhooks`: the daemon's webhook
        delivery worker, which `tritonctl webhooks` asks."""
        self.settings = settings
        self.registry = registry
        self.store = store
        self.serving = serving
        self.triton = triton
        self.counters = Counters()
        self.counts = PipelineCounts()
        self.source_graph = SourceGraph(registry)  # recorded source contents: signatures, ensemble graph
        self.retries = RetryBook()  # deploys that failed for an environment fault (controlplane.deploy.causes)
        self.restores = RetryBook()  # reconcile's restores that failed: retried with the same backoff
        self.outcomes = outcomes if outcomes is not None else Outcomes()
        self.outcomes.subscribe(self._note_outcome)
        self.leases = LeaseBook(on_expiry=lambda lease: self.ondemand.on_expiry(lease))  # controlplane/memory/leases.py
        self.guard = self._memory_guard(settings, registry, triton, host)
        self.deployer = Deployer(registry, store, serving, triton, load_timeout_s=settings.load_timeout_s,
                                 on_outcome=self.outcomes.publish, host=host, guard=self.guard)
        self.ondemand = OnDemand(registry, self.deployer, triton, self.leases, self.effective_policy,
                                 lambda: self.settings.idle_unload_s, self.guard.spared, self.guard.fits,
                                 self.guard.refused, lambda: self.settings.load_timeout_s)  # ensure, leases
        self._capture_locks: dict[str, threading.RLock] = {}
        self._guard = threading.Lock()
        self.source: Source = source if source is not None else NoSource()
        self.in_hand = InHand()  # handed on by the source, not captured yet: `status` says "capturing"
        self.http_url = http_url
        # the daemon launched tritonserver and other local users can read its command line (its key)
        self.triton_key_exposed = False
        self.capture_waits: dict[str, str] = {}  # why the watcher's last capture of a model was put off
        self._tags_seen: tuple[list[Any], dict[str, str]] = ([], {})  # the last tags and tracks read
        self.capture_refusals: dict[str, str] = {}  # why the watcher's last capture of a model was refused
        self.served_view = ServedView()  # one repository-index call per reconcile, not one per model
        self.webhooks = webhooks  # the daemon's delivery worker (controlplane/webhooks.py): `tritonctl webhooks`
        # which ensembles serve now, over which steps: change sets group by it, reconcile orders by it
        self.serving_ensembles = ServingEnsembles(registry, self.source_graph, serving)
        self.changesets = ChangeSets(self)  # ensembles and their steps changing together (controlplane/changeset.py)
        # Triton made to serve what the registry says: recoveries, restores, the sentinel (controlplane/reconciler.py)
        self.reconciler = Reconciler(registry, triton, self.deployer, self.serving_ensembles, self.served_view,
                                     self.counters, self.restores, self.load_parallelism)
        self.outcomes.subscribe(self.reconciler.note)
        # a new digest served on live figures, rolled back by itself (controlplane/bake.py)
        self.baker = Baker(registry, self.deployer, triton, lambda: self.settings,
                           path=settings.state_dir / BAKES_FILE)
        self.outcomes.subscribe(self.baker.note)
        self.deployer.on_set = self.baker.note_set  # a change set bakes as one
        # where the verbs' changes go, chosen once by the daemon (controlplane/targets.py)
        self.target: Target = target(self) if target else HostTarget(
            registry, self.deployer, self.changesets, self.ondemand, self.retries,
            capture=self._source_content, converge=self.converge, policy_of=self.effective_policy)

    def _memory_guard(self, settings: Settings, registry: Registry, triton: TritonClient,
                      host: TritonHost | None) -> MemoryGuard:
        """Footprints of every load and, with a budget, room made by evicting idle models
        (controlplane/memory/budget.py)."""
        def last_used() -> dict[str, float]:
            used = self.leases.last_used()
            for model, when in triton.last_inferences().items():
                used[model] = max(used.get(model, 0.0), when)
            return used

        hooks = Hooks(last_used=last_used,
                      held=lambda model: self.leases.held(model) or self.deployer.lock(model).locked(),
                      evict=lambda model, why: self.deployer.evict(model, "tritonctl:budget", why,
                                                                   unless=lambda: self.leases.held(model)))
        return MemoryGuard(registry, Meter(host.server_pid if host is not None else None), hooks,
                           memory_budget_mb=settings.memory_budget_mb,
                           gpu_memory_budget_mb=settings.gpu_memory_budget_mb,
                           protected_tags=[t.strip() for t in settings.protected_tags.split(",") if t.strip()])

    @property
    def fleet(self) -> FleetStrategy | None:
        """The fleet this daemon is a member of (--fleet), else None: the web view and the fleet routes
        read its shared registry."""
        return self.target.fleet

    def reconfigure(self, settings: Settings) -> None:
        """SIGHUP: the settings that change without a restart (policy, settle window, ...) apply from now."""
        self.settings = settings

    def _note_outcome(self, outcome: Outcome) -> None:
        self.counters.last_action = f"{outcome.action} {outcome.model}: {outcome.outcome}"
        if outcome.action != CHANGESET:  # a set's members each end with their own outcome
            self.serving_ensembles.note(outcome.model, outcome.active_digest)
        if outcome.action in ("deploy", "rollback"):
            if outcome.retried and outcome.digest:
                retry = self.retries.failed(outcome.model, outcome.digest, outcome.message)
                log.warning("%s: not the content's fault; retry %d in %d s", outcome.model, retry.attempt,
                            retry.seconds_left())
            elif outcome.outcome != Result.FAILED or outcome.cause == Cause.CONTENT:
                self.retries.clear(outcome.model)
        if outcome.outcome == Result.OK and outcome.action == "unload":
            self.retries.clear(outcome.model)  # an operator's unload: nothing retries what it took out
        if outcome.outcome == Result.OK and outcome.action in ("deploy", "rollback", "restore", "unload"):
            self.restores.clear(outcome.model)  # it serves what the registry says now (or nothing, meant)
        if (outcome.outcome == Result.OK and outcome.action in ("deploy", "rollback", "restore")
                and outcome.active_digest):
            self.served_view.note(outcome.model, outcome.active_digest)  # its verification read it just now

    def capture_lock(self, model: str) -> threading.RLock:
        """Serializes a model's capture-and-decide pipeline, so two settled events for the same
        content cannot both decide to deploy it (the second sees the first's outcome)."""
        with self._guard:
            return self._capture_locks.setdefault(model, threading.RLock())

    def effective_policy(self, model: ModelRecord) -> str:
        return model.policy or self.settings.policy

    # -- snapshots ------------------------------------------------------------------------------

    def capture(self, model: str, actor: str = WATCHER_ACTOR, *, settled: bool = True, complete: bool = False,
                members: dict[str, SnapshotRecord] | None = None) -> SnapshotRecord:
        """Snapshot the model's source now, validate the immutable tree, record it (once per content).

        `settled` (the watcher's captures): refuse, as "still changing", a source that changed within
        the settle window, measured now, not when the watcher fired (the capture may run later, when
        the writer has begun its next edit). `tritonctl load` asks for what is there now.
        `complete`: the writer declared the model whole (renamed in, symlink flip, commit marker):
        no quiet window; the snapshot's before/after check still refuses a change during the copy."""
        validate_model_name(model)
        with self.capture_lock(model):
            snapshot, signature, trusted = self.snapshot_source(model, settled=settled, complete=complete)
            self.counts.add("validations")
            content = intake.validate(self.registry, self.store, snapshot, members)
            entry = intake.source_entry(model, snapshot.digest, content, signature, trusted)
            self.counts.add("records")
            record = intake.record(self.registry, model, snapshot.digest, content, actor, entry)
            self.source_graph.recorded(entry)
            return record

    def snapshot_source(self, model: str, *, settled: bool = True,
                        complete: bool = False) -> tuple[Snapshot, str | None, bool]:
        """The capture step of `capture` alone (the start-up scan validates and records many at once,
        controlplane/startup/record.py): the source's content now, as an immutable snapshot, with the
        signature it was captured at and whether a start may trust that signature."""
        self.counts.add("captures")
        snapshot, signature, trusted = self.source.capture_into(self.store, model, settled=settled, complete=complete)
        return snapshot, signature, trusted

    def source_changed(self, model: str, *, unknown: bool = True) -> bool:
        """Whether `model`'s source differs from its newest recorded content: its signature now is not
        the one recorded with it. `unknown`: the answer when no signature can say (none recorded: a
        registry from before migration 0007, or no watcher). Stat facts only: no file is read."""
        entry = self.source_graph.entry(model)
        if entry is None:
            return True
        if entry.signature is None:
            return unknown
        return self.source.signature(model) != entry.signature

    def handle_settled(self, model: str, *, complete: bool = False) -> Outcome | None:
        """The watcher saw `model` settle: record what it now holds; deploy it if policy says so.
        `complete`: handed on at once as declared whole (see `capture`)."""
        try:
            validate_model_name(model)
        except UsageError as exc:
            self.registry.audit(AuditEntry(WATCHER_ACTOR, "snapshot", None, None, "invalid", str(exc)))
            return None
        problem = self.source.entry_problem(model)
        if problem is not None:  # a dangling symlink: whatever serves keeps serving, nothing is removed
            log.warning("%s: %s", model, problem)
            self._capture_refused(model, problem)
            self.registry.audit(AuditEntry(WATCHER_ACTOR, "snapshot", model, None, "failed", problem))
            return None
        if not self.source_has(model):
            self.capture_refusals.pop(model, None)
            existing = self.registry.find_model(model)
            if existing is not None and existing.removed_at is None:
                self.retries.clear(model)  # nothing retries content the source no longer holds
                self.registry.update_model(model, removed_at=queries.now())
                self.registry.audit(
                    AuditEntry(WATCHER_ACTOR, "remove", model, existing.active_digest, "ok",
                               "removed from the source repository; what serves keeps serving")
                )
            return None
        taken, outcome = self.changesets.settled(model)  # connected through ensembles: one change set
        if taken:
            return outcome
        with self.capture_lock(model):
            return self._capture_and_decide(model, complete=complete)

    def source_has(self, model: str) -> bool:
        """Whether the source repository (a directory or object storage) holds `model` now."""
        return self.source.has(model)

    def _capture_and_decide(self, model: str, *, complete: bool = False) -> Outcome | None:
        try:
            record = self.capture(model, complete=complete)
        except (SnapshotError, StoreError) as exc:
            self.capture_failed(model, exc)
            return None
        self.capture_done(model)
        current = self.registry.ensure_model(model)
        if current.removed_at is not None:
            self.registry.update_model(model, removed_at=None)
        decision = decide(current, record, policy=self.effective_policy(current),
                          last=self.registry.last_deployment(model))
        if decision.rule is Rule.TRACKS_TAG:  # it serves what its tag names, not the source (controlplane/tags.py)
            tags.follow(self.target, model, WATCHER_ACTOR)
        elif decision.rule is Rule.QUARANTINED:
            self._note_quarantined(record)
        if not decision.deploys:
            return None
        return self.deployer.deploy(model, record.digest, WATCHER_ACTOR)

    def capture_failed(self, model: str, exc: SnapshotError | StoreError) -> None:
        """The watcher's capture of `model` did not produce content: look again later (why: `status`),
        or report the failure once in the audit (controlplane.decision.decide_capture)."""
        decision = decide_capture(exc, model, self.settings.settle_s)
        unreachable = isinstance(exc, (StoreError, ObjectStoreError))  # nothing recorded: not the source's state
        if decision.verdict is Verdict.WAIT:
            # A registry or object store that is busy or unreachable is the operator's to see (ERROR);
            # content still changing is the usual settle (INFO).
            log.log(logging.ERROR if unreachable else logging.INFO, "%s: %s; looking again in %.1f s",
                    model, exc, decision.delay_s)
            if unreachable:
                self.look_again(model, decision.delay_s)
            else:
                self.put_off(model, decision.reason, decision.delay_s)
            return
        self.capture_done(model)
        log.warning("%s: capture refused: %s", model, decision.reason)
        self._capture_refused(model, decision.reason)
        self.registry.audit(AuditEntry(WATCHER_ACTOR, "snapshot", model, None, "failed", str(exc)))

    def _capture_refused(self, model: str, reason: str) -> None:
        """The source's content of `model` was refused (not put off): `status` and the web view show the
        model, sync `invalid` with this reason, until a capture succeeds or the source drops it. A model
        whose every capture is refused gets its registry row here (state `new`, nothing serving)."""
        self.capture_refusals[model] = reason
        if self.registry.ensure_model(model).removed_at is not None:
            self.registry.update_model(model, removed_at=None)

    def _note_quarantined(self, record: SnapshotRecord) -> None:
        """A quarantined digest is in the source (again): say so once, in the log and the audit."""
        model, digest = record.model, record.digest
        earlier = self.registry.query_audit(AuditQuery(model=model, action="skip", limit=200))
        if any(e.digest == digest for e in earlier):
            return
        since = next((e.time for e in self.registry.query_audit(AuditQuery(model=model, limit=200))
                      if e.digest == digest and e.outcome in ("rolled_back", "failed")), None)
        when = iso(since) if since else "?"
        message = f"skipped: quarantined since {when}: {record.quarantine_reason}"
        log.warning("%s %s %s", model, digest[:12], message)
        self.registry.audit(AuditEntry(WATCHER_ACTOR, "skip", model, digest, "invalid", message))

    def put_off(self, model: str, reason: str, delay_s: float) -> None:
        """The watcher's capture of `model` waits (`reason`, shown by `status`); look again after `delay_s`."""
        self.capture_waits[model] = reason
        self.look_again(model, delay_s)

    def capture_done(self, model: str) -> None:
        """`model`'s source was captured: nothing puts it off any more."""
        self.capture_waits.pop(model, None)
        self.capture_refusals.pop(model, None)

    def look_again(self, model: str, delay_s: float) -> None:
        """Have the source hand `model` on again after `delay_s` (nothing without a source)."""
        self.source.reschedule(model, delay_s)

    def converge(self, model: str) -> None:
        """Nothing may hold `model` any more: look at its source again (the watcher's path, so the
        usual rules decide), soon and without blocking the caller."""
        self.look_again(model, 0.0)

    def due_retries(self) -> list[str]:
        return [retry.model for retry in self.retries.due()]

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
        host: str = "", bake_s: float | None = None,
    ) -> Outcome:
        """`bake_s`: this deploy's own bake (`load --bake 5m`; 0: none), else the daemon's `bake_s`."""
        validate_model_name(model)
        if bake_s is not None and not 0 <= bake_s < float("inf"):
            raise UsageError(f"--bake: {bake_s:g} s: expected 0 or more seconds")
        if digest:
            target = recorded_digest(self.registry, model, validate_digest(digest))
        else:
            target = self._source_content(model, actor)
        self.baker.ask(model, bake_s)
        try:
            return self.target.load(model, target, actor, force, progress, host)
        except BaseException:
            self.baker.ask(model, None)  # refused before any deploy: the next deploy bakes as configured
            raise

    def promote(self, model: str, actor: str) -> dict[str, Any]:
        """`tritonctl promote MODEL`: the bake in progress ends `passed` now (controlplane/bake.py)."""
        validate_model_name(model)
        return self.baker.promote(model, actor)

    def _source_content(self, model: str, actor: str) -> str:
        """The digest of what `model`'s source holds now, captured and recorded (`tritonctl load MODEL`)."""
        if not self.source_has(model):
            raise NotFoundError(f"model '{model}' is unknown: {self.source.missing(model)}; "
                                "`tritonctl status` lists the models")
        return self.capture(model, actor, settled=False).digest

    def load_set(self, models: list[str], actor: str, force: bool = False,
                 progress: ProgressFn | None = None) -> Outcome:
        """`tritonctl load a b pipe`: the named models as one change set (controlplane/changeset.py)."""
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

    def rollback_here(self, model: str, actor: str, to: str | None, progress: ProgressFn | None) -> Outcome:
        return self.deployer.rollback(model, actor, to, progress)

    def unload_here(self, model: str, actor: str, dependents: bool = False,
                    progress: ProgressFn | None = None) -> Outcome:
        return self.deployer.unload(model, actor, dependents, progress)

    def deploy_set(self, records: dict[str, SnapshotRecord], actor: str, *, force: bool = False) -> Outcome:
        return self.changesets.deploy_records(records, actor, force=force)

    def repository_held(self) -> bool:
        return self.source.repository_held()

    def still_settling(self, models: Sequence[str]) -> list[str]:
        return self.changesets.still_settling(models)

    # -- tags (controlplane/tags.py; the plane is its ports.TagPlane) -------------------------------

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
        for name in models or []:
            validate_model_name(name)
        if not models:
            return self._status_of(self.registry.list_models(), None)
        records = self.registry.list_models(names=models)
        known = {m.name for m in records}
        for name in models:
            if name not in known:
                raise NotFoundError(f"model '{name}' is unknown to the registry")
        return self._status_of(records, self.registry.active_digests())

    def status_page(self, *, state: str = "", sync: str = "", name: str = "", page: int = 1,
                    size: int = 100) -> StatusPage:
        """One page of `status` by model name, filtered by state, sync and a part of the name (the web
        view's overview). State and name are filtered and the page cut in SQL, so only the page's models
        are looked at; sync is derived per model, so filtering by it derives every model's sync first."""
        if sync:  # derived per model, not stored: every model's sync (not its whole status row), then the page's rows
            candidates = self.registry.list_models(states=[state] if state else None)
            inputs = self._sync_inputs(candidates, None)
            matching = [m.name for m in candidates
                        if name.lower() in m.name.lower() and self._sync_of(m, inputs)[0] == sync]
            pages = max((len(matching) + size - 1) // size, 1)
            page = min(max(page, 1), pages)
            shown = matching[(page - 1) * size: page * size]
            result = self._status_of(self.registry.list_models(names=shown) if shown else [],
                                     self.registry.active_digests())
            return StatusPage(result, len(matching), page, pages, self.registry.model_states())
        total, names = self.registry.model_page(state=state or None, name_contains=name or None,
                                                offset=(max(page, 1) - 1) * size, limit=size)
        pages = max((total + size - 1) // size, 1)
        if page > pages:  # past the end: the last page
            page = pages
            total, names = self.registry.model_page(state=state or None, name_contains=name or None,
                                                    offset=(page - 1) * size, limit=size)
        result = self._status_of(self.registry.list_models(names=names) if names else [],
                                 self.registry.active_digests())
        return StatusPage(result, total, max(page, 1), pages, self.registry.model_states())

    def _status_of(self, records: list[ModelRecord], wanted: dict[str, str | None] | None) -> StatusResult:
        """The status rows of `records`; `wanted`: every model's active digest, when `records` is not
        every model (None: `records` is; see _triton_view)."""
        try:
            index, served = self.served_view.public(self.triton, records, wanted)
            reachable = True
        except TritonctlError:
            index, served, reachable = [], {}, False
        drift = {d.model: d for d in plan(records, index, served).drift} if reachable else {}
        names = [m.name for m in records] if wanted is not None else None
        inputs = self._sync_inputs(records, names)
        footprints = self.registry.footprints(names)
        by_name: dict[str, list[VersionState]] = {}  # one pass over the index, not one per model
        for e in index:
            by_name.setdefault(e.name, []).append(VersionState(e.version, e.state, e.reason))
        rows = []
        for model in records:
            sync, reason, policy, retry = self._sync_of(model, inputs)
            row = queries.status_row(model, self.effective_policy(model), by_name.get(model.name, []),
                                     drift.get(model.name), reachable)
            head = inputs.heads.get(model.name)
            row.source_digest = head.digest if head is not None and model.removed_at is None else None
            row.sync, row.sync_reason, row.policy = sync, reason, policy
            row.next_retry_s = retry.seconds_left() if retry is not None else None
            row.tags = inputs.tagged.get((model.name, model.active_digest or ""), [])
            row.footprint = footprints.get((model.name, model.active_digest or ""))
            standing = self.ondemand.standing(model)
            row.ondemand = standing.to_json() if standing is not None else None
            bake = self.baker.of(model.name)
            row.bake = bake.to_json() if bake is not None else None
            if bake is not None and bake.state == "baking":
                left = f"baking {bake.digest[:12]}: {bake.seconds_left()} s left"
                row.sync_reason = f"{row.sync_reason}; {left}" if row.sync_reason else left
            rows.append(row)
        outage = self.registry_outage()
        return StatusResult(reachable, self.triton.url, self.http_url, dict(self.source.watch_info()), rows,
                            registry_reachable=outage is None,
                            registry_unreachable_since=iso(outage.since) if outage and outage.since else None,
                            registry_reason=f"registry {outage.name}: {outage.reason}" if outage else "",
                            triton_key_exposed=self.triton_key_exposed)

    def registry_outage(self) -> RegistryHealth | None:
        """The registry this plane reads that does not answer now (this host's, or where its tags live: a
        fleet's shared one), else None (controlplane/store/health.py)."""
        return next((h for h in (self.registry.health, self.tag_registry().health) if not h.reachable), None)

    def _tags_read(self) -> tuple[list[Any], dict[str, str]]:
        """The tags and the tracks; while their registry does not answer, the last ones read (status
        answers from what this host knows)."""
        registry = self.tag_registry()
        try:
            self._tags_seen = (registry.list_tags(), registry.tracks())
        except StoreError:
            if registry.health.reachable:
                raise
        return self._tags_seen

    def _sync_inputs(self, records: list[ModelRecord], names: list[str] | None) -> _SyncInputs:
        """What the sync of `records` (named `names`; None: every model) is derived from, each read once.
        Last deployments only of the models not in sync (none when all are): by name while they are few,
        else all of `names` in one query."""
        tagged, tracks = self._tags_read()
        heads = self.registry.source_heads(names)
        owed = [m.name for m in records if needs_last_deployment(m, heads.get(m.name))]
        lasts = self.registry.last_deployments(owed if len(owed) <= LASTS_BY_NAME else names) if owed else {}
        return _SyncInputs(heads, lasts,
                           set(self.deployer.busy_models()),
                           self.in_hand.reasons(self.source.settling(), dict(self.capture_waits)),
                           tags.by_digest(tagged), tracks,
                           self.retries.all(), self.restores.all())  # one lock each, not two per model

    def _sync_of(self, model: ModelRecord, inputs: _SyncInputs) -> tuple[str, str, str, Retry | None]:
        """(sync, sync_reason, the policy shown, the retry owed) of one model."""
        policy = self.effective_policy(model)
        retry = inputs.retries.get(model.name) or inputs.restores.get(model.name)
        busy = model.name in inputs.busy
        refused = self.capture_refusals.get(model.name)
        if refused is not None and not busy:  # the source's newest content could not even be captured
            return SyncState.INVALID, f"{CAPTURE_REFUSED}{refused}", policy, retry
        track = inputs.tracks.get(model.name)
        if track:
            tag_digest = next((d for (m, d), names in inputs.tagged.items() if m == model.name and track in names),
                              None)
            sync, reason = track_sync(model, track, tag_digest, busy=busy)
            return sync, reason, f"{tags.TRACK_PREFIX}{track}", retry
        sync, reason = sync_state(model, policy, inputs.heads.get(model.name), inputs.lasts.get(model.name),
                                  busy=busy, retry=retry, settling=inputs.settling.get(model.name))
        return sync, reason, policy, retry

    def reconcile(self) -> list[Drift]:
        """Compare desired and actual; restore what should serve; finish interrupted deployments."""
        return self.reconciler.reconcile()

    def preloaded(self, models: Sequence[str]) -> None:
        """A tritonserver was launched with these models loading in its own start-up (reconciler.py)."""
        self.reconciler.preloaded(models)

    def load_parallelism(self) -> int:
        """How many models go to Triton at once (start-up, restores): `startup_parallelism`, or (0)
        Triton's own model-load thread count, `triton_load_threads`."""
        return self.settings.startup_parallelism or self.settings.triton_load_threads

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
        settling = self.in_hand.reasons(self.source.settling(), dict(self.capture_waits))
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
