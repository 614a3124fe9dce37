"""A change set through the gateway: its members brought up under their own names and switched in one update
(`run_set`), and a bake's set rollback, every member back on the digest it left in one update
(`roll_back_set`). Apart from controlplane/deploy/routed.py, whose steps they use (one plan's bring-up and
switch, the drain of what was left), to keep each module to its size.
"""

from __future__ import annotations

import secrets
import time
from contextlib import ExitStack

from controlplane.deploy.aliases import Target
from controlplane.deploy.plans import ACTION, Plan, audit_set
from controlplane.deploy.routed import RoutedDeploys, Up
from controlplane.deploy.steps import DeployOperation, ProgressFn, ms_since
from controlplane.documents.results import Outcome, Progress
from controlplane.errors import TritonctlError
from controlplane.store.records import ServingRecord
from controlplane.vocab import Cause, ModelState, Result


def run_set(routed: RoutedDeploys, plan: Plan, actor: str, progress: ProgressFn | None) -> Outcome:
    """A change set (steps before ensembles): each changed member brought up under its name, with its own
    deployment, and every public name switched in one update. (A bake's set rollback goes member by
    member through the Deployer's SetRunner: each a switch back to a name the bake kept loaded.)"""
    started = time.monotonic()
    set_id = secrets.token_hex(4)
    steps: list[Progress] = []

    def emit(p: Progress) -> None:
        steps.append(p)
        if progress:
            progress(p)

    members = list(plan.members)
    changed = [m for m in members if m.changed or plan.force]
    if not changed:
        return Outcome(plan.label, ACTION, "noop", None, None, "every member already serves its source content")
    with ExitStack() as stack:
        for member in sorted(changed, key=lambda m: m.model):
            stack.enter_context(routed.d.lock(member.model))
        ups: list[Up] = []
        for m in changed:
            snap = routed.d.registry.get_snapshot(m.model, m.digest)
            op = DeployOperation(routed.d.registry, routed.d.report, m.model, snap.digest, m.previous, actor,
                                 "deploy", progress=emit)
            refusal = routed.d._refusal(snap, plan.force, {u.model: u.snap for u in ups})
            if refusal is not None:
                message = f"{m.model}: {refusal[0]}"
                op.refuse(*refusal)
                audit_set(routed.d.registry, actor, set_id, members, "failed", message, started)
                return Outcome(plan.label, ACTION, Result.FAILED, None, None, message, ms_since(started), steps,
                               refusal[1])
            ups.append(Up(m.model, snap.digest, snap, "", op, routed.aliases.target(m.model)))
        outcomes = routed.run(ups)
    failed = next((o for o in outcomes.values() if not o.succeeded), None)
    if failed is None:
        outcome, result = "deployed", Result.OK
        message = f"deployed {', '.join(u.model for u in ups)} in one switch of the gateway"
    else:
        result = Result(failed.outcome)
        outcome, message = failed.outcome, f"{failed.model}: {failed.message}"
    audit_set(routed.d.registry, actor, set_id, members, outcome, message, started)
    return Outcome(plan.label, ACTION, result, None, None, f"change set {set_id}: {message}", ms_since(started),
                   steps, Cause.NONE if failed is None else failed.cause)


def roll_back_set(routed: RoutedDeploys, plan: Plan, actor: str, progress: ProgressFn | None) -> Outcome:
    """A bake's set rollback (`plan.analysis`): every member back on the digest it left (`member.digest`;
    its bake kept that name loaded), steps before ensembles, in ONE switch; each member's deployment
    ends `rolled_back`, cause `analysis`. Members that no longer serve what was baked are left alone."""
    started = time.monotonic()
    set_id = secrets.token_hex(4)
    ups: list[Up] = []
    planned: dict[str, str] = {}
    with ExitStack() as stack:
        for member in sorted(plan.members, key=lambda m: m.model):
            stack.enter_context(routed.d.lock(member.model))
        try:
            for member in plan.members:  # steps first (Plan.of orders them)
                record = routed.d.registry.find_model(member.model)
                if record is None or record.active_digest != member.previous or member.previous is None:
                    continue  # another operation came first
                snap = routed.d.registry.get_snapshot(member.model, member.digest)
                op = DeployOperation(routed.d.registry, routed.d.report, member.model, snap.digest, member.previous,
                                     actor, "rollback", progress=progress)
                op.begin()
                up = Up(member.model, snap.digest, snap, "", op, routed.aliases.target(member.model))
                up.name, binding = routed.name_for(member.model, snap.digest, snap.config, planned)
                planned[member.model] = up.name
                ups.append(up)
                routed.bring_up(up, binding, reload=True, record=False)
            routed.aliases.switch({u.model: Target(u.name, u.digest) for u in ups})
        except (TritonctlError, OSError) as exc:
            message = f"{plan.analysis}; the set's rollback failed: {exc}"
            for up in ups:
                assert up.op is not None
                up.op.end(Result.FAILED, message, error=message, state=ModelState.DEGRADED,
                          active=up.op.previous, cause=Cause.ANALYSIS)
            audit_set(routed.d.registry, actor, set_id, list(plan.members), Result.FAILED.value, message, started)
            return Outcome(plan.label, ACTION, Result.FAILED, None, None, message, ms_since(started), [],
                           Cause.ANALYSIS)
        for up in ups:
            assert up.op is not None
            text = f"rolled back to {up.digest[:12]} with its change set: {plan.analysis}"
            up.op.end(Result.ROLLED_BACK, text, error=plan.analysis, state=ModelState.SERVING, active=up.digest,
                      serving=ServingRecord(up.model, up.digest, [int(v) for v in up.ready if v.isdigit()]),
                      cause=Cause.ANALYSIS)
    for up in ups:
        routed.leave(up)
    message = f"rolled back as a set in one switch of the gateway: {plan.analysis}"
    audit_set(routed.d.registry, actor, set_id, list(plan.members), Result.ROLLED_BACK.value, message, started)
    return Outcome(plan.label, ACTION, Result.ROLLED_BACK, None, None, f"change set {set_id}: {message}",
                   ms_since(started), [], Cause.ANALYSIS)
