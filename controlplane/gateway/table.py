"""The route table as the hot path reads it: one immutable object, swapped whole on every update.

`LiveTable.compile(RouteTable, figures)` turns routes.py's data into lookups keyed by the bytes a
request carries: the public name, the encoded protobuf field of each private name (so a rename is one
concatenation), each target's figures slot. A request reads `gateway.table` once when it starts and
keeps that object: a route update swaps the attribute and never changes a table a request holds, so an
in-flight request keeps the target it started with.

Choosing a target costs a dict lookup and an attribute read for a single-target route. Weighted routes
draw a random percent; `sticky_header` hashes the header's value (crc32, stable across processes and
restarts); `x-tritonctl-route: <digest prefix or private name>` pins a request to any target of the
route, weight 0 included. A route with a `shadow` (shadow.py) is never a single-target route: its requests
take `choose`, and the call asks the shadow whether to copy them; a route without one is compiled as it
always was, so the shadow costs its requests nothing.
"""

from __future__ import annotations

import random
import zlib
from bisect import bisect_right

from controlplane.gateway.figures import Figures, Slot
from controlplane.gateway.routes import Route, RouteTable
from controlplane.gateway.shadow import ShadowState, state_for
from controlplane.gateway.wire import string_field

MIN_PIN = 4  # hex digits of a digest a pin must give


class RouteRefusal(Exception):
    """The route cannot take this request: `kind` is not_found, unavailable, bad_pin, or loadable (the model is
    not loaded and a request loads it: the caller parks the request, parking.py)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class LiveTarget:
    __slots__ = ("model", "name", "digest", "weight", "private", "field", "slot", "public", "public_field")

    def __init__(self, model: str, name: str, digest: str, weight: int, slot: Slot) -> None:
        self.model = model
        self.name = name
        self.digest = digest
        self.weight = weight
        self.private = name.encode()
        self.field = string_field(1, self.private)
        self.public = model.encode()
        self.public_field = string_field(1, self.public)
        self.slot = slot


class LiveRoute:
    __slots__ = ("model", "targets", "single", "cumulative", "weighted", "sticky", "state", "serving", "tags",
                 "shadow")

    def __init__(self, route: Route, figures: Figures) -> None:
        self.model = route.model
        self.targets = tuple(LiveTarget(route.model, t.name, t.digest, t.weight,
                                        figures.slot(route.model, t.digest, t.name)) for t in route.targets)
        self.state = route.state
        self.sticky = route.sticky_header.encode() if route.sticky_header else None
        self.tags = dict(route.tags)
        self.weighted = tuple(t for t in self.targets if t.weight > 0)
        running, cumulative = 0, []
        for target in self.weighted:
            running += target.weight
            cumulative.append(running)
        self.cumulative = tuple(cumulative)
        # a copy of the requests to the shadow, when the route has one (its target is one of weight 0)
        self.shadow: ShadowState | None = state_for(figures, route.model, route.shadow) \
            if route.shadow is not None and route.state == "serving" else None
        only = len(self.weighted) == 1 and route.state == "serving" and self.sticky is None and self.shadow is None
        self.single = self.weighted[0] if only else None
        heaviest = route.serving()
        self.serving = next((t for t in self.targets if heaviest is not None and t.name == heaviest.name), None) \
            if route.state == "serving" else None

    def primary(self, pin: bytes | None) -> LiveTarget:
        """The target a question about the model goes to (metadata, config, readiness, statistics): the
        serving digest, or the pinned one; never a weighted draw, so the answers do not flicker."""
        if pin is not None and self.state != "loadable":
            return self._pinned(pin)
        if self.serving is None:
            raise self._not_serving()
        return self.serving

    def _not_serving(self) -> RouteRefusal:
        if self.state == "loadable":
            return RouteRefusal("loadable", f"model '{self.model}' is not loaded (a request for it loads it)")
        return RouteRefusal("unavailable", f"model '{self.model}' is not serving: it is {self.state}")

    def choose(self, pin: bytes | None, sticky: bytes | None) -> LiveTarget:
        if pin is not None and self.state != "loadable":
            return self._pinned(pin)
        if self.state != "serving" or not self.weighted:
            raise self._not_serving()
        if len(self.weighted) == 1:
            return self.weighted[0]
        if sticky is not None:
            point = zlib.crc32(sticky) % 100
        else:
            point = int(random.random() * 100)
        return self.weighted[bisect_right(self.cumulative, point)]

    def _pinned(self, pin: bytes) -> LiveTarget:
        text = pin.decode("latin-1")
        text = self.tags.get(text, text)  # a tag names its digest
        for target in self.targets:
            if text == target.name or (len(text) >= MIN_PIN and target.digest.startswith(text)):
                return target
        loaded = ", ".join(f"{t.digest[:12]} ({t.weight}%)" for t in self.targets) or "none"
        raise RouteRefusal("bad_pin", f"x-tritonctl-route '{text[:80]}' names no loaded version of model "
                                      f"'{self.model}'; loaded: {loaded}")


class LiveTable:
    __slots__ = ("version", "routes", "source", "serving_names")

    def __init__(self, source: RouteTable, figures: Figures) -> None:
        self.source = source
        self.version = source.version
        self.routes = {name.encode(): LiveRoute(route, figures) for name, route in source.routes.items()}
        # private name -> public name, for the digests that serve (what statistics may show)
        self.serving_names = {r.serving.name: r.model for r in self.routes.values() if r.serving is not None}

    def route(self, public: bytes) -> LiveRoute:
        found = self.routes.get(public)
        if found is None:
            raise RouteRefusal("not_found", "Request for unknown model: '" + public.decode("utf-8", "replace")
                               + "' is not found")
        return found
