"""The shadow before a canary's first step, driven (docs/bake.md "Shadow"): planned at the deploy's switch, judged
on the gateway's figures of its pairs, and left for the first step when it passes or is promoted.

`ShadowRuns` is a part of `Rollouts` (controlplane/bake/rollout.py, which inherits it), kept apart so that each
module holds one thing: here what is the shadow's own, there the canary's steps it leads into.

- `shadow_plan(own, lanes)`: whether the deploy the switch moves is shadowed first. Only a deploy of one model
  with a previous digest that no ensemble rides along with (a change set, or an ensemble bound again over a
  changed step, goes to its steps at once: a copy of an ensemble's requests would not judge its step alone),
  where the gateway's figures are read, when `load --shadow` or `shadow_s` says so. Its switch then gives the
  new digest weight 0 and names it the route's shadow (`shadow_spec`, which the routed deploy path asks).
- `judge_shadow(bake)`: the gateway's figures of the shadow read (`TrafficFigures.shadow`) and judged with
  the bake's limits (controlplane/bake/shadow.py `judge`): a crossed limit is the caller's rollback; passed,
  or inconclusive and kept, goes on to the first step (`leave_shadow`).
- `leave_shadow`: one route update to the first step's weight (the shadow's copies stop with it), the
  shadow's end audited (action `shadow`), the first step begun and audited (action `canary`). `promote` does
  it by hand, for a model whose answers legitimately change.
"""

from __future__ import annotations

import logging
import secrets
import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from controlplane.bake.figures import FAILED, INCONCLUSIVE, Bake
from controlplane.bake.shadow import PROMOTED, SHADOW_ACTION, ShadowPhase, judge
from controlplane.bake.traffic import TrafficFigures
from controlplane.deploy.aliases import Lane
from controlplane.errors import TritonctlError
from controlplane.settings.config import Settings
from controlplane.vocab import BAKE_ACTOR, Result

log = logging.getLogger("tritonctl.bake")


class ShadowRuns:
    """The shadow phase of `Rollouts` (see the module docstring); Rollouts provides the attributes below."""

    settings: Callable[[], Settings]
    clock: Callable[[], float]
    traffic: TrafficFigures | None
    _lock: threading.Lock
    _planned: dict[str, Any]

    def __init__(self) -> None:
        self._asked_shadow: dict[str, float] = {}  # a deploy's own `load --shadow`

    def ask_shadow(self, model: str, shadow_s: float | None) -> None:
        """`load MODEL --shadow 5m`: the next deploy of `model` is shadowed this long first (0: not at all)."""
        with self._lock:
            if shadow_s is None:
                self._asked_shadow.pop(model, None)
            else:
                self._asked_shadow[model] = shadow_s

    def forget_shadow(self, model: str) -> None:
        with self._lock:
            self._asked_shadow.pop(model, None)

    def shadow_plan(self, own: list[Lane], lanes: list[Lane]) -> ShadowPhase | None:
        """The shadow the switch of `own` begins with, or None (see the module docstring)."""
        if len(own) != 1 or len(lanes) != 1 or self.traffic is None:
            return None
        lane = own[0]
        if lane.old is None or lane.old.name == lane.new.name:
            return None
        settings = self.settings()
        with self._lock:
            shadow_s = self._asked_shadow.get(lane.model, settings.shadow_s)
        if shadow_s <= 0:
            return None
        return ShadowPhase(secrets.token_hex(8), shadow_s, 0.0, settings.shadow_fraction, settings.shadow_rtol,
                           settings.shadow_atol, settings.shadow_keep_inputs, settings.shadow_min_agreement)

    def shadow_spec(self, lane: Lane) -> Mapping[str, Any] | None:
        """The routed deploy path's question at its switch: the route's `shadow` for `lane`, or None."""
        with self._lock:
            planned = self._planned.get(lane.model)
        shadow = getattr(planned, "shadow", None)
        if planned is None or shadow is None or planned.digest != lane.new.digest:
            return None
        return shadow.spec()  # type: ignore[no-any-return]

    @staticmethod
    def began(phase: ShadowPhase | None, started: float) -> ShadowPhase | None:
        return replace(phase, started=started) if phase is not None else None

    # -- judging ------------------------------------------------------------------------------------

    def read_shadow(self, bake: Bake) -> None:
        """The gateway's figures of the shadow, kept on it (a round the gateway does not answer keeps the last)."""
        phase = bake.canary.shadow if bake.canary is not None else None
        if phase is None or self.traffic is None:
            return
        try:
            found = self.traffic.shadow(phase.id)
        except TritonctlError as exc:
            log.info("%s: shadow: figures unavailable this round: %s", bake.model, exc)
            return
        if found is not None:
            phase.figures = dict(found)

    def judge_shadow(self, bake: Bake) -> tuple[str, str] | None:
        """The shadow judged now: (state, reason) when it fails (the caller rolls back), else None (it goes on,
        or it ended and the first step began)."""
        phase = bake.canary.shadow if bake.canary is not None else None
        assert phase is not None
        self.read_shadow(bake)
        verdict = judge(phase, bake.limits, self.clock())
        if verdict is None:
            return None
        state, reason, rollback = verdict
        if rollback:
            return (FAILED if state == FAILED else INCONCLUSIVE), f"shadow {reason}"
        self.leave_shadow(bake, state, reason)
        return None

    def leave_shadow(self, bake: Bake, state: str, reason: str, actor: str = BAKE_ACTOR, strict: bool = False) -> bool:
        """The shadow ends (`state`: passed, inconclusive, promoted) and the first step begins: one route update to
        its weight; False (`strict`: TritonctlError) when it cannot be made now (tried again next round)."""
        canary = bake.canary
        assert canary is not None and canary.shadow is not None
        if not self.move([bake], canary.weight_at(0), strict=strict):
            return False
        now = self.clock()
        canary.shadow.end(state, reason, now)
        outcome = Result.INCONCLUSIVE if state == INCONCLUSIVE else Result.OK
        self._audit(bake, canary.shadow.end_line(state, reason), outcome, actor, SHADOW_ACTION)
        canary.begin(0, now, self.zero(bake))
        self._audit(bake, canary.step_line(bake.limits.bake_s), Result.OK, actor)
        log.info("%s: shadow of %s %s; canary step 1 at %d%%", bake.model, bake.digest[:12], state, canary.weight)
        return True

    def promote_shadow(self, bake: Bake, actor: str) -> None:
        """`tritonctl promote` during the shadow: it ends `promoted` whatever its figures, and the first step
        begins (a model whose answers legitimately change)."""
        phase = bake.canary.shadow if bake.canary is not None else None
        assert phase is not None
        self.read_shadow(bake)
        self.leave_shadow(bake, PROMOTED, f"promoted by {actor}: {phase.text()}", actor, strict=True)

    # -- provided by Rollouts -------------------------------------------------------------------------

    def move(self, members: list[Bake], weight: int, strict: bool = False) -> bool:
        raise NotImplementedError

    def zero(self, bake: Bake) -> dict[str, Any]:
        raise NotImplementedError

    def _audit(self, bake: Bake, message: str, outcome: Result = Result.OK, actor: str = BAKE_ACTOR,
               action: str = "canary") -> None:
        raise NotImplementedError
