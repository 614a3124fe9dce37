"""Change sets: an ensemble and the steps that change with it deploy as one unit, with the old
pipeline answering until the new one answers.

Why: Triton swaps one model at a time. When a step's outputs are renamed together with the
ensemble's mapping, there is no order of per-model reloads in which every moment serves a consistent
pipeline: the new ensemble does not load over the old step, and the old ensemble does not load over
the new step (shared/TRITON_NOTES.md, "Ensembles whose steps change together"). A step's
config.pbtxt is shared by all its versions, so version numbers cannot stage it either. tritonctl
owns the serving tree, so a change set is staged under private names instead:

1. each changed step is published and loaded under a private name `<step>__<8 hex of its digest>`
   (config `name` rewritten; names.py reserves the pattern), verified READY with its digest and its
   own smoke requests;
2. each serving ensemble over those steps is reloaded with its steps pointed at the private names
   (stamped with an interim digest); Triton keeps the old ensemble answering until the new one is
   READY; then it is verified and its smoke requests run: the new pipeline answers now;
3. the public steps are deployed with the new content (`Deployer.deploy`, as any model; clients that
   call a step directly see it change like any other deploy);
4. each ensemble is reloaded again, pointed back at the public names, verified and smoke-tested;
5. the private names are unloaded and unpublished.

Any failure before step 3 puts every ensemble back on its previous content and unloads the private
names: the old pipeline never stopped answering. Only content that failed by its own fault is
quarantined: a private step that fails to load, or a changed ensemble that fails over verified
steps; an unchanged ensemble that does not fit its new steps is nobody's single fault and is never
quarantined. A failure from step 3 on is undone in reverse (public steps back, ensembles back), the
interim pipeline answering meanwhile.

Grouping (`ChangeSets.settled`): a model the watcher hands on is taken with every model connected
to it through ensembles (the source's configs and the serving ones, transitively); while one of them
still settles, the last one to settle deploys them all. Everything that settles while the repository
holds `.tritonctl-hold` at its root waits and is released as one set when the file goes. With
`--commit-marker M` and a file `M` at the repository root, that file commits the whole repository: a
model whose content is newer than it waits the same way (its own `<model>/M` is not looked at), and
when the root marker is touched again everything that waited, and everything settling then, deploys
as one set.
`tritonctl load a b pipe` makes one set of the named models. A set is recorded as one audit event
(action `changeset`, message: JSON with its id, members and their digests) beside each member's own
deployment.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from google.protobuf import text_format

from controlplane.decision import Verdict, decide, decide_capture, refuse_pinned, serves
from controlplane.deploy import SMOKE_FILE, Outcome, Progress, ProgressFn, VerifyError
from controlplane.ensemblemembers import SERVING_STATES, require_members, step_models
from controlplane.errors import SnapshotError, StoreError, TritonctlError, UsageError
from controlplane.faults import environment_cause
from controlplane.modelconfig import is_ensemble_text, parse_config_text, stamp_parameter
from controlplane.names import is_private_name, validate_model_name
from controlplane.smoke import SmokeInput, load_smoke_file, run_smoke
from controlplane.snapshot import CONFIG_FILE, HOLD_FILE, MAX_CONFIG_BYTES
from controlplane.snapshot.fsutil import read_small_text
from controlplane.store.records import DeploymentRecord, ServingRecord, SnapshotRecord
from controlplane.store.registry import AuditEntry
from controlplane.triton.client import DIGEST_PARAMETER
from controlplane.vocab import Cause, Result

if TYPE_CHECKING:
    from controlplane.service import ControlPlane

log = logging.getLogger("tritonctl.changeset")

ACTION = "changeset"
WATCHER_ACTOR = "watcher"


def private_name(model: str, digest: str) -> str:
    """The name a step's new content is staged under while its change set switches."""
    return f"{model}__{digest[:8]}"


def rename_config(text: str, name: str) -> str:
    """config.pbtxt text with its `name` set to `name` (canonical protobuf text)."""
    config = parse_config_text(text, CONFIG_FILE)
    config.name = name
    return str(text_format.MessageToString(config))


def point_steps(text: str, names: dict[str, str]) -> str:
    """An ensemble's config.pbtxt text with each step's model_name mapped through `names`."""
    config = parse_config_text(text, CONFIG_FILE)
    for step in config.ensemble_scheduling.step:
        if step.model_name in names:
            step.model_name = names[step.model_name]
    return str(text_format.MessageToString(config))


