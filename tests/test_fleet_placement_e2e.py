"""On-demand models on a fleet (issue 29 item 4): placed on ONE host with room, leased through any host.

Two `tritonctl daemon --fleet` processes (each with its launched tritonserver, a memory budget of 200 MB,
the global policy `ondemand`), one PostgreSQL, the CLI as a process. Three models that declare their
footprint (`tritonctl.footprint_mb`): `a` and `b` 150 MB each (their real measurement replaces it once
loaded), `huge` 5000 MB. In order: nothing is rolled out (on-demand); `ensure a` through h1 places it on
a host and answers that host's gateway (the addresses its heartbeat records, `hosts`), where the inference
goes; `ensure b` through h1 lands on the host with the most room; `ensure b` through h2 answers the same
host without a second load; `huge` fits nowhere: exit 1 naming each host's budget; `status --fleet` shows
where each one is placed, with its leases; renew and release work through the other host, and once no
lease holds `b` its host unloads it when idle, which frees its placement (audited `place` / `unplace`).
The placement rule's cases one by one: tests/unit/test_placement.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as grpcclient

from tests.harness import gen_config, infer_gen, python_model, wait_for
from tests.pg import PostgresServer
from tests.test_fleet_e2e import Fleet, running_fleet

HOSTS = ["h1", "h2"]
pytestmark = [pytest.mark.triton, pytest.mark.postgres]


def write_model(repo: Path, name: str, gen: int, footprint_mb: int) -> None:
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    declared = f'parameters {{ key: "tritonctl.footprint_mb" value {{ string_value: "{footprint_mb}" }} }}\n'
    (repo / name / "config.pbtxt").write_text(gen_config(name, gen) + declared)
    (repo / name / "1" / "model.py").write_text(
        python_model("np.full_like(x, GEN, dtype=np.float32)", prelude=f"\nGEN = {gen}\n"))


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, postgres: PostgresServer) -> Iterator[Fleet]:
    def configure(fl: Fleet) -> None:
        for gen, (name, footprint) in enumerate((("a", 150), ("b", 150), ("huge", 5000)), start=1):
            write_model(fl.repo, name, gen, footprint)
        for host in HOSTS:
            daemon = fl.daemon(host)
            daemon.extra_args += ["--policy", "ondemand", "--memory-budget-mb", "200"]
            daemon.env["TRITONCTL_IDLE_UNLOAD_S"] = "1"

    with running_fleet(tmp_path_factory.mktemp("placement"), postgres.new_database("placement"), HOSTS,
                       configure) as fl:
        yield fl


def ensure(fleet: Fleet, through: str, model: str, check: bool = True) -> Any:
    result = fleet.daemons[through].cli("ensure", model, "--for", "5m", "--json", check=check)
    return json.loads(result.stdout) if check else result


def placement(fleet: Fleet, model: str) -> Any:
    rows = [m for m in fleet.cli_json("status", "--fleet")["models"] if m["model"] == model]
    return rows[0]["placement"] if rows else None


def recorded(fleet: Fleet, model: str) -> bool:
    """Whether the fleet's registry holds one version of `model` (the leader scans behind READY, so a
    model may still be unknown to it: not yet, rather than an error)."""
    try:
        return len(fleet.cli_json("versions", model)) == 1
    except AssertionError as exc:
        if "unknown to the registry" in str(exc):
            return False
        raise


def test_ondemand_models_are_placed_on_one_host_and_leased_through_any(fleet: Fleet) -> None:
    wait_for(lambda: recorded(fleet, "huge") and fleet.cli_json("hosts")
             and all(h["alive"] for h in fleet.cli_json("hosts")) and len(fleet.cli_json("hosts")) == 2,
             60, 0.2, "the leader recorded every model; both hosts alive")
    assert not fleet.cli_json("rollouts"), "on-demand models are recorded, never rolled out"

    first = ensure(fleet, "h1", "a")
    assert first["host"] in HOSTS and first["loaded"] is True, first
    with grpcclient.InferenceServerClient(first["grpc_url"]) as client:  # where the answer says to send it
        assert infer_gen(client, "a") == 1.0
    # the addresses a host advertises (its heartbeat: `hosts`, `ensure`) are where its clients send inference:
    # its gateway's, which serves the public names (tritonserver's own ports answer private ones only)
    placed_on = fleet.daemons[first["host"]].status()
    assert (first["grpc_url"], first["http_url"]) == (placed_on["triton_grpc_url"], placed_on["triton_http_url"])
    assert placed_on["gateway"] and first["grpc_url"] == placed_on["gateway"]["grpc_url"], placed_on
    advertised = {h["host"]: h["triton_url"] for h in fleet.cli_json("hosts")}
    assert advertised == {h: fleet.daemons[h].status()["gateway"]["grpc_url"] for h in HOSTS}, advertised
    other = next(h for h in HOSTS if h != first["host"])
    assert not fleet.clients[other].is_model_ready("a"), "loaded on one host only"

    second = ensure(fleet, "h1", "b")  # `a`'s host has less room left: the other one
    assert second["host"] == other and second["loaded"] is True, second
    again = ensure(fleet, "h2", "b")  # through the other host: the same host, no second load
    assert (again["host"], again["digest"], again["loaded"]) == (other, second["digest"], False), again
    assert len(fleet.cli_json("audit", "--model", "b", "--action", "place")) == 1
    assert infer_gen(fleet.clients[other], "b") == 2.0

    refused = ensure(fleet, "h2", "huge", check=False)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "huge needs 5000 MB" in refused.stderr and "memory_budget_mb = 200 MB" in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr
    assert placement(fleet, "huge") is None
    [decision] = fleet.cli_json("audit", "--model", "huge", "--action", "place")
    assert decision["outcome"] == "failed" and "memory_budget_mb" in decision["message"], decision

    placed = {m: placement(fleet, m) for m in ("a", "b")}
    assert (placed["a"]["host"], placed["a"]["state"], placed["a"]["leases"]) == (first["host"], "loaded", 1)
    assert (placed["b"]["host"], placed["b"]["state"], placed["b"]["leases"]) == (other, "loaded", 2)
    text = fleet.daemons["h1"].cli("status", "--fleet").stdout
    assert f"{other} loaded (leases: 2" in text, text

    # renew and release through the host the lease was not taken on; with no lease left `b` goes idle,
    # its host unloads it once idle, and its placement is free
    renewed = json.loads(fleet.daemons["h1"].cli("lease", "renew", "b", again["lease"], "--for", "1m", "--json").stdout)
    assert renewed["host"] == other and renewed["lease"] == again["lease"]
    for lease, through in ((second["lease"], "h2"), (again["lease"], "h1")):
        assert json.loads(fleet.daemons[through].cli("lease", "release", "b", lease, "--json").stdout)["released"]
    assert fleet.daemons["h1"].cli("lease", "release", "b", second["lease"], check=False).returncode == 2
    wait_for(lambda: placement(fleet, "b") is None, 30, 0.3, "b unloaded when idle, its placement freed")
    assert not fleet.clients[other].is_model_ready("b")
    assert fleet.cli_json("audit", "--model", "b", "--action", "unplace")
    assert placement(fleet, "a")["state"] == "loaded", "a leased model stays"
