"""Which models a request loads (controlplane/memory/onrequest.py `loads_on_request`), and the loadable route
the gateway parks their requests on (controlplane/gateway/routes.py, table.py). The loads themselves, through
the real daemon, gateway and tritonserver: tests/test_request_loads_e2e.py."""

from __future__ import annotations

from datetime import datetime

import pytest

from controlplane.deploy.aliases import LOADABLE, Routed, Target
from controlplane.errors import UsageError
from controlplane.gateway.figures import Figures
from controlplane.gateway.routes import RouteTable, route_from_json, route_to_json
from controlplane.gateway.table import LiveTable, RouteRefusal
from controlplane.memory.onrequest import loads_on_request
from controlplane.store.records import DeploymentRecord, ModelRecord

T0 = datetime(2026, 1, 1)


def record(state: str, removed: bool = False) -> ModelRecord:
    return ModelRecord("m", None, False, None, state, None, None, T0, T0 if removed else None)


def last(kind: str) -> DeploymentRecord:
    return DeploymentRecord(1, "m", kind, None, None, "done", "alice", T0, T0, "ok", None)


@pytest.mark.parametrize(("state", "policy", "kind", "loads"), [
    ("new", "ondemand", None, True),  # on demand, never loaded
    ("unloaded", "ondemand", "evict", True),  # unloaded for idleness
    ("unloaded", "auto", "evict", True),  # evicted by the memory budget, any policy
    ("failed", "auto", "ondemand", True),  # a request's load failed (no room): the next request tries again
    ("unloaded", "ondemand", "unload", False),  # the operator's unload stays
    ("unloaded", "auto", "unload", False),
    ("new", "auto", None, False),  # auto deploys by itself: not a request's business
    ("failed", "auto", "deploy", False),  # a failed deploy is retried by reconcile, not by requests
    ("serving", "ondemand", "ondemand", False),  # loaded already
])
def test_which_models_a_request_loads(state: str, policy: str, kind: str | None, loads: bool) -> None:
    assert loads_on_request(record(state), policy, last(kind) if kind else None) is loads


def test_a_removed_model_is_not_loaded_by_a_request() -> None:
    assert not loads_on_request(record("unloaded", removed=True), "ondemand", last("evict"))


def test_a_loadable_route_has_no_target_and_refuses_as_loadable() -> None:
    route = route_from_json("m", {"targets": [], "state": "loadable"})
    assert route_to_json(route) == {"targets": [], "state": "loadable"}
    with pytest.raises(UsageError, match=r"routes\.m\.targets: a loadable route has no targets"):
        route_from_json("m", {"targets": [{"digest": "a" * 64}], "state": "loadable"})
    live = LiveTable(RouteTable(1, {"m": route}), Figures()).route(b"m")
    for ask in (lambda: live.choose(None, None), lambda: live.primary(None), lambda: live.choose(b"aaaa", None)):
        with pytest.raises(RouteRefusal) as refused:
            ask()
        assert refused.value.kind == "loadable" and "not loaded" in refused.value.message


class Port:
    """The gateway's control channel as the daemon's Routed sees it: the routes it holds after each update."""

    def __init__(self) -> None:
        self.held: dict[str, dict[str, object]] = {}

    def update(self, set: dict[str, dict[str, object]], delete: list[str] = ()) -> int:  # type: ignore[assignment]  # noqa: A002
        self.held.update(set)
        for model in delete:
            self.held.pop(model, None)
        return 1

    def routes(self) -> dict[str, dict[str, object]]:
        return dict(self.held)

    def inflight(self, names: list[str]) -> dict[str, int]:
        return {}


def test_routed_keeps_loadable_routes_apart_from_targets() -> None:
    port = Port()
    routed = Routed(port)
    routed.switch({"m": Target("m__aaaaaaaa", "a" * 64)})
    routed.switch({"m": LOADABLE})  # an eviction
    assert port.held["m"] == {"targets": [], "state": "loadable"}
    assert routed.target("m") is None and routed.loadable() == {"m"} and routed.in_use() == set()
    routed.switch({"m": Target("m__bbbbbbbb", "b" * 64)})  # a request's load
    assert routed.loadable() == frozenset() and routed.target("m") == Target("m__bbbbbbbb", "b" * 64)
    routed.switch({"n": LOADABLE})
    fresh = Routed(port)  # a restarted daemon adopts what the gateway routes
    assert fresh.adopt() == {"m": Target("m__bbbbbbbb", "b" * 64)} and fresh.loadable() == {"n"}
    routed.switch({"n": None})  # an operator's unload: no route
    assert "n" not in port.held and routed.loadable() == frozenset()
