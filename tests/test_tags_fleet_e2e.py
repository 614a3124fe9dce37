"""Tags on a fleet end to end (issue 18; slow: three daemons with their tritonservers and a PostgreSQL): the
tags live in the shared registry, and moving the tag a fleet model tracks rolls the new digest out like any
other change (canary first, then the waves); a move to content that fails at the canary is rolled back on
the fleet with 0 failed requests and the tag stays on what every host serves. The cheap default check of
the same entry point is tests/test_tags.py (a stand-in fleet)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack

import pytest

from tests.harness import request_loop, wait_for, write_gen_model
from tests.pg import PostgresServer
from tests.test_fleet_e2e import MODEL, Fleet, running_fleet

HOSTS = ["h1", "h2", "h3"]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, postgres: PostgresServer) -> Iterator[Fleet]:
    with running_fleet(tmp_path_factory.mktemp("tagfleet"), postgres.new_database("tagfleet"), HOSTS) as fl:
        yield fl


def _recorded(fleet: Fleet, count: int) -> str:
    rows = wait_for(lambda: v if len(v := fleet.cli_json("versions", MODEL)) >= count else None, 60, 0.3,
                    f"{count} recorded versions")
    return str(rows[0]["digest"])


@pytest.mark.slow
def test_moving_a_tracked_tag_rolls_out_on_three_hosts(fleet: Fleet) -> None:
    write_gen_model(fleet.repo, MODEL, 1)
    fleet.wait_gen(1, HOSTS, 120)
    h2 = fleet.daemons["h2"]
    h2.cli("policy", MODEL, "manual")
    wait_for(lambda: not fleet.cli_json("rollouts", "--open"), 30, 0.3, "no open rollout")
    first = _recorded(fleet, 1)
    write_gen_model(fleet.repo, MODEL, 2)
    second = _recorded(fleet, 2)
    write_gen_model(fleet.repo, MODEL, 3, init="raise RuntimeError('weights missing')")
    bad = _recorded(fleet, 3)
    assert all(fleet.gen(h) == 1.0 for h in HOSTS)  # manual: recorded, not rolled out

    h2.cli("tag", MODEL, "stable")  # what the fleet serves
    h2.cli("policy", MODEL, "track:stable")
    policy = fleet.cli_json("audit", "--model", MODEL, "--action", "policy")[0]  # a fleet policy change
    assert "track:stable on the fleet (through h2)" in policy["message"], policy
    moved = h2.json("tag", MODEL, "stable", second[:12])  # through any host
    assert moved["outcome"] == "ok" and moved["deployed"], moved
    fleet.wait_gen(2, HOSTS, 30)
    rollout = next(r for r in fleet.cli_json("rollouts") if r["digest"] == second)
    assert rollout["state"] == "done"
    assert [s["host"] for s in rollout["steps"] if s["wave"] == 0] == ["h1"]  # canary first
    assert {t["name"]: t["digest"] for t in fleet.cli_json("tags", MODEL)["tags"]} == {"stable": second}
    [row] = [m for m in fleet.cli_json("status", "--fleet")["models"] if m["model"] == MODEL]
    assert (row["target"], row["tags"]) == (second, ["stable"])

    with ExitStack() as stack:
        loops = {h: stack.enter_context(request_loop(fleet.daemons[h].triton_url(), MODEL, threads=1)) for h in HOSTS}
        failed = fleet.daemons["h3"].cli("tag", MODEL, "stable", bad[:12], check=False)
    assert failed.returncode == 1, failed.stderr + failed.stdout
    for host, stats in loops.items():
        assert stats["failed"] == 0 and set(stats["gens"]) == {2.0}, (host, stats)
    assert {t["name"]: t["digest"] for t in fleet.cli_json("tags", MODEL)["tags"]} == {"stable": second}
    events = fleet.cli_json("audit", "--model", MODEL, "--action", "tag")
    assert [e["outcome"] for e in events] == ["failed", "ok", "ok"] and events[0]["digest"] == bad
    assert first != second
