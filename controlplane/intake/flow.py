"""The intake: what the source hands on becomes recorded content and a plan, and nothing is deployed here.

source → **intake** → plan → target → outcome (docs/architecture.md "One direction"). The watcher
hands on a model that settled; the intake captures its source into the content store, validates and
records it (controlplane.intake.recording), groups it with the models connected to it through ensembles
(controlplane/intake/changeset.py) and decides (controlplane.intake.decision) what should serve. What comes back is a
plan: a `deploy.plans.Plan` (one model, or a change set in order), or `FollowTag` (the model serves what
its tag names, controlplane/intake/tags.py), or nothing. The target (controlplane/target/targets.py: this host's
Deployer, or the fleet's rollout) runs it; its outcome goes to the subscribers wired in daemon.py.

The intake also keeps what `status` says of models it has not recorded yet: handed on and not captured
(`in_hand`), put off with a reason (`capture_waits`), refused (`capture_refusals`), and the source's entries
whose name no model can have (`bad_names`: `my model`, `线性`; Triton cannot take them).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from controlplane.base import clock
from controlplane.deploy.causes import RetryBook
from controlplane.deploy.plans import Plan, serving_member
from controlplane.deploy.servingensembles import ServingEnsembles
from controlplane.errors import (
    NotFoundError,
    ObjectStoreError,
    SnapshotEnvironmentError,
    SnapshotError,
    StoreError,
    UsageError,
)
from controlplane.intake import recording
from controlplane.intake.changeset import ChangeSets
from controlplane.intake.decision import Rule, Verdict, decide, decide_capture
from controlplane.intake.inhand import InHand
from controlplane.names import MAX_NAME_LENGTH, printable_name, validate_model_name
from controlplane.outcomes.counters import PipelineCounts
from controlplane.settings.config import Settings
from controlplane.settings.live import LiveSettings
from controlplane.snapshot import ContentStore, Snapshot
from controlplane.source.protocol import Source
from controlplane.source.recorded import SourceGraph
from controlplane.store.records import ModelRecord, SnapshotRecord, iso
from controlplane.store.registry import AuditEntry, AuditQuery, Registry
from controlplane.vocab import WATCHER_ACTOR

log = logging.getLogger("tritonctl.intake")


@dataclass(frozen=True)
class FollowTag:
    """The plan of a model that tracks a tag: serve what the tag names (controlplane/intake/tags.py `follow`)."""

    model: str


IntakePlan = Plan | FollowTag


class Intake:
    """Settled source content → recorded snapshot → plan (see the module docstring)."""

    def __init__(self, live: LiveSettings, registry: Registry, content: ContentStore, source: Source,
                 source_graph: SourceGraph, serving_ensembles: ServingEnsembles, retries: RetryBook) -> None:
        """`retries`: the deploys that wait to be tried again (a model its source no longer holds has
        none)."""
        self.live = live  # the settings now (settle window, default policy): replaced on SIGHUP
        self.registry = registry
        self.content = content
        self.source = source
        self.source_graph = source_graph  # recorded source contents: signatures, ensemble graph
        self.serving_ensembles = serving_ensembles
        self.retries = retries
        self.counts = PipelineCounts()
        self.in_hand = InHand()  # handed on by the source, not captured yet: `status` says "capturing"
        self.capture_waits: dict[str, str] = {}  # why the watcher's last capture of a model was put off
        self.capture_refusals: dict[str, str] = {}  # why the watcher's last capture of a model was refused
        # a source entry whose name no model can have, with why: `status` shows it, nothing is made under it
        self.bad_names: dict[str, str] = {}
        self._capture_locks: dict[str, threading.RLock] = {}
        self._guard = threading.Lock()
        self.changesets = ChangeSets(self)  # ensembles and their steps changing together

    def recording(self, model: str) -> bool:
        """Whether `model` is on its way to the registry: settling in the source, handed on, or the
        start-up scan's (an on-demand ensure waits for it instead of refusing an unknown model)."""
        return self.in_hand.holds(model) or model in self.source.settling()

    def capture_lock(self, model: str) -> threading.RLock:
        """Serializes a model's capture, decision and the run of its plan, so two settled events for the
        same content cannot both decide to deploy it (the second sees the first's outcome)."""
        with self._guard:
            return self._capture_locks.setdefault(model, threading.RLock())

    @property
    def settings(self) -> Settings:
        return self.live()

    def effective_policy(self, model: ModelRecord) -> str:
        return self.live.policy_of(model)

    # -- capture and record ----------------------------------------------------------------------

    def capture(self, model: str, actor: str = WATCHER_ACTOR, *, settled: bool = True, complete: bool = False,
                members: dict[str, SnapshotRecord] | None = None) -> SnapshotRecord:
        """Snapshot the model's source now, validate the immutable tree, record it (once per content).

        `settled` (the watcher's captures): refuse, as "still changing", a source that changed within
        the settle window, measured now, not when the watcher fired (the capture may run later, when
        the writer has begun its next edit). `tritonctl load` asks for what is there now.
        `complete`: the writer declared the model whole (renamed in, symlink flip, commit marker):
        no quiet window; the snapshot's before/after check still refuses a change during the copy."""
        validate_model_name(model)
        with self.capture_lock(model):
            snapshot, signature, trusted = self.snapshot_source(model, settled=settled, complete=complete)
            self.counts.add("validations")
            recorded = recording.validate(self.registry, self.content, snapshot, members)
            entry = recording.source_entry(model, snapshot.digest, recorded, signature, trusted)
            self.counts.add("records")
            record = recording.record(self.registry, model, snapshot.digest, recorded, actor, entry)
            self.source_graph.recorded(entry)
            return record

    def snapshot_source(self, model: str, *, settled: bool = True,
                        complete: bool = False) -> tuple[Snapshot, str | None, bool]:
        """The capture step of `capture` alone (the start-up scan validates and records many at once,
        controlplane/startup/record.py): the source's content now, as an immutable snapshot, with the
        signature it was captured at and whether a start may trust that signature."""
        self.counts.add("captures")
        return self.source.capture_into(self.content, model, settled=settled, complete=complete)

    def source_content(self, model: str, actor: str) -> str:
        """The digest of what `model`'s source holds now, captured and recorded (`tritonctl load MODEL`)."""
        if not self.source_has(model):
            raise NotFoundError(f"model '{model}' is unknown: {self.source.missing(model)}; "
                                "`tritonctl status` lists the models")
        return self.capture(model, actor, settled=False).digest

    def source_changed(self, model: str, *, unknown: bool = True) -> bool:
        """Whether `model`'s source differs from its newest recorded content: its signature now is not
        the one recorded with it. `unknown`: the answer when no signature can say (none recorded: a
        registry from before migration 0007, or no watcher). Stat facts only: no file is read."""
        entry = self.source_graph.entry(model)
        if entry is None:
            return True
        if entry.signature is None:
            return unknown
        return self.source.signature(model) != entry.signature

    def source_has(self, model: str) -> bool:
        """Whether the source repository (a directory or object storage) holds `model` now."""
        return self.source.has(model)

    # -- the watcher's path ------------------------------------------------------------------------

    @contextmanager
    def settled(self, model: str, *, complete: bool = False) -> Iterator[IntakePlan | None]:
        """The watcher saw `model` settle: record what it now holds and yield what should run (None:
        nothing). The plan is yielded while its lock is held (a single model's capture lock; the change
        sets' `one_at_a_time`), so the caller runs it before another settled event decides.
        `complete`: handed on at once as declared whole (see `capture`)."""
        if not self._handed_on(model):
            yield None
            return
        with self.changesets.settled(model) as (taken, planned):  # connected through ensembles: one set
            if taken:
                yield planned
                return
        with self.capture_lock(model):
            yield self._capture_and_decide(model, complete=complete)

    def _handed_on(self, model: str) -> bool:
        """Whether the source holds a model by that name to capture; a bad name, a dangling link and a
        removed model are recorded here (nothing serving is touched)."""
        try:
            validate_model_name(model)
        except UsageError as exc:
            self._bad_name(model, str(exc))
            return False
        problem = self.source.entry_problem(model)
        if problem is not None:  # a dangling symlink: whatever serves keeps serving, nothing is removed
            log.warning("%s: %s", model, problem)
            self._capture_refused(model, problem)
            self.registry.audit(AuditEntry(WATCHER_ACTOR, "snapshot", model, None, "failed", problem))
            return False
        if self.source_has(model):
            return True
        self.capture_refusals.pop(model, None)
        existing = self.registry.find_model(model)
        held = model in self.source.held()  # the source holds it back (an MLflow alias names no version)
        if existing is None and held:
            self.registry.ensure_model(model)  # a row, so `status` shows it held, with why
            return False
        if existing is not None and existing.removed_at is None and not (held and not existing.active_digest):
            self.retries.clear(model)  # nothing retries content the source no longer holds
            self.registry.update_model(model, removed_at=clock.now())
            self.registry.audit(AuditEntry(WATCHER_ACTOR, "remove", model, existing.active_digest, "ok",
                                           "removed from the source repository; what serves keeps serving"))
        return False

    def _bad_name(self, name: str, reason: str) -> None:
        """A source entry whose name no model can have (`my model`, `线性`: Triton cannot take it), handed on
        by the watcher: nothing is captured, and nothing is made under that name (no registry row, nothing
        under the state directory, whose `serving/` holds model names). `status` shows it (`bad_names`: sync
        `invalid`, the reason) while the source holds it; the first time (or when the reason changed), one
        WARNING line and an audit event naming the entry."""
        try:
            present = self.source_has(name)
        except (OSError, ValueError):
            present = False
        with self._guard:
            known = self.bad_names.pop(name, None)
            if present:
                self.bad_names[name] = reason
        if not present or known == reason:
            return
        log.warning("source entry skipped: %s (rename it to serve it)", reason)
        self.registry.audit(AuditEntry(WATCHER_ACTOR, "snapshot", printable_name(name)[:MAX_NAME_LENGTH], None,
                                       "invalid", reason))

    def _capture_and_decide(self, model: str, *, complete: bool = False) -> IntakePlan | None:
        try:
            record = self.capture(model, complete=complete)
        except (SnapshotError, StoreError) as exc:
            self.capture_failed(model, exc)
            return None
        self.capture_done(model)
        current = self.registry.ensure_model(model)
        if current.removed_at is not None:
            self.registry.update_model(model, removed_at=None)
        decision = decide(current, record, policy=self.effective_policy(current),
                          last=self.registry.last_deployment(model))
        if decision.rule is Rule.TRACKS_TAG:  # it serves what its tag names, not the source
            return FollowTag(model)
        if decision.rule is Rule.QUARANTINED:
            self._note_quarantined(record)
        if not decision.deploys:
            return None
        return Plan.of([serving_member(self.registry, model, record.digest, record.config)])

    def capture_failed(self, model: str, exc: SnapshotError | StoreError) -> None:
        """The watcher's capture of `model` did not produce content: look again later (why: `status`),
        or report the failure once in the audit (controlplane.intake.decision.decide_capture)."""
        decision = decide_capture(exc, model, self.settings.settle_s)
        unreachable = isinstance(exc, (StoreError, ObjectStoreError))  # nothing recorded: not the source's state
        if decision.verdict is Verdict.WAIT:
            # A registry or object store that is busy or unreachable is the operator's to see (ERROR);
            # content still changing is the usual settle (INFO).
            host_failed = unreachable or isinstance(exc, SnapshotEnvironmentError)  # the host's, not the content's
            log.log(logging.ERROR if host_failed else logging.INFO, "%s: %s; looking again in %.1f s",
                    model, exc, decision.delay_s)
            if unreachable:
                self.look_again(model, decision.delay_s)
            else:
                self.put_off(model, decision.reason, decision.delay_s)
            return
        self.capture_done(model)
        log.warning("%s: capture refused: %s", model, decision.reason)
        self._capture_refused(model, decision.reason)
        self.registry.audit(AuditEntry(WATCHER_ACTOR, "snapshot", model, None, "failed", str(exc)))

    def _capture_refused(self, model: str, reason: str) -> None:
        """The source's content of `model` was refused (not put off): `status` and the web view show the
        model, sync `invalid` with this reason, until a capture succeeds or the source drops it. A model
        whose every capture is refused gets its registry row here (state `new`, nothing serving)."""
        self.capture_refusals[model] = reason
        if self.registry.ensure_model(model).removed_at is not None:
            self.registry.update_model(model, removed_at=None)

    def _note_quarantined(self, record: SnapshotRecord) -> None:
        """A quarantined digest is in the source (again): say so once, in the log and the audit."""
        model, digest = record.model, record.digest
        earlier = self.registry.query_audit(AuditQuery(model=model, action="skip", limit=200))
        if any(e.digest == digest for e in earlier):
            return
        since = next((e.time for e in self.registry.query_audit(AuditQuery(model=model, limit=200))
                      if e.digest == digest and e.outcome in ("rolled_back", "failed")), None)
        when = iso(since) if since else "?"
        message = f"skipped: quarantined since {when}: {record.quarantine_reason}"
        log.warning("%s %s %s", model, digest[:12], message)
        self.registry.audit(AuditEntry(WATCHER_ACTOR, "skip", model, digest, "invalid", message))

    def put_off(self, model: str, reason: str, delay_s: float) -> None:
        """The watcher's capture of `model` waits (`reason`, shown by `status`); look again after `delay_s`."""
        self.capture_waits[model] = reason
        self.look_again(model, delay_s)

    def capture_done(self, model: str) -> None:
        """`model`'s source was captured: nothing puts it off any more."""
        self.capture_waits.pop(model, None)
        self.capture_refusals.pop(model, None)

    def look_again(self, model: str, delay_s: float) -> None:
        """Have the source hand `model` on again after `delay_s` (nothing without a source)."""
        self.source.reschedule(model, delay_s)

    def converge(self, model: str) -> None:
        """Nothing may hold `model` any more: look at its source again (the watcher's path, so the
        usual rules decide), soon and without blocking the caller."""
        self.look_again(model, 0.0)

