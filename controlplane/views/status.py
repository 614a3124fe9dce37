"""`status`: one row per model, from the registry, what Triton serves and what the daemon is doing now.

The rows (controlplane/documents/results.py `StatusRow`) join the registry's models with Triton's repository index
(one call, controlplane/deploy/servedview.py), each model's sync (controlplane/views/sync.py: derived, not
stored), its tags, footprint, on-demand standing and bake. `StatusView` reads; it changes nothing.
While the registry does not answer, the rows come from what this host last read (controlplane/store/health.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from controlplane.bake.baker import Baker
from controlplane.deploy.causes import Retry, RetryBook
from controlplane.deploy.engine import Deployer
from controlplane.deploy.reconcile import plan
from controlplane.deploy.servedview import ServedView
from controlplane.documents.results import StatusPage, StatusResult, StatusRow, VersionState
from controlplane.errors import NotFoundError, StoreError, TritonctlError
from controlplane.intake import tags
from controlplane.intake.flow import Intake
from controlplane.memory.ondemand import OnDemand
from controlplane.names import printable_name, validate_model_name
from controlplane.store.health import RegistryHealth
from controlplane.store.records import DeploymentRecord, ModelRecord, SourceHead, iso
from controlplane.store.registry import Registry
from controlplane.triton.client import TritonClient
from controlplane.views import queries
from controlplane.views.sync import needs_last_deployment, sync_state, track_sync
from controlplane.vocab import CAPTURE_REFUSED, ModelState, SyncState

LASTS_BY_NAME = 500  # `status`: up to this many models not in sync have their last deployments read by name


@dataclass
class _SyncInputs:
    """What `sync` is derived from (controlplane/views/sync.py), read once for many models."""

    heads: dict[str, SourceHead]
    lasts: dict[str, DeploymentRecord]
    busy: set[str]
    settling: dict[str, str]
    tagged: dict[tuple[str, str], list[str]]
    tracks: dict[str, str]
    retries: dict[str, Retry]
    restores: dict[str, Retry]
    held: dict[str, str]  # what the source holds back, with why (controlplane/source/protocol.py `held`)


class StatusView:
    """`status` and the web view's pages of it (see the module docstring)."""

    def __init__(self, registry: Registry, triton: TritonClient, served_view: ServedView, deployer: Deployer,
                 intake: Intake, retries: RetryBook, restores: RetryBook, ondemand: OnDemand, baker: Baker,
                 *, tag_registry: Callable[[], Registry], http_url: str | None,
                 gateway: Callable[[], dict[str, Any] | None] = lambda: None,
                 traffic: Callable[[], Mapping[str, Any]] = dict) -> None:
        """`tag_registry`: where tags live (a fleet's shared registry)."""
        self.registry = registry
        self.triton = triton
        self.served_view = served_view
        self.deployer = deployer
        self.intake = intake
        self.retries = retries
        self.restores = restores
        self.ondemand = ondemand
        self.baker = baker
        self.tag_registry = tag_registry
        self.http_url = http_url
        self.gateway = gateway  # where the gateway listens and its upstream (None without one)
        self.traffic = traffic  # what the gateway saw, per public model (status --json `traffic`)
        # other local users can read the launched tritonserver's key (the daemon learns it before the plane)
        self.key_exposed = False
        self._tags_seen: tuple[list[Any], dict[str, str]] = ([], {})  # the last tags and tracks read

    def status(self, models: list[str] | None = None) -> StatusResult:
        for name in models or []:
            validate_model_name(name)
        if not models:
            result = self._status_of(self.registry.list_models(), None)
            result.models.extend(self._bad_name_rows())
            return result
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
            if page == 1 and sync == SyncState.INVALID and state in ("", ModelState.NEW):
                result.models.extend(self._bad_name_rows(name))
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
        if page <= 1 and state in ("", ModelState.NEW):  # the source's badly named entries: on the first page
            result.models.extend(self._bad_name_rows(name))
        return StatusPage(result, total, max(page, 1), pages, self.registry.model_states())

    def _bad_name_rows(self, name_contains: str = "") -> list[StatusRow]:
        """A row for each source entry whose name no model can have (`my model`: the intake's `bad_names`), sync
        `invalid` with why, under its printable name (names.printable_name). It is no model of the registry: nothing is
        kept or made under its name."""
        policy = self.intake.settings.policy
        shown = {printable_name(name): reason for name, reason in dict(self.intake.bad_names).items()}
        return [StatusRow(model=name, state=ModelState.NEW, versions=[], digest=None, since=None, policy=policy,
                          pinned=False, drift=None, drift_detail=None, last_error=reason, removed=False,
                          sync=SyncState.INVALID, sync_reason=reason)
                for name, reason in sorted(shown.items())
                if name_contains.lower() in name.lower()]

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
        completed = self.registry.completed_configs(names)
        by_name: dict[str, list[VersionState]] = {}  # one pass over the index, not one per model
        for e in index:
            by_name.setdefault(e.name, []).append(VersionState(e.version, e.state, e.reason))
        try:  # one figures document for every row (a gateway that does not answer: none)
            traffic = self.traffic()
        except TritonctlError:
            traffic = {}
        rows = []
        for model in records:
            sync, reason, policy, retry = self._sync_of(model, inputs)
            row = queries.status_row(model, self.intake.effective_policy(model), by_name.get(model.name, []),
                                     drift.get(model.name), reachable)
            head = inputs.heads.get(model.name)
            row.source_digest = head.digest if head is not None and model.removed_at is None else None
            row.sync, row.sync_reason, row.policy = sync, reason, policy
            row.next_retry_s = retry.seconds_left() if retry is not None else None
            row.tags = inputs.tagged.get((model.name, model.active_digest or ""), [])
            row.footprint = footprints.get((model.name, model.active_digest or ""))
            row.completed_config = completed.get((model.name, model.active_digest or ""))
            standing = self.ondemand.standing(model)
            row.ondemand = standing.to_json() if standing is not None else None
            bake = self.baker.of(model.name)
            row.bake = bake.to_json() if bake is not None else None
            row.canary = self.baker.canary_of(bake)
            row.traffic = traffic.get(model.name)
            row.shadow = self.baker.shadow_of(bake)
            if bake is not None and bake.state == "baking":
                left = f"baking {bake.digest[:12]}: {bake.seconds_left()} s left"
                if row.shadow is not None and row.shadow["state"] == "running":  # before its first step
                    left = f"shadow of {bake.digest[:12]}: {row.shadow['seconds_left']} s left"
                row.sync_reason = f"{row.sync_reason}; {left}" if row.sync_reason else left
            rows.append(row)
        outage = self.registry_outage()
        gateway = self.gateway()
        grpc_url, http_url = self.inference_urls(gateway)
        return StatusResult(reachable, grpc_url, http_url, dict(self.intake.source.watch_info()), rows,
                            gateway=gateway,
                            registry_reachable=outage is None,
                            registry_unreachable_since=iso(outage.since) if outage and outage.since else None,
                            registry_reason=f"registry {outage.name}: {outage.reason}" if outage else "",
                            triton_key_exposed=self.key_exposed)

    def inference_urls(self, gateway: dict[str, Any] | None = None) -> tuple[str, str | None]:
        """Where clients send inference to this host, (gRPC HOST:PORT, HTTP URL or None): its gateway's when
        one carries the traffic (clients name the public models; tritonserver's own ports serve only the
        gateway's private names), else its tritonserver's. `status` shows them and a fleet host's heartbeat
        advertises them (`hosts`' triton_url, `ensure`'s grpc_url / http_url). `gateway`: one read of it."""
        gateway = self.gateway() if gateway is None else gateway
        if gateway is None:
            return self.triton.url, self.http_url
        grpc_url = str(gateway["grpc_url"]) if gateway.get("grpc_url") else self.triton.url
        return grpc_url, str(gateway["http_url"]) if gateway.get("http_url") else self.http_url

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
                           self.intake.in_hand.reasons(self.intake.source.settling(), dict(self.intake.capture_waits)),
                           tags.by_digest(tagged), tracks,
                           self.retries.all(), self.restores.all(),  # one lock each, not two per model
                           self.intake.source.held())

    def _sync_of(self, model: ModelRecord, inputs: _SyncInputs) -> tuple[str, str, str, Retry | None]:
        """(sync, sync_reason, the policy shown, the retry owed) of one model."""
        policy = self.intake.effective_policy(model)
        retry = inputs.retries.get(model.name) or inputs.restores.get(model.name)
        busy = model.name in inputs.busy
        refused = self.intake.capture_refusals.get(model.name)
        if refused is not None and not busy:  # the source's newest content could not even be captured
            return SyncState.INVALID, f"{CAPTURE_REFUSED}{refused}", policy, retry
        held = inputs.held.get(model.name)
        if held is not None and not model.active_digest:  # nothing served yet: the source holds it back
            return SyncState.HELD, held, policy, retry
        track = inputs.tracks.get(model.name)
        if track:
            tag_digest = next((d for (m, d), names in inputs.tagged.items() if m == model.name and track in names),
                              None)
            sync, reason = track_sync(model, track, tag_digest, busy=busy)
            return sync, reason, f"{tags.TRACK_PREFIX}{track}", retry
        sync, reason = sync_state(model, policy, inputs.heads.get(model.name), inputs.lasts.get(model.name),
                                  busy=busy, retry=retry, settling=inputs.settling.get(model.name))
        return sync, reason, policy, retry
