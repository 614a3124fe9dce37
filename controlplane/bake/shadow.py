"""A shadow's record and its judgement (docs/bake.md "Shadow"): before a canary's first step, the new digest is
judged on copies of live requests whose answers no client gets.

Where a gateway carries the traffic and `shadow_s` (or a deploy's `load --shadow 5m`) is above 0, a deploy of
one model with a previous digest switches to a route that serves every request from the previous digest and
names the new one, at weight 0, the route's `shadow` (controlplane/deploy/aliases.py `Lane.at`). The gateway
copies the requests (`shadow_fraction` of them, up to its rate limit: docs/gateway.md "Shadow") and compares
each pair of answers: output names, shapes and datatypes equal; BYTES, BOOL and integer outputs equal;
floating ones within `shadow_rtol` / `shadow_atol`; one side failing is an error (of that side). This module
keeps what the bake needs of it (its `id` in the gateway's figures, its time, its tolerances, the last
figures read) and `judge`s it with the bake's limits, once `bake_min_requests` pairs came:

- `errors`: pairs where the new version failed and the serving one answered, over all pairs, against
  `bake_max_failure_ratio`;
- `agreement`: pairs that agreed over all pairs, at least `shadow_min_agreement` (1.0 by default: any
  answer that differs beyond the tolerances fails it);
- `latency_ratio`: the new version's p99 over the serving one's, both measured by the gateway on the same
  pairs, against `bake_max_latency_ratio` (off by default).

A crossed limit rolls the deploy back before any client saw the new version; at the end of `shadow_s`
the shadow `passed` (or is `inconclusive` with too few pairs: kept, or rolled back with
`bake_inconclusive = "rollback"`) and the canary goes on to its first step. The driver is
controlplane/bake/rollout.py; each begin and end is audited as action `shadow` (`begin_line`, `end_line`).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

from controlplane.bake.traffic import of_figure
from controlplane.base.jsontext import iso

SHADOW_ACTION = "shadow"  # the audit action of a shadow's begin and end
RUNNING, PASSED, INCONCLUSIVE, FAILED, PROMOTED = "running", "passed", "inconclusive", "failed", "promoted"
# ended with its canary before any step: a crossed limit, by hand, another operation
ROLLED_BACK, ABORTED, SUPERSEDED = "rolled_back", "aborted", "superseded"
STATES = (RUNNING, PASSED, INCONCLUSIVE, PROMOTED, ROLLED_BACK, ABORTED, SUPERSEDED)


@dataclass
class ShadowPhase:
    """One deploy's shadow: its `id` (the gateway's figures of it), how long, since when, its tolerances and
    limits, how it stands, and the gateway's figures as last read (`figures`: controlplane/gateway/shadow.py)."""

    id: str
    shadow_s: float
    started: float
    fraction: float = 1.0
    rtol: float = 1e-5
    atol: float = 1e-8
    keep_inputs: bool = False
    min_agreement: float = 1.0
    state: str = RUNNING
    reason: str = ""
    ended: float | None = None
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def until(self) -> float:
        return self.started + self.shadow_s

    @property
    def running(self) -> bool:
        return self.state == RUNNING

    def spec(self) -> dict[str, Any]:
        """The route's `shadow` fields but the target's name and digest (controlplane/gateway/routes.py)."""
        return {"id": self.id, "fraction": self.fraction, "rtol": self.rtol, "atol": self.atol,
                "keep_inputs": self.keep_inputs}

    # -- the figures ------------------------------------------------------------------------------

    def count(self, key: str) -> int:
        value = self.figures.get(key, 0)
        return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0

    @property
    def pairs(self) -> int:
        return self.count("pairs")

    @property
    def errors(self) -> int:
        """Pairs where the new version failed and the serving one answered."""
        return int((self.figures.get("errors") or {}).get("shadow", 0))

    @property
    def agreement(self) -> float | None:
        return self.count("agreed") / self.pairs if self.pairs else None

    def latency_ms(self) -> tuple[float | None, float | None]:
        """(the new version's p99, the serving one's) over the pairs both answered, in ms."""
        latency = self.figures.get("latency") or {}
        out = []
        for side in ("shadow", "serving"):
            lat = latency.get(side)
            out.append(of_figure({"requests": 0, "latency": lat}).quantile_ms() if isinstance(lat, dict) else None)
        return out[0], out[1]

    @property
    def latency_ratio(self) -> float | None:
        shadow, serving = self.latency_ms()
        return shadow / serving if shadow is not None and serving else None

    def first(self) -> str:
        """The first disagreement in words (`output 'y'[3]: 1.0 (serving) vs 1.5 (new)`), "" without one."""
        found = (self.figures.get("disagreements") or [None])[0]
        if not isinstance(found, dict):
            return ""
        kind = found.get("kind")
        both = f"{found.get('serving')!r} (serving) vs {found.get('shadow')!r} (new)"
        if kind == "value":
            return f"output '{found.get('output')}'[{found.get('index')}]: {both}"
        if kind in ("shape", "datatype"):
            return f"output '{found.get('output')}' {kind}: {both}"
        return f"{kind}: {both}"

    def text(self) -> str:
        """The figures in words, as the audit and a verdict say them."""
        if not self.pairs:
            return f"no pairs ({self.count('copied')} copied)"
        text = (f"agreement {self.agreement:.2f} over {self.pairs} pairs ({self.count('disagreed')} disagreed, "
                f"{self.errors} errors of the new version)")
        ratio = self.latency_ratio
        if ratio is not None:
            shadow, serving = self.latency_ms()
            text += f", latency ratio {ratio:.2f} (p99 {shadow:.1f} ms against {serving:.1f} ms)"
        return text

    # -- lines, JSON, record --------------------------------------------------------------------

    def begin_line(self, digest: str) -> str:
        return (f"shadow of {digest[:12]}: a copy of {self.fraction:g} of the live requests for {self.shadow_s:g} s, "
                f"compared with the serving version's answers (rtol {self.rtol:g}, atol {self.atol:g})")

    def end_line(self, how: str, reason: str) -> str:
        """The audit line of its end: `rolled_back: shadow agreement 0.80 < 1 over 25 pairs ...; first: ...`,
        `passed: agreement 1.00 over 120 pairs ...`, `promoted by alice: ...`."""
        return reason if reason.startswith(how) else f"{how}: {reason}"

    def end(self, how: str, reason: str, now: float) -> None:
        self.state, self.reason, self.ended = how, reason, now

    def to_json(self, now: float | None = None) -> dict[str, Any]:
        """`status --json`'s `shadow` (docs/json.md)."""
        now = time.time() if now is None else now
        shadow_ms, serving_ms = self.latency_ms()
        agreement, ratio = self.agreement, self.latency_ratio
        return {"state": self.state, "started": _iso(self.started), "until": _iso(self.until),
                "seconds_left": max(0, int(round(self.until - now))) if self.running else None,
                "copied": self.count("copied"), "pairs": self.pairs, "agreed": self.count("agreed"),
                "disagreed": self.count("disagreed"),
                "agreement": round(agreement, 4) if agreement is not None else None,
                "errors": {"shadow": self.errors, "serving": int((self.figures.get("errors") or {}).get("serving", 0))},
                "skipped": {k: int(v) for k, v in (self.figures.get("skipped") or {}).items()},
                "latency_ms": _ms(shadow_ms), "serving_latency_ms": _ms(serving_ms),
                "latency_ratio": round(ratio, 4) if ratio is not None else None,
                "fraction": self.fraction, "rtol": self.rtol, "atol": self.atol, "keep_inputs": self.keep_inputs,
                "min_agreement": self.min_agreement,
                "disagreements": [dict(d) for d in self.figures.get("disagreements") or []],
                "reason": self.reason}

    def to_record(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> ShadowPhase:
        return cls(**{k: v for k, v in record.items() if k in cls.__dataclass_fields__})


def judge(phase: ShadowPhase, limits: Any, now: float) -> tuple[str, str, bool] | None:
    """The shadow on its figures at `now`: (state, reason, whether it rolls back), or None: it goes on.
    `limits`: the bake's (controlplane/bake/figures.py `Limits`)."""
    pairs, first = phase.pairs, phase.first()
    then = f"; first: {first}" if first else ""
    if pairs and pairs >= limits.min_requests:
        ratio = phase.errors / pairs
        if ratio > limits.max_failure_ratio:
            return (FAILED, f"errors {ratio:.2f} > {limits.max_failure_ratio:g} over {pairs} pairs ({phase.errors} "
                            f"failed where the serving version answered){then}", True)
        agreement = phase.agreement or 0.0
        if agreement < phase.min_agreement:
            return (FAILED, f"agreement {agreement:.2f} < {phase.min_agreement:g} over {pairs} pairs "
                            f"({phase.count('disagreed')} disagreed){then}", True)
        latency = phase.latency_ratio
        if limits.max_latency_ratio is not None and latency is not None and latency > limits.max_latency_ratio:
            shadow, serving = phase.latency_ms()
            return (FAILED, f"latency ratio {latency:.2f} > {limits.max_latency_ratio:g} (p99 {shadow:.1f} ms against "
                            f"the serving version's {serving:.1f} ms) over {pairs} pairs", True)
    if now < phase.until:
        return None
    if pairs < limits.min_requests:
        reason = f"inconclusive: {pairs} pairs < bake_min_requests {limits.min_requests}"
        if limits.inconclusive == "rollback":
            return INCONCLUSIVE, reason, True
        return INCONCLUSIVE, f"{reason}; kept", False
    return PASSED, f"passed: {phase.text()}", False


def _ms(value: float | None) -> float | None:
    return round(value, 3) if value is not None and math.isfinite(value) else None


def _iso(epoch: float) -> str | None:
    return iso(datetime.fromtimestamp(epoch, timezone.utc).replace(tzinfo=None))
