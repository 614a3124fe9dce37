"""Canary steps (controlplane/bake/rollout.py, canary.py) against a stand-in Triton, a stand-in route table and
stand-in gateway figures: the switch gives the new digest the first weight, each step passed sets the next
weight in one route update, the last one leaves every request on the new digest and the old one drains, a
crossed limit (failures, latency against the previous digest in the same window) flips every request back
at once, a pause waits for `promote`, `abort` ends it by hand, a restarted daemon resumes the step, and a
change set's members move their weights together. The gateway and tritonserver themselves are driven end to
end by tests/test_canary_e2e.py."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from controlplane.bake.baker import Baker
from controlplane.bake.canary import histories, weights_text
from controlplane.bake.traffic import Counts, GatewayFigures
from controlplane.deploy.aliases import PublicNames, Routed, private_name
from controlplane.deploy.engine import Deployer
from controlplane.deploy.plans import Plan, serving_member
from controlplane.errors import ConfigError, NotFoundError
from controlplane.settings.config import Settings, load_settings
from controlplane.store.registry import AuditQuery
from controlplane.vocab import Cause, Result
from tests.unit.test_deploy_routed import Bench, wait_for

pytestmark = pytest.mark.unit

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25)


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


class StandinFigures:
    """The gateway's figures as the bake reads them: per model and digest, cumulative (the test sends)."""

    def __init__(self) -> None:
        self.table: dict[str, dict[str, Counts]] = {}

    def counts(self, model: str) -> Mapping[str, Counts]:
        return dict(self.table.get(model, {}))

    def send(self, model: str, digest: str, requests: int, failures: int = 0, latency_s: float = 0.002) -> None:
        """`requests` more answered by `digest`, `failures` of them the model's errors, each `latency_s`."""
        before = self.table.setdefault(model, {}).get(digest, Counts(buckets=BUCKETS, cumulative=(0,) * len(BUCKETS)))
        cumulative = tuple(c + (requests if latency_s <= bound else 0) for c, bound in zip(before.cumulative, BUCKETS,
                                                                                            strict=True))
        self.table[model][digest] = Counts(before.requests + requests, before.failures + failures,
                                           before.latency_s + requests * latency_s, before.observed + requests,
                                           BUCKETS, cumulative)


class Canaries(Bench):
    """A routed Deployer with a Baker wired as build_parts wires it (weigh, note, note_set, figures)."""

    def __init__(self, tmp: Path, settings: Settings) -> None:
        super().__init__(tmp)
        self.tmp = tmp
        self.settings = settings
        self.clock = Clock()
        self.figures = StandinFigures()
        self.triton.request_counts = lambda model: {}  # type: ignore[attr-defined]  # a first deploy's bake: no figures
        self.baker = self._baker()

    def _baker(self) -> Baker:
        baker = Baker(self.registry, self.deployer, PublicNames(self.triton, self.deployer.aliases),  # type: ignore[arg-type]
                      lambda: self.settings, clock=self.clock, path=self.tmp / "bakes.json")
        self.deployer.on_outcome = lambda o: (self.outcomes.append(o), baker.note(o))  # type: ignore[func-returns-value]
        self.deployer.on_set = baker.note_set
        assert self.deployer.routed is not None
        self.deployer.routed.weigh = baker.weigh
        baker.rollouts.traffic = self.figures
        return baker

    def restart(self) -> None:
        """A new daemon over the same state: the route table adopted from the gateway, bakes.json resumed."""
        assert self.deployer.drainer is not None
        self.deployer.drainer.stop()
        aliases = Routed(self.routes)
        aliases.adopt()
        self.deployer = Deployer(self.registry, self.store, self.serving, self.triton, load_timeout_s=5.0,
                                 on_outcome=self.outcomes.append, aliases=aliases, drain_s=lambda: 0.05,
                                 ensembles=lambda: dict(self.ensembles))
        assert self.deployer.drainer is not None
        self.deployer.drainer.start()
        self.baker = self._baker()
        self.baker.resume()

    def later(self, seconds: float) -> None:
        self.clock.now += seconds
        self.baker.tick()

    def weights(self, model: str = "m") -> list[tuple[str, int]]:
        return [(t["digest"], t["weight"]) for t in self.routes.table[model]["targets"]]

    def canary_audit(self, model: str = "m") -> list[tuple[str, str]]:
        return [(e.outcome, e.message) for e in
                reversed(self.registry.query_audit(AuditQuery(model=model, action="canary", limit=50)))]


