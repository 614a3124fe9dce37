"""Canary steps, driven (docs/bake.md, "Canary steps"): the first weight a deploy's switch gives the new digest,
each step judged on the gateway's figures of the new digest alone in the step's window, the next weight set
when a step passes, every request flipped back to the previous digest at once when one fails.

`Rollouts` is the `Baker`'s (controlplane/bake/baker.py) part for the bakes of deploys a gateway carries:

- `weigh(lanes)` is what the routed deploy path asks before its switch (controlplane/deploy/routed.py): the
  percent of the requests the new digests take first. 100 (the switch of old) for a rollback, a first deploy,
  `canary_steps = [100]`, or no bake at all (`bake_s` 0 and no `pause`). Otherwise the canary is planned: its
  steps (the deploy's own `load --steps`, else the model's `tritonctl.canary_steps` parameter, else the
  daemon's `canary_steps`; a change set takes its members' most cautious list: the smallest first weight,
  then the most steps) and its lanes (every public name the switch moved, the ensembles bound again over a
  changed step riding along), taken by the bake its deploy's outcome starts (`taken`, `attach`).
- `judge(members)` reads each member's figures (`TrafficFigures`: the gateway's; without them Triton's
  counts of the new digest's private name, no baseline) and judges the step's window with the bake's limits
  (controlplane.bake.figures.judge): the failure ratio of the new digest's requests in the window, its latency
  against the previous digest's in the same window (both serve at once; at 100 % the previous digest's
  figures so far), `bake_min_requests` in the window. A limit crossed: the bake fails (the Baker flips back:
  `flip_back`, one route update for every lane, then records the rollback). Every member's window done
  (passed, or too few requests and kept): the next step, one route update for every lane; past the last
  step the bake ends.
- `promote` goes on to the next step at once (a pause's only way on); `flip_back` serves `tritonctl abort`
  too. Each step begun and the canary's end are audited as action `canary` (controlplane/bake/canary.py's
  lines, which `tritonctl versions` reads back).

Route updates are made under the models' deploy locks, and only while the gateway still routes each lane
to the canary's digests: a deploy, a rollback or an unload that came first decides (its outcome ends the
bake). A deploy of one model may be shadowed before its first step (`shadow_s`, `load --shadow`): its
switch gives the new digest weight 0 and a copy of the requests (controlplane/bake/shadowrun.py, which
this class inherits: `ShadowRuns`); the steps begin once the shadow passed or was promoted.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from controlplane.bake.canary import ABORTED, CANARY_ACTION, DONE, ROLLED_BACK, SUPERSEDED, Canary
from controlplane.bake.figures import INCONCLUSIVE, PASSED, Bake, judge
from controlplane.bake.shadow import SHADOW_ACTION, ShadowPhase
from controlplane.bake.shadowrun import ShadowRuns
from controlplane.bake.traffic import Counts, TrafficFigures
from controlplane.base.jsontext import iso
from controlplane.deploy.aliases import Lane, Routed, Target
from controlplane.deploy.engine import Deployer
from controlplane.errors import TritonctlError
from controlplane.settings.canarysteps import AT_ONCE, PAUSE
from controlplane.settings.config import Settings
from controlplane.settings.modelparams import bake_parameters
from controlplane.store.registry import AuditEntry, Registry
from controlplane.triton.client import TritonClient
from controlplane.vocab import BAKE_ACTOR, Result

log = logging.getLogger("tritonctl.bake")

LOCK_WAIT_S = 2.0  # how long a flip back waits for a model's deploy lock before it leaves that lane be


@dataclass(frozen=True)
class Planned:
    """A canary its deploy's switch began: the digest, the steps, the lanes its bake moves."""

    digest: str
    steps: tuple[int | str, ...]
    lanes: tuple[Lane, ...]
    index: int = 0  # the step it begins at (a split taken on after a restart: the step of its weight)
    shadow: ShadowPhase | None = None  # judged on copies of the requests first (its start set when it begins)


@dataclass(frozen=True)
class Ending:
    """How a canary's bake ends: `state` (passed, failed, inconclusive), `reason`, whether it rolls back, and
    the member at fault (a change set's)."""

    state: str
    reason: str
    rollback: bool
    culprit: Bake | None = None


