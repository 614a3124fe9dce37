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
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

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
    verdict,
)
from controlplane.bake.warn import LOADS_FILE, WARNING, LoadTimes, warning
from controlplane.base.periodic import Periodic
from controlplane.deploy.engine import Deployer
from controlplane.deploy.plans import Plan, order, serving_member
from controlplane.documents.results import Outcome
from controlplane.errors import NotFoundError, TritonctlError
from controlplane.settings.config import Settings, bake_parameters
from controlplane.snapshot.fsutil import write_atomic
from controlplane.snapshot.layout import SMOKE_FILE
from controlplane.store.registry import AuditEntry, Registry
from controlplane.triton.client import RequestCounts, TritonClient
from controlplane.triton.summaries import fetch_request_p99_ms
from controlplane.validation.smokefile import load_smoke_file
from controlplane.vocab import BAKE_ACTOR, Result

log = logging.getLogger("tritonctl.bake")

TICK_S = 0.5
P99_SAMPLE_S = 2.0  # how often every model's p99 is read for the latency baselines (Triton's window: a minute)
P99_KEEP_S = 20.0  # the baseline samples are kept at least this long: a deploy's p99 baseline is read before it
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
        self._history: dict[str, deque[tuple[float, int, int, float | None]]] = {}  # latency baseline samples
        # Triton's metrics endpoint, where its p99s are read (set by the daemon); None: the mean only
        self.metrics_url: Callable[[], str | None] = lambda: None
        self._p99_read = float("-inf")  # when Triton's metrics were last read (time.monotonic)
        self.loads = LoadTimes(path.with_name(LOADS_FILE) if path is not None else None)  # each deploy's load time
        self._lock = threading.Lock()
        self._judge_thread = Periodic("bake", TICK_S, self.tick, log)

    # -- what starts and ends a bake --------------------------------------------------------------

    def ask(self, model: str, bake_s: float | None) -> None:
        """`load MODEL --bake 5m`: the next deploy of `model` bakes this long (0: not at all)."""
        with self._lock:
            if bake_s is None:
                self._asked.pop(model, None)
            else:
                self._asked[model] = bake_s

    def note(self, outcome: Outcome) -> None:
        """An outcome subscriber: a deploy that ended `ok` begins a bake; any other operation that changed
        what the model serves (a rollback, an unload, another deploy) ends the bake in progress."""
        if outcome.action not in ("deploy", "rollback", "unload", "evict", "restore"):
            return
        with self._lock:
            asked = self._asked.pop(outcome.model, None) if outcome.action == "deploy" else None
            bake = self._bakes.get(outcome.model)
        if outcome.action == "deploy" and outcome.outcome == Result.OK and outcome.digest:
            self.loads.note(outcome.model, outcome.digest, getattr(self.triton, "load_seconds", {}).get(outcome.model))
        if outcome.action == "restore" or outcome.outcome not in (Result.OK, Result.ROLLED_BACK):
            return
        if bake is not None and bake.state == BAKING and outcome.active_digest != bake.digest:
            how = f"{'an' if outcome.action[0] in 'aeiou' else 'a'} {outcome.action}"
            self._end(bake, FAILED if outcome.action == "rollback" else INCONCLUSIVE,
                      f"ended by {how} to {(outcome.active_digest or 'nothing')[:12]}")
        if outcome.action != "deploy" or outcome.outcome != Result.OK or not outcome.digest:
            return
        if self.deployer.in_change_set():  # a change set's members bake together once it ended (note_set)
            return
        settings = self.settings()
        limits = Limits.of(settings, asked, self._parameters(outcome.model, outcome.digest))
        if limits.bake_s <= 0 or settings.fleet:  # a fleet's rollouts do not bake yet (docs/bake.md)
            return
        self._begin(outcome.model, outcome.digest, limits, self.clock() - outcome.duration_ms / 1000)

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
        if bake_s <= 0:
            return
        group, group_id, started = tuple(m.model for m in plan.members), secrets.token_hex(4), self.clock()
        deployed_from = started - outcome.duration_ms / 1000
        for member in changed:
            self._begin(member.model, member.digest, replace(limits[member.model], bake_s=bake_s), deployed_from,
                        group, group_id, started)

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
               group_id: str = "", started: float | None = None) -> None:
        """`deployed_from`: when the deploy began (what Triton's metrics reported before it is the previous
        digest's); `group`, `group_id`, `started`: a change set's bake (note_set), one window for every member."""
        previous = self._previous(model, digest)
        try:
            tally = Tally.starting_at(self._counts_after_smoke(model, digest))  # the smoke requests: not the bake's
        except TritonctlError as exc:
            log.warning("%s: bake: no figures at its start (%s); counting from 0", model, exc)
            tally = Tally()
        now = self.clock() if started is None else started
        mean_ms, p99_ms = self._baseline_ms(model, limits.bake_s, deployed_from)
        bake = Bake(model, digest, previous, limits, now, tally, mean_ms, baseline_p99_ms=p99_ms, group=group,
                    group_id=group_id)
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
        """`tritonctl promote MODEL`: the bake in progress ends `passed` now."""
        with self._lock:
            bake = self._bakes.get(model)
        if bake is None or bake.state != BAKING:
            raise NotFoundError(f"model '{model}' has no bake in progress")
        for member in self._set_of(bake):  # a change set's bake is promoted as one
            self._end(member, PASSED, f"promoted by {actor}: {member.figures()}", actor=actor)
        return bake.to_json()

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
        # Triton's whole metrics text: each round while a bake runs, every P99_SAMPLE_S for the baselines
        sampling = self.settings().bake_max_latency_ratio is not None and (
            time.monotonic() - self._p99_read >= P99_SAMPLE_S)
        p99s = self._p99s() if baking or sampling else None
        self._sample(p99s)
        sets: dict[str, list[Bake]] = {}
        for model in baking:
            bake = self.of(model)
            if bake is None or bake.state != BAKING:
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

    def _fail_set(self, culprit: Bake, reason: str, state: str) -> None:
        """End every bake of the culprit's set, and roll the set back as a set: the Deployer's change-set
        plan (controlplane/deploy/plans.py, the old pipeline answering until the restored one does) with
        each member that still serves its baked digest on its previous one (its deployment `rolled_back`,
        cause `analysis`), the other members as they serve now."""
        members = self._set_of(culprit)
        self._end(culprit, state, reason)
        for bake in members:
            if bake is not culprit:
                self._end(bake, FAILED, f"rolled back with its change set: {culprit.model}: {reason}")
        with self._lock:
            baked = {b.model: b for b in self._bakes.values() if b.group_id == culprit.group_id}
        try:
            self._roll_back_set(culprit, baked, reason, state)
        except TritonctlError as exc:
            log.error("change set %s: bake: rollback: %s", ",".join(culprit.group), exc)

    def _roll_back_set(self, culprit: Bake, baked: dict[str, Bake], reason: str, state: str) -> None:
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
            self.deployer.roll_back_analysis(alone.model, alone.digest, alone.previous, BAKE_ACTOR, why)
            return
        members = order([serving_member(self.registry, model, r.digest, r.config) for model, r in records.items()])
        outcome = self.deployer.run(Plan(tuple(members), kind="rollback", analysis=why), BAKE_ACTOR)
        log.warning("change set %s: %s", ",".join(culprit.group), outcome.message)

    def _fail(self, bake: Bake, reason: str, state: str = FAILED) -> None:
        """End the bake and roll back to the previous digest (when there is one)."""
        self._end(bake, state, reason)
        if bake.previous is None:
            log.warning("%s: bake %s: %s; nothing to roll back to: it keeps serving", bake.model, state, reason)
            return
        try:
            outcome = self.deployer.roll_back_analysis(bake.model, bake.digest, bake.previous, BAKE_ACTOR, reason)
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

    def _end(self, bake: Bake, state: str, reason: str, actor: str = BAKE_ACTOR) -> None:
        if bake.state == BAKING:
            self._warn(bake, final=True)  # its warning line before its end's
        with self._lock:
            if bake.state != BAKING:
                return
            bake.state, bake.reason, bake.ended = state, reason, self.clock()
            self.counts[AUDIT_OUTCOME[state]] += 1
            held = self._held.pop(bake.model, None)
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

    # -- the latency baseline -----------------------------------------------------------------------

    def _p99s(self) -> dict[str, float] | None:
        """model → its request p99 in ms over Triton's last minute (its metrics' summaries); None without them."""
        self._p99_read = time.monotonic()
        url = self.metrics_url()
        return fetch_request_p99_ms(url) if url else None

    def _sample(self, p99s: dict[str, float] | None) -> None:
        """With `bake_max_latency_ratio` and `bake_s` set: every serving model's cumulative successes and
        their time, and its p99 when Triton reports one (`p99s`), kept for `bake_s`, so a bake knows the
        previous digest's latency before the switch."""
        settings = self.settings()
        if settings.bake_max_latency_ratio is None:
            self._history.clear()
            return
        keep_s = max(settings.bake_s, *self._asked.values(), P99_KEEP_S) if self._asked else max(settings.bake_s,
                                                                                                 P99_KEEP_S)
        try:
            every = self.triton.request_counts("")
        except TritonctlError:
            return
        now = self.clock()
        totals: dict[str, tuple[int, int]] = {}
        for (model, _version), counts in every.items():
            success, ns = totals.get(model, (0, 0))
            totals[model] = (success + counts.success, ns + counts.success_ns)
        with self._lock:
            for model, (success, ns) in totals.items():
                samples = self._history.setdefault(model, deque())
                samples.append((now, success, ns, (p99s or {}).get(model)))
                while samples and samples[0][0] < now - keep_s:
                    samples.popleft()

    def _baseline_ms(self, model: str, window_s: float, deployed_from: float) -> tuple[float | None, float | None]:
        """(mean, p99) latency of `model`'s successful requests before the switch (the previous digest's), or
        None without samples or requests, from the samples taken before the deploy began (`deployed_from`):
        the mean over the last `window_s` of them (a reset between two samples, a reload, adds nothing), the
        p99 as Triton reported it last (the reload keeps Triton's summaries, whose window holds the new
        digest's smoke requests too from then on)."""
        with self._lock:
            history = [s for s in self._history.pop(model, deque()) if s[0] <= deployed_from]
        samples = [s for s in history if s[0] >= deployed_from - window_s]
        success = ns = 0
        for (_, s0, n0, _p0), (_, s1, n1, _p1) in zip(samples, samples[1:], strict=False):
            if s1 >= s0 and n1 >= n0:  # a reset (the switch's reload) between two samples adds nothing
                success, ns = success + s1 - s0, ns + n1 - n0
        if not success:  # no request to the previous digest in the window: no baseline at all
            return None, None
        p99s = [p99 for _, _, _, p99 in history if p99 is not None]
        return ns / success / 1e6, (p99s[-1] if p99s else None)

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
        """At the daemon's start: the last bakes from the state file. A bake still in progress resumes (its
        figures so far kept, Triton's counted from now: what came while no daemon looked is not counted)
        when its digest still serves; it then ends by its figures, at its own `until`. One whose digest no
        longer serves is forgotten."""
        if self.path is None or not self.path.exists():
            return
        try:
            bakes = [Bake.from_record(r) for r in json.loads(self.path.read_text())]
        except (OSError, ValueError, KeyError, TypeError) as exc:
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
                try:
                    bake.tally.last = dict(self.triton.request_counts(bake.model))
                except TritonctlError:
                    pass
                log.info("%s: bake of %s resumed, %d s left", bake.model, bake.digest[:12], bake.seconds_left())
            with self._lock:
                self._bakes[bake.model] = bake
            if bake.state == BAKING:
                self._hold(bake)

    # -- the thread ---------------------------------------------------------------------------------

    def start(self) -> None:
        self.resume()
        self._judge_thread.start()

    def stop(self) -> None:
        self._judge_thread.stop()
