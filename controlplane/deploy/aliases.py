"""Which name Triton serves a digest under, and the switch that makes a model's public name answer with it.

Without the gateway (`--no-gateway`, `InPlace`): every digest of a model loads under the model's own name,
and a switch is Triton reloading that name in place, which NVIDIA no longer promises to do without a gap
(docs/gateway.md). With the gateway (`Routed`): each digest loads under a private name no client uses,
`<model>__<8 hex>` (controlplane/names.py reserves the pattern), and a switch is one update of the gateway's
route table (the public name → the private name of the digest that serves), made atomically for every
model it names: a change set flips as one. No path of this mode loads new content into a loaded name.

An ensemble's private name is bound to its steps' private names: its published config points at them, so
the same ensemble content over other step content is another name (`bound_name`), loaded fresh and
flipped together with its steps. A model registered but not loaded that a request loads (evicted, or an
on-demand one) is routed LOADABLE: no target, its requests wait in the gateway while the daemon loads it
(docs/ondemand.md "Requests load models"). The route table itself lives in the gateway process, which keeps it on
disk and serves it while the daemon is away; `Routed` keeps the daemon's copy, read from the gateway at
start (adoption) and changed only through `switch`.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol


def private_name(model: str, digest: str) -> str:
    """The name one digest of `model` is loaded under (a change set's staged step names too)."""
    return f"{model}__{digest[:8]}"


def bound_name(model: str, digest: str, steps: Mapping[str, str]) -> str:
    """An ensemble's private name for its content `digest` over the step names `steps` (step → the
    private name it is pointed at): another binding of the same content is another name."""
    if not steps:
        return private_name(model, digest)
    binding = digest + "|" + ",".join(f"{step}={name}" for step, name in sorted(steps.items()))
    return f"{model}__{hashlib.sha256(binding.encode()).hexdigest()[:8]}"


@dataclass(frozen=True)
class Target:
    """What a public name is routed to: the private name Triton serves, and the digest loaded under it."""

    name: str
    digest: str


@dataclass(frozen=True)
class Weighted:
    """A route that splits the requests (a canary step): `targets` with their percent `weights`, the first
    one the digest the registry calls active (the one being rolled out), the others what served before.
    `shadow`: the first target, of weight 0, gets a copy of the requests the others serve (its `id`,
    `fraction`, `rtol`, `atol`, `keep_inputs`: controlplane/gateway/routes.py `Shadow`)."""

    targets: tuple[Target, ...]
    weights: tuple[int, ...]
    shadow: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Loadable:
    """A route with no target whose requests wait in the gateway while tritonctl loads the model (a model
    registered but not loaded that a request loads: docs/ondemand.md "Requests load models")."""


LOADABLE = Loadable()
Route = Target | Weighted | Loadable | None  # what `switch` routes a model to (None: no route)


@dataclass(frozen=True)
class Lane:
    """One public name a switch moves, to `new` from `old` (what served before; None: nothing did): a canary
    splits the requests between the two (controlplane/bake/canary.py). `kind` is the operation's ("deploy",
    "rollback"...), "" for an ensemble bound again to the new names of its steps (it moves with them)."""

    model: str
    new: Target
    old: Target | None
    kind: str = "deploy"

    def at(self, weight: int, shadow: Mapping[str, Any] | None = None) -> Target | Weighted:
        """The route that gives the new digest `weight` percent of the requests (100: all; 0: none, it is
        reached by pinning only) and the old one the rest; with `shadow` (at 0 only) a copy of the old one's
        requests goes to the new digest (docs/bake.md "Shadow")."""
        if weight >= 100 or self.old is None or self.old.name == self.new.name:
            return self.new
        return Weighted((self.new, self.old), (weight, 100 - weight), shadow if weight == 0 else None)


class RoutePort(Protocol):
    """What the daemon asks of the gateway's control channel (controlplane/gateway/control.py)."""

    def update(self, set: Mapping[str, Any], delete: Iterable[str] = ()) -> int: ...  # noqa: A002

    def routes(self) -> Mapping[str, Any]: ...

    def inflight(self, names: Iterable[str]) -> Mapping[str, int]: ...


class Aliases:
    """The names and switches of a Deployer without a gateway (`InPlace`): a digest serves under its model's
    own name and loading it is the switch. `Routed` overrides each method."""

    gateway = False

    def name(self, model: str, digest: str, steps: Mapping[str, str] | None = None) -> str:
        return model

    def target(self, model: str) -> Target | None:
        """What `model`'s public name answers with now (None: no route; without a gateway, always None)."""
        return None

    def targets(self) -> dict[str, Target]:
        return {}

    def switch(self, changes: Mapping[str, Route]) -> None:
        """Route each model of `changes` to its target (None: no route; LOADABLE: its requests wait for a
        load) in one atomic update."""

    def in_use(self) -> set[str]:
        """Every private name a client request can reach now: routed, or a step of a routed ensemble."""
        return set()

    def loadable(self) -> frozenset[str]:
        """The models whose route is LOADABLE now (their requests wait for a load)."""
        return frozenset()


InPlace = Aliases


class Routed(Aliases):
    """Names and switches through the gateway (see the module docstring). Thread-safe: deploys of different
    models switch concurrently; each switch is one request to the gateway, answered once it is on disk."""

    gateway = True

    def __init__(self, port: RoutePort, extras: Callable[[str, tuple[str, ...]], Mapping[str, Any]] | None = None
                 ) -> None:
        """`extras(model, digests)`: what a route of `model` over `digests` carries beside its targets (the
        sticky header a split hashes, the tags a client may pin: route_json), read at each switch."""
        self.port = port
        self.extras = extras
        self._weights: dict[str, dict[str, int]] = {}  # model -> digest -> percent (tritonctl_gateway_route_weight)
        self._lock = threading.Lock()
        self._targets: dict[str, Target] = {}  # replaced, never changed, on each switch: `targets()` hands it out
        self._steps: dict[str, frozenset[str]] = {}  # an ensemble's private name -> the step names it points at
        self._in_place: set[str] = set()  # models other models call by BLS: served under their own names
        # a model calls by BLS a name computed at run time, undeclared: every model, later ones too, is served
        # under its own name (from this daemon's first such deploy on; its own models keep theirs after a restart)
        self._every_in_place = False
        self._also: dict[str, tuple[Target, ...]] = {}  # a weighted route's other targets (a canary's previous)
        self._loadable: frozenset[str] = frozenset()  # models routed LOADABLE

    def adopt(self, steps_of: Any = None) -> dict[str, Target]:
        """Read the gateway's routes (a restarted daemon takes over what the gateway serves); `steps_of(name)`
        gives a routed ensemble's step names (from its published config), so they count as in use."""
        routes = self.port.routes()
        targets: dict[str, Target] = {}
        also: dict[str, tuple[Target, ...]] = {}
        weights: dict[str, dict[str, int]] = {}
        loadable = set()
        for model, route in routes.items():
            if _state_of(route) == "loadable":
                loadable.add(model)
                continue
            listed = _targets_of(route)
            weights[model] = _weights_of(route, listed)
            if listed:
                targets[model] = listed[0]
                if len(listed) > 1:
                    also[model] = tuple(listed[1:])
        with self._lock:
            self._targets = dict(targets)
            self._also = also
            self._weights = weights
            self._loadable = frozenset(loadable)
            self._in_place |= {model for model, target in targets.items() if target.name == model}
        if steps_of is not None:
            for target in targets.values():
                steps = steps_of(target.name)
                if steps:
                    self.bind(target.name, steps)
        return dict(targets)

    def name(self, model: str, digest: str, steps: Mapping[str, str] | None = None) -> str:
        with self._lock:
            if model in self._in_place or self._every_in_place:  # called by BLS, inside Triton: its own name
                return model
        if steps is None:
            return private_name(model, digest)
        name = bound_name(model, digest, steps)
        self.bind(name, steps.values())
        return name

    def in_place(self, models: Iterable[str]) -> set[str]:
        """Serve `models` under their own names from their next bring-up on (another model calls them by
        BLS: controlplane/validation/bls.py); returns those that were not so yet."""
        with self._lock:
            if "*" in models:  # controlplane/validation/bls.py DYNAMIC: any model may be called
                self._every_in_place = True
            new = set(models) - self._in_place - {"*"}
            self._in_place |= new
            return new

    def bind(self, name: str, step_names: Iterable[str]) -> None:
        with self._lock:
            self._steps[name] = frozenset(step_names)

    def target(self, model: str) -> Target | None:
        with self._lock:
            return self._targets.get(model)

    def split(self, model: str) -> tuple[Target, ...]:
        """Every target of `model`'s route, the active digest first (one: no split; none: no route)."""
        with self._lock:
            first = self._targets.get(model)
            return (first, *self._also.get(model, ())) if first is not None else ()

    def targets(self) -> dict[str, Target]:
        """Every route now: one dict per switch (the same object until the next one), not to be changed."""
        with self._lock:
            return self._targets

    def switch(self, changes: Mapping[str, Route]) -> None:
        if not changes:
            return
        routes = {model: LOADABLE_ROUTE if isinstance(t, Loadable) else route_json(t, self._extras(model, t))
                  for model, t in changes.items() if t is not None}
        gone = [model for model, t in changes.items() if t is None]
        self.port.update(set=routes, delete=gone)  # GatewayError: nothing switched (the gateway kept its table)
        with self._lock:
            targets = dict(self._targets)
            loadable = set(self._loadable)
            for model, target in changes.items():
                self._also.pop(model, None)
                self._weights.pop(model, None)
                loadable.discard(model)
                if target is not None and not isinstance(target, Loadable):
                    self._weights[model] = _weights_of(routes[model], _targets_of(routes[model]))
                if isinstance(target, Loadable):
                    loadable.add(model)
                    targets.pop(model, None)
                elif target is None:
                    targets.pop(model, None)
                elif isinstance(target, Weighted):
                    targets[model] = target.targets[0]
                    if len(target.targets) > 1:
                        self._also[model] = target.targets[1:]
                else:
                    targets[model] = target
            self._targets = targets
            self._loadable = frozenset(loadable)

    def loadable(self) -> frozenset[str]:
        with self._lock:
            return self._loadable

    def _extras(self, model: str, target: Target | Weighted) -> Mapping[str, Any] | None:
        if self.extras is None:
            return None
        digests = (target.digest,) if isinstance(target, Target) else tuple(t.digest for t in target.targets)
        return self.extras(model, digests)

    def weights(self) -> dict[str, dict[str, int]]:
        """model → digest → the percent of its requests the gateway routes to it now."""
        with self._lock:
            return {model: dict(w) for model, w in self._weights.items()}

    def in_use(self) -> set[str]:
        with self._lock:
            names = {t.name for t in self._targets.values()} | {t.name for ts in self._also.values() for t in ts}
            for name in list(names):
                names |= self._steps.get(name, frozenset())
            return names

    def inflight(self, names: Iterable[str]) -> Mapping[str, int]:
        return self.port.inflight(list(names))


def route_json(target: Target | Weighted, extras: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One route as the gateway's control channel takes it: its targets in order (the active digest first),
    each with its percent weight (a single target takes every request), and the `extras` given: a split's
    `sticky_header` (the request header whose value's hash picks the target: one client, one version), and
    `tags` (tag → digest, for the targets' digests: a client's `x-tritonctl-route: TAG` pins to it)."""
    if isinstance(target, Target):
        route: dict[str, Any] = {"targets": [{"name": target.name, "digest": target.digest, "weight": 100}],
                                 "state": "serving"}
    else:
        route = {"targets": [{"name": t.name, "digest": t.digest, "weight": w}
                             for t, w in zip(target.targets, target.weights, strict=True)], "state": "serving"}
        if target.shadow:
            route["shadow"] = {"name": target.targets[0].name, "digest": target.targets[0].digest, **target.shadow}
    for key, value in (extras or {}).items():
        if value:
            route[key] = value
    return route


LOADABLE_ROUTE: dict[str, Any] = {"targets": [], "state": "loadable"}  # a LOADABLE route, as the gateway takes it


def _state_of(route: Any) -> str:
    state = route.get("state") if isinstance(route, Mapping) else getattr(route, "state", None)
    return state if isinstance(state, str) else "serving"


def _weights_of(route: Any, targets: list[Target]) -> dict[str, int]:
    """digest → percent, from a route as route_json writes it (a target without a weight takes 100)."""
    listed = route.get("targets") if isinstance(route, Mapping) else getattr(route, "targets", None)
    out: dict[str, int] = {}
    for target, raw in zip(targets, listed or (), strict=False):
        weight = raw.get("weight", 100) if isinstance(raw, Mapping) else getattr(raw, "weight", 100)
        out[target.digest] = out.get(target.digest, 0) + (int(weight) if isinstance(weight, int) else 100)
    return out


def _targets_of(route: Any) -> list[Target]:
    """A route's targets as the gateway holds them, in order (the first is the active digest)."""
    targets = route.get("targets") if isinstance(route, Mapping) else getattr(route, "targets", None)
    out: list[Target] = []
    for t in targets or ():
        name = t.get("name") if isinstance(t, Mapping) else getattr(t, "name", None)
        digest = t.get("digest") if isinstance(t, Mapping) else getattr(t, "digest", None)
        if isinstance(name, str) and isinstance(digest, str):
            out.append(Target(name, digest))
    return out


class PublicNames:
    """A Triton client read by public names (with a gateway, Triton knows only private ones): readiness,
    statistics and last-inference times of a model are its routed private name's, handed back under the
    public name; every other call passes through as it is (a private name stays private)."""

    def __init__(self, triton: Any, aliases: Aliases) -> None:
        self._triton = triton
        self._aliases = aliases

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._triton, attr)

    def _name(self, model: str) -> str:
        target = self._aliases.target(model)
        return target.name if target is not None else model

    def _public(self) -> dict[str, str]:
        return {t.name: model for model, t in self._aliases.targets().items()}

    def version_ready(self, model: str, version: str = "") -> bool:
        return bool(self._triton.version_ready(self._name(model), version))

    def last_inferences(self, model: str = "") -> dict[str, float]:
        public = self._public()
        out: dict[str, float] = {}
        for name, when in self._triton.last_inferences(self._name(model) if model else "").items():
            key = public.get(name, name)
            out[key] = max(out.get(key, 0.0), when)
        return out

    def request_counts(self, model: str) -> dict[tuple[str, str], Any]:
        public = self._public()
        return {(public.get(name, name), version): counts
                for (name, version), counts in self._triton.request_counts(self._name(model) if model else "").items()}
