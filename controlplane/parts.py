"""The parts of one host's control plane, built and wired once: the composition root below the daemon.

`build_parts` builds every part the verbs use and wires the outcome subscribers that belong to them
(controlplane/outcomes/bookkeeping.py first, then the reconciler and the bake); the daemon adds its own
(controlplane/outcomes/log.py, metrics) and hands the parts to `ControlPlane`, which is verbs over them
and builds nothing but its target and its `status` view (both depend on the target the daemon chose).
Each part is handed the parts it uses, never the plane; the settings a reload changes are read through
`livesettings.LiveSettings`. The memory budget's hooks and the lease book's expiry are the one place where
parts built later are reached, through closures here (the guard is built before the Deployer that uses
it, the lease book before the on-demand book that expires it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from controlplane.bake.baker import BAKES_FILE, Baker
from controlplane.bake.traffic import GatewayFigures
from controlplane.deploy.aliases import Aliases, InPlace, PublicNames, Routed, RoutePort
from controlplane.deploy.causes import RetryBook
from controlplane.deploy.engine import Deployer
from controlplane.deploy.publish import ServingRepository
from controlplane.deploy.servedview import ServedView
from controlplane.deploy.servingensembles import ServingEnsembles, step_names
from controlplane.errors import TritonctlError
from controlplane.intake.flow import Intake
from controlplane.memory.budget import Hooks, MemoryGuard
from controlplane.memory.footprint import Meter
from controlplane.memory.leases import LeaseBook
from controlplane.memory.ondemand import OnDemand
from controlplane.memory.onrequest import RequestLoads, RequestPort
from controlplane.outcomes.bookkeeping import Bookkeeping
from controlplane.outcomes.bus import Outcomes
from controlplane.outcomes.counters import Counters
from controlplane.outcomes.reconciler import Reconciler
from controlplane.settings.config import Settings
from controlplane.settings.live import LiveSettings
from controlplane.snapshot import ContentStore
from controlplane.source.protocol import NoSource, Source
from controlplane.source.recorded import SourceGraph
from controlplane.store.registry import Registry
from controlplane.triton.client import TritonClient
from controlplane.triton.host import TritonHost

if TYPE_CHECKING:
    from controlplane.outcomes.webhooks import Webhooks


@dataclass
class HostParts:
    """What one host's control plane is made of (see the module docstring)."""

    settings: Settings  # as the daemon started; `live` is what a reload replaced them with
    live: LiveSettings
    registry: Registry
    content: ContentStore
    serving: ServingRepository
    triton: TritonClient
    outcomes: Outcomes
    counters: Counters
    retries: RetryBook  # deploys that failed for an environment fault (controlplane.deploy.causes)
    restores: RetryBook  # reconcile's restores that failed: retried with the same backoff
    served_view: ServedView  # one repository-index call per reconcile, not one per model
    serving_ensembles: ServingEnsembles  # which ensembles serve now, over which steps
    leases: LeaseBook
    guard: MemoryGuard
    deployer: Deployer
    ondemand: OnDemand
    intake: Intake  # settled source content -> recorded snapshot -> plan
    reconciler: Reconciler  # Triton made to serve what the registry says: recoveries, restores, the sentinel
    baker: Baker  # a new digest served on live figures, rolled back by itself
    request_loads: RequestLoads | None  # with a gateway: requests load the models they ask for
    http_url: str | None  # where clients send HTTP inference (the gateway's, or a launched tritonserver's)
    webhooks: Webhooks | None  # the daemon's delivery worker, which `tritonctl webhooks` asks
    gateway: Callable[[], dict[str, Any] | None] = lambda: None  # status's gateway: addresses, upstream
    traffic: Callable[[], Mapping[str, Any]] = dict  # status's traffic: the gateway's figures per public model


def route_extras(registry: Registry, live: LiveSettings) -> Any:
    """What a route carries beside its targets (controlplane/deploy/aliases.py route_json): the sticky header
    a split hashes (`canary_sticky_header`), and the model's tags on the route's digests, so that a client's
    `x-tritonctl-route: TAG` reaches the digest the tag names (docs/bake.md "Sticky routing")."""

    def extras(model: str, digests: tuple[str, ...]) -> dict[str, Any]:
        try:
            tags = {t.name: t.digest for t in registry.list_tags(model) if t.digest in digests}
        except TritonctlError:
            tags = {}
        return {"sticky_header": live().canary_sticky_header if len(digests) > 1 else None, "tags": tags}

    return extras


