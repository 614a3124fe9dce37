"""Bake: a new digest serves for `bake_s` seconds on Triton's own figures before its deploy is done, and is
rolled back by itself when live traffic fails it (docs/bake.md).

A deploy that ends `ok` (reported to `Outcomes`) starts a bake when `bake_s` (or the deploy's own
`load --bake`) is above 0. The bake holds no lock: the model serves the new digest and may be rolled back,
unloaded or deployed again meanwhile (any of these ends the bake). A thread of its own (`start`/`stop`,
like the on-demand sweep) reads Triton's inference statistics of each baking model every `TICK_S` and
compares them with the limits:

- failures over requests since the digest began serving (`bake_max_failure_ratio`), judged once there are
  `bake_min_requests`; a counter that went down (a reload, a restarted tritonserver) is a reset: what it
  counts from then on is added, never a negative figure;
- the latency of successful requests over the previous digest's (`bake_max_latency_ratio`, off by default;
  while it is set, every serving model's figures are sampled each tick to have that baseline): p99 where
  Triton reports quantiles (its metrics' summaries, controlplane/triton/summaries.py: the previous digest's
  p99 read just before the switch), else the mean (cumulative time over count from the statistics API,
  the previous digest's over the last `bake_s` before the switch).

A crossed limit ends the bake `failed` at once and rolls back to the previous digest (the Deployer's
`roll_back_analysis`: recorded, verified, smoke-tested; outcome `rolled_back`, cause `analysis`; the
digest is not quarantined). At `until`, fewer than `bake_min_requests` requests end it `inconclusive`
(kept, or rolled back with `bake_inconclusive = "rollback"`), else `passed`. Each end is audited as
action `bake` (`ok`, `failed`, `inconclusive`). Each model's last bake is kept in `<state>/bakes.json`:
a restarted daemon resumes a bake in progress (its figures so far, Triton's from the restart on) and
ends it by its figures at its own `until`.

A bake also compares the digest's load time and footprint with the previous digest's, as a warning only
(`bake_warn_load_ratio`, controlplane/bake/warn.py): once, when the digest's footprint is recorded (or at
the bake's end), before it is judged.

Where a gateway carries the traffic, a deploy with a previous digest goes through canary steps
(controlplane/bake/rollout.py, `Rollouts`): its switch gave the new digest the first step's weight (`weigh`,
which the routed deploy path asks), each step is judged on the gateway's figures of the new digest alone in
the step's window, a step passed sets the next weight, and a crossed limit flips every request back at once
before the rollback is recorded. `promote` goes on to the next step; `abort` ends it as a crossed limit does,
by hand.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from controlplane.bake.baseline import Baselines
from controlplane.bake.canary import ABORTED, DONE, ROLLED_BACK, SUPERSEDED
from controlplane.bake.figures import (
    AUDIT_OUTCOME,
    BAKE_OUTCOMES,
    BAKING,
    FAILED,
    INCONCLUSIVE,
    PASSED,
    Bake,
    Limits,
    Tally,
    bakes_from_records,
    verdict,
)
from controlplane.bake.rollout import Ending, Planned, Rollouts
from controlplane.bake.warn import LOADS_FILE, WARNING, LoadTimes, warning
from controlplane.base.periodic import Periodic
from controlplane.deploy.aliases import Lane
from controlplane.deploy.engine import Deployer
from controlplane.deploy.plans import Plan, order, serving_member
from controlplane.documents.results import Outcome
from controlplane.errors import NotFoundError, TritonctlError
from controlplane.settings.config import Settings
from controlplane.settings.modelparams import bake_parameters
from controlplane.snapshot.fsutil import write_atomic
from controlplane.snapshot.layout import SMOKE_FILE
from controlplane.store.registry import AuditEntry, Registry
from controlplane.triton.client import RequestCounts, TritonClient
from controlplane.validation.smokefile import load_smoke_file
from controlplane.vocab import BAKE_ACTOR, Result

log = logging.getLogger("tritonctl.bake")

TICK_S = 0.5
SMOKE_COUNTED_S = 1.0  # at most this long for Triton to count a deploy's smoke requests
BAKES_FILE = "bakes.json"  # in the state directory: each model's last bake, kept across a restart


class Baker:
    """Every bake of this daemon: started by deploy outcomes, judged by its thread, shown by `status`."""

    def __init__(self, registry: Registry, deployer: Deployer, triton: TritonClient,
                 settings: Callable[[], Settings], clock: Callable[[], float] = time.time,
                 path: Path | None = None) -> None:
        """`path`: the state file that keeps each model's last bake across a restart (None: memory only)."""
        self.path = path
        self.registry = registry
        self.deployer = deployer
        self.triton = triton
        self.settings = settings
        self.clock = clock
        self.counts: dict[str, int] = {outcome: 0 for outcome in BAKE_OUTCOMES}
        self._bakes: dict[str, Bake] = {}  # the last bake of each model
        self._asked: dict[str, float] = {}  # a deploy's own --bake, taken by its outcome
        self._held: dict[str, str] = {}  # through a gateway: the previous digest's private name a bake keeps loaded
        # the previous digest's latency before a switch (controlplane/bake/baseline.py)
        self.baselines = Baselines(triton, settings, clock, lambda: self._asked_values(), lambda: self.metrics_url())
        # Triton's metrics endpoint, where its p99s are read (set by the daemon); None: the mean only
        self.metrics_url: Callable[[], str | None] = lambda: None
        self.loads = LoadTimes(path.with_name(LOADS_FILE) if path is not None else None)  # each deploy's load time
        self._lock = threading.Lock()
        self._judge_thread = Periodic("bake", TICK_S, self.tick, log)
        self.rollouts = Rollouts(registry, deployer, triton, settings, clock)  # canary steps through a gateway
        self._resumed = False

    # -- what starts and ends a bake --------------------------------------------------------------

    def ask(self, model: str, bake_s: float | None, steps: tuple[int | str, ...] | None = None,
            shadow_s: float | None = None) -> None:
        """`load MODEL --bake 5m --steps [5, 100] --shadow 5m`: the next deploy of `model` bakes this long (0: not
        at all), goes through these canary steps, and is shadowed this long first (where a gateway carries the
        traffic)."""
        with self._lock:
            if bake_s is None:
                self._asked.pop(model, None)
            else:
                self._asked[model] = bake_s
        self.rollouts.ask(model, steps)
        self.rollouts.ask_shadow(model, shadow_s)

    def weigh(self, lanes: list[Lane]) -> int:
        """The routed deploy path's question before its switch: the percent of the requests the new digests
        take first (a canary's first step; 100: at once). controlplane/bake/rollout.py."""
        return self.rollouts.weigh(lanes, self._bake_s_of)

    def _asked_values(self) -> list[float]:
        with self._lock:
            return list(self._asked.values())

    def _bake_s_of(self, model: str, digest: str) -> float:
        with self._lock:
            asked = self._asked.get(model)
        return Limits.of(self.settings(), asked, self._parameters(model, digest)).bake_s

    def note(self, outcome: Outcome) -> None:
        """An outcome subscriber: a deploy that ended `ok` begins a bake; any other operation that changed
        what the model serves (a rollback, an unload, another deploy) ends the bake in progress."""
        if outcome.action not in ("deploy", "rollback", "unload", "evict", "restore"):
            return
        with self._lock:
            asked = self._asked.pop(outcome.model, None) if outcome.action == "deploy" else None
            bake = self._bakes.get(outcome.model)
        if outcome.action == "deploy":
            self.rollouts.forget(outcome.model)
        if outcome.action == "deploy" and outcome.outcome == Result.OK and outcome.digest:
            self.loads.note(outcome.model, outcome.digest, getattr(self.triton, "load_seconds", {}).get(outcome.model))
        if outcome.action == "restore" or outcome.outcome not in (Result.OK, Result.ROLLED_BACK):
            return
        if bake is not None and bake.state == BAKING and outcome.active_digest != bake.digest:
            how = f"{'an' if outcome.action[0] in 'aeiou' else 'a'} {outcome.action}"
            self._end(bake, FAILED if outcome.action == "rollback" else INCONCLUSIVE,
                      f"ended by {how} to {(outcome.active_digest or 'nothing')[:12]}",
                      how=ROLLED_BACK if outcome.action == "rollback" else SUPERSEDED)
        if outcome.action != "deploy" or outcome.outcome != Result.OK or not outcome.digest:
            return
        if self.deployer.in_change_set():  # a change set's members bake together once it ended (note_set)
            return
        settings = self.settings()
        limits = Limits.of(settings, asked, self._parameters(outcome.model, outcome.digest))
        planned = self.rollouts.taken(outcome.model, outcome.digest)  # its switch began canary steps
        if (limits.bake_s <= 0 and planned is None) or settings.fleet:  # a fleet's rollouts bake wave by wave
            return
        self._begin(outcome.model, outcome.digest, limits, self.clock() - outcome.duration_ms / 1000,
                    planned=planned)

    def note_set(self, plan: Plan, outcome: Outcome) -> None:
        """The Deployer's `on_set`: a change set that deployed bakes as one. Each changed member bakes on its
        own limits over one window (the longest `bake_s` of them); any member crossing a limit rolls the
        whole set back as a set (`_fail_set`); the set passes when every member did."""
        if plan.analysis or outcome.outcome != Result.OK:
            return
        settings = self.settings()
        if settings.fleet:
            return
        changed = [m for m in plan.members if m.changed]
        limits = {m.model: Limits.of(settings, None, self._parameters(m.model, m.digest)) for m in changed}
        bake_s = max((lim.bake_s for lim in limits.values()), default=0.0)
        planned = {m.model: self.rollouts.taken(m.model, m.digest) for m in changed}
        if bake_s <= 0 and not any(planned.values()):
            return
        group, group_id, started = tuple(m.model for m in plan.members), secrets.token_hex(4), self.clock()
        deployed_from = started - outcome.duration_ms / 1000
        for member in changed:
            self._begin(member.model, member.digest, replace(limits[member.model], bake_s=bake_s), deployed_from,
                        group, group_id, started, planned=planned[member.model])

    def _parameters(self, model: str, digest: str) -> dict[str, Any]:
        """The model's own bake settings in the deployed config (validation refused bad ones)."""
        try:
            config = self.registry.snapshot_content(model, digest)[0] or {}  # kept: read once a content
            return bake_parameters(config.get("parameters") or {})
        except (TritonctlError, ValueError) as exc:
            log.warning("%s: bake: the config's bake parameters are not used: %s", model, exc)
            return {}

    def _counts_after_smoke(self, model: str, digest: str) -> dict[tuple[str, str], RequestCounts]:
        """Triton's figures once the deploy's own smoke requests are in them. Triton counts a request when
        it has finished with it, which can be just after its answer reached the deploy (measured: under
        load the bake's first reading missed the smoke request and counted it as the bake's). A freshly
        loaded version starts at 0, so the figures wait, for a second at most, until they hold at least
        the smoke file's requests."""
        expected = 0
        path = self.deployer.store.tree_path(digest) / SMOKE_FILE
        if path.exists():
            try:
                expected = len(load_smoke_file(path, build=False))
            except TritonctlError:
                expected = 0
        counts = self.triton.request_counts(model)
        deadline = time.monotonic() + SMOKE_COUNTED_S
        while sum(c.success + c.failure for c in counts.values()) < expected and time.monotonic() < deadline:
            time.sleep(0.05)
            counts = self.triton.request_counts(model)
        return counts

    def _begin(self, model: str, digest: str, limits: Limits, deployed_from: float, group: tuple[str, ...] = (),
               group_id: str = "", started: float | None = None, planned: Planned | None = None) -> None:
        """`deployed_from`: when the deploy began (what Triton's metrics reported before it is the previous
        digest's); `group`, `group_id`, `started`: a change set's bake (note_set), one window for every member;
        `planned`: the canary steps its switch began (judged on the gateway's figures from now on)."""
        previous = self._previous(model, digest)
        tally = Tally()
        if planned is None:
            try:
                tally = Tally.starting_at(self._counts_after_smoke(model, digest))  # the smoke requests: not the bake's
            except TritonctlError as exc:
                log.warning("%s: bake: no figures at its start (%s); counting from 0", model, exc)
        now = self.clock() if started is None else started
        mean_ms, p99_ms = self.baselines.before(model, limits.bake_s, deployed_from)
        bake = Bake(model, digest, previous, limits, now, tally, mean_ms, baseline_p99_ms=p99_ms, group=group,
                    group_id=group_id)
        if planned is not None:
            self.rollouts.attach(bake, planned)
        with self._lock:
            self._bakes[model] = bake
        self._hold(bake)
        self._save()
        log.info("%s: baking %s for %.0f s (previous %s)", model, digest[:12], limits.bake_s,
                 (previous or "none")[:12])

    def _previous(self, model: str, digest: str) -> str | None:
        """The digest that served before `digest` (what a failed bake returns to)."""
        for entry in self.registry.serving_history(model, limit=20):
            if entry.digest and entry.digest != digest:
                return str(entry.digest)
        return None

    def promote(self, model: str, actor: str) -> dict[str, Any]:
        """`tritonctl promote MODEL`: the bake in progress ends `passed` now; a canary goes on to its next
        step (past its last one, it ends `passed`)."""
        bake = self._in_progress(model)
        members = self._set_of(bake)  # a change set's bake is promoted as one
        ending = self.rollouts.promote(members, actor) if bake.canary is not None else None
        if bake.canary is None or ending is not None:
            for member in members:
                self._end(member, PASSED, f"promoted by {actor}: {member.figures()}", actor=actor)
        self._save()
        return self.document(bake)

    def abort(self, model: str, actor: str) -> dict[str, Any]:
        """`tritonctl abort MODEL`: the canary (or bake) in progress ends as a crossed limit ends it: every
        request back on the previous digest at once, the deploy `rolled_back` with cause `analysis`, by
        `actor`."""
        bake = self._in_progress(model)
        if bake.previous is None:
            raise NotFoundError(f"model '{model}' has nothing to go back to: its bake is its first version's")
        reason = f"aborted by {actor}"
        if bake.group_id:
            self._fail_set(bake, reason, FAILED, actor=actor)
        else:
            self._fail(bake, reason, actor=actor, how=ABORTED)
        return self.document(bake)

    def _in_progress(self, model: str) -> Bake:
        with self._lock:
            bake = self._bakes.get(model)
        if bake is None or bake.state != BAKING:
            raise NotFoundError(f"model '{model}' has no bake in progress")
        return bake

    def document(self, bake: Bake) -> dict[str, Any]:
        """The bake's document (`status --json` row's `bake`) with its canary's (`canary`, null without)."""
        return {**bake.to_json(), "canary": self.canary_of(bake), "shadow": self.shadow_of(bake)}

    @staticmethod
    def canary_of(bake: Bake | None) -> dict[str, Any] | None:
        """`status --json`'s `canary` of a model's last bake (None: no canary)."""
        if bake is None or bake.canary is None:
            return None
        return bake.canary.to_json(bake.limits.bake_s)

    @staticmethod
    def shadow_of(bake: Bake | None) -> dict[str, Any] | None:
        """`status --json`'s `shadow` of a model's last bake (None: it was not shadowed; docs/bake.md "Shadow")."""
        if bake is None or bake.canary is None or bake.canary.shadow is None:
            return None
        return bake.canary.shadow.to_json()

    def of(self, model: str) -> Bake | None:
        with self._lock:
            return self._bakes.get(model)

    def baking(self) -> list[str]:
        with self._lock:
            return [m for m, b in self._bakes.items() if b.state == BAKING]

    # -- judging ----------------------------------------------------------------------------------

    def tick(self) -> None:
        """Read each baking model's figures; end the bakes whose limits were crossed or whose time is up."""
        baking = self.baking()
        p99s = self.baselines.round(any(b.canary is None for b in map(self.of, baking) if b is not None))
        sets: dict[str, list[Bake]] = {}
        for model in baking:
            bake = self.of(model)
            if bake is None or bake.state != BAKING:
                continue
            if bake.canary is not None:  # judged on the gateway's figures, step by step
                self._warn(bake)
                sets.setdefault(bake.group_id or f"canary:{model}", []).append(bake)
                continue
            try:
                bake.tally.add(self.triton.request_counts(model))
            except TritonctlError as exc:
                log.info("%s: bake: figures unavailable this round: %s", model, exc)
                continue
            if p99s and model in p99s:
                bake.p99_ms = p99s[model]
            self._warn(bake)
            if bake.group_id:
                sets.setdefault(bake.group_id, []).append(bake)
            else:
                self._judge(bake)
        for members in sets.values():
            if members[0].canary is not None:
                self._judge_canary(members)
            else:
                self._judge_set(members)
        if baking:
            self._save()  # the figures so far: a restart resumes from them

    def _judge(self, bake: Bake) -> None:
        verdict = self._verdict(bake)
        if verdict is not None:
            state, reason, rollback = verdict
            if rollback:
                self._fail(bake, reason, state=state)
            else:
                self._end(bake, state, reason)

    def _verdict(self, bake: Bake) -> tuple[str, str, bool] | None:
        return verdict(bake, self.clock())

    def _judge_canary(self, members: list[Bake]) -> None:
        """A canary's step (a change set's members together): on to the next step, or its end."""
        members = [m for m in members if m.state == BAKING]
        ending: Ending | None = self.rollouts.judge(members) if members else None
        if ending is None:
            return
        if ending.rollback and ending.culprit is not None:
            if ending.culprit.group_id:
                self._fail_set(ending.culprit, ending.reason, ending.state)
            else:
                self._fail(ending.culprit, ending.reason, state=ending.state)
            return
        for bake in members:
            self._end(bake, ending.state, ending.reason)

    # -- a change set's bake -----------------------------------------------------------------------

    def _set_of(self, bake: Bake) -> list[Bake]:
        """The bakes in progress of `bake`'s change set (itself alone when it is no set's)."""
        if not bake.group_id:
            return [bake]
        with self._lock:
            return [b for b in self._bakes.values() if b.group_id == bake.group_id and b.state == BAKING]

    def _judge_set(self, members: list[Bake]) -> None:
        """A change set bakes as one: the first member crossing a limit rolls the whole set back; the set
        ends when every member's time is up, each member with its own verdict."""
        verdicts = [(bake, self._verdict(bake)) for bake in members]
        failing = next(((bake, v) for bake, v in verdicts if v is not None and v[2]), None)
        if failing is not None:
            bake, (state, reason, _) = failing
            self._fail_set(bake, reason, state)
            return
        if all(v is not None for _, v in verdicts):
            for bake, v in verdicts:
                assert v is not None
                self._end(bake, v[0], v[1])

    def _fail_set(self, culprit: Bake, reason: str, state: str, actor: str = BAKE_ACTOR) -> None:
        """End every bake of the culprit's set, and roll the set back as a set: the Deployer's change-set
        plan (controlplane/deploy/plans.py, the old pipeline answering until the restored one does) with
        each member that still serves its baked digest on its previous one (its deployment `rolled_back`,
        cause `analysis`), the other members as they serve now. A canary's set flips back first: every
        member's requests on its previous digest in one route update."""
        members = self._set_of(culprit)
        how = ABORTED if actor != BAKE_ACTOR else ROLLED_BACK
        if culprit.canary is not None:
            self.rollouts.flip_back(members)
        self._end(culprit, state, reason, actor=actor, how=how)
        for bake in members:
            if bake is not culprit:
                self._end(bake, FAILED, f"rolled back with its change set: {culprit.model}: {reason}", actor=actor,
                          how=how)
        with self._lock:
            baked = {b.model: b for b in self._bakes.values() if b.group_id == culprit.group_id}
        try:
            self._roll_back_set(culprit, baked, reason, state, actor)
        except TritonctlError as exc:
            log.error("change set %s: bake: rollback: %s", ",".join(culprit.group), exc)

    def _roll_back_set(self, culprit: Bake, baked: dict[str, Bake], reason: str, state: str, actor: str) -> None:
        records = {}
        leaving = []
        for model in culprit.group:
            current = self.registry.find_model(model)
            if current is None or not current.active_digest:
                continue
            mine = baked.get(model)
            target = current.active_digest
            if mine is not None and mine.previous and current.active_digest == mine.digest:
                target = mine.previous
                leaving.append(model)
            records[model] = self.registry.get_snapshot(model, target)
        if not leaving:
            log.warning("change set %s: bake %s: %s; nothing to roll back to: it keeps serving",
                        ",".join(culprit.group), state, reason)
            return
        why = f"{culprit.model}: {reason}"
        if len(records) == 1:
            alone = baked[leaving[0]]
            assert alone.previous is not None
            self.deployer.roll_back_analysis(alone.model, alone.digest, alone.previous, actor, why)
            return
        members = order([serving_member(self.registry, model, r.digest, r.config) for model, r in records.items()])
        outcome = self.deployer.run(Plan(tuple(members), kind="rollback", analysis=why), actor)
        log.warning("change set %s: %s", ",".join(culprit.group), outcome.message)

    def _fail(self, bake: Bake, reason: str, state: str = FAILED, actor: str = BAKE_ACTOR,
              how: str = ROLLED_BACK) -> None:
        """End the bake and roll back to the previous digest (when there is one): a canary's requests flipped
        back first, in one route update, then the rollback recorded (controlplane/deploy/routed.py back_to)."""
        if bake.canary is not None and bake.previous is not None:
            self.rollouts.flip_back([bake])
        self._end(bake, state, reason, actor=actor, how=how)
        if bake.previous is None:
            log.warning("%s: bake %s: %s; nothing to roll back to: it keeps serving", bake.model, state, reason)
            return
        try:
            outcome = self.deployer.roll_back_analysis(bake.model, bake.digest, bake.previous, actor, reason)
        except TritonctlError as exc:
            log.error("%s: bake: rollback to %s: %s", bake.model, bake.previous[:12], exc)
            return
        if outcome is None:
            log.info("%s: bake: %s no longer serves; nothing rolled back", bake.model, bake.digest[:12])

    def _warn(self, bake: Bake, final: bool = False) -> None:
        """Once per bake, when the digest's footprint is recorded (the memory budget code measures it just after
        the deploy), or `final`ly at the bake's end: one audit line when its load time or footprint is over
        `bake_warn_load_ratio` times the previous digest's."""
        if bake.warned:
            return
        try:
            footprints = self.registry.footprints([bake.model])
        except TritonctlError as exc:
            log.info("%s: bake: footprints unavailable this round: %s", bake.model, exc)
            return
        with self._lock:  # the judging thread and an operation ending the bake: one of them compares
            if bake.warned or ((bake.model, bake.digest) not in footprints and not final):
                return
            bake.warned = True
        if bake.previous is None:
            return
        text = warning(self.settings().bake_warn_load_ratio, self.loads.of(bake.model, bake.digest),
                       self.loads.of(bake.model, bake.previous), footprints.get((bake.model, bake.digest)),
                       footprints.get((bake.model, bake.previous)))
        if text is None:
            return
        log.warning("%s: bake of %s: %s", bake.model, bake.digest[:12], text)
        try:
            self.registry.audit(AuditEntry(BAKE_ACTOR, "bake", bake.model, bake.digest, WARNING, text))
        except TritonctlError as exc:
            log.error("%s: bake: audit: %s", bake.model, exc)

    def _end(self, bake: Bake, state: str, reason: str, actor: str = BAKE_ACTOR, how: str | None = None) -> None:
        """`how` a canary ended (controlplane/bake/canary.py): by default `done` unless `state` is failed."""
        if bake.state == BAKING:
            self._warn(bake, final=True)  # its warning line before its end's
        with self._lock:
            if bake.state != BAKING:
                return
            bake.state, bake.reason, bake.ended = state, reason, self.clock()
            self.counts[AUDIT_OUTCOME[state]] += 1
            held = self._held.pop(bake.model, None)
        if bake.canary is not None:
            self.rollouts.ended(bake, how or (ROLLED_BACK if state == FAILED else DONE), reason, actor)
        if held is not None and self.deployer.routed is not None:
            self.deployer.routed.release(bake.model, held)
        self._save()
        log.log(logging.INFO if state == PASSED else logging.WARNING, "%s: bake of %s %s: %s", bake.model,
                bake.digest[:12], state, reason)
        try:
            self.registry.audit(AuditEntry(actor, "bake", bake.model, bake.digest, AUDIT_OUTCOME[state], reason,
                                           int((self.clock() - bake.started) * 1000)))
        except TritonctlError as exc:
            log.error("%s: bake: audit: %s", bake.model, exc)

    def _hold(self, bake: Bake) -> None:
        """Through a gateway, the previous digest stays loaded while its successor bakes: a failed bake is a
        switch back (controlplane/deploy/routed.py), not a load."""
        routed = self.deployer.routed
        if routed is None or not bake.previous:
            return
        name = routed.hold(bake.model, bake.previous)
        if name is not None:
            with self._lock:
                self._held[bake.model] = name

    # -- across a restart ----------------------------------------------------------------------------

    def _save(self) -> None:
        """Every model's last bake to the state file (written whole, then renamed over the old one)."""
        if self.path is None:
            return
        with self._lock:
            records = [bake.to_record() for bake in self._bakes.values()]
        try:  # through an exclusive temporary file, mode 0640 whatever the umask (issue 58)
            write_atomic(self.path, json.dumps(records).encode(), mode=0o640)
        except OSError as exc:
            log.warning("bake: cannot write %s: %s", self.path, exc)

    def resume(self) -> None:
        """At the daemon's start (once: build_parts calls it before the first reconcile where a gateway routes,
        so that the names a bake holds are held before anything sweeps unrouted names): the last bakes from
        the state file. A bake still in progress resumes (its figures so far kept, Triton's counted from now:
        what came while no daemon looked is not counted; a canary's step keeps its window, the gateway's
        counters and weights outlived the daemon) when its digest still serves; it then ends by its figures, at
        its own `until`. One whose digest no longer serves is forgotten."""
        if self._resumed:
            return
        self._resumed = True
        if self.path is None or not self.path.exists():
            return
        try:
            bakes, dropped = bakes_from_records(json.loads(self.path.read_text()))
        except (OSError, ValueError) as exc:
            log.warning("bake: %s unreadable, no bake resumed: %s", self.path, exc)
            return
        for bake in bakes:
            try:
                current = self.registry.find_model(bake.model)
            except TritonctlError:
                current = None
            if current is None or current.active_digest != bake.digest:
                continue
            if bake.state == BAKING:
                self._count_from_now(bake)
                log.info("%s: bake of %s resumed, %d s left", bake.model, bake.digest[:12], bake.seconds_left())
            with self._lock:
                self._bakes[bake.model] = bake
            if bake.state == BAKING:
                self._hold(bake)
                self.rollouts.hold(bake)
        if dropped:  # one line, and the file rewritten without them: the next start does not warn again
            log.warning("bake: %s: %s", self.path, dropped)
            self._save()

    def _count_from_now(self, bake: Bake) -> None:
        if bake.canary is None:
            try:
                bake.tally.last = dict(self.triton.request_counts(bake.model))
            except TritonctlError:
                pass

    # -- the thread ---------------------------------------------------------------------------------

    def start(self) -> None:
        if self._resumed:  # early (build_parts): Triton's figures count from now, not from then
            for model in self.baking():
                bake = self.of(model)
                if bake is not None:
                    self._count_from_now(bake)
        self.resume()
        self._judge_thread.start()

    def stop(self) -> None:
        self._judge_thread.stop()
