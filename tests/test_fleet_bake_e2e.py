"""A fleet's canary bakes before the next wave starts (issue 38, docs/bake.md "Sets and fleets"; slow: two
daemons with their tritonservers and a PostgreSQL).

Two hosts, h1 the canary and h2 the next wave, both daemons with `--bake 3s`: a version that raises in
`execute` on about a fifth of its inputs (what Triton counts as a failure) but passes its smoke test is
deployed on the canary, fails its bake there on the requests clients send to the canary's tritonserver,
and is never loaded on h2: the rollout stops, the canary is rolled back, the digest is not quarantined;
`rollouts --json` and the web view's Fleet page show the bake.
"""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator

import pytest

from tests import jsonschemas
from tests.harness import wait_for
from tests.pg import PostgresServer
from tests.test_bake_e2e import clients, write_model
from tests.test_fleet_e2e import MODEL, Fleet, running_fleet

HOSTS = ["h1", "h2"]

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.triton]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, postgres: PostgresServer) -> Iterator[Fleet]:
    def configure(fl: Fleet) -> None:
        for host in HOSTS:
            fl.daemon(host).extra_args += ["--bake", "3s", "--canary-hosts", "h1", "--wave-size", "1"]

    with running_fleet(tmp_path_factory.mktemp("bakefleet"), postgres.new_database("bakefleet"), HOSTS,
                       configure) as fl:
        yield fl


def test_a_fleet_canary_that_fails_its_bake_is_never_loaded_on_a_second_host(fleet: Fleet) -> None:
    write_model(fleet.repo, MODEL, 1)  # its canary bake passes (the polls below are its requests) or is kept
    fleet.wait_gen(1, HOSTS, 120)
    [first] = wait_for(lambda: [r for r in fleet.cli_json("rollouts", "--limit", "1") if r["state"] == "done"],
                       30, 0.3, "generation 1's rollout done")
    assert first["bake"]["state"] in ("passed", "inconclusive") and first["bake"]["hosts"] == ["h1"], first["bake"]
    with clients(fleet.daemons["h1"].triton_url(), MODEL, threads=1) as seen:
        write_model(fleet.repo, MODEL, 2, failing=True)  # its smoke test (input 0) passes
        [rollout] = wait_for(lambda: [r for r in fleet.cli_json("rollouts", "--limit", "1")
                                      if r["id"] != first["id"] and r["state"] == "rolled_back"],
                             90, 0.3, "generation 2's rollout rolled back by its canary's bake")
        fleet.wait_gen(1, ["h1"], 30)
    documents = fleet.cli_json("rollouts", "--limit", "2")
    jsonschemas.assert_valid("rollouts", documents)
    steps = {(s["host"], s["action"]): s for s in rollout["steps"]}
    assert {k: s["state"] for k, s in steps.items()} == {
        ("h1", "deploy"): "ok", ("h1", "bake"): "failed", ("h2", "deploy"): "skipped", ("h1", "rollback"): "ok"}
    bake = rollout["bake"]
    assert (bake["state"], bake["wave"], bake["hosts"], bake["digest"]) == ("failed", 0, ["h1"], rollout["digest"])
    assert bake["requests"] >= 20 and bake["failures"] > 0 and bake["failure_ratio"] > 0.01, bake
    assert bake["reason"].startswith("failure ratio ") and "> 0.01 over " in bake["reason"], bake
    # one host: its figures are the pool (the host may have written a round more before the leader ended its step)
    assert steps[("h1", "bake")]["figures"]["requests"] >= bake["requests"] > 0
    assert rollout["error"] == f"bake failed: {bake['reason']}", rollout
    assert seen["failed"] and any(gen == 2.0 for _, gen in seen["ok"])  # the canary did serve it
    # never loaded on h2: the fleet audited no step of that digest there, and h2 serves generation 1
    d2 = rollout["digest"]
    audit = fleet.cli_json("audit", "--model", MODEL)
    assert not [e for e in audit if e["host"] == "h2" and e["digest"] == d2 and e["action"] in ("deploy", "rollback")]
    assert fleet.gen("h2") == 1.0
    [ended] = [e for e in audit if e["action"] == "bake" and e["digest"] == d2]
    assert ended["outcome"] == "failed" and "the canary wave on h1" in ended["message"], ended
    versions = {v["digest"]: v for v in fleet.cli_json("versions", MODEL)}
    assert versions[d2]["quarantined"] is False  # it failed on this traffic: `load --digest` may try it again
    # the web view's Fleet page (h1 serves one) shows the canary's bake among the rollout's waves
    url = wait_for(lambda: re.search(r"web view: (http://127\.0\.0\.1:\d+)/ui/",
                                     fleet.daemons["h1"].log_path.read_text()), 10, what="the web view").group(1)
    with urllib.request.urlopen(f"{url}/ui/fleet", timeout=10) as answer:
        page = answer.read().decode()
    row = page[page.index(f'<tr data-rollout="{rollout["id"]}">'):]
    assert re.search(r'data-action="bake">bake canary:\s*<span class="badge st-failed" data-host="h1"', row), row[:2000]