def build_parts(settings: Settings, registry: Registry, content: ContentStore, serving: ServingRepository,
                triton: TritonClient, outcomes: Outcomes | None = None, *, source: Source | None = None,
                host: TritonHost | None = None, http_url: str | None = None,
                webhooks: Webhooks | None = None, gateway: RoutePort | None = None) -> HostParts:
    """`outcomes`: where every finished operation is reported; `source`: where models come from
    (controlplane/source/protocol.py: a directory, s3://; default none); `host`: capability checks and
    Triton's real reasons; `webhooks`: the daemon's webhook delivery worker; `gateway`: the control channel
    of the gateway that routes the traffic (controlplane/deploy/aliases.py; None: Triton reloads in place)."""
    live = LiveSettings(settings)
    outcomes = outcomes if outcomes is not None else Outcomes()
    aliases: Aliases = Routed(gateway, route_extras(registry, live)) if gateway is not None else InPlace()
    if isinstance(aliases, Routed):
        aliases.adopt(steps_of=lambda name: step_names(serving, name))  # what the gateway routes now
    # readiness and figures by public name: PublicNames answers every TritonClient call (passing the rest through)
    public = cast(TritonClient, PublicNames(triton, aliases)) if aliases.gateway else triton
    counters, retries, restores = Counters(), RetryBook(), RetryBook()
    served_view = ServedView(routes=aliases.targets if aliases.gateway else None)
    source_graph = SourceGraph(registry)  # recorded source contents: signatures, ensemble graph
    serving_ensembles = ServingEnsembles(registry, source_graph, serving)
    # the first subscriber: the others read what it keeps
    outcomes.subscribe(Bookkeeping(counters, serving_ensembles, retries, restores, served_view).note)
    built: dict[str, Any] = {}  # the Deployer and OnDemand, for the hooks of parts built before them
    leases = LeaseBook(on_expiry=lambda lease: built["ondemand"].on_expiry(lease))

    def last_inferences() -> dict[str, float]:
        """Each model's last use: its last inference request through the gateway when one carries the traffic
        (what clients asked for, issue 55), else (no gateway, or it did not answer) Triton's stamps."""
        seen = built["requests"].last_requests() if built.get("requests") is not None else None
        return seen if seen is not None else public.last_inferences()

    def last_used() -> dict[str, float]:
        used = leases.last_used()
        for model, when in last_inferences().items():
            used[model] = max(used.get(model, 0.0), when)
        return used

    hooks = Hooks(last_used=last_used,
                  held=lambda model: leases.held(model) or built["deployer"].lock(model).locked(),
                  evict=lambda model, why: built["deployer"].evict(model, "tritonctl:budget", why,
                                                                   unless=lambda: leases.held(model)))
    guard = MemoryGuard(registry, Meter(host.server_pid if host is not None else None), hooks,
                        memory_budget_mb=settings.memory_budget_mb,
                        gpu_memory_budget_mb=settings.gpu_memory_budget_mb,
                        protected_tags=[t.strip() for t in settings.protected_tags.split(",") if t.strip()])
    deployer = built["deployer"] = Deployer(registry, content, serving, triton, load_timeout_s=settings.load_timeout_s,
                                            on_outcome=outcomes.publish, host=host, guard=guard, aliases=aliases,
                                            drain_s=live.getter("gateway_drain_s"), ensembles=serving_ensembles.get)
    ondemand = built["ondemand"] = OnDemand(registry, deployer, public, leases, live.policy_of,
                                            live.getter("idle_unload_s"),
                                            guard.spared, guard.fits, guard.refused, live.getter("load_timeout_s"))
    intake = Intake(live, registry, content, source if source is not None else NoSource(), source_graph,
                    serving_ensembles, retries)
    ondemand.recording = intake.recording
    ondemand.last_inferences = last_inferences
    requests = built["requests"] = RequestLoads(
        cast(RequestPort, gateway), registry, deployer, aliases, ondemand, guard, live.policy_of,
        live.getter("gateway_load_wait_s")) if gateway is not None and hasattr(gateway, "wanted") else None
    reconciler = Reconciler(registry, public, deployer, serving_ensembles, served_view, counters, restores,
                            live.getter("load_parallelism"))
    outcomes.subscribe(reconciler.note)
    baker = Baker(registry, deployer, public, live, path=settings.state_dir / BAKES_FILE)
    outcomes.subscribe(baker.note)
    deployer.on_set = baker.note_set  # a change set bakes as one
    if deployer.routed is not None:  # canary steps: the switch's first weight, the gateway's figures
        deployer.routed.weigh = baker.weigh
        deployer.routed.shadowing = baker.rollouts.shadow_spec  # a shadow before the first step
        figures = getattr(gateway, "figures", None)
        baker.rollouts.traffic = GatewayFigures(figures) if callable(figures) else None
        baker.resume()  # before the first reconcile sweeps unrouted names: a bake's held names stay
    parts_traffic: Callable[[], Mapping[str, Any]] = dict
    figures_of = getattr(gateway, "figures", None)
    if callable(figures_of):
        def parts_traffic() -> Mapping[str, Any]:
            return dict((figures_of() or {}).get("models") or {})
    return HostParts(settings, live, registry, content, serving, triton, outcomes, counters, retries, restores,
                     served_view, serving_ensembles, leases, guard, deployer, ondemand, intake, reconciler, baker,
                     requests, http_url, webhooks, traffic=parts_traffic)
