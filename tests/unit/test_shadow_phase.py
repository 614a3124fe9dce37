"""The shadow before a canary's first step (controlplane/bake/shadowrun.py, shadow.py) against a stand-in Triton,
a stand-in route table and stand-in gateway figures: the switch serves every request from the previous digest and
names the new one the route's shadow (a route the gateway's own validation takes), its figures are judged with
the bake's limits, a disagreement or the new version's errors roll it back before any step (the canary never
reaches a weight above 0), a shadow that passes goes on to the first step (the copies stop with it), `promote`
moves on by hand, `abort` ends it, and a restarted daemon resumes it. End to end through the real gateway and
tritonserver: tests/test_shadow_e2e.py."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from controlplane.bake.figures import Limits
from controlplane.bake.shadow import ShadowPhase, judge
from controlplane.deploy.aliases import private_name
from controlplane.gateway.routes import routes_from_json
from controlplane.settings.config import Settings
from controlplane.store.registry import AuditQuery
from controlplane.vocab import Cause, Result
from tests.unit.test_canary import Canaries, StandinFigures
from tests.unit.test_deploy_routed import wait_for

pytestmark = pytest.mark.unit

SETTINGS = Settings(bake_s=60.0, canary_steps=(10, 100), bake_min_requests=20, bake_max_failure_ratio=0.01,
                    shadow_s=300.0)
LAT = {"buckets": [0.001, 0.01, 0.1], "cumulative": [0, 0, 0], "count": 0, "sum_s": 0.0}


class ShadowFigures(StandinFigures):
    """The gateway's figures, with its shadows' (by id) as the test sets them."""

    def __init__(self) -> None:
        super().__init__()
        self.shadows: dict[str, dict[str, Any]] = {}

    def shadow(self, ident: str) -> Mapping[str, Any] | None:
        return self.shadows.get(ident)

    def pairs(self, ident: str, agreed: int, disagreed: int = 0, errors: int = 0,
              first: dict[str, Any] | None = None) -> None:
        self.shadows[ident] = {"id": ident, "copied": agreed + disagreed, "pairs": agreed + disagreed,
                               "agreed": agreed, "disagreed": disagreed, "errors": {"shadow": errors, "serving": 0},
                               "skipped": {"rate": 0}, "latency": {"serving": LAT, "shadow": LAT},
                               "disagreements": [first] if first else []}


class Shadowed(Canaries):
    def __init__(self, tmp: Path, settings: Settings) -> None:
        super().__init__(tmp, settings)
        self.figures = ShadowFigures()
        self.baker.rollouts.traffic = self.figures

    def _baker(self) -> Any:
        baker = super()._baker()
        assert self.deployer.routed is not None
        self.deployer.routed.shadowing = baker.rollouts.shadow_spec
        return baker

    def ident(self) -> str:
        bake = self.baker.of("m")
        assert bake is not None and bake.canary is not None and bake.canary.shadow is not None
        return bake.canary.shadow.id

    def shadow_audit(self) -> list[tuple[str, str]]:
        return [(e.outcome, e.message) for e in
                reversed(self.registry.query_audit(AuditQuery(model="m", action="shadow", limit=50)))]


@pytest.fixture
def bench(tmp_path: Path) -> Iterator[Shadowed]:
    b = Shadowed(tmp_path, SETTINGS)
    yield b
    assert b.deployer.drainer is not None
    b.deployer.drainer.stop()
    b.registry.close()


def shadowed(bench: Shadowed) -> tuple[str, str]:
    first = bench.record(1)
    assert bench.deployer.deploy("m", first, "alice").outcome == Result.OK
    second = bench.record(2)
    outcome = bench.deployer.deploy("m", second, "alice")
    assert outcome.outcome == Result.OK, outcome.message
    return first, second


def test_the_switch_serves_the_previous_digest_and_names_the_new_one_its_shadow(bench: Shadowed) -> None:
    first, second = shadowed(bench)
    route = bench.routes.table["m"]
    routes_from_json(json.loads(json.dumps({"m": route})))  # the gateway takes it as it is
    assert bench.weights() == [(second, 0), (first, 100)]
    assert route["shadow"] == {"name": private_name("m", second), "digest": second, "id": bench.ident(),
                               "fraction": 1.0, "rtol": 1e-5, "atol": 1e-8, "keep_inputs": False}
    bake = bench.baker.of("m")
    canary, shadow = bench.baker.canary_of(bake), bench.baker.shadow_of(bake)
    assert canary is not None and (canary["state"], canary["weight"]) == ("shadow", 0)
    assert shadow is not None and (shadow["state"], shadow["pairs"]) == ("running", 0)
    assert 295 <= shadow["seconds_left"] <= 300 and canary["seconds_left"] == shadow["seconds_left"]
    assert bench.shadow_audit()[0][1].startswith(f"shadow of {second[:12]}: a copy of 1 of the live requests for 300 s")
    assert bench.canary_audit() == []  # no step has begun


def test_a_disagreement_rolls_back_before_any_step(bench: Shadowed) -> None:
    first, second = shadowed(bench)
    loads = len(bench.loads())
    first_disagreement = {"kind": "value", "output": "gen", "index": 0, "serving": 1.0, "shadow": 2.0}
    bench.figures.pairs(bench.ident(), agreed=19, disagreed=1, first=first_disagreement)
    bench.later(2)
    assert bench.weights() == [(first, 100)] and "shadow" not in bench.routes.table["m"]  # copies stop
    assert len(bench.loads()) == loads  # a flip: the previous digest served every request throughout
    rollback = bench.outcomes[-1]
    assert (rollback.action, rollback.outcome, rollback.cause) == ("rollback", Result.ROLLED_BACK, Cause.ANALYSIS)
    assert "shadow agreement 0.95 < 1 over 20 pairs (1 disagreed); first: output 'gen'[0]: 1.0 (serving) vs 2.0" \
        in rollback.message
    bake = bench.baker.of("m")
    assert bake is not None and bake.state == "failed" and bake.canary is not None
    assert bake.canary.state == "rolled_back" and bake.canary.history == []  # it never reached a step
    assert bench.baker.canary_of(bake) == {"step": 0, "steps": [10, 100], "weight": 0, "state": "rolled_back",
                                           "seconds_left": None, "history": []}
    shadow = bench.baker.shadow_of(bake)
    assert shadow is not None and shadow["state"] == "rolled_back" and shadow["disagreements"] == [first_disagreement]
    assert bench.canary_audit() == [] and bench.shadow_audit()[-1][0] == "failed"
    wait_for(lambda: private_name("m", second) not in bench.triton.models)  # its name drained


def test_the_new_versions_errors_roll_back(bench: Shadowed) -> None:
    first, _ = shadowed(bench)
    bench.figures.pairs(bench.ident(), agreed=20, disagreed=5, errors=5,
                        first={"kind": "error", "serving": "OK", "shadow": "INTERNAL: boom"})
    bench.later(1)
    assert bench.weights() == [(first, 100)]
    assert "shadow errors 0.20 > 0.01 over 25 pairs (5 failed where the serving version answered)" in \
        bench.outcomes[-1].message


def test_a_shadow_that_passes_goes_on_to_the_first_step(bench: Shadowed) -> None:
    first, second = shadowed(bench)
    bench.figures.pairs(bench.ident(), agreed=40)
    bench.later(100)
    assert bench.weights() == [(second, 0), (first, 100)]  # judged every round, passed only at its end
    bench.later(201)
    assert bench.weights() == [(second, 10), (first, 90)] and "shadow" not in bench.routes.table["m"]
    bake = bench.baker.of("m")
    assert bake is not None and bake.state == "baking" and bake.canary is not None
    assert (bake.canary.state, bake.canary.weight, bake.canary.step_started) == ("running", 10, bench.clock.now)
    assert bench.shadow_audit()[-1] == ("ok", "passed: agreement 1.00 over 40 pairs (0 disagreed, 0 errors of the "
                                              "new version)")
    assert bench.canary_audit() == [("ok", "step 1/2: 10% of the requests for 60 s")]


def test_promote_moves_on_from_the_shadow_and_abort_ends_it(bench: Shadowed) -> None:
    first, second = shadowed(bench)
    bench.figures.pairs(bench.ident(), agreed=3, disagreed=2)  # under bake_min_requests: not judged yet
    document = bench.baker.promote("m", "alice")
    assert document["shadow"]["state"] == "promoted" and document["canary"]["state"] == "running"
    assert bench.weights() == [(second, 10), (first, 90)]
    assert bench.shadow_audit()[-1][1].startswith("promoted by alice: agreement 0.60 over 5 pairs")
    first_again, third = first, bench.record(3)
    bench.baker.abort("m", "bob")  # the canary now
    assert bench.weights() == [(first_again, 100)]
    outcome = bench.deployer.deploy("m", third, "alice")
    assert outcome.outcome == Result.OK and bench.weights() == [(third, 0), (first, 100)]
    aborted = bench.baker.abort("m", "bob")
    assert aborted["shadow"]["state"] == "aborted" and bench.weights() == [(first, 100)]
    assert bench.shadow_audit()[-1] == ("failed", "aborted by bob")


def test_a_change_set_or_no_shadow_s_goes_to_the_steps_at_once(bench: Shadowed) -> None:
    bench.settings = replace(SETTINGS, shadow_s=0.0)
    first = bench.record(1)
    bench.deployer.deploy("m", first, "alice")
    second = bench.record(2)
    bench.baker.ask("m", None, None, 60.0)  # `load m --shadow 1m`: this deploy only
    bench.deployer.deploy("m", second, "alice")
    assert bench.weights() == [(second, 0), (first, 100)] and bench.routes.table["m"]["shadow"]["digest"] == second
    bench.baker.abort("m", "bob")
    third = bench.record(3)
    bench.deployer.deploy("m", third, "alice")
    assert bench.weights() == [(third, 10), (first, 90)]  # the next deploy: the daemon's shadow_s, 0


def test_a_restarted_daemon_resumes_the_shadow(bench: Shadowed) -> None:
    first, second = shadowed(bench)
    ident = bench.ident()
    bench.restart()
    assert bench.ident() == ident
    bench.figures.pairs(ident, agreed=19, disagreed=1)
    bench.later(1)
    assert bench.weights() == [(first, 100)]


@pytest.mark.parametrize("figures, now, expected", [
    ({"pairs": 10, "agreed": 5, "disagreed": 5}, 10, None),  # under bake_min_requests: on
    ({"pairs": 30, "agreed": 30}, 10, None),  # agrees: on until its end
    ({"pairs": 30, "agreed": 30}, 400, ("passed", False)),
    ({"pairs": 3, "agreed": 3}, 400, ("inconclusive", False)),
    ({"pairs": 30, "agreed": 29, "disagreed": 1}, 10, ("failed", True)),
])
def test_judge(figures: dict[str, Any], now: float, expected: tuple[str, bool] | None) -> None:
    phase = ShadowPhase("0123abcd", 300.0, 0.0, figures=figures)
    limits = Limits(60.0, 0.01, None, 20, "keep")
    found = judge(phase, limits, now)
    assert (found[0], found[2]) == expected if found is not None else expected is None


def test_status_says_the_shadow_runs_in_its_sync_cell() -> None:
    from cli.render import canary_text

    canary = {"state": "shadow", "seconds_left": 42, "weight": 0, "step": 0, "steps": [10, 100], "history": []}
    assert canary_text(canary, {"pairs": 120, "agreement": 1.0}) == "shadow 42s left, 120 pairs, agreement 1.00"
    assert canary_text(canary, {"pairs": 0, "agreement": None}) == "shadow 42s left"
    assert canary_text({**canary, "state": "running", "weight": 10}) == "canary 10% 42s left"
