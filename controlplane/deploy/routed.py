"""The deploy engine through the gateway: every digest brought up under its own private name, then one switch.

What a deploy, a rollback, a restore, an unload and a crash recovery do when a gateway carries the
traffic (controlplane/deploy/aliases.py `Routed`; docs/gateway.md):

- **deploy** (a model alone, or a change set, the same path): each member is brought up under its private
  name (checked, published as a fresh tree, loaded, verified, smoke-tested: no client request reaches that
  name, so none shares the smoke test's batch); every serving ensemble over a changed step is brought up
  again bound to the new step names; then ONE route update switches every public name at once; then each
  member's deployment is committed, and the names they left drain (controlplane/deploy/drain.py). A failure
  before the switch takes the new names out and changes nothing a client sees: the outcome is
  `rolled_back` (the last good version never stopped serving), the content quarantined when at fault.
- **rollback after a bake** (`back_to`): the previous digest's name is still loaded (the bake holds it), so
  it is a switch back; otherwise it is brought up afresh first.
- **restore** (reconcile: Triton lost it): the active digest brought up under its name, then routed.
- **unload / evict**: the route goes first (an unload: requests get a clear error from the gateway; an
  eviction, by the memory budget or for idleness: the route becomes `loadable`, so a request waits while
  the model is loaded again, docs/ondemand.md "Requests load models"), then every private name of the
  model is unloaded.
- **recover** a deployment a crash left open: the gateway's route says whether the switch happened — the
  new digest is routed and READY: committed (rolled forward); else rolled back, its name unloaded.

No path loads new content into a name Triton has loaded.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from controlplane.deploy.aliases import LOADABLE, Lane, Routed, Target, Weighted
from controlplane.deploy.causes import classify
from controlplane.deploy.drain import Drainer
from controlplane.deploy.plans import point_steps
from controlplane.deploy.publish import ServingRepository
from controlplane.deploy.steps import (
    BringUp,
    DeployOperation,
    LoadGuard,
    TritonPort,
    TritonSteps,
    VerifyError,
    fault_point,
)
from controlplane.documents.results import Outcome
from controlplane.errors import EnvironmentFault, TritonctlError
from controlplane.names import is_private_name, public_of
from controlplane.snapshot import ContentStore
from controlplane.store.records import DeploymentRecord, ServingRecord, SnapshotRecord
from controlplane.store.registry import Registry
from controlplane.triton.client import DIGEST_PARAMETER
from controlplane.validation.bls import DYNAMIC, bls_callees, declared_callees
from controlplane.validation.ensemblemembers import step_models
from controlplane.validation.modelconfig import stamp_parameter
from controlplane.vocab import SERVING_STATES, Cause, DeployStep, ModelState, Result, StepState

log = logging.getLogger("tritonctl.deploy")

_TOP_NAME = re.compile(r"""^(\s*name\s*:\s*)(["'])((?:\\.|(?!\2).)*)\2""")


def rename_top_level(text: str, name: str) -> str:
    """config.pbtxt text with its top-level `name` set to `name`, without parsing the whole config (pure-
    Python protobuf text parsing was most of a publish's CPU at 2,000 models): the one `name:` field at
    brace depth 0, outside strings and comments, is replaced; none: one is put first."""
    depth = 0
    lines = text.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if depth == 0:
            match = _TOP_NAME.match(line)
            if match:
                lines[i] = f'{match.group(1)}"{name}"{line[match.end():]}'
                return "".join(lines)
        depth += _brace_delta(line)
    return f'name: "{name}"\n' + text


def _brace_delta(line: str) -> int:
    delta, quote, i = 0, "", 0
    while i < len(line):
        ch = line[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch == "#":
            break
        elif ch in "{[<":
            delta += 1
        elif ch in "}]>":
            delta -= 1
        i += 1
    return delta


@dataclass
class Up:
    """One member of a routed plan: the digest it brings up, under which name, and what it leaves."""

    model: str
    digest: str
    snap: SnapshotRecord
    name: str
    op: DeployOperation | None  # None: an ensemble only bound again to new step names (its content unchanged)
    old: Target | None
    ready: list[str] = field(default_factory=list)
    brought_up: bool = False  # published under its name by this plan (taken out again if the plan fails)
    ticket: Any = None


class DeployerParts(Protocol):
    """What the routed path uses of the Deployer (controlplane/deploy/engine.py), which builds it."""

    registry: Registry
    store: ContentStore
    serving: ServingRepository
    steps: TritonSteps
    guard: LoadGuard
    triton: TritonPort

    def lock(self, model: str) -> AbstractContextManager[Any]: ...

    def report(self, outcome: Outcome) -> None: ...

    def busy_models(self) -> list[str]: ...

    def _bring_up(self, op: DeployOperation, b: BringUp, *, record: bool = True, quiet: bool = False,
                  start: str | None = None, stop: str | None = None) -> BringUp: ...

    def _refusal(self, snap: SnapshotRecord, force: bool,
                 overrides: Mapping[str, SnapshotRecord] | None = None) -> tuple[str, Cause] | None: ...


class RoutedDeploys:
    """The Deployer's operations when a gateway routes the traffic (see the module docstring)."""

    def __init__(self, deployer: DeployerParts, aliases: Routed, drainer: Drainer,
                 ensembles: Callable[[], dict[str, list[str]]]) -> None:
        self.d = deployer
        self.aliases = aliases
        self.drainer = drainer
        self.ensembles = ensembles  # each serving ensemble -> its steps (deploy/servingensembles.py)
        # the percent of the requests a switch gives the new digests first: a canary's first step (set by the
        # bake, controlplane/bake/baker.py `weigh`; asked once per switch with every lane it moves)
        self.weigh: Callable[[list[Lane]], int] = lambda lanes: 100
        # a lane's shadow when its first weight is 0 and it is judged on copies first (docs/bake.md "Shadow"):
        # the route's `shadow` fields but its name and digest, else None (set with `weigh`)
        self.shadowing: Callable[[Lane], Mapping[str, Any] | None] = lambda lane: None

    # -- names ----------------------------------------------------------------------------------

    def name_for(self, model: str, digest: str, config: dict[str, Any] | None,
                 planned: dict[str, str] | None = None) -> tuple[str, dict[str, str] | None]:
        """The private name of `digest` and, for an ensemble, the step names it is bound to: the plan's new
        names (`planned`), else what each step is routed to now."""
        steps = step_models(config)
        if not steps:
            return self.aliases.name(model, digest), None
        binding: dict[str, str] = {}
        for step in steps:
            if planned and step in planned:
                binding[step] = planned[step]
                continue
            target = self.aliases.target(step)
            if target is None:
                raise EnvironmentFault(f"'{model}': its step '{step}' is not routed by the gateway yet")
            binding[step] = target.name
        return self.aliases.name(model, digest, binding), binding

    def bring_up_of(self, model: str, digest: str, snap: SnapshotRecord, name: str,
                    binding: dict[str, str] | None, *, reload: bool) -> BringUp:
        """The BringUp of `digest` under its private name `name`: its config renamed to it, an ensemble's
        steps pointed at `binding`, stamped with the digest."""
        def rewrite(text: str) -> str:
            text = point_steps(text, binding) if binding else text
            return stamp_parameter(rename_top_level(text, name), DIGEST_PARAMETER, digest)

        return BringUp(model, digest, snap.config, snap.served_versions, name=name, rewrite=rewrite, reload=reload)

    def bring_up(self, up: Up, binding: dict[str, str] | None, *, reload: bool, record: bool = True) -> None:
        """`up`'s digest brought up under its private name (BRING_UP, the one sequence): skipped from the
        load on when that name is loaded and serves the digest already (a rollback to a held name)."""
        if self.serves(up.name, up.digest, up.snap.served_versions):
            up.ready = self.d.steps.verify(up.name, up.digest, up.snap.served_versions)
            return
        b = self.bring_up_of(up.model, up.digest, up.snap, up.name, binding, reload=reload)
        up.brought_up = True  # from its publish on: a failure takes the name out
        if up.op is not None:
            self.d._bring_up(up.op, b, record=record)
        else:
            self.d.steps.bring_up(b)
        up.ready = b.ready

    def serves(self, name: str, digest: str, versions: Sequence[int] = ()) -> bool:
        """Whether Triton has `name` loaded, READY, stamped `digest`, from the tree published for it."""
        tree = self.d.serving.current(name)
        if tree is None:
            return False
        try:
            ready = self.d.triton.ready_versions(name)
            return bool(ready) and all(str(v) in ready for v in versions) and \
                self.d.triton.served_digest(name) == digest
        except TritonctlError:
            return False

    def routed_serves(self, model: str, digest: str) -> bool:
        target = self.aliases.target(model)
        return target is not None and target.digest == digest and self.serves(target.name, digest)

    # -- deploy (one model, or a change set) -------------------------------------------------------

    def deploy_admitted(self, op: DeployOperation, snap: SnapshotRecord, ticket: Any) -> Outcome:
        """A model's deploy after its admission (the Deployer holds its lock): a plan of one."""
        up = Up(op.model, snap.digest, snap, "", op, self.aliases.target(op.model), ticket=ticket)
        return self.run([up])[op.model]

    def run(self, ups: list[Up]) -> dict[str, Outcome]:
        """Bring every member up, rebind the serving ensembles over changed steps, switch once, commit."""
        planned: dict[str, str] = {}
        rebound: list[Up] = []
        callees: list[Up] = []
        current: Up | None = None
        for up in ups:
            assert up.op is not None
            up.op.begin()
        try:
            callees = self._callees_of(ups)  # what the members call by BLS: under their own names, first
            for up in callees:
                current = up
                self.bring_up(up, None, reload=True)
            for up in ups:
                current = up
                up.name, binding = self.name_for(up.model, up.digest, up.snap.config, planned)
                planned[up.model] = up.name
                if up.ticket is None:  # beside what serves: both are loaded until the old one drains
                    up.ticket = self.d.guard.admit(up.model, up.digest, up.snap.config, None, up.name)
                self.bring_up(up, binding, reload=False)
            current = None
            rebound = self._rebind(planned, {u.model for u in ups})
            for up in rebound:
                current = up
                self.bring_up(up, self.name_for(up.model, up.digest, up.snap.config, planned)[1], reload=True)
            current = None
            for up in ups:
                assert up.op is not None
                up.op.emit(DeployStep.COMMIT, StepState.START, f"switching the gateway to {up.name}")
            lanes = [Lane(u.model, Target(u.name, u.digest), u.old, u.op.kind if u.op is not None else "")
                     for u in [*ups, *rebound]]
            weight = self.weigh(lanes)  # 100: every request at once; less: a canary's first step
            changes: dict[str, Target | Weighted] = {
                lane.model: lane.at(weight, self.shadowing(lane) if weight == 0 else None) for lane in lanes}
            changes.update({u.model: Target(u.name, u.digest) for u in callees})  # the same content: at once
            self.aliases.switch(changes)
            fault_point("before_commit")  # switched, not committed: the recovery rolls forward (tests' kill point)
        except (TritonctlError, OSError) as exc:
            culprit = current.model if current is not None and current.op is not None else None
            if current is not None and current.op is None:  # an ensemble over a changed step refused it
                culprit = next((u.model for u in ups if u.model in set(self.ensembles().get(current.model, []))),
                               ups[-1].model)
            return self._failed_before_switch(ups, [*rebound, *callees], exc, culprit)
        done: dict[str, Outcome] = {}
        for up in ups:
            assert up.op is not None
            message = f"serving {up.digest[:12]} as {up.name} (versions {', '.join(up.ready)})"
            done[up.model] = up.op.commit(up.ready, message)
            if up.snap.quarantined:
                self.d.registry.set_quarantine(up.model, up.digest, None)
            up.op.emit(DeployStep.COMMIT, StepState.OK, message)
            self._settle(up, True)
        for up in [*ups, *rebound, *callees]:
            self.leave(up)
        return done

    def mark_callees(self, members: Sequence[tuple[str, SnapshotRecord]]) -> set[str]:
        """The models these (model, recorded content) call by BLS are served under their own names from now
        on (controlplane/validation/bls.py); returns the ones newly marked."""
        called: set[str] = set()
        for model, snap in members:
            if step_models(snap.config):
                continue
            declared = declared_callees(snap.config)
            calls = declared or bls_callees(self.d.store.tree_path(snap.digest))
            if DYNAMIC in calls:  # a name computed at run time, undeclared: any model may be called, later ones too
                log.warning("%s calls models by BLS with names computed at run time and declares none "
                            "(parameters tritonctl.bls_callees): every model is served under its own name", model)
                calls = {m.name for m in self.d.registry.list_models()} | {DYNAMIC}
            called |= calls - {model}
        return self.aliases.in_place(called)

    def _callees_of(self, ups: list[Up]) -> list[Up]:
        """The models `ups`' python code calls by BLS (controlplane/validation/bls.py) are served under their
        own names from now on; each that serves under a private name now is brought up under its own name in
        the same switch (an in-place name, loaded fresh, its private one drained)."""
        members = {u.model for u in ups}
        out: list[Up] = []
        for model in sorted(self.mark_callees([(u.model, u.snap) for u in ups]) - members):
            target = self.aliases.target(model)
            if target is None or target.name == model:
                continue  # not serving yet: its own deploy uses its own name
            snap = self.d.registry.get_snapshot(model, target.digest)
            log.info("%s: called by BLS from %s: served under its own name from now on", model,
                     ", ".join(sorted(members)))
            out.append(Up(model, target.digest, snap, model, None, target))
        return out

    def _rebind(self, planned: dict[str, str], members: set[str]) -> list[Up]:
        """Every serving ensemble over a planned step (and over those, nested), not in the plan itself:
        its active content bound again to the new names (steps first)."""
        serving = self.ensembles()
        out: list[Up] = []
        changed = set(planned)
        grew = True
        while grew:
            grew = False
            for ensemble, steps in sorted(serving.items()):
                if ensemble in members or ensemble in {u.model for u in out} or not changed & set(steps):
                    continue
                record = self.d.registry.find_model(ensemble)
                if record is None or record.state not in SERVING_STATES or not record.active_digest:
                    continue
                snap = self.d.registry.get_snapshot(ensemble, record.active_digest)
                name, _ = self.name_for(ensemble, snap.digest, snap.config, planned)
                out.append(Up(ensemble, snap.digest, snap, name, None, self.aliases.target(ensemble)))
                planned[ensemble] = name
                changed.add(ensemble)
                grew = True
        return out

    def _failed_before_switch(self, ups: list[Up], rebound: list[Up], exc: BaseException,
                              culprit: str | None) -> dict[str, Outcome]:
        """Nothing switched: every name brought up for the plan is taken out; `culprit`'s content is
        quarantined when at fault; each member ends `rolled_back` (what served still serves) or `failed` (an
        environment fault, or nothing served before: retried, or shown failed)."""
        fault = classify(exc)
        error = str(exc)
        for up in [*rebound, *ups]:
            if up.brought_up and up.name and (up.old is None or up.name != up.old.name):
                self.d.steps.take_out(up.name)
        outcomes: dict[str, Outcome] = {}
        for up in ups:
            op = up.op
            assert op is not None
            own = up.model == culprit
            if own and fault.cause.quarantines:
                self.d.registry.set_quarantine(up.model, up.digest, error)
                log.warning("%s %s quarantined: %s", up.model, up.digest[:12], error)
            message = error if own or culprit is None else f"{culprit} failed in the same change set: {error}"
            if not fault.cause.quarantines:
                message = f"{fault.reason}: {message}"
            op.emit(DeployStep.DEPLOY, StepState.FAILED, message)
            cause = fault.cause if own or not fault.cause.quarantines else Cause.NONE
            if op.previous:
                result = Result.ROLLED_BACK if fault.cause.quarantines else Result.FAILED
                text = f"rolled back to {op.previous[:12]}: {message}" if result is Result.ROLLED_BACK else message
                outcomes[up.model] = op.end(result, text, error=message, state=ModelState.SERVING,
                                            active=op.previous, cause=cause)
            else:
                outcomes[up.model] = op.end(Result.FAILED, f"failed, nothing to roll back to: {message}",
                                            error=message, state=ModelState.FAILED, active=None,
                                            serving=ServingRecord(up.model, None, []), cause=cause)
            self._settle(up, False)
        return outcomes

    def failed(self, op: DeployOperation, exc: BaseException, name: str) -> Outcome:
        """A staged deploy (a first start's) that failed before its switch: as a plan of one that did."""
        snap = self.d.registry.get_snapshot(op.model, op.require_digest())
        up = Up(op.model, snap.digest, snap, name, op, self.aliases.target(op.model), brought_up=True)
        return self._failed_before_switch([up], [], exc, op.model)[op.model]

    def _settle(self, up: Up, loaded: bool) -> None:
        if up.ticket is not None:
            ticket, up.ticket = up.ticket, None
            self.d.guard.settle(ticket, loaded)

    def leave(self, up: Up) -> None:
        """The name `up` switched away from drains; the published trees of its new name are pruned."""
        if up.old is not None and up.old.name != up.name:
            self.drainer.retire(up.model, up.old.name)
        self.d.serving.prune(up.name)

    # -- back to an earlier digest, restore, take out ---------------------------------------------

    def back_to(self, op: DeployOperation, previous: str, error: str, cause: Cause, *, result: Result,
                committed: bool) -> Outcome:
        """`previous` serves again: a switch back to its name (brought up first unless still loaded)."""
        model = op.model
        op.emit(DeployStep.ROLLBACK, StepState.START, f"switching back to {previous[:12]}", previous)
        snap = self.d.registry.get_snapshot(model, previous)
        up = Up(model, previous, snap, "", None, self.aliases.target(model))
        try:
            up.name, binding = self.name_for(model, previous, snap.config)
            self.bring_up(up, binding, reload=True)
            self.aliases.switch({model: Target(up.name, previous)})
        except (TritonctlError, OSError) as exc:
            if up.brought_up and (up.old is None or up.old.name != up.name):
                self.d.steps.take_out(up.name)
            message = f"{error}; rollback to {previous[:12]} failed: {exc}"
            op.emit(DeployStep.ROLLBACK, StepState.FAILED, str(exc), previous)
            return op.end(Result.FAILED, message, error=message, state=ModelState.DEGRADED,
                          active=op.digest if committed else previous, cause=cause)
        message = f"rolled back to {previous[:12]}: {error}"
        self.leave(up)
        op.emit(DeployStep.ROLLBACK, StepState.OK, message, previous)
        serving = ServingRecord(model, previous, [int(v) for v in up.ready if v.isdigit()]) if committed else None
        return op.end(result, message, error=error, state=ModelState.SERVING, active=previous, serving=serving,
                      cause=cause)

    def restore(self, op: DeployOperation, model: str, digest: str) -> None:
        """Triton does not serve the active digest as routed: bring it up under its name, route it."""
        snap = self.d.registry.get_snapshot(model, digest)
        up = Up(model, digest, snap, "", None, self.aliases.target(model))
        up.name, binding = self.name_for(model, digest, snap.config)
        ticket = self.d.guard.admit(model, digest, snap.config, None, up.name)
        loaded = False
        try:
            self.bring_up(up, binding, reload=True)
            loaded = True
        finally:
            self.d.guard.settle(ticket, loaded)
        if up.old != Target(up.name, digest):
            self.aliases.switch({model: Target(up.name, digest)})
        self.leave(up)

    def take_out_model(self, model: str, *, switch: bool = True, loadable: bool = False) -> None:
        """The public name gets no route (the gateway answers its requests with a clear error), or with
        `loadable` (an eviction) a LOADABLE one (its requests wait while a load brings it back: docs/ondemand.md
        "Requests load models"); then every private name of `model` Triton or the serving root has goes."""
        if loadable:
            self.aliases.switch({model: LOADABLE})
        elif switch and (self.aliases.target(model) is not None or model in self.aliases.loadable()):
            self.aliases.switch({model: None})
        for name in self.names_of(model):
            self.d.steps.take_out(name)

    def hold(self, model: str, digest: str) -> str | None:
        """Keep `digest`'s private name loaded while no route uses it (a bake's previous digest: its rollback
        is then a switch), until `release`; the name held, or None when none of `model` serves `digest`."""
        name = self.loaded_name(model, digest)
        if name is not None:
            self.drainer.hold(name)
        return name

    def release(self, model: str, name: str) -> None:
        self.drainer.release(model, name)

    def loaded_name(self, model: str, digest: str) -> str | None:
        """The private name of `model` whose published tree carries `digest` (its routed name first)."""
        target = self.aliases.target(model)
        if target is not None and target.digest == digest:
            return target.name
        for name in self.names_of(model):
            tree = self.d.serving.current(name)
            try:
                if tree is not None and digest in (tree / "config.pbtxt").read_text(errors="replace"):
                    return name
            except OSError:
                continue
        return None

    def names_of(self, model: str) -> list[str]:
        """The names of `model` published in the serving root: its private ones, and its own when it is
        served under it (a model another calls by BLS)."""
        return [n for n in self.d.serving.models() if n == model or (is_private_name(n) and public_of(n) == model)]

    def retire_now(self, model: str, name: str) -> bool:
        """The drainer's unload: `name` out of Triton and the serving root unless routed again (under the
        model's lock, so no deploy of it is switching meanwhile)."""
        with self.d.lock(model):
            if name in self.aliases.in_use():
                return False
            self.d.steps.take_out(name)
            return True

    def sweep(self) -> list[str]:
        """Private names in the serving root that nothing routes, drains or holds (a stopped daemon left
        them): handed to the drainer with no wait. The ones handed."""
        keep = self.aliases.in_use() | set(self.drainer.pending()) | self.drainer.held()
        busy = set(self.d.busy_models())
        left = [n for n in self.d.serving.models() if is_private_name(n) and n not in keep
                and public_of(n) not in busy]
        for name in left:
            self.drainer.retire(public_of(name), name, after_s=0.0)
        return left

    def misnamed(self) -> list[tuple[str, str]]:
        """(model, digest) of the routed models not served under the name they take now: one another model
        came to call by BLS while it switched (a caller and its callee deployed at once), to restore."""
        busy = set(self.d.busy_models())
        return [(model, target.digest) for model, target in self.aliases.targets().items()
                if model not in busy and target.name != model and self.aliases.name(model, target.digest) == model]

    # -- after a crash --------------------------------------------------------------------------

    def recover(self, op: DeployOperation, deployment: DeploymentRecord) -> Outcome:
        """A deployment a crash left open (the Deployer holds the model's lock): the route decides."""
        model, digest, previous = deployment.model, deployment.digest, deployment.previous_digest
        reason = f"interrupted at step '{deployment.step}' by a daemon stop"
        target = self.aliases.target(model)
        if deployment.kind in ("unload", "evict"):
            self.take_out_model(model, loadable=deployment.kind == "evict")
            return op.end(Result.OK, f"finished after restart; {reason}", state=ModelState.UNLOADED, active=None,
                          serving=ServingRecord(model, None, []))
        if digest and target is not None and target.digest == digest:
            snap = self.d.registry.get_snapshot(model, digest)
            try:
                ready = self.d.steps.verify(target.name, digest, snap.served_versions)
            except (TritonctlError, VerifyError):
                ready = []
            if ready:
                message = f"rolled forward: serving {digest[:12]} as {target.name}; {reason}"
                return op.commit(ready, message)
        if previous:
            if target is None or target.digest != previous:
                try:
                    self.restore(op, model, previous)
                except (TritonctlError, OSError) as exc:
                    message = f"{reason}; restoring {previous[:12]} failed: {exc}"
                    return op.end(Result.FAILED, message, error=message, state=ModelState.DEGRADED, active=previous)
            return op.end(Result.ROLLED_BACK, f"rolled back to {previous[:12]}: {reason}", error=reason,
                          state=ModelState.SERVING, active=previous)
        self.take_out_model(model)
        return op.end(Result.FAILED, f"failed: {reason} (no previous version)", error=reason,
                      state=ModelState.FAILED, active=None, serving=ServingRecord(model, None, []))
