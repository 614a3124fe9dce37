"""The gateway's route table as data: which private name serves each public model name.

Every digest of a model is loaded into tritonserver under a private name, `<model>__<8 hex of its
digest>` (controlplane/names.py reserves the pattern); clients use the public name, and the gateway's
route for it names the target(s) a request goes to. A switch is one new route, swapped in at once.

A `Route` has one target (the usual case) or several with percent weights that add up to 100 (a
canary step, issue 55); a target of weight 0 is loaded and reachable only by pinning
(`x-tritonctl-route: <digest prefix>`), as an old digest is while it drains. `sticky_header` names a
request header whose value picks the target by hash, so one user stays on one version. `state` is
`serving`; `unavailable` for a model the route table knows but that serves nothing now (its
requests are answered UNAVAILABLE / 503 by the gateway); or `loadable`, no target, for a model that is
registered but not loaded and that a request loads (its requests wait in parking.py while the daemon
loads it: docs/ondemand.md "Requests load models"). `shadow` (issue 55 item 4) names a target of
weight 0 that gets a copy of the route's inference requests, whose answers the gateway compares with the
serving version's and never returns to a client (controlplane/gateway/shadow.py).

This module is pure (no asyncio): the daemon builds and validates routes with it, the gateway reads
the routes file with it. Every refusal is a `UsageError` with a one-line message naming the field.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from controlplane.errors import UsageError
from controlplane.names import is_private_name, validate_model_name

STATES = ("serving", "unavailable", "loadable")
ROUTES_FILE_FORMAT = 1
_HEADER_RE = re.compile(r"[a-z0-9!#$%&'*+.^_`|~-]{1,64}", re.ASCII)
_HEX_RE = re.compile(r"[0-9a-f]{8,64}", re.ASCII)
_SHADOW_ID_RE = re.compile(r"[0-9a-f]{8,32}", re.ASCII)
RESERVED_HEADERS = frozenset({"x-tritonctl-route", "host", "content-length", "content-type", "te"})


@dataclass(frozen=True)
class Target:
    """One loaded digest of the model: its private name in tritonserver, its digest, its weight (%)."""

    name: str
    digest: str
    weight: int = 100


@dataclass(frozen=True)
class Shadow:
    """A copy of the route's inference requests goes to `name` (a target of weight 0), its answers compared
    with the serving version's: floating outputs within `rtol` / `atol`, everything else equal. `id` names this
    shadow's figures (a new shadow of the same digest counts from 0); `fraction` of the requests are copied (up
    to the gateway's rate limit); `keep_inputs`: the first disagreements keep the request's inputs."""

    name: str
    digest: str
    id: str
    fraction: float = 1.0
    rtol: float = 1e-5
    atol: float = 1e-8
    keep_inputs: bool = False


@dataclass(frozen=True)
class Route:
    model: str
    targets: tuple[Target, ...]
    sticky_header: str | None = None
    state: str = "serving"
    tags: Mapping[str, str] = field(default_factory=dict)  # tag → digest: `x-tritonctl-route: TAG` pins to it
    shadow: Shadow | None = None

    def serving(self) -> Target | None:
        """The target the model's figures and statistics are named after: the heaviest (first on a tie)."""
        best: Target | None = None
        for target in self.targets:
            if best is None or target.weight > best.weight:
                best = target
        return best


@dataclass(frozen=True)
class RouteTable:
    version: int = 0
    routes: Mapping[str, Route] = field(default_factory=dict)

    def updated(self, set_routes: Mapping[str, Route], delete: Iterable[str], version: int | None) -> RouteTable:
        routes = dict(self.routes)
        for name in delete:
            routes.pop(name, None)
        routes.update(set_routes)
        new_version = self.version + 1 if version is None else version
        if new_version < self.version:
            raise UsageError(f"routes version {new_version} is older than the gateway's {self.version}")
        return RouteTable(new_version, routes)


def private_name(model: str, digest: str) -> str:
    """The private name a digest of `model` is loaded under."""
    return f"{model}__{digest[:8]}"