class Rollouts(ShadowRuns):
    """The canary steps of this daemon's bakes (see the module docstring)."""

    def __init__(self, registry: Registry, deployer: Deployer, triton: TritonClient,
                 settings: Callable[[], Settings], clock: Callable[[], float] = time.time) -> None:
        super().__init__()
        self.registry = registry
        self.deployer = deployer
        self.triton = triton  # by public names (PublicNames): the routed digest's counts, without a gateway's
        self.settings = settings
        self.clock = clock
        self.traffic: TrafficFigures | None = None  # the gateway's figures (set by build_parts)
        self._asked: dict[str, tuple[int | str, ...]] = {}  # a deploy's own `load --steps`
        self._planned: dict[str, Planned] = {}
        # a fleet host: the first weight of a rollout step's deploy (the agent's), and the lanes it moved
        self._fleet_first: dict[tuple[str, str], int] = {}
        self._fleet_lanes: dict[str, tuple[str, list[Lane]]] = {}
        self._lock = threading.Lock()
        self._stepping = threading.Lock()  # the judging thread and a `promote` never move a canary on together

    # -- the switch's first weight ---------------------------------------------------------------------

    def ask(self, model: str, steps: tuple[int | str, ...] | None) -> None:
        """`load MODEL --steps [5, 25, 100]`: the next deploy of `model` goes through these steps."""
        with self._lock:
            if steps is None:
                self._asked.pop(model, None)
            else:
                self._asked[model] = steps

    def forget(self, model: str) -> None:
        """A deploy's outcome took its `--steps` and `--shadow` (or it was refused before any deploy)."""
        with self._lock:
            self._asked.pop(model, None)
        self.forget_shadow(model)

    def steps_of(self, model: str, digest: str) -> tuple[int | str, ...]:
        """The steps a deploy of `digest` goes through: `load --steps`, else the model's own config parameter,
        else the daemon's `canary_steps`."""
        with self._lock:
            asked = self._asked.get(model)
        if asked is not None:
            return asked
        own = self.parameters(model, digest).get("canary_steps")
        return tuple(own) if own else tuple(self.settings().canary_steps)

    def parameters(self, model: str, digest: str) -> dict[str, Any]:
        try:
            config = self.registry.snapshot_content(model, digest)[0] or {}
            return bake_parameters(config.get("parameters") or {})
        except (TritonctlError, ValueError) as exc:
            log.warning("%s: bake: the config's bake parameters are not used: %s", model, exc)
            return {}

    def weigh(self, lanes: list[Lane], bake_s: Callable[[str, str], float]) -> int:
        """The routed deploy path's question before its switch (see the module docstring). `bake_s(model,
        digest)`: how long that deploy would bake (the Baker's limits)."""
        try:
            return self._weigh(lanes, bake_s)
        except Exception:  # a canary never stops a deploy: the switch goes through at once
            log.exception("canary: planning the steps of %s failed; switched at once", [lane.model for lane in lanes])
            return 100

    def _weigh(self, lanes: list[Lane], bake_s: Callable[[str, str], float]) -> int:
        own = [lane for lane in lanes if lane.kind]
        if not own or any(lane.kind != "deploy" for lane in own):
            return 100
        if self.settings().fleet:  # the leader judges a fleet's canary wave (controlplane/fleet/bake.py)
            return self._fleet_weigh(own, lanes)
        if not any(lane.old is not None and lane.old.name != lane.new.name for lane in own):
            return 100  # a first deploy: nothing to split with
        choices = [self.steps_of(lane.model, lane.new.digest) for lane in own]
        steps = min(choices, key=lambda s: (_first_weight(s), -len(s)))
        baked = max(bake_s(lane.model, lane.new.digest) for lane in own)
        shadow = self.shadow_plan(own, lanes)
        if baked <= 0 and PAUSE not in steps:
            if shadow is None:
                return 100  # no bake, no pause: nothing would judge a step
            steps = AT_ONCE  # judged by its shadow only, then every request at once
        riders = tuple(lane for lane in lanes if not lane.kind and lane.old is not None)
        with self._lock:
            for i, lane in enumerate(own):
                self._planned[lane.model] = Planned(lane.new.digest, steps, (lane, *(riders if i == 0 else ())),
                                                    shadow=shadow)
        log.info("canary of %s: steps %s%s", ", ".join(lane.model for lane in own), list(steps),
                 f" after a shadow of {shadow.shadow_s:g} s" if shadow is not None else "")
        return 0 if shadow is not None else _first_weight(steps)

    def taken(self, model: str, digest: str) -> Planned | None:
        """The canary the deploy of `digest` began, for the bake its outcome starts; else a split the gateway
        routes for it that no canary drives (a daemon killed between a canary's switch and its commit: the
        recovery rolled it forward), which the bake takes on from the step of its weight now."""
        with self._lock:
            planned = self._planned.pop(model, None)
        if planned is not None and planned.digest == digest:
            return planned
        routes = self.deployer.aliases
        if not isinstance(routes, Routed) or self.settings().fleet:
            return None
        split = routes.split(model)
        if len(split) < 2 or split[0].digest != digest:
            return None
        weight = routes.weights().get(model, {}).get(digest, 0)
        steps = self.steps_of(model, digest)
        canary = Canary(steps, ())
        index = next((i for i in range(len(steps)) if canary.weight_at(i) == weight), 0)
        log.warning("%s: a split of %d%% no canary drove (a daemon stopped mid-switch): taken on at step %d",
                    model, weight, index + 1)
        return Planned(digest, steps, (Lane(model, split[0], split[1]),), index)

    # -- a fleet host's canary wave (the leader judges it: controlplane/fleet/bake.py) ----------------

    def fleet_first(self, model: str, digest: str, weight: int) -> None:
        """A rollout step's deploy of `digest` on this host begins at `weight` percent (its wave's first step)."""
        with self._lock:
            self._fleet_first[(model, digest)] = weight

    def _fleet_weigh(self, own: list[Lane], lanes: list[Lane]) -> int:
        with self._lock:
            weights = [self._fleet_first.pop((lane.model, lane.new.digest), 100) for lane in own]
        weight = min(weights)
        if weight >= 100 or not any(lane.old is not None and lane.old.name != lane.new.name for lane in own):
            return 100
        with self._lock:
            for lane in own:
                self._fleet_lanes[lane.model] = (lane.new.digest, [lane, *(x for x in lanes if not x.kind)])
        drainer = self.deployer.drainer
        for lane in lanes:  # the previous names stay loaded while the wave's canary runs: a rollback is a flip
            if drainer is not None and lane.old is not None:
                drainer.hold(lane.old.name)
        return weight

    def fleet_weight(self, model: str, digest: str, weight: int) -> bool:
        """The leader set the wave's next weight: this host's route of `model` follows (one update)."""
        with self._lock:
            found = self._fleet_lanes.get(model)
        if found is None or found[0] != digest:
            return weight >= 100  # nothing split here (a first deploy, no gateway): every request is its already
        return self.move_lanes(found[1], weight)

    def fleet_done(self, model: str, digest: str) -> None:
        """The wave's bake ended (the leader ended this host's bake step): the held names are released, and
        the ones no route uses drain."""
        with self._lock:
            found = self._fleet_lanes.get(model)
            if found is None or found[0] != digest:
                return
            del self._fleet_lanes[model]
        routed, drainer = self.deployer.routed, self.deployer.drainer
        if routed is None or drainer is None:
            return
        for lane in found[1]:
            if lane.old is not None:
                routed.release(lane.model, lane.old.name)
            drainer.retire(lane.model, lane.new.name)

    # -- a canary's life -------------------------------------------------------------------------------

    def attach(self, bake: Bake, planned: Planned) -> None:
        """`bake` (begun now) goes through `planned`'s steps: its window starts at the figures now, the
        ensembles riding along keep their previous names loaded (held) until it ends."""
        canary = bake.canary = Canary(planned.steps, planned.lanes, step_started=bake.started,
                                      shadow=self.began(planned.shadow, bake.started))
        canary.begin(planned.index, bake.started, self.zero(bake))
        self.hold(bake)
        if canary.shadow is not None:  # its first step begins once the shadow passed (shadowrun.py)
            self._audit(bake, canary.shadow.begin_line(bake.digest), action=SHADOW_ACTION)
            return
        self._audit(bake, canary.step_line(bake.limits.bake_s))

    def hold(self, bake: Bake) -> None:
        """The previous names of the lanes riding along (an ensemble bound again over a changed step) stay
        loaded while the canary runs (its own model's: the Baker's hold), so that a flip back finds them."""
        drainer = self.deployer.drainer
        if drainer is not None and bake.canary is not None:
            for lane in bake.canary.lanes[1:]:
                if lane.old is not None:
                    drainer.hold(lane.old.name)

    def ended(self, bake: Bake, how: str, reason: str, actor: str) -> None:
        """The canary of `bake` ended (`how`: done, rolled_back, aborted, superseded): audited; the names the
        routes no longer use drain (held ones released)."""
        canary = bake.canary
        if canary is None or canary.state in (DONE, ROLLED_BACK, ABORTED, SUPERSEDED):
            return
        outcome = Result.OK if how == DONE else Result.FAILED if how in (ROLLED_BACK, ABORTED) else Result.NOOP
        if canary.shadowing:  # ended before any step: the shadow's end, no step's
            assert canary.shadow is not None
            canary.shadow.end(how, reason, self.clock())
            self._audit(bake, canary.shadow.end_line(how, reason), outcome, actor, SHADOW_ACTION)
        else:
            self._audit(bake, canary.end_line(how, reason), outcome, actor)
        canary.state = how
        routed, drainer = self.deployer.routed, self.deployer.drainer
        if routed is None or drainer is None:
            return
        for lane in canary.lanes[1:]:
            if lane.old is not None:
                routed.release(lane.model, lane.old.name)
        for lane in canary.lanes:  # a name still routed stays (the drainer looks)
            drainer.retire(lane.model, lane.new.name)
            if lane.old is not None:
                drainer.retire(lane.model, lane.old.name)

    # -- judging a step --------------------------------------------------------------------------------

    def counts(self, bake: Bake) -> dict[str, Counts]:
        """digest → its cumulative figures: the gateway's, else Triton's of the digest the public name routes
        to first (the new one; no baseline then)."""
        if self.traffic is not None:
            return dict(self.traffic.counts(bake.model))
        total = Counts()
        for counts in self.triton.request_counts(bake.model).values():
            total = total.plus(Counts(counts.success + counts.failure, counts.failure, counts.success_ns / 1e9,
                                      counts.success))
        return {bake.digest: total}

    def zero(self, bake: Bake) -> dict[str, Counts]:
        try:
            return self.counts(bake)
        except TritonctlError as exc:
            log.warning("%s: canary: no figures at the step's start (%s); counting from 0", bake.model, exc)
            return {}

    def _window(self, bake: Bake, counts: dict[str, Counts]) -> tuple[Counts, tuple[str, float | None, float | None]]:
        """The new digest's figures in the step's window, and the latency judged: (p99 or mean, its ms, the
        previous digest's in the same window, else over all it served)."""
        canary = bake.canary
        assert canary is not None
        new = canary.window(bake.digest, counts.get(bake.digest))
        before = counts.get(bake.previous or "")
        old = canary.window(bake.previous, before)
        baseline = old if old.observed else (before or Counts())
        if new.buckets and baseline.buckets:
            return new, ("p99", new.quantile_ms(), baseline.quantile_ms())
        return new, ("mean", new.mean_ms(), baseline.mean_ms())

    def judge(self, members: list[Bake]) -> Ending | None:
        """A canary's step judged (a change set's members together): how the bake ends, or None (it goes on,
        perhaps on to its next step)."""
        with self._stepping:
            return self._judge(members)

    def _judge(self, members: list[Bake]) -> Ending | None:
        lead = members[0]
        if lead.canary is not None and lead.canary.shadowing:  # copies judged before any step (a model alone)
            failed = self.judge_shadow(lead)
            return Ending(failed[0], failed[1], True, lead) if failed is not None else None
        now = self.clock()
        windows: dict[str, tuple[Counts, str, str]] = {}
        for bake in members:
            canary = bake.canary
            assert canary is not None
            try:
                counts = self.counts(bake)
            except TritonctlError as exc:
                log.info("%s: canary: figures unavailable this round: %s", bake.model, exc)
                return None
            new, latency = self._window(bake, counts)
            bake.judged = latency if latency[1] is not None else None
            _tally(bake, canary.total.plus(new))
            verdict = judge(bake.limits, new.requests, new.failures, new.successes, latency,
                            canary.until(bake.limits.bake_s), now, functools.partial(_figures, bake, new))
            if verdict is not None and verdict[2]:  # any member crossing a limit: the whole canary fails
                state, reason, _ = verdict
                return Ending(state, f"{reason} at {canary.weight}% (step {canary.index + 1}/{len(canary.steps)})",
                              True, bake)
            if verdict is not None:
                windows[bake.model] = (new, verdict[0], verdict[1])
        if len(windows) < len(members):  # a member's window goes on
            return None
        return self._next(members, windows, now)

    def promote(self, members: list[Bake], actor: str) -> Ending | None:
        """`tritonctl promote`: the step now ends as passed and the next one begins (None); past the last
        step, the bake ends passed (the Ending). A gateway that does not take the next weight: GatewayError."""
        with self._stepping:
            return self._promote(members, actor)

    def _promote(self, members: list[Bake], actor: str) -> Ending | None:
        if members[0].canary is not None and members[0].canary.shadowing:  # on from the shadow to the first step
            self.promote_shadow(members[0], actor)
            return None
        now = self.clock()
        windows = {}
        for bake in members:
            try:
                new, _ = self._window(bake, self.counts(bake))
            except TritonctlError:
                new = Counts()
            windows[bake.model] = (new, "promoted", f"promoted by {actor}")
        return self._next(members, windows, now, actor=actor, strict=True)

    def _next(self, members: list[Bake], windows: dict[str, tuple[Counts, str, str]], now: float,
              actor: str = BAKE_ACTOR, strict: bool = False) -> Ending | None:
        """Every member's step ended (`windows`: its figures, state and reason): the next step for all of
        them (one route update when the weight changes), or past the last one the bake's end."""
        lead = members[0].canary
        assert lead is not None
        if not lead.last and lead.weight_at(lead.index + 1) != lead.weight:
            if not self.move(members, lead.weight_at(lead.index + 1), strict=strict):
                return None  # tried again next round
        for bake in members:
            canary = bake.canary
            assert canary is not None
            new, state, reason = windows[bake.model]
            canary.history.append({"step": canary.index, "weight": canary.weight, "started": iso(_utc(
                canary.step_started)), "ended": iso(_utc(now)), "outcome": state, "requests": new.requests,
                "failures": new.failures})
            canary.total = canary.total.plus(new)
            canary.inconclusive = canary.inconclusive or state == INCONCLUSIVE
        if lead.last:
            inconclusive = any(b.canary is not None and b.canary.inconclusive for b in members)
            state = INCONCLUSIVE if inconclusive else PASSED
            weights = list(dict.fromkeys(h["weight"] for h in lead.history))
            word = "inconclusive" if inconclusive else "passed"
            # one step at 100 % is the bake as it was before canary steps: its words too
            head = f"{word} every step ({' → '.join(f'{w}%' for w in weights)})" if weights != [100] else word
            return Ending(state, f"{head}: " + ("; ".join(_figures(b, None) for b in members))
                          + ("; kept" if inconclusive else ""), False)
        for bake in members:
            canary = bake.canary
            assert canary is not None
            canary.begin(canary.index + 1, now, self.zero(bake))
            self._audit(bake, canary.step_line(bake.limits.bake_s), actor=actor)
        return None

    # -- the routes ------------------------------------------------------------------------------------

    def move(self, members: list[Bake], weight: int, strict: bool = False) -> bool:
        """One route update giving every lane's new digest `weight` percent; False (`strict`: GatewayError)
        when a deploy lock is busy, the gateway refused it, or another operation moved a lane meanwhile."""
        return self.move_lanes([lane for bake in members if bake.canary is not None for lane in bake.canary.lanes],
                               weight, strict)

    def move_lanes(self, lanes: list[Lane], weight: int, strict: bool = False) -> bool:
        first = lanes[0].model if lanes else ""
        with self._locked({lane.model for lane in lanes}, wait_s=LOCK_WAIT_S if strict else 0.0) as got:
            mine = [lane for lane in lanes if lane.model in got and self._routed_to_canary(lane)]
            if len(mine) != len(lanes):
                log.info("canary of %s: a lane is busy or moved; the next weight waits", first)
                if strict:
                    raise TritonctlError(f"'{first}': another operation holds it; try again")
                return False
            try:
                self.deployer.aliases.switch({lane.model: lane.at(weight) for lane in lanes})
            except TritonctlError as exc:
                log.warning("canary of %s: the gateway did not take %d%%: %s", first, weight, exc)
                if strict:
                    raise
                return False
        log.info("canary of %s: %d%% of the requests on the new digest", ", ".join(sorted({ln.model for ln in lanes})),
                 weight)
        return True

    def flip_back(self, members: list[Bake]) -> list[str]:
        """Every request back on the previous digest at once: one route update for every lane whose previous
        name is still loaded (the bake held it) and still routed beside the canary's; the models flipped (a
        lane left out is brought back by the rollback that follows, which loads it first)."""
        routed = self.deployer.routed
        if routed is None:
            return []
        lanes = [lane for bake in members if bake.canary is not None for lane in bake.canary.lanes
                 if lane.old is not None]
        with self._locked({lane.model for lane in lanes}, wait_s=LOCK_WAIT_S) as got:
            back: dict[str, Target] = {}
            for lane in lanes:
                assert lane.old is not None
                if lane.model in got and self._routed_to_canary(lane) and routed.serves(lane.old.name, lane.old.digest):
                    back[lane.model] = lane.old
            if back:
                try:
                    self.deployer.aliases.switch(dict(back))
                except TritonctlError as exc:
                    log.error("canary of %s: flipping back failed (%s); the rollback brings it back",
                              members[0].model, exc)
                    return []
        if back:
            log.warning("canary of %s: every request back on the previous digest", ", ".join(sorted(back)))
        return sorted(back)

    def _routed_to_canary(self, lane: Lane) -> bool:
        """The gateway still routes `lane`'s public name to the canary's new digest (first)."""
        target = self.deployer.aliases.target(lane.model)
        return target is not None and target.name == lane.new.name

    @contextmanager
    def _locked(self, models: set[str], wait_s: float) -> Iterator[set[str]]:
        """The deploy locks of `models` (sorted: no deadlock with a change set), each waited for `wait_s` at
        most; yields the models whose lock was taken."""
        with ExitStack() as stack:
            got: set[str] = set()
            for model in sorted(models):
                lock = self.deployer.lock(model)
                if lock.acquire(timeout=wait_s) if wait_s > 0 else lock.acquire(blocking=False):
                    stack.callback(lock.release)
                    got.add(model)
            yield got

    def _audit(self, bake: Bake, message: str, outcome: Result = Result.OK, actor: str = BAKE_ACTOR,
               action: str = CANARY_ACTION) -> None:
        try:
            self.registry.audit(AuditEntry(actor, action, bake.model, bake.digest, outcome.value, message,
                                           int((self.clock() - bake.started) * 1000)))
        except TritonctlError as exc:
            log.error("%s: canary: audit: %s", bake.model, exc)


def _first_weight(steps: tuple[int | str, ...]) -> int:
    return Canary(steps, ()).weight_at(0)


def _tally(bake: Bake, total: Counts) -> None:
    """The bake's figures (status, its audit line): the new digest's over every step so far."""
    t = bake.tally
    t.requests, t.failures, t.success, t.success_ns = total.requests, total.failures, total.successes, \
        int(total.latency_s * 1e9)


def _figures(bake: Bake, window: Counts | None) -> str:
    """A step's figures (`window`), or the whole bake's (None), as the audit says them."""
    if window is None:
        return f"{bake.model}: {bake.figures()}" if bake.group_id else bake.figures()
    ratio = window.failures / window.requests if window.requests else None
    text = (f"failure ratio {ratio:.2f} over {window.requests} requests ({window.failures} failed)"
            if ratio is not None else "no requests")
    if bake.judged is not None and bake.judged[1] is not None and bake.judged[2]:
        text += f", {bake.judged[0]} latency {bake.judged[1]:.1f} ms (previous digest: {bake.judged[2]:.1f} ms)"
    return text


def _utc(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, timezone.utc).replace(tzinfo=None)