SETTINGS = Settings(bake_s=60.0, canary_steps=(10, 100), bake_min_requests=20, bake_max_failure_ratio=0.01)


@pytest.fixture
def bench(tmp_path: Path) -> Iterator[Canaries]:
    b = Canaries(tmp_path, SETTINGS)
    yield b
    assert b.deployer.drainer is not None
    b.deployer.drainer.stop()
    b.registry.close()


def two_versions(bench: Canaries, model: str = "m") -> tuple[str, str]:
    first = bench.record(1, model=model)
    assert bench.deployer.deploy(model, first, "alice").outcome == Result.OK
    bench.baker.tick()
    second = bench.record(2, model=model)
    outcome = bench.deployer.deploy(model, second, "alice")
    assert outcome.outcome == Result.OK, outcome.message
    return first, second


def test_a_first_deploy_switches_at_once_and_the_next_one_takes_the_first_weight(bench: Canaries) -> None:
    first = bench.record(1)
    bench.deployer.deploy("m", first, "alice")
    assert bench.weights() == [(first, 100)]  # nothing to split with
    second = bench.record(2)
    bench.deployer.deploy("m", second, "alice")
    assert bench.weights() == [(second, 10), (first, 90)]
    bake = bench.baker.of("m")
    assert bake is not None and bake.canary is not None
    canary = bench.baker.canary_of(bake)
    assert canary is not None and (canary["step"], canary["steps"], canary["weight"], canary["state"]) == \
        (0, [10, 100], 10, "running")
    assert canary["seconds_left"] == 60
    assert bench.canary_audit() == [("ok", "step 1/2: 10% of the requests for 60 s")]
    # the previous digest is still loaded and held: a failure is a flip, not a load
    assert private_name("m", first) in bench.triton.models


def test_each_step_passed_sets_the_next_weight_and_the_last_one_lets_the_old_digest_drain(bench: Canaries) -> None:
    first, second = two_versions(bench)
    bench.figures.send("m", second, 30)
    bench.figures.send("m", first, 270)
    bench.later(30)
    assert bench.weights() == [(second, 10), (first, 90)]  # the step's window is not over
    updates = len(bench.routes.updates)
    bench.later(31)
    assert bench.weights() == [(second, 100)] and len(bench.routes.updates) == updates + 1
    bake = bench.baker.of("m")
    assert bake is not None and bake.canary is not None and bake.canary.index == 1
    assert bake.state == "baking"
    bench.figures.send("m", second, 300)
    bench.later(61)
    assert bake.state == "passed" and bake.canary.state == "done"
    assert [h["weight"] for h in bake.canary.history] == [10, 100]
    assert [h["outcome"] for h in bake.canary.history] == ["passed", "passed"]
    assert bake.tally.requests == 330  # the new digest's requests over every step
    assert [m for _, m in bench.canary_audit()][1:] == [
        "step 2/2: 100% of the requests for 60 s",
        f"done at 100% (step 2/2): {bake.reason}"]
    wait_for(lambda: private_name("m", first) not in bench.triton.models)  # drained once the rollout is done
    history = histories(bench.registry.query_audit(AuditQuery(model="m", action="canary", limit=50)))
    assert weights_text(history[second]) == "canary 10% → 100% done"


