"""controlplane.intake.decision: the one rule book every path asks (the watcher, a change set, the fleet's
leader and agents, retries, tracked tags). Pure functions of records: no server needed."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from controlplane.errors import ObjectStoreError, SnapshotChangingError, SnapshotError, StoreError
from controlplane.intake.decision import (
    DEPLOY,
    Rule,
    Verdict,
    decide,
    decide_capture,
    held,
    refuse_pinned,
    rollback_holds,
)
from controlplane.store.records import DeploymentRecord, ModelRecord, SnapshotRecord

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
OLD, NEW = "a" * 64, "b" * 64


def model(**kw: object) -> ModelRecord:
    base = ModelRecord("m", None, False, OLD, "serving", None, T0, T0, None)
    return replace(base, **kw)  # type: ignore[arg-type]


def snap(digest: str = NEW, first_seen: datetime = T0 + timedelta(hours=1), **kw: object) -> SnapshotRecord:
    base = SnapshotRecord(manifest="", config=None, versions=[1], served_versions=[1], valid=True, problems=[],
                          total_bytes=10, model="m", digest=digest, first_seen=first_seen, last_seen=first_seen,
                          quarantined=False, quarantine_reason=None, collected=False)
    return replace(base, **kw)  # type: ignore[arg-type]


def rollback(finished: datetime, outcome: str = "ok", kind: str = "rollback") -> DeploymentRecord:
    return DeploymentRecord(1, "m", kind, OLD, NEW, "done", "op", finished, finished, outcome, None)


def test_new_valid_content_under_auto_policy_deploys() -> None:
    assert decide(model(), snap(), policy="auto") == DEPLOY


@pytest.mark.parametrize(("record", "content", "policy", "rule"), [
    (model(policy="track"), snap(), "auto", Rule.TRACKS_TAG),
    (model(), snap(), "manual", Rule.POLICY),
    (model(pinned=True), snap(), "auto", Rule.PINNED),
    (model(state="unloaded", active_digest=None), snap(), "auto", Rule.UNLOADED),
    (model(), snap(valid=False, problems=[{"file": "m/config.pbtxt", "field": "x", "message": "bad",
                                           "severity": "error"}]), "auto", Rule.INVALID),
    (model(), snap(quarantined=True, quarantine_reason="init raised"), "auto", Rule.QUARANTINED),
    (model(), snap(OLD), "auto", Rule.SERVING),
    (model(state="degraded"), snap(OLD), "auto", Rule.SERVING),
])
def test_each_rule_skips_with_its_reason(record: ModelRecord, content: SnapshotRecord, policy: str, rule: Rule) -> None:
    decision = decide(record, content, policy=policy)
    assert (decision.verdict, decision.rule) == (Verdict.SKIP, rule)
    assert decision.reason


def test_the_pin_comes_before_validity_and_the_policy_before_the_pin() -> None:
    bad = snap(valid=False)
    assert decide(model(pinned=True), bad, policy="auto").rule is Rule.PINNED
    assert decide(model(pinned=True), bad, policy="manual").rule is Rule.POLICY
    assert "init raised" in decide(model(), snap(quarantined=True, quarantine_reason="init raised"),
                                   policy="auto").reason


def test_a_rollback_holds_until_content_first_seen_after_it() -> None:
    done = T0 + timedelta(hours=2)
    before, after = snap(first_seen=T0 + timedelta(hours=1)), snap(first_seen=T0 + timedelta(hours=3))
    assert decide(model(), before, policy="auto", last=rollback(done)).rule is Rule.ROLLBACK_HOLDS
    assert decide(model(), after, policy="auto", last=rollback(done)) == DEPLOY
    assert decide(model(), before, policy="auto", last=rollback(done, outcome="failed")) == DEPLOY
    assert decide(model(), before, policy="auto", last=rollback(done, kind="deploy")) == DEPLOY
    assert rollback_holds(rollback(done), before.first_seen) and not rollback_holds(None, before.first_seen)


def test_a_bakes_rollback_holds_like_an_operators_but_a_failed_deploys_does_not() -> None:
    """A bake's rollback (controlplane/bake/baker.py) ends `rolled_back` by `tritonctl:bake`: the digest that failed
    on live traffic is not quarantined, so only the hold keeps the watcher from deploying it again."""
    done = T0 + timedelta(hours=2)
    before = snap(first_seen=T0 + timedelta(hours=1))
    baked = replace(rollback(done, outcome="rolled_back"), actor="tritonctl:bake")
    assert decide(model(), before, policy="auto", last=baked).rule is Rule.ROLLBACK_HOLDS
    assert decide(model(), before, policy="auto", last=rollback(done, outcome="rolled_back")) == DEPLOY


def test_a_chosen_target_skips_only_for_a_pin_bad_content_or_a_healthy_serving() -> None:
    """A fleet host converging, a retry, a tracked tag: policy, unload and a rollback's hold were the
    operator's or the fleet's to weigh already."""
    held_back = rollback(T0 + timedelta(hours=2))
    assert decide(model(state="unloaded"), snap(), policy="manual", last=held_back, chosen=True) == DEPLOY
    assert decide(model(policy="track"), snap(), policy="auto", chosen=True) == DEPLOY
    assert decide(model(pinned=True), snap(), policy="auto", chosen=True).rule is Rule.PINNED
    assert decide(model(), snap(quarantined=True), policy="auto", chosen=True).rule is Rule.QUARANTINED
    assert decide(model(), snap(OLD), policy="auto", chosen=True).rule is Rule.SERVING
    assert decide(model(state="degraded"), snap(OLD), policy="auto", chosen=True) == DEPLOY  # not healthy


def test_the_pin_refuses_an_operators_change_unless_forced_or_a_noop() -> None:
    pinned = model(pinned=True)
    assert held(pinned) is not None and held(model()) is None and held(None) is None
    refused = refuse_pinned(pinned, NEW, force=False)
    assert refused == f"model 'm' is pinned to {OLD[:12]}; unpin it or use --force"
    assert "pinned on the fleet" in str(refuse_pinned(pinned, NEW, force=False, where=" on the fleet"))
    assert refuse_pinned(pinned, NEW, force=True) is None
    assert refuse_pinned(pinned, OLD, force=False) is None  # what serves already
    assert refuse_pinned(pinned, None, force=False) is not None  # a rollback always changes it
    assert refuse_pinned(model(), NEW, force=False) is None


def test_a_capture_that_failed_waits_or_is_reported() -> None:
    changing = SnapshotChangingError("m: still changing (modified 0.1 s ago)")
    decision = decide_capture(changing, "m", 2.0)
    assert (decision.verdict, decision.delay_s, decision.reason) == (Verdict.WAIT, 2.0,
                                                                    "still changing (modified 0.1 s ago)")
    assert decide_capture(StoreError("database is locked"), "m", 0.2).delay_s == 1.0  # at least a second
    assert decide_capture(ObjectStoreError("m: bucket unreachable"), "m", 3.0).verdict is Verdict.WAIT
    broken = decide_capture(SnapshotError("m: a fifo in the model"), "m", 2.0)
    assert (broken.verdict, broken.rule, broken.reason) == (Verdict.SKIP, Rule.CAPTURE, "a fifo in the model")