def _field(where: str, message: str) -> UsageError:
    return UsageError(f"{where}: {message}")


def target_from_json(data: Any, model: str, where: str) -> Target:
    if not isinstance(data, dict):
        raise _field(where, "a target must be an object with name, digest and weight")
    unknown = set(data) - {"name", "digest", "weight"}
    if unknown:
        raise _field(where, f"unknown key {sorted(unknown)[0]!r}")
    name, digest, weight = data.get("name"), data.get("digest"), data.get("weight", 100)
    if not isinstance(digest, str) or not _HEX_RE.fullmatch(digest):
        raise _field(f"{where}.digest", "must be 8 to 64 lowercase hex digits")
    if name is None:
        name = private_name(model, digest)
    # a private name of this model: `<model>__<8 hex>` (an ensemble's is bound to its steps' names, so its hex
    # is not its digest's: controlplane/deploy/aliases.py bound_name), or the public name itself for a model
    # Triton serves in place (one another model calls by name through BLS, inside Triton)
    if not isinstance(name, str) or not (name == model or (is_private_name(name) and name.rsplit("__", 1)[0] == model)):
        raise _field(f"{where}.name", f"{name!r} is neither model {model!r}'s own name nor one of its private names "
                                      "(<model>__<8 hex>)")
    if isinstance(weight, bool) or not isinstance(weight, int) or not 0 <= weight <= 100:
        raise _field(f"{where}.weight", "must be an integer percent from 0 to 100")
    return Target(name, digest, weight)


def _number(data: dict[str, Any], key: str, default: float, where: str, low: float, high: float) -> float:
    value = data.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not low <= value <= high:
        raise _field(f"{where}.{key}", f"must be a number from {low:g} to {high:g}")
    return float(value)


def shadow_from_json(data: Any, targets: tuple[Target, ...], where: str) -> Shadow:
    """A route's `shadow`: it names one of the route's targets of weight 0 (copies only, no client request)."""
    if not isinstance(data, dict):
        raise _field(where, "must be an object with name, digest, id, fraction, rtol, atol, keep_inputs")
    unknown = set(data) - {"name", "digest", "id", "fraction", "rtol", "atol", "keep_inputs"}
    if unknown:
        raise _field(where, f"unknown key {sorted(unknown)[0]!r}")
    name, digest, ident = data.get("name"), data.get("digest"), data.get("id")
    if not any(t.name == name and t.digest == digest and t.weight == 0 for t in targets):
        raise _field(f"{where}.name", f"{name!r} is not a target of weight 0 of this route with digest {digest!r}: a "
                                      "shadow gets copies of requests, never a client's")
    if not isinstance(ident, str) or not _SHADOW_ID_RE.fullmatch(ident):
        raise _field(f"{where}.id", "must be 8 to 32 lowercase hex digits")
    fraction = _number(data, "fraction", 1.0, where, 0.0, 1.0)
    if fraction <= 0:
        raise _field(f"{where}.fraction", "must be above 0 (up to 1: every request)")
    keep = data.get("keep_inputs", False)
    if not isinstance(keep, bool):
        raise _field(f"{where}.keep_inputs", "must be true or false")
    return Shadow(str(name), str(digest), ident, fraction, _number(data, "rtol", 1e-5, where, 0.0, 1e6),
                  _number(data, "atol", 1e-8, where, 0.0, 1e300), keep)


def shadow_to_json(shadow: Shadow) -> dict[str, Any]:
    return {"name": shadow.name, "digest": shadow.digest, "id": shadow.id, "fraction": shadow.fraction,
            "rtol": shadow.rtol, "atol": shadow.atol, "keep_inputs": shadow.keep_inputs}