def test_a_failing_step_flips_every_request_back_at_once(bench: Canaries) -> None:
    first, second = two_versions(bench)
    loads = len(bench.loads())
    updates = len(bench.routes.updates)
    bench.figures.send("m", second, 25, failures=5)
    bench.figures.send("m", first, 225)
    bench.later(3)  # within the step's window: judged as soon as bake_min_requests came
    # the first route update after the verdict sends every request to the previous digest
    assert bench.routes.updates[updates][0]["m"]["targets"] == [
        {"name": private_name("m", first), "digest": first, "weight": 100}]
    assert bench.weights() == [(first, 100)]
    assert len(bench.loads()) == loads  # a flip: the previous digest never stopped being loaded
    rollback = bench.outcomes[-1]
    assert (rollback.action, rollback.outcome, rollback.cause) == ("rollback", Result.ROLLED_BACK, Cause.ANALYSIS)
    assert "failure ratio 0.20 > 0.01 over 25 requests (5 failed) at 10% (step 1/2)" in rollback.message
    assert bench.registry.get_model("m").active_digest == first
    assert not bench.registry.get_snapshot("m", second).quarantined  # it failed on this traffic: not bad content
    bake = bench.baker.of("m")
    assert bake is not None and bake.state == "failed" and bake.canary is not None
    assert bake.canary.state == "rolled_back" and bake.canary.weight == 10  # it never reached more than its first step
    assert bench.canary_audit()[-1][0] == "failed"
    wait_for(lambda: private_name("m", second) not in bench.triton.models)
    history = histories(bench.registry.query_audit(AuditQuery(model="m", action="canary", limit=50)))
    assert weights_text(history[second]) == "canary 10% rolled back"


def test_the_latency_limit_compares_with_the_previous_digest_in_the_same_window(bench: Canaries) -> None:
    bench.settings = replace(SETTINGS, bake_max_latency_ratio=2.0)
    first, second = two_versions(bench)
    bench.figures.send("m", first, 300, latency_s=0.002)
    bench.figures.send("m", second, 30, latency_s=0.052)  # 50 ms slower
    bench.later(2)
    assert bench.weights() == [(first, 100)]
    rollback = bench.outcomes[-1]
    assert rollback.cause == Cause.ANALYSIS and "latency ratio" in rollback.message and "p99" in rollback.message


def test_a_pause_waits_for_promote_and_promote_goes_on_to_the_next_step(bench: Canaries) -> None:
    bench.settings = replace(SETTINGS, canary_steps=(10, "pause", 100), bake_s=5.0)
    first, second = two_versions(bench)
    bench.figures.send("m", second, 30)
    bench.later(6)  # step 1 passed: the pause keeps 10 %
    bake = bench.baker.of("m")
    assert bake is not None and bake.canary is not None
    assert (bake.canary.index, bake.canary.state, bake.canary.weight) == (1, "paused", 10)
    assert bench.weights() == [(second, 10), (first, 90)]
    bench.later(3600)  # a pause has no end but `promote`
    assert bake.state == "baking" and bench.baker.canary_of(bake)["seconds_left"] is None  # type: ignore[index]
    document = bench.baker.promote("m", "alice")
    assert document["canary"]["weight"] == 100 and bench.weights() == [(second, 100)]
    assert bench.canary_audit()[-1] == ("ok", "step 3/3: 100% of the requests for 5 s")
    assert bench.registry.query_audit(AuditQuery(model="m", action="canary", limit=1))[0].actor == "alice"
    bench.baker.promote("m", "alice")  # promoting the last step ends the bake passed
    assert bake.state == "passed" and bake.canary.state == "done"


def test_a_pause_first_gives_the_new_digest_no_request_until_promoted(bench: Canaries) -> None:
    bench.settings = replace(SETTINGS, canary_steps=("pause", 100))
    first, second = two_versions(bench)
    assert bench.weights() == [(second, 0), (first, 100)]  # loaded, reachable by pinning only


