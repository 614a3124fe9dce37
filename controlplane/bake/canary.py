"""A canary's record: the steps a new digest goes through where a gateway carries the traffic, the step it is
at, the route lanes it moves, and the figures of the step's window (docs/bake.md, "Canary steps").

`canary_steps` is a list of percents of the requests (`[10, 100]`), `pause` waiting for `tritonctl
promote`. The deploy's switch gives the new digest the first weight (controlplane/deploy/routed.py asks
the bake's `weigh`); each step then bakes `bake_s` judged on the gateway's figures of the new digest alone
in the step's window, against the previous digest's in the same window; a step passed sets the next
weight (one route update for every lane: a change set's members and the ensembles bound again over them
move together); the last one done leaves every request on the new digest. The driver is
controlplane/bake/rollout.py; this module is the record (kept in `<state>/bakes.json` with its bake, so a
restarted daemon resumes the step), its JSON (`status --json` `canary`), and the audit lines each step
writes (action `canary`), which `tritonctl versions` reads back as each rollout's history.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from controlplane.bake.shadow import ShadowPhase
from controlplane.bake.traffic import Counts
from controlplane.deploy.aliases import Lane, Target, Weighted
from controlplane.settings.canarysteps import PAUSE

# in progress: a step bakes, a pause waits for `tritonctl promote`, or the shadow before the first step runs
RUNNING, PAUSED, SHADOW = "running", "paused", "shadow"
# ended: every request on the new digest; back on the previous one (a limit crossed); aborted by hand
# (`tritonctl abort`); another operation changed what the model serves (a deploy, a rollback, an unload)
DONE, ROLLED_BACK, ABORTED, SUPERSEDED = "done", "rolled_back", "aborted", "superseded"
STATES = (RUNNING, PAUSED, SHADOW, DONE, ROLLED_BACK, ABORTED, SUPERSEDED)
CANARY_ACTION = "canary"  # the audit action of each step and of a canary's end
STEP_LINE = re.compile(r"^step (\d+)/(\d+): (\d+)%")
END_LINE = re.compile(r"^(done|rolled_back|aborted|superseded) at (\d+)%")


@dataclass
class Canary:
    """One bake's canary: `steps` (weights and pauses), the step now (`index`, since `step_started`), the
    lanes it moves (its own model's first; a change set's ensembles bound again ride on its first member's),
    each digest's figures when the step began (`zero`: the gateway's counters are cumulative and outlive a
    daemon restart, so a resumed step's window still starts there), and the steps reached (`history`)."""

    steps: tuple[int | str, ...]
    lanes: tuple[Lane, ...]
    index: int = 0
    step_started: float = field(default_factory=time.time)
    zero: dict[str, Counts] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    state: str = RUNNING
    total: Counts = field(default_factory=Counts)  # the new digest's figures in the steps already ended
    inconclusive: bool = False  # a step ended with too few requests (kept): the whole canary is inconclusive
    shadow: ShadowPhase | None = None  # judged on copies before its first step (controlplane/bake/shadow.py)

    @property
    def shadowing(self) -> bool:
        """The shadow before the first step runs: no step has begun, no client request reaches the new digest."""
        return self.shadow is not None and self.shadow.running

    def weight_at(self, index: int) -> int:
        """The percent of the requests the new digest has at step `index` (a pause keeps the one before it; a
        pause first: 0, the new digest is reached by pinning only)."""
        for step in reversed(self.steps[:index + 1]):
            if step != PAUSE:
                return int(step)
        return 0

    @property
    def weight(self) -> int:
        return self.weight_at(self.index)

    @property
    def paused(self) -> bool:
        return self.steps[self.index] == PAUSE

    @property
    def last(self) -> bool:
        return self.index >= len(self.steps) - 1

    def until(self, bake_s: float) -> float:
        """When the step's window ends (a pause: never, until promoted)."""
        return math.inf if self.paused else self.step_started + bake_s

    def window(self, digest: str | None, now: Counts | None) -> Counts:
        """`digest`'s figures in this step's window: since the step began (a counter reset: since the reset)."""
        return now.minus(self.zero.get(digest or "")) if now is not None else Counts()

    def begin(self, index: int, now: float, zero: dict[str, Counts]) -> None:
        self.index, self.step_started, self.zero = index, now, dict(zero)
        self.state = PAUSED if self.paused else RUNNING

    def moves(self, weight: int | None = None) -> dict[str, Target | Weighted]:
        """Every lane's route at `weight` (default the step's): the switch a step makes."""
        at = self.weight if weight is None else weight
        return {lane.model: lane.at(at) for lane in self.lanes}

    def step_line(self, bake_s: float) -> str:
        """The audit line of the step now (action `canary`): `step 1/2: 10% of the requests for 60 s`."""
        where = f"step {self.index + 1}/{len(self.steps)}: {self.weight}%"
        if self.paused:
            return f"{where} of the requests, paused until `tritonctl promote`"
        return f"{where} of the requests for {bake_s:g} s"

    def end_line(self, how: str, reason: str) -> str:
        """The audit line of the canary's end (`how`: done, rolled_back, aborted, superseded):
        `rolled_back at 10% (step 1/2): failure ratio 0.20 > 0.01 over 21 requests (4 failed)`."""
        return f"{how} at {self.weight}% (step {self.index + 1}/{len(self.steps)}): {reason}"

    def to_json(self, bake_s: float, now: float | None = None) -> dict[str, Any]:
        """`status --json`'s `canary`: the step (from 0), the steps, the weight now, seconds left in the step
        (None while paused or ended), the state."""
        until = self.until(bake_s)
        left = None if self.state not in (RUNNING,) or until == math.inf else \
            max(0, int(round(until - (time.time() if now is None else now))))
        if self.shadow is not None and self.shadow.state in (RUNNING, ROLLED_BACK, ABORTED, SUPERSEDED):  # no step yet
            shadowing = self.shadowing and self.state in (RUNNING, PAUSED)
            return {"step": self.index, "steps": list(self.steps), "weight": 0,
                    "state": SHADOW if shadowing else self.state,
                    "seconds_left": self.shadow.to_json(now)["seconds_left"] if shadowing else None, "history": []}
        return {"step": self.index, "steps": list(self.steps), "weight": self.weight, "seconds_left": left,
                "state": self.state, "history": [dict(h) for h in self.history]}

    def to_record(self) -> dict[str, Any]:
        return {"steps": list(self.steps), "index": self.index, "step_started": self.step_started,
                "lanes": [_lane_record(lane) for lane in self.lanes], "state": self.state,
                "zero": {d: asdict(c) for d, c in self.zero.items()},
                "history": self.history, "inconclusive": self.inconclusive, "total": asdict(self.total),
                "shadow": self.shadow.to_record() if self.shadow is not None else None}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Canary:
        return cls(tuple(int(s) if s != PAUSE else PAUSE for s in record["steps"]),
                   tuple(_lane_of(lane) for lane in record["lanes"]), int(record["index"]),
                   float(record["step_started"]), {d: _counts_of(c) for d, c in (record.get("zero") or {}).items()},
                   list(record.get("history") or []), str(record.get("state") or RUNNING),
                   _counts_of(record["total"]) if record.get("total") else Counts(),
                   bool(record.get("inconclusive", False)),
                   ShadowPhase.from_record(record["shadow"]) if record.get("shadow") else None)


def _lane_record(lane: Lane) -> dict[str, Any]:
    return {"model": lane.model, "new": [lane.new.name, lane.new.digest],
            "old": [lane.old.name, lane.old.digest] if lane.old is not None else None, "kind": lane.kind}


def _lane_of(record: dict[str, Any]) -> Lane:
    old = record.get("old")
    return Lane(str(record["model"]), Target(*record["new"]), Target(*old) if old else None,
                str(record.get("kind") or ""))


def _counts_of(record: dict[str, Any]) -> Counts:
    return Counts(int(record["requests"]), int(record["failures"]), float(record["latency_s"]),
                  int(record["observed"]), tuple(float(b) for b in record.get("buckets") or ()),
                  tuple(int(c) for c in record.get("cumulative") or ()))


def histories(entries: Iterable[Any]) -> dict[str, dict[str, Any]]:
    """digest → its last rollout's history, from a model's `canary` audit records (newest first):
    {"weights": the weights its steps reached in order, "state": how it ended (`running` while it goes
    on), "reason": the end's line}. `tritonctl versions` shows it."""
    found: dict[str, dict[str, Any]] = {}
    done: set[str] = set()
    for entry in entries:  # newest first: a digest's last rollout is read back to its step 1
        digest = entry.digest
        if not digest or digest in done or entry.action != CANARY_ACTION:
            continue
        history = found.setdefault(digest, {"weights": [], "state": RUNNING, "reason": ""})
        ended, step = END_LINE.match(entry.message), STEP_LINE.match(entry.message)
        if ended is not None and not history["weights"] and history["state"] == RUNNING:
            history["state"], history["reason"] = ended.group(1), entry.message
        elif step is not None:
            weight = int(step.group(3))
            if weight not in history["weights"]:
                history["weights"].insert(0, weight)
            if step.group(1) == "1":
                done.add(digest)
    return found


def weights_text(history: dict[str, Any]) -> str:
    """`canary 10% → 100% passed`: a rollout's history in one phrase (the versions table's note)."""
    steps = " → ".join(f"{w}%" for w in history["weights"]) or "-"
    return f"canary {steps} {history['state'].replace('_', ' ')}"
