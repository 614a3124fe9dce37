"""Requests load models on a fleet (issue 55 item 5; docs/ondemand.md "On a fleet"): a request at a host's
gateway for an on-demand model places it on THAT host when the fleet's placement allows, and a request at
another host's gateway is told which host serves it.

Two `tritonctl daemon --fleet` processes (each with its launched tritonserver and gateway), one PostgreSQL,
the global policy `ondemand`, a memory budget of 200 MB per host and a model `a` declaring 150 MB. Both
hosts have the same room, so the placement alone picks h1 (by name): the request arriving at h2 makes it
h2. Then a request at h1's gateway gets UNAVAILABLE naming h2 (the fleet serves an on-demand model on one
host), and h1 loads nothing.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from controlplane.gateway.control import GatewayControl
from tests.harness import infer_gen, wait_for
from tests.pg import PostgresServer
from tests.test_fleet_e2e import Fleet, running_fleet
from tests.test_fleet_placement_e2e import placement, recorded, write_model

HOSTS = ["h1", "h2"]
pytestmark = [pytest.mark.triton, pytest.mark.postgres]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, postgres: PostgresServer) -> Iterator[Fleet]:
    def configure(fl: Fleet) -> None:
        write_model(fl.repo, "a", 1, 150)
        for host in HOSTS:
            fl.daemon(host).extra_args += ["--policy", "ondemand", "--memory-budget-mb", "200"]

    with running_fleet(tmp_path_factory.mktemp("fleet-requests"), postgres.new_database("fleetrequests"), HOSTS,
                       configure) as fl:
        yield fl


def route_state(fleet: Fleet, host: str, model: str) -> str | None:
    socket = fleet.daemons[host].state_dir / "gateway" / "gateway.sock"
    route = GatewayControl(socket, 10.0).routes().routes.get(model)
    return None if route is None else route.state


def test_a_request_places_the_model_on_the_host_it_arrived_at(fleet: Fleet) -> None:
    wait_for(lambda: recorded(fleet, "a") and len(fleet.cli_json("hosts")) == 2
             and all(h["alive"] for h in fleet.cli_json("hosts")), 60, 0.2, "a recorded; both hosts alive")
    wait_for(lambda: all(route_state(fleet, h, "a") == "loadable" for h in HOSTS), 60, 0.3,
             "a routed loadable on both hosts' gateways")

    assert infer_gen(fleet.clients["h2"], "a") == 1.0  # through h2's gateway: loaded there
    placed = placement(fleet, "a")
    assert placed["host"] == "h2", placed
    [decision] = fleet.cli_json("audit", "--model", "a", "--action", "place")
    assert "where a request for it arrived" in decision["message"], decision

    with pytest.raises(InferenceServerException) as raised:  # at h1's gateway: the fleet serves it on h2
        fleet.clients["h1"].infer("a", [_x()], client_timeout=60)
    assert raised.value.status() == "StatusCode.UNAVAILABLE", raised.value
    assert raised.value.message().startswith("model 'a' could not be loaded: the fleet serves it on host h2"), \
        raised.value.message()
    assert "send its requests there" in raised.value.message()
    assert placement(fleet, "a")["host"] == "h2"
    assert not [e for e in fleet.cli_json("audit", "--model", "a", "--action", "ondemand") if e["host"] == "h1"]


def _x() -> grpcclient.InferInput:
    import numpy as np

    x = grpcclient.InferInput("x", [1, 1], "FP32")
    x.set_data_from_numpy(np.zeros((1, 1), dtype=np.float32))
    return x