def test_abort_flips_back_and_ends_the_deploy_rolled_back_by_the_operator(bench: Canaries) -> None:
    first, second = two_versions(bench)
    bench.baker.abort("m", "alice")
    assert bench.weights() == [(first, 100)]
    rollback = bench.outcomes[-1]
    assert (rollback.outcome, rollback.cause) == (Result.ROLLED_BACK, Cause.ANALYSIS)
    entries = bench.registry.query_audit(AuditQuery(model="m", limit=50))
    assert ("alice", "rollback", "rolled_back") in [(e.actor, e.action, e.outcome) for e in entries]
    assert ("alice", "bake", "failed") in [(e.actor, e.action, e.outcome) for e in entries]
    assert bench.canary_audit()[-1][1].startswith("aborted at 10% (step 1/2): aborted by alice")
    with pytest.raises(NotFoundError, match="has no bake in progress"):
        bench.baker.abort("m", "alice")


def test_a_restarted_daemon_resumes_the_step_the_gateway_kept(bench: Canaries) -> None:
    first, second = two_versions(bench)
    bench.figures.send("m", second, 30)
    bench.later(61)  # on to 100 %
    assert bench.weights() == [(second, 100)]
    bench.figures.send("m", second, 10)
    bench.restart()
    bake = bench.baker.of("m")
    assert bake is not None and bake.canary is not None and bake.state == "baking"
    assert (bake.canary.index, bake.canary.weight) == (1, 100)
    # the previous digest stays loaded across the restart (held again): a failure is still a flip
    assert bench.deployer.drainer is not None and private_name("m", first) in bench.deployer.drainer.held()
    bench.figures.send("m", second, 10, failures=10)  # the window holds what came before the restart too
    bench.later(1)
    assert bench.weights() == [(first, 100)]
    assert "over 20 requests (10 failed) at 100% (step 2/2)" in bench.outcomes[-1].message


def test_a_change_sets_members_move_their_weights_together(bench: Canaries) -> None:
    a1, b1 = bench.record(1, model="a"), bench.record(1, model="b")
    bench.deployer.deploy("a", a1, "alice")
    bench.deployer.deploy("b", b1, "alice")
    a2, b2 = bench.record(2, model="a"), bench.record(2, model="b")
    members = [serving_member(bench.registry, m, d, None) for m, d in (("a", a2), ("b", b2))]
    outcome = bench.deployer.run(Plan(tuple(members)), "alice")
    assert outcome.outcome == Result.OK, outcome.message
    assert bench.weights("a") == [(a2, 10), (a1, 90)] and bench.weights("b") == [(b2, 10), (b1, 90)]
    for model, new, old in (("a", a2, a1), ("b", b2, b1)):
        bench.figures.send(model, new, 30)
        bench.figures.send(model, old, 270)
    updates = len(bench.routes.updates)
    bench.later(61)
    assert len(bench.routes.updates) == updates + 1 and bench.routes.updates[-1][0].keys() == {"a", "b"}
    assert bench.weights("a") == [(a2, 100)] and bench.weights("b") == [(b2, 100)]
    bench.figures.send("b", b2, 30, failures=10)  # one member fails: the whole set flips back at once
    updates = len(bench.routes.updates)
    bench.later(1)
    assert bench.routes.updates[updates][0].keys() == {"a", "b"}
    assert bench.weights("a") == [(a1, 100)] and bench.weights("b") == [(b1, 100)]
    wait_for(lambda: bench.registry.get_model("a").active_digest == a1 and
             bench.registry.get_model("b").active_digest == b1)


def test_steps_of_100_or_no_bake_switch_at_once(bench: Canaries) -> None:
    bench.settings = replace(SETTINGS, canary_steps=(100,), bake_s=0.0)
    first, second = two_versions(bench)
    assert bench.weights() == [(second, 100)] and bench.baker.of("m") is None


def test_a_rollback_switches_at_once(bench: Canaries) -> None:
    first, second = two_versions(bench)
    bench.figures.send("m", second, 30)
    bench.later(61)
    bench.later(61)  # done
    outcome = bench.deployer.rollback("m", "alice")
    assert outcome.outcome == Result.OK and bench.weights() == [(first, 100)]