@dataclass
class Member:
    """One model of a change set: what it deploys and what served before."""

    model: str
    digest: str
    previous: str | None
    ensemble: bool
    steps: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return self.digest != self.previous

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "digest": self.digest, "previous_digest": self.previous,
                "ensemble": self.ensemble, "changed": self.changed}


class SetFailed(TritonctlError):
    """A step of a change set failed; `model` is the member at fault, `own_fault` whether its content is."""

    def __init__(self, message: str, model: str, own_fault: bool) -> None:
        super().__init__(message)
        self.model = model
        self.own_fault = own_fault


def order(members: Sequence[Member]) -> list[Member]:
    """Steps before the ensembles over them (nested ensembles after their inner ones)."""
    left = list(members)
    out: list[Member] = []
    while left:
        waiting = {m.model for m in left}
        ready = [m for m in left if not m.ensemble or not any(s in waiting and s != m.model for s in m.steps)]
        if not ready:  # a cycle: Triton refuses it at load; keep a stable order
            ready = left[:1]
        taken = {id(m) for m in ready}
        out.extend(ready)
        left = [m for m in left if id(m) not in taken]
    return out


class ChangeSets:
    """Groups models into change sets and deploys each set as one unit (see the module docstring)."""

    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane
        self._lock = threading.Lock()  # one change set at a time
        self._guard = threading.Lock()
        self._held: set[str] = set()  # settled while the repository-level hold was there
        self._release_lock = threading.Lock()  # repository-level holds: settle decisions one at a time
        self._serving: dict[str, list[str]] | None = None  # serving ensemble -> steps (None: not read yet)
        self._skipped: set[frozenset[tuple[str, str]]] = set()
        self._swept = False  # private names left by a stopped daemon: removed once, at the first reconcile

    # -- grouping --------------------------------------------------------------------------------

    def _source_config_text(self, model: str) -> str:
        plane = self.plane
        try:
            if plane.source is not None:
                return str(plane.source.read_text(model, CONFIG_FILE) or "")
            if plane.settings.repository is None:
                return ""
            # the source may be mid-edit: a fifo or a huge file named config.pbtxt is no ensemble here
            return read_small_text(plane.settings.repository / model / CONFIG_FILE, MAX_CONFIG_BYTES) or ""
        except (OSError, TritonctlError):
            return ""

    def source_steps(self, model: str) -> list[str] | None:
        """The step models the source's config of `model` names; None when it is no ensemble."""
        text = self._source_config_text(model)
        if not is_ensemble_text(text):
            return None
        try:
            config = parse_config_text(text, CONFIG_FILE)
        except TritonctlError:
            return []
        names: list[str] = []
        for step in config.ensemble_scheduling.step:
            if step.model_name and step.model_name not in names:
                names.append(step.model_name)
        return names

    def _serving_ensembles(self) -> dict[str, list[str]]:
        """Each serving ensemble and its steps: read from the registry once, then kept up to date from
        every outcome (`note`), so a settle costs no registry scan (10,000 models at start-up)."""
        with self._guard:
            if self._serving is not None:
                return dict(self._serving)
        out: dict[str, list[str]] = {}
        registry = self.plane.registry
        for record in registry.list_models(states=SERVING_STATES):
            if not record.active_digest:
                continue
            tree = self.plane.serving.current(record.name)
            try:  # the published config says cheaply which ones are ensembles; only those are looked up
                if tree is not None and not is_ensemble_text((tree / CONFIG_FILE).read_text(errors="replace")):
                    continue
            except OSError:
                pass
            steps = step_models(registry.get_snapshot(record.name, record.active_digest).config)
            if steps:
                out[record.name] = steps
        with self._guard:
            self._serving = out
        return dict(out)

    def note(self, outcome: Outcome) -> None:
        """A deploy, rollback, restore or unload ended: what its model serves now is `active_digest`."""
        if outcome.action == ACTION:
            return
        with self._guard:
            if self._serving is None:
                return
        try:
            steps = step_models(self.plane.registry.get_snapshot(outcome.model, outcome.active_digest).config) \
                if outcome.active_digest else []
        except TritonctlError:
            steps = []
        with self._guard:
            if self._serving is None:
                return
            if steps:
                self._serving[outcome.model] = steps
            else:
                self._serving.pop(outcome.model, None)

    def group(self, models: Sequence[str]) -> list[str]:
        """`models` and every model connected to them through ensembles (source or serving), sorted."""
        serving = self._serving_ensembles()
        seen: set[str] = set()
        todo = list(models)
        while todo:
            model = todo.pop()
            if model in seen or is_private_name(model):
                continue
            seen.add(model)
            near = set(self.source_steps(model) or []) | set(serving.get(model, []))
            near |= {e for e, steps in serving.items() if model in steps}
            todo.extend(sorted(near - seen))
        return sorted(seen)

    def _members(self, records: dict[str, SnapshotRecord]) -> list[Member]:
        out = []
        for model, record in records.items():
            current = self.plane.registry.find_model(model)
            serving = current is not None and current.state in SERVING_STATES and current.active_digest
            steps = step_models(record.config)
            out.append(Member(model, record.digest, current.active_digest if serving and current else None,
                              bool(steps) or (record.config or {}).get("platform") == "ensemble", steps))
        return order(out)

    # -- ordering elsewhere: reconcile, restore after a Triton restart, crash recovery -------------------

    def steps_first(self, models: Sequence[str]) -> list[str]:
        """`models` with every ensemble after the models it names (stable otherwise): what reconcile
        restores and recovers in, so an ensemble never loads over steps that do not serve yet."""
        if not models:
            return []
        serving = self._serving_ensembles()
        members = [Member(m, "", None, m in serving, serving.get(m, [])) for m in dict.fromkeys(models)]
        return [m.model for m in order(members)]

    def sweep(self) -> list[str]:
        """Unload and unpublish private step names a stopped daemon left behind (none while a set runs),
        except those a loaded ensemble still uses (unloading a step unloads its ensemble): looked at
        again at the next reconcile."""
        if self._swept or not self._lock.acquire(blocking=False):
            return []
        try:
            names = [n for n in self.plane.serving.models() if is_private_name(n)]
            if not names:
                self._swept = True
                return []
            used: set[str] = set()
            for ensemble in self._serving_ensembles():
                try:
                    steps = self.plane.triton.served_config(ensemble).get("ensemble_scheduling", {}).get("step", [])
                except TritonctlError:
                    continue
                used |= {str(step.get("model_name")) for step in steps}
            drop = [n for n in names if n not in used]
            if drop:
                log.warning("removing private step names left by an interrupted change set: %s", ", ".join(drop))
                self._drop_privates({n: n for n in drop})
            self._swept = len(drop) == len(names)
            return drop
        finally:
            self._lock.release()

    def recover(self, deployment: DeploymentRecord) -> bool:
        """A daemon stopped mid change set, with the ensemble of `deployment` serving its interim content
        (steps pointed at private names): when the public steps already serve content the new ensemble
        fits, point it at them (roll forward, the interim pipeline answering until then) and finish the
        deployment. False: not such a case, or it did not work; the deployer's recovery decides."""
        model, digest = deployment.model, deployment.digest
        if not digest or deployment.kind != "deploy" or deployment.step != "intent":
            return False
        registry = self.plane.registry
        try:
            served = self.plane.triton.served_digest(model) or ""
            if not served.startswith(f"{digest}+changeset-"):
                return False
            snap = registry.get_snapshot(model, digest)
            steps = self.plane.triton.served_config(model).get("ensemble_scheduling", {}).get("step", [])
            for name in {str(step.get("model_name")) for step in steps if is_private_name(str(step.get("model_name")))}:
                public, prefix = name.rsplit("__", 1)
                target = registry.get_snapshot(public, prefix).digest
                current = registry.find_model(public)
                if current is None or current.active_digest != target:  # the set's public step, forward too
                    result = self.plane.deployer.deploy(public, target, "tritonctl", kind="deploy")
                    if not result.succeeded:
                        return False
            require_members(registry, snap)
        except TritonctlError:
            return False  # the steps do not fit the new ensemble: the deployer puts the previous content back
        member = Member(model, digest, deployment.previous_digest, True, step_models(snap.config))
        with self.plane.deployer.lock(model):
            try:
                self._switch(member, {}, digest, "recover", lambda p: None)
            except TritonctlError as exc:
                log.warning("%s: rolling the interrupted change set forward failed: %s", model, exc)
                return False
            self._finish(member, deployment.id, "ok", f"rolled forward: serving {digest[:12]}; interrupted change "
                         "set finished after restart", "tritonctl", serving=True)
        self.note(Outcome(model, "deploy", "ok", digest, digest, ""))
        self.plane.serving.prune(model)
        log.warning("%s: rolled an interrupted change set forward to %s", model, digest[:12])
        return True

    # -- the watcher's path ------------------------------------------------------------------------

    def repository_held(self) -> bool:
        repo = self.plane.settings.repository
        return repo is not None and (repo / HOLD_FILE).exists()

    def marker_root(self) -> Path | None:
        """The repository root when it holds the commit marker (`--commit-marker M` and `<repo>/M`
        exists): then that marker commits every model, and a model's own marker is not looked at."""
        repo, marker = self.plane.settings.repository, self.plane.settings.commit_marker
        if repo is None or not marker or self.plane.source is not None:
            return None
        return repo if (repo / marker).is_file() else None

    def _repository_wait(self, model: str) -> str | None:
        """Why the repository level holds `model` back: the root hold file, or a root commit marker
        older than its content; None when nothing does."""
        if self.repository_held():
            return f"on hold ({HOLD_FILE} present at the repository root)"
        root = self.marker_root()
        if root is None or self.plane.settings.commit_marker is None:
            return None
        try:
            self.plane.store.check_marker(root / model, model, self.plane.settings.commit_marker, root)
        except SnapshotError as exc:
            return str(exc).removeprefix(f"{model}: ")
        return None

    def still_settling(self, models: Sequence[str]) -> list[str]:
        """Models connected to `models` through ensembles whose source still changes (the watcher has a
        change pending): a fleet leader proposes a set's rollouts once none does."""
        hooks = self.plane.watch
        pending = hooks.pending() if hooks and hooks.pending else {}
        if not any(due is not None for due in pending.values()):
            return []
        try:
            group = self.group(models)
        except TritonctlError:
            return []
        return [m for m in group if m not in models and pending.get(m) is not None]

    def settled(self, model: str) -> tuple[bool, Outcome | None]:
        """The watcher handed `model` on. (False, None): not part of a change set, deploy it alone;
        (True, outcome): the change sets took it (outcome None: deferred, held, or nothing to do)."""
        with self._guard:
            repository_level = bool(self._held)
        if not repository_level and self.marker_root() is None and not self.repository_held():
            return self._settled(model)
        # a repository-level hold or marker: one worker at a time decides, so a model the hold
        # released cannot deploy alone while another worker deploys the others
        with self._release_lock:
            return self._settled(model)

    def _settled(self, model: str) -> tuple[bool, Outcome | None]:
        plane = self.plane
        wait_reason = self._repository_wait(model)
        if wait_reason is not None:
            with self._guard:
                self._held.add(model)
            plane.capture_waits[model] = wait_reason
            if plane.watch:
                plane.watch.reschedule(model, max(plane.settings.settle_s, 0.5))
            return True, None
        root_marker = self.marker_root() is not None
        hooks = self.plane.watch  # the watcher's pending checks (WatchHooks.pending)
        pending = hooks.pending() if hooks and hooks.pending else {}
        with self._guard:
            held, self._held = self._held, set()
        # under a root commit marker, everything settling now is one set with what it released
        also = sorted(m for m, due in pending.items() if due is not None) if root_marker and held else []
        try:
            group = self.group([model, *sorted(held), *also])
        except TritonctlError as exc:
            log.warning("%s: cannot group with its ensembles: %s", model, exc)
            group = [model]
        if len(group) == 1 and not held:
            return False, None
        # one of them still settles: the last one to settle deploys the set (the held ones are pending
        # only because they were rescheduled here: released now, they come along)
        waiting = [m for m in group if m != model and m not in held and pending.get(m) is not None]
        if waiting:
            with self._guard:
                self._held |= held
                if root_marker:  # not connected to the others by ensembles: come back for them
                    self._held.add(model)
            if root_marker and plane.watch:
                plane.watch.reschedule(model, max(plane.settings.settle_s, 0.5))
            log.info("%s: change set %s waits for %s to settle", model, ",".join(group), ",".join(waiting))
            return True, None
        with self._lock:
            records = self._capture(group, WATCHER_ACTOR, settled=True)
            if records is None:
                with self._guard:
                    self._held |= held
                return True, None
            for name in records:
                plane.capture_waits.pop(name, None)
            targets = self._auto_targets(records)
            if targets is None:
                return True, None
            return True, self._deploy(self._members(targets), WATCHER_ACTOR, None, force=False)

    def _capture(self, group: Sequence[str], actor: str, *, settled: bool) -> dict[str, SnapshotRecord] | None:
        """Record every member's source now, steps first, each ensemble checked against its steps' new
        snapshots. None: a member is still changing or held (it was rescheduled)."""
        plane = self.plane
        present = [m for m in group if plane.source_has(m)]
        ensembles = [m for m in present if self.source_steps(m) is not None]
        records: dict[str, SnapshotRecord] = {}
        for model in [m for m in present if m not in ensembles] + ensembles:
            try:
                records[model] = plane.capture(model, actor, settled=settled, members=dict(records))
            except (SnapshotError, StoreError) as exc:
                if not settled:
                    raise
                decision = decide_capture(exc, model, plane.settings.settle_s)
                if decision.verdict is Verdict.WAIT and plane.watch:
                    plane.capture_failed(model, exc)  # looked at again later, with the reason for `status`
                    return None
                if isinstance(exc, StoreError):
                    raise
                plane.capture_failed(model, exc)
        return records

    def _auto_targets(self, records: dict[str, SnapshotRecord]) -> dict[str, SnapshotRecord] | None:
        """What the watcher may deploy: the set's records when every changed member may deploy under
        auto policy; None (and one audit line) when one of them may not."""
        plane = self.plane
        changed, blocked = [], []
        for model, record in records.items():
            current = plane.registry.ensure_model(model)
            if current.removed_at is not None:
                plane.registry.update_model(model, removed_at=None)
            if serves(current, record.digest):
                continue
            changed.append(model)
            decision = decide(current, record, policy=plane.effective_policy(current),
                              last=plane.registry.last_deployment(model))
            if not decision.deploys:
                blocked.append(f"{model} {record.digest[:12]}: {decision.reason}")
        if not changed:
            return None
        if blocked:
            key = frozenset((m, r.digest) for m, r in records.items())
            if key in self._skipped:  # said once per content (every member handed on asks again)
                return None
            self._skipped.add(key)
            detail = {"members": [{"model": m, "digest": r.digest} for m, r in sorted(records.items())],
                      "message": "not deployed: " + "; ".join(blocked)}
            plane.registry.audit(AuditEntry(WATCHER_ACTOR, ACTION, None, None, "skipped", json.dumps(detail)))
            log.warning("change set %s not deployed: %s", ",".join(sorted(records)), "; ".join(blocked))
            return None
        return records

    # -- the operator's path ---------------------------------------------------------------------

    def load(self, models: Sequence[str], actor: str, force: bool = False,
             progress: ProgressFn | None = None) -> Outcome:
        """`tritonctl load a b pipe`: the named models' source content, deployed as one change set."""
        names = list(dict.fromkeys(models))
        for name in names:
            validate_model_name(name)
        with self._lock:
            records = self._capture(names, actor, settled=False)
            assert records is not None
            missing = [m for m in names if m not in records]
            if missing:
                raise UsageError(f"model(s) {', '.join(missing)} not in the source repository")
            for model, record in records.items():
                refused = refuse_pinned(self.plane.registry.find_model(model), record.digest, force=force)
                if refused is not None:
                    raise UsageError(refused)
            return self._deploy(self._members(records), actor, progress, force=force)

    # -- deploying a set -------------------------------------------------------------------------
    def deploy_records(self, records: dict[str, SnapshotRecord], actor: str, *, force: bool = False) -> Outcome:
        """Snapshots this host's registry holds, deployed as one change set (a fleet host's steps of
        one set: controlplane/fleet/sets.py)."""
        with self._lock:
            return self._deploy(self._members(records), actor, None, force=force)


    def _deploy(self, members: list[Member], actor: str, progress: ProgressFn | None, *, force: bool) -> Outcome:
        started = time.monotonic()
        set_id = secrets.token_hex(4)
        steps: list[Progress] = []
        label = ",".join(m.model for m in members)

        def emit(p: Progress) -> None:
            steps.append(p)
            log.info("changeset %s: %s %s %s %s", set_id, p.model, p.step, p.state, p.message)
            if progress:
                progress(p)

        changed = [m for m in members if m.changed or force]
        if not changed:
            return Outcome(label, ACTION, "noop", None, None, "every member already serves its source content")
        problems = [self.plane.registry.get_snapshot(m.model, m.digest) for m in changed]
        bad = next((s for s in problems if not s.valid or (s.quarantined and not force)), None)
        if bad is not None:
            why = f"invalid: {bad.first_error}" if not bad.valid else "quarantined; use --force to retry"
            message = f"{bad.model} {bad.digest[:12]} is {why}"
            self._audit(actor, set_id, members, "failed", message, started)
            return Outcome(label, ACTION, Result.FAILED, None, None, message, _ms(started), steps, Cause.CONTENT)
        changed_steps = [m for m in changed if not m.ensemble]
        staged = [m for m in members if m.ensemble and m.previous
                  and set(m.steps) & {s.model for s in changed_steps}]
        if staged and (len(changed) > 1 or any(m.ensemble for m in changed)):
            outcome, message = self._staged(set_id, members, changed_steps, staged, actor, emit, force)
        else:
            outcome, message = self._in_order(changed, actor, progress, force)
        self._audit(actor, set_id, members, outcome, message, started)
        result = "ok" if outcome == "deployed" else outcome
        cause = Cause.NONE if result == "ok" else Cause.CONTENT
        return Outcome(label, ACTION, result, None, None, f"change set {set_id}: {message}", _ms(started), steps,
                       cause)

    def _audit(self, actor: str, set_id: str, members: list[Member], outcome: str, message: str,
               started: float) -> None:
        detail = {"id": set_id, "members": [m.to_json() for m in members], "message": message}
        self.plane.registry.audit(AuditEntry(actor, ACTION, None, None, outcome, json.dumps(detail), _ms(started)))

    def _in_order(self, changed: list[Member], actor: str, progress: ProgressFn | None,
                  force: bool) -> tuple[str, str]:
        """No serving pipeline to keep answering (or one model alone): steps first, then ensembles."""
        done: list[str] = []
        for member in changed:
            result = self.plane.deployer.deploy(member.model, member.digest, actor, force=force, progress=progress)
            if not result.succeeded:
                return ("rolled_back" if result.outcome == "rolled_back" else "failed",
                        f"{member.model}: {result.message}" + (f" (deployed before it: {', '.join(done)})"
                                                               if done else ""))
            done.append(member.model)
        return "deployed", f"deployed {', '.join(done)}"

    # -- the staged switch -------------------------------------------------------------------------

    def _staged(self, set_id: str, members: list[Member], changed_steps: list[Member], staged: list[Member],
                actor: str, emit: ProgressFn, force: bool) -> tuple[str, str]:
        plane = self.plane
        privates: dict[str, str] = {}
        interim: list[Member] = []
        deployments: dict[str, int] = {}
        with ExitStack() as stack:
            for member in sorted(staged, key=lambda m: m.model):
                stack.enter_context(plane.deployer.lock(member.model))  # reconcile leaves them alone meanwhile
            try:
                for step in changed_steps:
                    privates[step.model] = private_name(step.model, step.digest)
                self._each(changed_steps, lambda step: self._load_private(step, privates[step.model], emit))
                for ensemble in staged:
                    if ensemble.changed:
                        deployments[ensemble.model] = plane.registry.begin_deployment(
                            ensemble.model, "deploy", ensemble.digest, ensemble.previous, actor).id
                    interim.append(ensemble)
                    self._switch(ensemble, privates, f"{ensemble.digest}+changeset-{set_id}", "interim", emit)
            except TritonctlError as exc:
                message = self._fail_before_switch(exc, changed_steps, interim, deployments, actor, emit)
                self._drop_privates(privates)
                return "rolled_back", message
            # The new pipeline answers through the private names: the public steps may change now.
            results = self._each(changed_steps, lambda step: plane.deployer.deploy(
                step.model, step.digest, actor, force=force, progress=emit), raise_first=False)
            public_done = [step for step, result in zip(changed_steps, results, strict=True)
                           if result is not None and result.succeeded]
            failure: str | None = None
            for step, result in zip(changed_steps, results, strict=True):
                if result is None or not result.succeeded:
                    failure = f"{step.model}: {result.message if result is not None else 'deploy raised'}"
                    break
            if failure is None:
                switched: list[Member] = []
                try:
                    for ensemble in staged:
                        self._switch(ensemble, {}, ensemble.digest, "switch", emit)
                        switched.append(ensemble)
                except TritonctlError as exc:
                    failure = f"{ensemble.model}: {exc}"
                    if ensemble.changed and environment_cause(exc) is None:
                        plane.registry.set_quarantine(ensemble.model, ensemble.digest, str(exc))
                    for back in [*switched, ensemble]:  # the interim pipeline answers again
                        self._quietly(self._switch, back.model, back, privates, f"{back.digest}+changeset-{set_id}",
                                      "interim", emit)
            if failure is not None:
                self._undo_after_switch(public_done, staged, deployments, failure, actor, emit)
                self._drop_privates(privates)
                return "rolled_back", f"rolled back: {failure}"
            for ensemble in staged:
                self.note(Outcome(ensemble.model, "deploy", "ok", ensemble.digest, ensemble.digest, ""))
                if ensemble.model in deployments:
                    self._finish(ensemble, deployments[ensemble.model], "ok", f"serving {ensemble.digest[:12]} "
                                 f"(change set {set_id})", actor, serving=True)
                plane.serving.prune(ensemble.model)
        self._drop_privates(privates)
        # changed ensembles that did not need staging (new, or over unchanged steps): as any deploy
        rest = [m for m in members if m.ensemble and m.changed and m not in staged]
        for member in rest:
            result = plane.deployer.deploy(member.model, member.digest, actor, force=force, progress=emit)
            if not result.succeeded:
                return "failed", f"{member.model}: {result.message}"
        names = ", ".join(m.model for m in [*changed_steps, *staged, *rest])
        return "deployed", f"deployed {names} with the old pipeline answering until the new one did"

    def _load_private(self, step: Member, name: str, emit: ProgressFn) -> None:
        plane = self.plane
        emit(Progress(step.model, "stage", "start", f"as {name}", step.digest))
        try:
            snapshot = plane.store.load(step.model, step.digest)
            tree = plane.serving.publish(
                snapshot, plane.store,
                lambda text: stamp_parameter(rename_config(text, name), DIGEST_PARAMETER, step.digest), name=name)
            plane.triton.load(name, plane.deployer.load_timeout_s)
            self._verify(name, step.digest, plane.registry.get_snapshot(step.model, step.digest).served_versions)
            self._smoke(name, tree, step.model)
        except TritonctlError as exc:
            emit(Progress(step.model, "stage", "failed", str(exc), step.digest))
            raise SetFailed(f"{step.model} (staged as {name}): {exc}", step.model, True) from exc
        emit(Progress(step.model, "stage", "ok", f"{name} READY", step.digest))

    def _switch(self, ensemble: Member, names: dict[str, str], stamp: str, what: str, emit: ProgressFn) -> None:
        """Publish and load the ensemble's new content with its steps mapped through `names`; verify it."""
        plane = self.plane
        emit(Progress(ensemble.model, what, "start", digest=ensemble.digest))
        try:
            snapshot = plane.store.load(ensemble.model, ensemble.digest)
            tree = plane.serving.publish(
                snapshot, plane.store,
                lambda text: stamp_parameter(point_steps(text, names), DIGEST_PARAMETER, stamp))
            plane.triton.load(ensemble.model, plane.deployer.load_timeout_s)
            self._verify(ensemble.model, stamp,
                         plane.registry.get_snapshot(ensemble.model, ensemble.digest).served_versions)
            self._smoke(ensemble.model, tree, ensemble.model)
        except TritonctlError as exc:
            emit(Progress(ensemble.model, what, "failed", str(exc), ensemble.digest))
            raise SetFailed(f"{ensemble.model}: {exc}", ensemble.model, ensemble.changed) from exc
        emit(Progress(ensemble.model, what, "ok", ", ".join(f"{k} -> {v}" for k, v in names.items()),
                      ensemble.digest))

    def _verify(self, name: str, stamp: str, served_versions: Sequence[int]) -> None:
        triton = self.plane.triton
        ready = triton.ready_versions(name)
        missing = [str(v) for v in served_versions if str(v) not in ready]
        if missing or not ready:
            raise VerifyError(f"'{name}': version(s) {', '.join(missing) or '?'} not READY after load")
        served = triton.served_digest(name)
        if served != stamp:
            raise VerifyError(f"'{name}': Triton serves {(served or 'none')[:20]}, not {stamp[:20]} (load ignored)")

    def _smoke(self, name: str, tree: Path, label: str) -> None:
        path = tree / SMOKE_FILE
        if not path.exists():
            return
        requests = load_smoke_file(path, label=f"{label}/{SMOKE_FILE}")
        triton = self.plane.triton

        def infer(model: str, version: str, inputs: Sequence[SmokeInput],
                  outputs: Sequence[str]) -> dict[str, np.ndarray]:
            return triton.infer(model, version, [(i.name, i.datatype, i.array) for i in inputs
                                                 if i.array is not None], outputs)

        failures = run_smoke(name, requests, infer)
        if failures:
            raise VerifyError(f"smoke: {failures[0]}" + (f" (+{len(failures) - 1} more)" if len(failures) > 1 else ""))

    # -- failure paths ---------------------------------------------------------------------------

    def _fail_before_switch(self, exc: TritonctlError, changed_steps: list[Member], interim: list[Member],
                            deployments: dict[str, int], actor: str, emit: ProgressFn) -> str:
        """Nothing public changed but the ensembles' interim content: put them back; quarantine the
        member whose own content failed; record each changed member's deployment as rolled back."""
        plane = self.plane
        at_fault = exc.model if isinstance(exc, SetFailed) and exc.own_fault else None
        environment = environment_cause(exc)
        for ensemble in reversed(interim):
            self._put_back(ensemble, emit)
        message = f"rolled back, the old pipeline kept answering: {exc}"
        if environment:
            message = f"{environment}: {message}"
        quarantined = ""
        for member in [*changed_steps, *interim]:
            if member.model == at_fault and environment is None:
                plane.registry.set_quarantine(member.model, member.digest, str(exc))
                quarantined = member.model
        for member in changed_steps:
            if member.model == at_fault:
                deployment = plane.registry.begin_deployment(member.model, "deploy", member.digest, member.previous,
                                                             actor)
                self._finish(member, deployment.id, "failed" if environment else "rolled_back", message, actor)
        for model, deployment_id in deployments.items():
            member = next(m for m in interim if m.model == model)
            self._finish(member, deployment_id, "failed" if environment or model != at_fault else "rolled_back",
                         message, actor)
        if quarantined:
            message += f" ({quarantined} quarantined)"
        return message

    def _put_back(self, ensemble: Member, emit: ProgressFn) -> None:
        """An ensemble back on its previous content (its public steps), its interim trees pruned."""
        target = ensemble.previous or ensemble.digest
        self._quietly(self._switch, ensemble.model,
                      Member(ensemble.model, target, ensemble.previous, True, ensemble.steps), {}, target,
                      "restore", emit)
        self.plane.serving.prune(ensemble.model)

    def _undo_after_switch(self, public_done: list[Member], staged: list[Member], deployments: dict[str, int],
                           failure: str, actor: str, emit: ProgressFn) -> None:
        """The public steps changed and a later step failed: the interim pipeline answers; put the public
        steps back, then the ensembles (which then drop the private names)."""
        plane = self.plane
        for step in reversed(public_done):
            if step.previous:
                plane.deployer.deploy(step.model, step.previous, actor, force=True, kind="rollback", progress=emit)
        for ensemble in reversed(staged):
            self._put_back(ensemble, emit)
            if ensemble.model in deployments:
                self._finish(ensemble, deployments[ensemble.model], "rolled_back", f"rolled back: {failure}", actor)

    def _finish(self, member: Member, deployment_id: int, outcome: str, message: str, actor: str,
                serving: bool = False) -> None:
        registry = self.plane.registry
        digest = member.digest if serving else member.previous
        record = None
        if serving:
            snap = registry.get_snapshot(member.model, member.digest)
            record = ServingRecord(member.model, member.digest, list(snap.served_versions))
        audit = AuditEntry(actor, "deploy", member.model, member.digest, outcome, message)
        registry.finish_deployment(deployment_id, outcome=outcome, error=None if serving else message, audit=audit,
                                   serving=record, model_state="serving" if serving or digest else "failed")

    def _drop_privates(self, privates: dict[str, str]) -> None:
        for name in privates.values():
            try:
                self.plane.triton.unload(name)
            except TritonctlError as exc:
                log.warning("%s: unload of a private step name: %s", name, exc)
            try:
                self.plane.serving.unpublish(name)
            except (OSError, TritonctlError) as exc:
                log.warning("%s: unpublish of a private step name: %s", name, exc)

    @staticmethod
    def _each(members: list[Member], fn: Callable[[Member], Any], raise_first: bool = True) -> list[Any]:
        """`fn` on every member at once (Triton loads different models concurrently); results in order.
        `raise_first`: re-raise the first member's exception after all finished; else None for it."""
        if len(members) <= 1:
            return [fn(m) for m in members] if raise_first else [_or_none(fn, m) for m in members]
        with ThreadPoolExecutor(max_workers=min(4, len(members)), thread_name_prefix="changeset") as pool:
            futures = [pool.submit(fn, m) for m in members]
            wait(futures)
        failed = next((f.exception() for f in futures if f.exception() is not None), None)
        if failed is not None and raise_first:
            raise failed
        return [None if f.exception() is not None else f.result() for f in futures]

    @staticmethod
    def _quietly(fn: Callable[..., None], model: str, *args: Any) -> None:
        try:
            fn(*args)
        except TritonctlError as exc:
            log.error("%s: putting it back failed: %s", model, exc)


def _or_none(fn: Callable[[Member], Any], member: Member) -> Any:
    try:
        return fn(member)
    except TritonctlError as exc:
        log.error("%s: %s", member.model, exc)
        return None


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)
