"""Whether a content deploys now: the one rule book every path asks.

Why: the same question (the source holds content X of model M; does M deploy it now?) is asked by the
single host's watcher path (controlplane.control_plane), a change set (controlplane.intake.changeset), the fleet's
leader before it starts a rollout (controlplane.fleet.leader), a fleet host converging to the fleet's
target (controlplane.fleet.agent), a retry after an environment fault and a model that tracks a tag
(controlplane.intake.tags). When each path kept its own copy of the rules they drifted apart; here they are
once, pure functions of what the registry and the source say, unit-tested in
tests/unit/test_decision.py.

`decide` answers deploy, or skip with the reason (policy, pinned, unloaded, invalid, quarantined,
serving already, held by a rollback, tracks a tag). `decide_capture` answers for a capture that did
not produce content: wait (the reason and after how long to look again: still changing, on hold,
awaiting the commit marker, the registry or object storage unreachable) or skip (a failure to report).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import Enum

from controlplane.errors import ObjectStoreError, SnapshotEnvironmentError, SnapshotError, StoreError
from controlplane.store.records import DeploymentRecord, ModelRecord, SnapshotRecord
from controlplane.vocab import BAKE_ACTOR, SERVING_STATES, ModelState, Policy, Result

TRACK_POLICY = "track"  # models.policy of a model that serves what a tag names (controlplane.intake.tags)


class Verdict(str, Enum):
    DEPLOY = "deploy"
    WAIT = "wait"
    SKIP = "skip"

    def __str__(self) -> str:
        return self.value


class Rule(str, Enum):
    """The rule that decided (what callers branch on; `Decision.reason` is the operator's line)."""

    NONE = ""  # deploy
    TRACKS_TAG = "tracks a tag"
    POLICY = "policy"
    PINNED = "pinned"
    UNLOADED = "unloaded"
    INVALID = "invalid"
    QUARANTINED = "quarantined"
    SERVING = "serving already"
    ROLLBACK_HOLDS = "held by a rollback"
    CAPTURE = "capture"  # the source's content could not be captured

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Decision:
    """deploy; wait `delay_s` seconds and look again; or skip. `rule`: which rule decided; `reason`:
    one line for the log, the audit or `status`."""

    verdict: Verdict
    rule: Rule = Rule.NONE
    reason: str = ""
    delay_s: float = 0.0

    @property
    def deploys(self) -> bool:
        return self.verdict is Verdict.DEPLOY


DEPLOY = Decision(Verdict.DEPLOY)


def wait(rule: Rule, reason: str, delay_s: float) -> Decision:
    return Decision(Verdict.WAIT, rule, reason, delay_s)


def skip(rule: Rule, reason: str = "") -> Decision:
    return Decision(Verdict.SKIP, rule, reason or rule.value)


def held(current: ModelRecord | None) -> Decision | None:
    """The pin: an operator's `pin` (on a fleet host, `--host`: the host is held) holds the model
    against every change but the operator's own `--force`. None: nothing holds it."""
    if current is not None and current.pinned:
        return skip(Rule.PINNED)
    return None


def refuse_pinned(current: ModelRecord | None, digest: str | None, *, force: bool, where: str = "") -> str | None:
    """An operator's load or rollback of a pinned model is refused (this line, exit 2) unless `force` or
    it asks for what serves already (`digest`; None: a rollback, always a change). `where`: " on the fleet"."""
    if force or held(current) is None or current is None or (digest is not None and digest == current.active_digest):
        return None
    return (f"model '{current.name}' is pinned{where} to {str(current.active_digest)[:12]}; "
            "unpin it or use --force")


def rollback_holds(last: DeploymentRecord | None, first_seen: datetime | None) -> bool:
    """An operator's rollback holds the model until content first seen after it (or an operator's load);
    so does a bake's rollback (controlplane/bake/baker.py), which ends `rolled_back`."""
    return (
        last is not None
        and last.kind == "rollback"
        and (last.outcome == Result.OK or (last.outcome == Result.ROLLED_BACK and last.actor == BAKE_ACTOR))
        and last.finished_at is not None
        and first_seen is not None
        and first_seen <= last.finished_at
    )


def serves(current: ModelRecord | None, digest: str) -> bool:
    """The registry says `current` serves `digest`."""
    return current is not None and current.active_digest == digest and current.state in SERVING_STATES


def decide(current: ModelRecord, snap: SnapshotRecord, *, policy: str,
           last: DeploymentRecord | None = None, chosen: bool = False) -> Decision:
    """Does `snap` (content of `current`'s model) deploy now?

    `policy`: the model's effective policy; `last`: its newest deployment (an operator's rollback holds
    the model until content first seen after it). `chosen`: the content is a target an operator, the
    fleet or a tag already chose (a host converging to the fleet's target, a retry of a deploy, a
    tracked tag): the policy, an unload and a rollback's hold are not asked again; a pin still holds
    and invalid or quarantined content still does not go."""
    if not chosen:
        if current.policy == TRACK_POLICY:
            return skip(Rule.TRACKS_TAG)
        if policy != Policy.AUTO:
            return skip(Rule.POLICY, f"policy {policy}")
    pinned = held(current)
    if pinned is not None:
        return pinned
    if not chosen and current.state == ModelState.UNLOADED:
        return skip(Rule.UNLOADED)
    if not snap.valid:
        return skip(Rule.INVALID, f"invalid: {snap.first_error}")
    if snap.quarantined:
        return skip(Rule.QUARANTINED, f"quarantined: {snap.quarantine_reason}")
    # the watcher's content: what the registry says serves, whatever its state (a degraded model is
    # reconcile's to restore); a chosen target: only a healthy serving is left alone
    if snap.digest == current.active_digest and (not chosen or current.state == ModelState.SERVING):
        return skip(Rule.SERVING)
    if not chosen and rollback_holds(last, snap.first_seen):
        return skip(Rule.ROLLBACK_HOLDS)
    return DEPLOY


def capture_passes(exc: Exception) -> bool:
    """A refused capture to try again after the settle window (still changing, on hold, awaiting the
    commit marker, object storage unreachable), rather than report as failed."""
    return isinstance(exc, ObjectStoreError) or (isinstance(exc, SnapshotError) and exc.retryable)


def decide_capture(exc: Exception, model: str, settle_s: float) -> Decision:
    """The source's content of `model` could not be captured (`exc`): wait and look again, or skip
    (a failure the caller reports once, in the audit)."""
    reason = str(exc).removeprefix(f"{model}: ")
    # busy or unreachable, or the host out of descriptors, space or memory: nothing was recorded or judged
    if isinstance(exc, (StoreError, ObjectStoreError, SnapshotEnvironmentError)):
        return wait(Rule.CAPTURE, reason, max(settle_s, 1.0))
    if capture_passes(exc):
        return wait(Rule.CAPTURE, reason, settle_s)
    return skip(Rule.CAPTURE, reason)