def test_a_step_without_traffic_is_inconclusive_kept_and_goes_on(bench: Canaries) -> None:
    first, second = two_versions(bench)
    bench.later(61)
    assert bench.weights() == [(second, 100)]
    bench.later(61)
    bake = bench.baker.of("m")
    assert bake is not None and bake.state == "inconclusive" and bake.canary is not None
    assert bake.canary.state == "done" and "kept" in bake.reason


def test_load_steps_and_the_models_own_parameter_choose_the_steps(bench: Canaries) -> None:
    first = bench.record(1)
    bench.deployer.deploy("m", first, "alice")
    bench.baker.ask("m", None, (25, 50, 100))
    second = bench.record(2)
    bench.deployer.deploy("m", second, "alice")
    assert bench.weights() == [(second, 25), (first, 75)]


def test_a_route_carries_the_sticky_header_and_the_tags_of_its_digests(tmp_path: Path) -> None:
    from tests.unit.test_deploy_routed import StandinRoutes

    routes = StandinRoutes()
    aliases = Routed(routes, lambda model, digests: {"sticky_header": "x-user-id" if len(digests) > 1 else None,
                                                     "tags": {"stable": digests[-1]}})
    from controlplane.deploy.aliases import Lane, Target
    lane = Lane("m", Target("m__bbbbbbbb", "b" * 64), Target("m__aaaaaaaa", "a" * 64))
    aliases.switch({"m": lane.at(10)})
    route = routes.table["m"]
    assert route["sticky_header"] == "x-user-id" and route["tags"] == {"stable": "a" * 64}
    assert aliases.weights() == {"m": {"b" * 64: 10, "a" * 64: 90}}
    aliases.switch({"m": lane.at(100)})
    assert "sticky_header" not in routes.table["m"] and aliases.weights() == {"m": {"b" * 64: 100}}


def test_the_gateways_figures_are_read_per_digest_and_a_reset_counts_from_zero() -> None:
    fig = {"requests": 12, "failures": {"model": 2, "unavailable": 1, "client": 3},
           "latency": {"buckets": [0.001, 0.01, 0.1], "cumulative": [2, 10, 12], "count": 12, "sum_s": 0.06}}
    document: dict[str, Any] = {"models": {"m": {"digests": {"d2": {"name": "m__d2", "grpc": fig, "http": fig}}}}}
    counts = GatewayFigures(lambda: document).counts("m")["d2"]
    # the client's own errors and an unreachable tritonserver are not the version's
    assert (counts.requests, counts.failures, counts.observed) == (16, 4, 24)
    assert counts.quantile_ms(0.5) == pytest.approx(1 + 9 * (12 - 4) / 16)  # interpolated within its bucket
    assert counts.quantile_ms(0.99) == pytest.approx(10 + 90 * (23.76 - 20) / 4)
    zero = Counts(20, 5, 1.0, 30, (0.001, 0.01, 0.1), (5, 20, 30))
    assert counts.minus(zero) == counts  # the gateway restarted: its counters went down, counted from 0
    assert Counts(requests=30, failures=6).minus(Counts(requests=10, failures=1)).failures == 5


