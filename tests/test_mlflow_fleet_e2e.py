"""A fleet whose source is an MLflow model registry, end to end (slow: a PostgreSQL, a real `mlflow
server`, two `tritonctl daemon --fleet --repository mlflow+http://...` processes, each with its own
tritonserver): moving the alias rolls the version out to both hosts, and MLflow shows on that version
what the fleet made of it, written by the leader from the shared registry: `tritonctl.state=serving`,
the fleet's digest and `tritonctl.hosts` naming both hosts; the version it replaced loses its state and
hosts tags. When the leader stops, the other daemon leads, starts from the tags MLflow holds (it never
captured the served version itself) and keeps them current: the stopped host leaves `tritonctl.hosts`,
and the next alias move retags both versions. One fleet for the module; the test stands alone (the slow
tier runs it by itself)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.harness import DaemonProcess, answers, wait_for
from tests.mlflowserver import MLflowServer, mlflow_server  # noqa: F401 - fixture
from tests.pg import PostgresServer
from tests.test_fleet_e2e import Fleet, running_fleet
from tests.test_mlflow_e2e import gen_files

# ruff: noqa: F811 - the fixture imported above is a parameter below

HOSTS = ["h1", "h2"]
MODEL = "mlfleet"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, postgres: PostgresServer,
          mlflow_server: MLflowServer) -> Iterator[Fleet]:
    def configure(fl: Fleet) -> None:
        for host in HOSTS:  # every host's daemon watches the MLflow registry (only the leader acts)
            fl.daemons[host] = DaemonProcess(
                f"mlflow+{mlflow_server.url}", fl.base / f"state-{host}",  # type: ignore[arg-type]
                env={"TRITONCTL_LOAD_TIMEOUT_S": "60"},
                extra_args=["--poll-interval", "0.2", "--fleet", "--db-url", fl.url, "--host", host,
                            "--shared-store", str(fl.shared)])

    with running_fleet(tmp_path_factory.mktemp("mlflowfleet"), postgres.new_database("mlflowfleet"), HOSTS,
                       configure) as fl:
        mlflow_server.wait_up()
        yield fl


def _serve_everywhere(fleet: Fleet, gen: int) -> str:
    """Wait until both hosts answer `gen` and the fleet settled on one digest: that digest."""
    try:
        wait_for(lambda: all(answers(fleet.clients[h], MODEL, float(gen)) for h in HOSTS), 120, 0.2,
                 f"{MODEL} answering {gen} on {HOSTS}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{fleet.daemons['h1'].log_tail()}\n{fleet.daemons['h2'].log_tail()}") from None

    def settled() -> Any:
        rows = [m for m in fleet.cli_json("status", "--fleet")["models"] if m["model"] == MODEL]
        ok = rows and sorted(rows[0]["hosts"]) == HOSTS and not any(c["drift"] for c in rows[0]["hosts"].values())
        return rows[0]["target"] if ok and not fleet.cli_json("rollouts", "--open") else None

    return str(wait_for(settled, 60, 0.2, "the fleet settled"))


def _tags(server: MLflowServer, version: str, want: dict[str, str | None]) -> dict[str, str]:
    """Wait until the version's tags hold `want` (None: the tag is absent)."""
    def matches() -> Any:
        tags = server.version_tags(MODEL, version)
        return tags if all(tags.get(k) == v for k, v in want.items()) else None

    try:
        return dict(wait_for(matches, 60, 0.2, f"{MODEL} version {version} tagged {want}"))
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {server.version_tags(MODEL, version)}") from None


@pytest.mark.slow  # ~60 s on 2 cores: PostgreSQL, mlflow server, two daemons and two tritonservers
def test_alias_move_rolls_out_to_the_fleet_and_mlflow_names_the_hosts(fleet: Fleet,
                                                                       mlflow_server: MLflowServer) -> None:
    server = mlflow_server
    v1 = server.register(MODEL, gen_files(MODEL, 1))
    server.set_alias(MODEL, "champion", v1)
    first = _serve_everywhere(fleet, 1)
    _tags(server, v1, {"tritonctl.state": "serving", "tritonctl.digest": first, "tritonctl.hosts": "h1,h2"})
    [rollout] = [r for r in fleet.cli_json("rollouts") if r["model"] == MODEL]
    assert rollout["state"] == "done" and [s["host"] for s in rollout["steps"] if s["wave"] == 0] == ["h1"], rollout

    v2 = server.register(MODEL, gen_files(MODEL, 2))
    server.set_alias(MODEL, "champion", v2)
    second = _serve_everywhere(fleet, 2)
    assert second != first
    _tags(server, v2, {"tritonctl.state": "serving", "tritonctl.digest": second, "tritonctl.hosts": "h1,h2"})
    # the version no longer served by any host: no state, no hosts, its digest stays
    _tags(server, v1, {"tritonctl.state": None, "tritonctl.hosts": None, "tritonctl.digest": first})
    # the alias, as a tag of the fleet's digest (in the shared registry, where a fleet's tags live)
    wait_for(lambda: next(m for m in fleet.cli_json("status", "--fleet")["models"] if m["model"] == MODEL)["tags"]
             == ["champion"], 30, 0.2, "champion as a tag of the fleet's digest")

    # the leader stops: the other daemon leads, reads the tags MLflow holds, and keeps them current
    leader = wait_for(fleet.leader, 10, 0.2, "a leader")
    [other] = [h for h in HOSTS if h != leader]
    assert fleet.daemons[leader].stop() == 0, fleet.daemons[leader].log_tail()
    _tags(server, v2, {"tritonctl.state": "serving", "tritonctl.hosts": other})  # the stopped host left it
    v3 = server.register(MODEL, gen_files(MODEL, 3))
    server.set_alias(MODEL, "champion", v3)
    wait_for(lambda: answers(fleet.clients[other], MODEL, 3.0), 120, 0.2, f"{MODEL} answering 3 on {other}")
    _tags(server, v3, {"tritonctl.state": "serving", "tritonctl.hosts": other})
    _tags(server, v2, {"tritonctl.state": None, "tritonctl.hosts": None, "tritonctl.digest": second})