def route_from_json(model: str, data: Any, where: str = "routes") -> Route:
    where = f"{where}.{model}"
    try:
        validate_model_name(model)
    except UsageError as exc:
        raise _field(where, str(exc)) from None
    if not isinstance(data, dict):
        raise _field(where, "a route must be an object with targets")
    unknown = set(data) - {"targets", "sticky_header", "state", "tags", "shadow"}
    if unknown:
        raise _field(where, f"unknown key {sorted(unknown)[0]!r}")
    state = data.get("state", "serving")
    if state not in STATES:
        raise _field(f"{where}.state", f"{state!r} is not one of {', '.join(STATES)}")
    raw = data.get("targets", [])
    if not isinstance(raw, list):
        raise _field(f"{where}.targets", "must be a list")
    targets = tuple(target_from_json(item, model, f"{where}.targets[{i}]") for i, item in enumerate(raw))
    names = [t.name for t in targets]
    if len(set(names)) != len(names):
        raise _field(f"{where}.targets", "a private name is listed twice")
    if state == "serving":
        if not targets:
            raise _field(f"{where}.targets", "a serving route needs at least one target")
        if sum(t.weight for t in targets) != 100:
            raise _field(f"{where}.targets", f"weights add up to {sum(t.weight for t in targets)}, not 100")
    if state == "loadable" and targets:
        raise _field(f"{where}.targets", "a loadable route has no targets (the model is not loaded)")
    sticky = data.get("sticky_header")
    if sticky is not None:
        if not isinstance(sticky, str) or not _HEADER_RE.fullmatch(sticky) or sticky in RESERVED_HEADERS:
            raise _field(f"{where}.sticky_header", f"{sticky!r} is not a lowercase header name the gateway can hash")
    tags = data.get("tags") or {}
    if not isinstance(tags, dict) or not all(
            isinstance(k, str) and 0 < len(k) <= 128 and isinstance(v, str) and _HEX_RE.fullmatch(v)
            for k, v in tags.items()):
        raise _field(f"{where}.tags", "must map tag names to digests (8 to 64 lowercase hex digits)")
    raw_shadow = data.get("shadow")
    shadow = shadow_from_json(raw_shadow, targets, f"{where}.shadow") if raw_shadow is not None else None
    return Route(model, targets, sticky, state, dict(sorted(tags.items())), shadow)


def route_to_json(route: Route) -> dict[str, Any]:
    out: dict[str, Any] = {"targets": [{"name": t.name, "digest": t.digest, "weight": t.weight}
                                       for t in route.targets]}
    if route.sticky_header is not None:
        out["sticky_header"] = route.sticky_header
    if route.state != "serving":
        out["state"] = route.state
    if route.tags:
        out["tags"] = dict(route.tags)
    if route.shadow is not None:
        out["shadow"] = shadow_to_json(route.shadow)
    return out


def routes_from_json(data: Any, where: str = "routes") -> dict[str, Route]:
    if not isinstance(data, dict):
        raise _field(where, "must be an object mapping each public model name to its route")
    return {model: route_from_json(model, value, where) for model, value in data.items()}


def table_to_json(table: RouteTable) -> dict[str, Any]:
    return {"format": ROUTES_FILE_FORMAT, "version": table.version,
            "routes": {name: route_to_json(route) for name, route in sorted(table.routes.items())}}


def table_from_json(data: Any, where: str) -> RouteTable:
    if not isinstance(data, dict):
        raise _field(where, "must be a JSON object")
    if data.get("format", ROUTES_FILE_FORMAT) != ROUTES_FILE_FORMAT:
        raise _field(f"{where}: format", f"{data.get('format')!r} is not {ROUTES_FILE_FORMAT}")
    version = data.get("version", 0)
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise _field(f"{where}: version", "must be a non-negative integer")
    return RouteTable(version, routes_from_json(data.get("routes", {}), f"{where}: routes"))


def read_table(path: Path) -> RouteTable:
    """The routes file; an absent file is an empty table."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return RouteTable()
    except OSError as exc:
        raise UsageError(f"{path}: cannot read the routes file: {exc.strerror}") from None
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"{path}: not JSON: {exc}") from None
    return table_from_json(data, str(path))


def write_table(path: Path, table: RouteTable) -> None:
    """Write the routes file durably: a temporary file (0600), fsync, rename, fsync of the directory."""
    text = json.dumps(table_to_json(table), indent=1, sort_keys=True) + "\n"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(text.encode("utf-8"))
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