def test_canary_steps_settings_are_checked_and_the_defaults_are_the_modes(tmp_path: Path) -> None:
    assert Settings().canary_steps == (100,) and Settings().bake_s == 0.0  # no gateway: at once, no bake
    gateway = Settings(launch_triton=True)
    assert gateway.canary_steps == (10, 100) and gateway.bake_s == 60.0 and gateway.bake_inconclusive == "keep"
    assert Settings(launch_triton=True, gateway=False).canary_steps == (100,)
    steps = load_settings({}, env={"TRITONCTL_CANARY_STEPS": "[5, pause, 25, 100]"}).canary_steps
    assert steps == (5, "pause", 25, 100)
    assert load_settings({}, env={"TRITONCTL_CANARY_STEPS": "[100]", "TRITONCTL_BAKE_S": "0",
                                  "TRITONCTL_LAUNCH_TRITON": "1"}).canary_steps == (100,)
    path = tmp_path / "t.toml"
    path.write_text('canary_steps = [10, "pause", 100]\ncanary_sticky_header = "X-User-Id"\n')
    settings = load_settings({}, env={}, config_file=path)
    assert settings.canary_steps == (10, "pause", 100) and settings.canary_sticky_header == "x-user-id"
    for bad, says in (("[10, 5, 100]", "5: expected percents rising to 100"), ("[10, 50]", "the last weight is 50"),
                      ("soon", "'soon': expected percents")):
        with pytest.raises(ConfigError) as caught:
            load_settings({}, env={"TRITONCTL_CANARY_STEPS": bad})
        assert str(caught.value).startswith("environment TRITONCTL_CANARY_STEPS: canary_steps: invalid value")
        assert says in str(caught.value) and "\n" not in str(caught.value)
    with pytest.raises(ConfigError, match="canary_sticky_header"):
        load_settings({}, env={"TRITONCTL_CANARY_STICKY_HEADER": "x-tritonctl-route"})


def test_the_bake_state_file_keeps_the_canary(bench: Canaries) -> None:
    two_versions(bench)
    bench.baker.tick()
    records = json.loads((bench.tmp / "bakes.json").read_text())
    canary = next(r["canary"] for r in records if r["model"] == "m" and r["canary"])
    assert canary["steps"] == [10, 100] and canary["index"] == 0 and canary["lanes"][0]["model"] == "m"



def test_status_shows_the_step_and_its_weight_without_wide(bench: Canaries) -> None:
    """`status` (plain, no -o wide): the SYNC cell says `canary 10% 60s left`; `versions` notes each rollout."""
    from cli import render
    from controlplane.documents.results import StatusResult
    from controlplane.views import queries

    first, second = two_versions(bench)
    row = queries.status_row(bench.registry.get_model("m"), "auto", [], None, True)
    row.sync = "synced"
    row.canary = bench.baker.canary_of(bench.baker.of("m"))
    lines = render.status_lines(StatusResult(True, "x", None, {}, [row]).to_json(), wide=False, max_width=100)
    assert "synced canary 10% 60s left" in lines[-1]
    bench.baker.abort("m", "alice")
    versions = queries.versions(bench.registry, "m").to_json()
    rollout = next(v["canary"] for v in versions if v["digest"] == second)
    assert render.rollout_text(rollout) == "canary 10% aborted"


def test_a_split_left_by_a_daemon_killed_mid_switch_is_taken_on_by_the_recovered_deploy(bench: Canaries) -> None:
    """A daemon SIGKILLed after a canary's first switch, before its commit: the gateway kept the split; the
    restarted daemon's recovery rolls the deploy forward, and its bake takes the split on at the step of its
    weight (nothing left at 10 % with nobody judging it)."""
    first = bench.record(1)
    bench.deployer.deploy("m", first, "alice")
    second = bench.record(2)
    bench.registry.ensure_model("m")
    deployment = bench.registry.begin_deployment("m", "deploy", second, first, "alice")
    routed = bench.deployer.routed
    assert routed is not None
    b = routed.bring_up_of("m", second, bench.registry.get_snapshot("m", second), private_name("m", second), None,
                           reload=False)
    bench.deployer.steps.bring_up(b)
    bench.routes.update({"m": {"targets": [{"name": private_name("m", second), "digest": second, "weight": 10},
                                           {"name": private_name("m", first), "digest": first, "weight": 90}]}})
    bench.restart()
    outcome = bench.deployer.recover(deployment)
    assert outcome is not None and "rolled forward" in outcome.message
    bake = bench.baker.of("m")
    assert bake is not None and bake.canary is not None and (bake.canary.index, bake.canary.weight) == (0, 10)
    bench.figures.send("m", second, 25, failures=5)
    bench.later(1)
    assert bench.weights() == [(first, 100)]
