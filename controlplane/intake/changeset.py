"""Change sets: which models deploy together as one unit, and in what order.

Why: an ensemble and the steps that change with it (a renamed intermediate tensor) serve consistently
only as one unit; the Deployer runs such a set as one plan (controlplane/deploy/plans.py: staged private
names, the old pipeline answering until the new one does). This module only forms the sets.

Grouping (`ChangeSets.settled`): a model the watcher hands on is taken with every model connected
to it through ensembles (the source's configs and the serving ones, transitively); while one of them
still settles, the last one to settle deploys them all. Everything that settles while the repository
holds `.tritonctl-hold` at its root waits and is released as one set when the file goes. With
`--commit-marker M` and a file `M` at the repository root, that file commits the whole repository: a
model whose content is newer than it waits the same way, and when the root marker is touched again
everything that waited, and everything settling then, deploys as one set. `tritonctl load a b pipe`
makes one set of the named models. Whether a set may deploy is controlplane.intake.decision's, member by
member; the set is recorded as one audit event (action `changeset`) beside each member's deployment.
The source (controlplane/source/protocol.py) says what settles and whether its repository level holds a model
back; which ensembles serve now is controlplane/deploy/servingensembles.py's.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager

from controlplane.deploy.plans import ACTION, Member, Plan, order, serving_member
from controlplane.errors import NotFoundError, SnapshotError, StoreError, TritonctlError, UsageError
from controlplane.intake.decision import Verdict, decide, decide_capture, refuse_pinned, serves
from controlplane.names import is_private_name, validate_model_name
from controlplane.ports import SetIntake
from controlplane.snapshot import CONFIG_FILE
from controlplane.store.records import SnapshotRecord
from controlplane.store.registry import AuditEntry
from controlplane.validation.modelconfig import is_ensemble_text, parse_config_text
from controlplane.vocab import SERVING_STATES, WATCHER_ACTOR

log = logging.getLogger("tritonctl.changeset")



class ChangeSets:
    """Groups models into change sets and returns each set's plan (see the module docstring); the
    target runs it as one unit (`Deployer.run`, which also runs one set at a time)."""

    def __init__(self, intake: SetIntake) -> None:
        self.intake = intake
        # one set at a time, from its capture to the end of its run: the next set is grouped and decided
        # against what the previous one left serving (held by the caller that runs the plan)
        self.one_at_a_time = threading.RLock()
        self._guard = threading.Lock()
        self._held: set[str] = set()  # settled while the repository-level hold was there
        self._release_lock = threading.Lock()  # repository-level holds: settle decisions one at a time
        self._skipped: set[frozenset[tuple[str, str]]] = set()

    # -- grouping --------------------------------------------------------------------------------

    def source_steps(self, model: str) -> list[str] | None:
        """The step models the source's config of `model` names; None when it is no ensemble."""
        text = self.intake.source.read_text(model, CONFIG_FILE) or ""
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

    def group(self, models: Sequence[str]) -> list[str]:
        """`models` and the models connected to them through ensembles that a change set must take,
        sorted: every step (of the source's config or the serving one) whose source changed too or that
        serves nothing and auto policy may deploy, and every ensemble over a model whose source changed
        (to be staged), transitively.
        `models` and the models the watcher still settles are read from the source; every other one
        from the registry's recorded configs (controlplane/source/recorded.py): a change costs what is
        connected to it, not a read of every source config."""
        serving = self.intake.serving_ensembles.get()
        serving_over: dict[str, set[str]] = {}
        for ensemble, steps in serving.items():
            for step in steps:
                serving_over.setdefault(step, set()).add(ensemble)
        graph = self.intake.source_graph
        fresh = self._fresh(models)
        changed_cache: dict[tuple[str, bool], bool] = {}

        def changed(model: str, unknown: bool = True) -> bool:
            """Its source differs from its recorded content (`unknown`: when no signature says)."""
            if model in fresh:
                return True
            if (model, unknown) not in changed_cache:
                changed_cache[model, unknown] = self.intake.source_changed(model, unknown=unknown)
            return changed_cache[model, unknown]

        def owed(model: str) -> bool:
            """It serves nothing, or serves other content than its newest recorded one (valid, not
            quarantined: a step a rolled-back set left recorded), and auto policy may deploy it."""
            record = self.intake.registry.find_model(model)
            if record is None:
                return True
            if not (self.intake.effective_policy(record) == "auto" and not record.pinned
                    and record.state != "unloaded"):
                return False
            if not (record.state in SERVING_STATES and record.active_digest):
                return True
            entry = graph.entry(model)
            if entry is None or entry.digest == record.active_digest:
                return False
            try:
                head = self.intake.registry.get_snapshot(model, entry.digest)
            except TritonctlError:
                return False
            return head.valid and not head.quarantined

        seen: set[str] = set()
        todo = list(models)
        while todo:
            model = todo.pop()
            if model in seen or is_private_name(model):
                continue
            seen.add(model)
            named = self.source_steps(model) if model in fresh else graph.steps(model)
            for step in set(named or []) | set(serving.get(model, [])):
                if step not in seen and (changed(step) or owed(step)):
                    todo.append(step)
            if changed(model, unknown=False):
                todo.extend(sorted((graph.ensembles_over(model) | serving_over.get(model, set())) - seen))
        return sorted(seen)

    def _fresh(self, models: Sequence[str]) -> set[str]:
        """`models` and the models the watcher still settles: their source is newer than the registry's."""
        pending = self.intake.source.settling()
        return set(models) | {m for m, due in pending.items() if due is not None}

    def _members(self, records: dict[str, SnapshotRecord]) -> list[Member]:
        registry = self.intake.registry
        return order([serving_member(registry, model, r.digest, r.config) for model, r in records.items()])

    # -- the watcher's path ------------------------------------------------------------------------

    def still_settling(self, models: Sequence[str]) -> list[str]:
        """Models connected to `models` through ensembles whose source still changes (the watcher has a
        change pending): a fleet leader proposes a set's rollouts once none does."""
        pending = self.intake.source.settling()
        if not any(due is not None for due in pending.values()):
            return []
        try:
            group = self.group(models)
        except TritonctlError:
            return []
        return [m for m in group if m not in models and pending.get(m) is not None]

    @contextmanager
    def settled(self, model: str) -> Iterator[tuple[bool, Plan | None]]:
        """The watcher handed `model` on. (False, None): not part of a change set, deploy it alone;
        (True, plan): the change sets took it (plan None: deferred, held, or nothing to do). A plan is
        yielded with `one_at_a_time` held: the caller runs it before the next set is decided."""
        with self._guard:
            repository_level = bool(self._held)
        source = self.intake.source
        with ExitStack() as stack:
            if repository_level or source.repository_marked() or source.repository_held():
                # a repository-level hold or marker: one worker at a time decides (and runs), so a model
                # the hold released cannot deploy alone while another worker deploys the others
                stack.enter_context(self._release_lock)
            yield self._settled(model, stack)

    def _settled(self, model: str, stack: ExitStack) -> tuple[bool, Plan | None]:
        intake = self.intake
        wait_reason = intake.source.repository_wait(model)
        if wait_reason is not None:
            with self._guard:
                self._held.add(model)
            intake.put_off(model, wait_reason, max(intake.settings.settle_s, 0.5))
            return True, None
        root_marker = intake.source.repository_marked()
        pending = intake.source.settling()  # model -> seconds since its last change (None: looked at again)
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
            if root_marker:
                intake.look_again(model, max(intake.settings.settle_s, 0.5))
            log.info("%s: change set %s waits for %s to settle", model, ",".join(group), ",".join(waiting))
            return True, None
        stack.enter_context(self.one_at_a_time)
        records = self._capture(group, WATCHER_ACTOR, settled=True, fresh_names=[model, *sorted(held), *also])
        if records is None:  # a member still changes (looked at again): `model` comes along with it then,
            with self._guard:  # an ensemble never recorded included (no recorded graph leads back to it)
                self._held |= held | {model}
            return True, None
        for name in records:
            intake.capture_done(name)
        targets = self._auto_targets(records)
        if targets is None:
            return True, None
        return True, Plan.of(self._members(targets))

    def _capture(self, group: Sequence[str], actor: str, *, settled: bool,
                 fresh_names: Sequence[str] | None = None) -> dict[str, SnapshotRecord] | None:
        """Record every member's source now, steps first, each ensemble checked against its steps' new
        snapshots; a member that is not in `fresh_names` (default: all) nor settling, and whose
        signature says its source did not change, keeps its recorded content (no capture). None: a
        member is still changing or held (it was rescheduled)."""
        intake = self.intake
        present = [m for m in group if intake.source_has(m)]
        # a member whose source did not change since recorded is not captured again (controlplane/startup/scan.py)
        fresh = self._fresh(fresh_names if fresh_names is not None else group)
        kept = {m: entry.digest for m in present if m not in fresh and not intake.source_changed(m, unknown=False)
                and (entry := intake.source_graph.entry(m)) is not None}
        ensembles = [m for m in present if (intake.source_graph.steps(m) if m in kept else self.source_steps(m))
                     is not None]
        records: dict[str, SnapshotRecord] = {}
        for model in [m for m in present if m not in ensembles] + ensembles:
            try:
                if model in kept:
                    records[model] = intake.registry.get_snapshot(model, kept[model])
                    continue
                records[model] = intake.capture(model, actor, settled=settled, members=dict(records))
            except (SnapshotError, StoreError) as exc:
                if not settled:
                    raise
                decision = decide_capture(exc, model, intake.settings.settle_s)
                if decision.verdict is Verdict.WAIT:
                    intake.capture_failed(model, exc)  # looked at again later, with the reason for `status`
                    return None
                if isinstance(exc, StoreError):
                    raise
                intake.capture_failed(model, exc)
        return records

    def _auto_targets(self, records: dict[str, SnapshotRecord]) -> dict[str, SnapshotRecord] | None:
        """What the watcher may deploy: the set's records when every changed member may deploy under
        auto policy; None (and one audit line) when one of them may not."""
        intake = self.intake
        changed, blocked = [], []
        for model, record in records.items():
            current = intake.registry.ensure_model(model)
            if current.removed_at is not None:
                intake.registry.update_model(model, removed_at=None)
            if serves(current, record.digest):
                continue
            changed.append(model)
            decision = decide(current, record, policy=intake.effective_policy(current),
                              last=intake.registry.last_deployment(model))
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
            intake.registry.audit(AuditEntry(WATCHER_ACTOR, ACTION, None, None, "skipped", json.dumps(detail)))
            log.warning("change set %s not deployed: %s", ",".join(sorted(records)), "; ".join(blocked))
            return None
        return records

    # -- the operator's path ---------------------------------------------------------------------

    def load(self, models: Sequence[str], actor: str, force: bool = False) -> Plan:
        """`tritonctl load a b pipe`: the named models' source content, captured and recorded now, as one
        change set's plan (the caller holds `one_at_a_time` until it ran)."""
        names = list(dict.fromkeys(models))
        for name in names:
            validate_model_name(name)
        with self.one_at_a_time:
            records = self._capture(names, actor, settled=False)
            assert records is not None
            missing = [m for m in names if m not in records]
            if missing:
                raise NotFoundError(f"model(s) {', '.join(missing)} not in the source repository")
            for model, record in records.items():
                refused = refuse_pinned(self.intake.registry.find_model(model), record.digest, force=force)
                if refused is not None:
                    raise UsageError(refused)
            return Plan.of(self._members(records), force=force)

    def plan_records(self, records: dict[str, SnapshotRecord], *, force: bool = False) -> Plan:
        """Snapshots this host's registry holds, as one change set's plan (a fleet host's steps of one
        set: controlplane/fleet/sets.py)."""
        return Plan.of(self._members(records), force=force)
