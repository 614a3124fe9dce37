"""A fleet rollout's bake (docs/bake.md, "Sets and fleets"): a wave that took the new digest bakes before
the next wave starts and before the rollout is done, on its hosts' figures pooled at the leader.

The canary wave bakes `bake_s` long on the daemon's bake limits (a model's own `tritonctl.bake_*`
parameters override them, as on a single host); each later wave `wave_bake_s` long (0, the default: it
does not bake). Each host of the wave that took the digest gets a `bake` step (FleetStore.add_bake_steps);
that host claims it and, every round until the leader ends it, writes on it what its own tritonserver
counted for the model since the claim (`HostBakes`: requests, failures, the time the successful ones
took; a counter that went down is a reset, as on a single host). The leader sums the steps' figures
(`WaveBakes`) and judges the sum as a single host's bake is judged (controlplane.bake.figures.verdict): a crossed
limit ends the bake `failed` at once, and the rollout stops and rolls back every host that took the
digest (not quarantined: it failed on this traffic, `tritonctl load --digest` may try it again); at the
end of the wave's bake time it passed (or is inconclusive: kept, or rolled back with
`bake_inconclusive = "rollback"`) and the rollout goes on. The pooled document is the rollout's `bake`
(`tritonctl rollouts`), each host's figures its step's `figures`; each end is audited as action `bake`.
A digest the whole fleet served before (an earlier rollout of it completed: what a fleet rollback
returns to) does not bake again. The latency limit is not applied in a fleet (no baseline is measured
there; the document has no `baseline_latency_ms`).

Canary steps (docs/bake.md "Sets and fleets"): the canary wave takes the model's `tritonctl.canary_steps`,
else the daemon's `canary_steps`; each later wave `wave_steps` (default [100]: at once). Where a wave's steps
split the requests, each of its hosts' deploys gives the new digest the first weight on its own gateway
(`steps_of_wave`, asked by the agent before the deploy), the leader judges each step on the pooled figures of
the step's window (the bake document's `canary`: its steps, the step now, its weight, the pooled figures when
it began), and a step passed sets the next weight in the document, which every host of the wave applies to
its route (`HostBakes`). A host's figures are its gateway's for the new digest where it has one (error
responses are failures there), else its tritonserver's. A `pause` is not honoured in a fleet (`promote`
acts on one host): the wave goes on to the next weight.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

from controlplane.bake.figures import AUDIT_OUTCOME, BAKING, FAILED, INCONCLUSIVE, Bake, Limits, Tally, judge, verdict
from controlplane.base.jsontext import iso
from controlplane.errors import TritonctlError
from controlplane.fleet.hostplane import HostPlane
from controlplane.fleet.settings import FleetSettings
from controlplane.settings.canarysteps import PAUSE
from controlplane.settings.config import Settings
from controlplane.settings.modelparams import bake_parameters
from controlplane.store.fleet import FleetStore, audit_event
from controlplane.store.records import Rollout, Step
from controlplane.store.registry import Registry

log = logging.getLogger("tritonctl.fleet")

BAKE = "bake"  # a rollout step's action: this host bakes the digest its wave took


def figures(tally: Tally) -> dict[str, int]:
    return {"requests": tally.requests, "failures": tally.failures, "success": tally.success,
            "success_ns": tally.success_ns}


def steps_of_wave(settings: Settings, parameters: dict[str, Any], wave: int) -> tuple[int, ...]:
    """The weights a wave's hosts go through: the canary wave the model's own `canary_steps`, else the daemon's;
    each later wave `wave_steps`. Pauses are left out (not honoured in a fleet)."""
    steps = (parameters.get("canary_steps") or settings.canary_steps) if wave == 0 else settings.wave_steps
    return tuple(int(s) for s in steps if s != PAUSE) or (100,)


def first_weight(settings: Settings, parameters: dict[str, Any], wave: int) -> int:
    """The percent of the requests a rollout step's deploy gives the new digest on its host: its wave's first
    step where that wave bakes (`bake_s`, `wave_bake_s`), else 100."""
    bake_s = parameters.get("bake_s", settings.bake_s) if wave == 0 else settings.wave_bake_s
    return steps_of_wave(settings, parameters, wave)[0] if bake_s > 0 else 100


def tally_of(steps: list[Step]) -> Tally:
    """The figures of `steps` summed (a step that wrote none yet adds nothing)."""
    total = Tally()
    for step in steps:
        f = step.figures or {}
        total.requests += int(f.get("requests", 0))
        total.failures += int(f.get("failures", 0))
        total.success += int(f.get("success", 0))
        total.success_ns += int(f.get("success_ns", 0))
    return total


class HostBakes:
    """This host's bake steps: its own tritonserver's figures of each, written on the step every round
    until the leader ends it (the agent thread calls `take` with the steps it claimed, `tick` each round)."""

    def __init__(self, plane: HostPlane, store: FleetStore) -> None:
        self.plane = plane
        self.store = store
        self._steps: dict[int, tuple[Step, Tally]] = {}
        self._weights: dict[int, int] = {}  # a canary wave's weight this host's route has now, per bake step

    def take(self, steps: list[Step]) -> None:
        """Bake steps claimed now: counted from Triton's figures now on (a step claimed again after this
        daemon restarted keeps the figures it had written)."""
        for step in steps:
            before = tally_of([step])
            try:
                before.last = dict(self.plane.bake_counts(step.model, step.digest or ""))
            except TritonctlError as exc:
                log.info("%s: bake step %s: no figures at its start (%s); counting from 0", step.model, step.id, exc)
            self._steps[step.id] = (step, before)
            log.info("%s: rollout %s: baking %s on this host", step.model, step.rollout_id, (step.digest or "")[:12])
            self._write(step, before)

    def tick(self) -> None:
        for step, tally in list(self._steps.values()):
            try:
                tally.add(self.plane.bake_counts(step.model, step.digest or ""))
            except TritonctlError as exc:
                log.info("%s: bake: figures unavailable this round: %s", step.model, exc)
                continue
            if self._write(step, tally):
                self._follow(step)

    def _write(self, step: Step, tally: Tally) -> bool:
        if not self.store.set_figures(step.id, figures(tally)):  # the leader ended the step
            self._steps.pop(step.id, None)
            self._weights.pop(step.id, None)
            self.plane.canary_done(step.model, step.digest or "")
            return False
        return True

    def _follow(self, step: Step) -> None:
        """A canary wave: this host's route takes the weight the leader set for the wave now."""
        bake = self.store.rollout(step.rollout_id).bake or {}
        canary = bake.get("canary") if bake.get("wave") == step.wave else None
        weight = int(canary["weight"]) if canary else None
        if weight is not None and self._weights.get(step.id) != weight:
            if self.plane.canary_weight(step.model, step.digest or "", weight):
                self._weights[step.id] = weight
                log.info("%s: rollout %s: %d%% of the requests on %s here", step.model, step.rollout_id, weight,
                         (step.digest or "")[:12])


class WaveBakes:
    """The leader's side: each running rollout's last finished wave bakes before the rollout goes on
    (RolloutMachine.drive asks `hold` each round)."""

    def __init__(self, store: FleetStore, registry: Registry, fleet: Callable[[], FleetSettings], host: str,
                 clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.registry = registry  # the shared registry: the model's own bake parameters
        self.fleet = fleet
        self.host = host
        self.clock = clock

    def hold(self, rollout: Rollout, steps: list[Step], open_waves: list[int]) -> tuple[bool, str | None]:
        """(whether the rollout waits for a bake, the reason it stops and rolls back: a failed bake)."""
        deploys = [s for s in steps if s.action == "deploy"]
        ended = sorted({s.wave for s in deploys if not open_waves or s.wave < open_waves[0]})
        if not ended or not rollout.digest:
            return False, None
        wave = ended[-1]
        took = sorted(s.host for s in deploys if s.wave == wave and s.state == "ok")
        if not took:
            return False, None
        limits = self._limits(rollout.model, rollout.digest)
        bake_s = limits.bake_s if wave == 0 else self.fleet().wave_bake_s
        if bake_s <= 0:
            return False, None
        limits = replace(limits, bake_s=bake_s)
        document = rollout.bake if rollout.bake and rollout.bake.get("wave") == wave else None
        if document is None and rollout.bake is None and self.store.served_before(rollout):
            return False, None  # a digest the whole fleet served before (a rollback's): no bake, as on one host
        weights = steps_of_wave(self.fleet().bake, self._parameters(rollout.model, rollout.digest), wave)
        if document is None:
            bake = Bake(rollout.model, rollout.digest, rollout.previous_digest, limits, self.clock(), Tally())
            document = self._document(bake, wave, took)
            if weights != (100,):
                document["canary"] = {"steps": list(weights), "step": 0, "weight": weights[0],
                                      "step_started": self.clock(), "zero": figures(Tally()), "history": []}
            self.store.add_bake_steps(rollout.id, took, rollout.digest, wave, document)
            log.info("%s: rollout %s: %s bakes %s for %.0f s on %s", rollout.model, rollout.id, _label(wave),
                     rollout.digest[:12], bake_s, ", ".join(took))
            return True, None
        if document["state"] != BAKING:  # ended: on, or (a failed bake whose stop did not go through) stop
            rolls_back = document["state"] == FAILED or (document["state"] == INCONCLUSIVE
                                                         and limits.inconclusive == "rollback")
            return False, (f"bake failed: {document['reason']}" if rolls_back else None)
        mine = [s for s in steps if s.action == BAKE and s.wave == wave]
        started = datetime.fromisoformat(str(document["started"]).replace("Z", "+00:00")).timestamp()
        bake = Bake(rollout.model, rollout.digest, rollout.previous_digest, limits, started, tally_of(mine))
        canary = document.get("canary")
        ended_now = verdict(bake, self.clock()) if canary is None else self._step(bake, canary)
        if ended_now is None:
            updated = {**self._document(bake, wave, took), **({"canary": canary} if canary else {})}
            if canary:
                updated["until"] = iso(_utc(float(canary["step_started"]) + limits.bake_s))
            if updated != document:
                self.store.set_rollout(rollout.id, None, bake=updated)
            return True, None
        bake.state, bake.reason, rolls_back = ended_now
        self.store.set_steps(rollout.id, ("pending", "running"), FAILED if rolls_back else "ok", wave=wave,
                             message=bake.reason)
        audit = audit_event("fleet", BAKE, rollout.model, rollout.digest, AUDIT_OUTCOME[bake.state],
                            f"rollout {rollout.id} {_label(wave)} on {', '.join(took)}: {bake.reason}")
        self.store.set_rollout(rollout.id, None, audit=audit, host=self.host, bake=self._document(bake, wave, took))
        log.log(logging.WARNING if rolls_back else logging.INFO, "%s: rollout %s: %s bake %s: %s", rollout.model,
                rollout.id, _label(wave), bake.state, bake.reason)
        return False, (f"bake failed: {bake.reason}" if rolls_back else None)

    def _step(self, bake: Bake, canary: dict[str, Any]) -> tuple[str, str, bool] | None:
        """A canary wave's step judged on the pooled figures of its window (`canary` is the document's, changed
        in place when the step passed: the next weight, which the hosts follow). The bake's end, or None."""
        zero, now = canary["zero"], self.clock()
        pooled = figures(bake.tally)
        requests, failures, success, success_ns = (max(0, pooled[k] - int(zero.get(k, 0)))
                                                    for k in ("requests", "failures", "success", "success_ns"))
        window = Tally(requests, failures, success, success_ns)
        until = float(canary["step_started"]) + bake.limits.bake_s
        where = f"at {canary['weight']}% (step {canary['step'] + 1}/{len(canary['steps'])})"
        ended = judge(bake.limits, window.requests, window.failures, window.success,
                      ("mean", window.mean_ms(), None), until, now, bake.figures)
        if ended is None or ended[2]:
            return None if ended is None else (ended[0], f"{ended[1]} {where}", True)
        canary["history"].append({"step": canary["step"], "weight": canary["weight"],
                                  "started": iso(_utc(float(canary["step_started"]))), "ended": iso(_utc(now)),
                                  "outcome": ended[0], "requests": window.requests, "failures": window.failures})
        if canary["step"] + 1 >= len(canary["steps"]):
            return ended[0], f"{ended[1]}; every step ({' → '.join(f'{w}%' for w in canary['steps'])})", False
        canary.update(step=canary["step"] + 1, weight=canary["steps"][canary["step"] + 1], step_started=now,
                      zero=pooled)
        log.info("%s: canary wave: %d%% of the requests on %s", bake.model, canary["weight"], bake.digest[:12])
        return None

    def _parameters(self, model: str, digest: str) -> dict[str, Any]:
        try:
            config = self.registry.get_snapshot(model, digest).config or {}
            return bake_parameters(config.get("parameters") or {})
        except (TritonctlError, ValueError) as exc:
            log.warning("%s: bake: the config's bake parameters are not used: %s", model, exc)
            return {}

    def _limits(self, model: str, digest: str) -> Limits:
        """The daemon's bake limits, overridden by the model's own config parameters."""
        return Limits.of(self.fleet().bake).with_model(self._parameters(model, digest))

    @staticmethod
    def _document(bake: Bake, wave: int, hosts: list[str]) -> dict[str, Any]:
        """The rollout's `bake`: the single host's bake document, pooled, with its wave and hosts (no
        baseline latency: none is measured in a fleet)."""
        document = {**bake.to_json(), "wave": wave, "hosts": hosts}
        document.pop("baseline_latency_ms", None)
        return document


def _utc(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, timezone.utc).replace(tzinfo=None)


def _label(wave: int) -> str:
    return "the canary wave" if wave == 0 else f"wave {wave}"
