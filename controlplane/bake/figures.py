"""A bake's record and its judgement, pure: the limits it is judged by, the figures it counted (counters
that reset counted as resets), and `verdict`, which says how it ends on them. The single host's `Baker`
(controlplane/bake/baker.py) and the fleet's pooled bakes (controlplane/fleet/bake.py) both judge with it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from controlplane.bake.canary import Canary
from controlplane.base.bounds import MAX_COUNT, MAX_RATIO, check, check_count, check_duration, check_moment
from controlplane.settings.config import BAKE_INCONCLUSIVE, Settings
from controlplane.store.records import iso
from controlplane.triton.client import RequestCounts
from controlplane.vocab import Result

BAKING, PASSED, FAILED, INCONCLUSIVE = "baking", "passed", "failed", "inconclusive"
AUDIT_OUTCOME = {PASSED: Result.OK.value, FAILED: Result.FAILED.value, INCONCLUSIVE: Result.INCONCLUSIVE.value}
BAKE_OUTCOMES = tuple(AUDIT_OUTCOME.values())  # tritonctl_bakes_total{outcome}


@dataclass(frozen=True)
class Limits:
    """What a bake is judged by (the daemon's settings when it began, or the deploy's own `--bake`)."""

    bake_s: float
    max_failure_ratio: float
    max_latency_ratio: float | None
    min_requests: int
    inconclusive: str  # "keep" or "rollback"

    def __post_init__(self) -> None:
        """Every source of these limits is bounded where it enters (controlplane/base/bounds.py); a record read
        back from `bakes.json` is not, so they are checked here too: ValueError for one out of range."""
        check_duration(self.bake_s)
        check(self.max_failure_ratio, 0.0, 1.0)
        if self.max_latency_ratio is not None:
            check(self.max_latency_ratio, 0.0, MAX_RATIO)
        check_count(self.min_requests, 0, MAX_COUNT)
        if self.inconclusive not in BAKE_INCONCLUSIVE:
            raise ValueError(f"inconclusive: expected one of {', '.join(BAKE_INCONCLUSIVE)}")

    def with_model(self, model: dict[str, Any]) -> Limits:
        """These limits overridden by a model's own config parameters (settings/modelparams.bake_parameters)."""
        return replace(self, bake_s=model.get("bake_s", self.bake_s),
                       max_failure_ratio=model.get("bake_max_failure_ratio", self.max_failure_ratio),
                       max_latency_ratio=model.get("bake_max_latency_ratio", self.max_latency_ratio))

    @classmethod
    def of(cls, settings: Settings, bake_s: float | None = None, model: dict[str, Any] | None = None) -> Limits:
        """The daemon's `settings`, overridden by the model's own config parameters (`model`:
        settings/modelparams.bake_parameters), overridden by the deploy's own `bake_s` (`load --bake`)."""
        own = {**(model or {}), **({} if bake_s is None else {"bake_s": bake_s})}
        return cls(settings.bake_s, settings.bake_max_failure_ratio, settings.bake_max_latency_ratio,
                   settings.bake_min_requests, settings.bake_inconclusive).with_model(own)


@dataclass
class Tally:
    """Cumulative figures summed over a model's versions, counters that reset counted as resets."""

    requests: int = 0
    failures: int = 0
    success: int = 0
    success_ns: int = 0
    last: dict[tuple[str, str], RequestCounts] = field(default_factory=dict)

    @classmethod
    def starting_at(cls, now: dict[tuple[str, str], RequestCounts]) -> Tally:
        """Figures counted from `now` on (what came before is not the bake's: the smoke requests, say)."""
        return cls(last=dict(now))

    def add(self, now: dict[tuple[str, str], RequestCounts]) -> None:
        for version, counts in now.items():
            before = self.last.get(version)
            if before is not None and (counts.success < before.success or counts.failure < before.failure):
                before = None  # a reset: its figures count from 0 again
            success = counts.success - (before.success if before else 0)
            failure = counts.failure - (before.failure if before else 0)
            self.success += success
            self.success_ns += max(0, counts.success_ns - (before.success_ns if before else 0))
            self.failures += failure
            self.requests += success + failure
            self.last[version] = counts

    def mean_ms(self) -> float | None:
        return self.success_ns / self.success / 1e6 if self.success else None


@dataclass
class Bake:
    """One digest's bake, from its deploy to its end."""

    model: str
    digest: str
    previous: str | None
    limits: Limits
    started: float  # seconds since the epoch
    tally: Tally
    baseline_latency_ms: float | None = None  # the previous digest's mean
    state: str = BAKING
    reason: str = ""
    ended: float | None = None
    baseline_p99_ms: float | None = None  # the previous digest's p99 at the switch (Triton's summaries)
    p99_ms: float | None = None  # the last p99 Triton reported for the model during the bake
    warned: bool = False  # its load time and footprint were compared (controlplane/bake/warn.py)
    group: tuple[str, ...] = ()  # a change set's bake: every model of the set (its unchanged ones too)
    group_id: str = ""  # the set's bake, shared by its members' bakes
    # through a gateway: the canary's steps and the step now (controlplane/bake/canary.py), and the latency the
    # last step judged on the gateway's figures: (p99 or mean, the new digest's ms, the previous digest's ms)
    canary: Canary | None = None
    judged: tuple[str, float | None, float | None] | None = None

    @property
    def until(self) -> float:
        return self.started + self.limits.bake_s

    @property
    def failure_ratio(self) -> float | None:
        return self.tally.failures / self.tally.requests if self.tally.requests else None

    def seconds_left(self, now: float | None = None) -> int:
        return max(0, int(round(self.until - (time.time() if now is None else now))))

    def latency(self) -> tuple[str, float | None, float | None]:
        """(which, the digest's latency in ms, the previous digest's): "p99" where Triton reported it (and the
        baseline, when there is one, is a p99 too), else "mean" (the statistics API's, over the bake)."""
        if self.judged is not None:
            return self.judged
        if self.p99_ms is not None and (self.baseline_p99_ms is not None or self.baseline_latency_ms is None):
            return "p99", self.p99_ms, self.baseline_p99_ms
        return "mean", self.tally.mean_ms(), self.baseline_latency_ms

    def figures(self) -> str:
        ratio = self.failure_ratio
        text = (f"failure ratio {ratio:.2f} over {self.tally.requests} requests ({self.tally.failures} failed)"
                if ratio is not None else "no requests")
        which, latency, baseline = self.latency()
        if latency is not None and baseline:
            text += f", {which} latency {latency:.1f} ms (before: {baseline:.1f} ms)"
        return text

    def to_json(self) -> dict[str, Any]:
        which, latency, baseline = self.latency()
        ratio = self.failure_ratio
        return {
            "state": self.state,
            "digest": self.digest,
            "started": iso(_utc(self.started)),
            "until": iso(_utc(self.until)),
            "requests": self.tally.requests,
            "failures": self.tally.failures,
            "failure_ratio": round(ratio, 4) if ratio is not None else None,
            "latency_ms": round(latency, 3) if latency is not None else None,
            "baseline_latency_ms": round(baseline, 3) if baseline else None,
            "latency_stat": which if latency is not None else None,
            "reason": self.reason,
        }


    def to_record(self) -> dict[str, Any]:
        """What `Baker` keeps in its state file (a restart resumes a bake from it)."""
        t = self.tally
        return {"model": self.model, "digest": self.digest, "previous": self.previous, "limits": asdict(self.limits),
                "started": self.started, "baseline_latency_ms": self.baseline_latency_ms, "state": self.state,
                "reason": self.reason, "ended": self.ended, "baseline_p99_ms": self.baseline_p99_ms,
                "p99_ms": self.p99_ms, "warned": self.warned,
                "tally": [t.requests, t.failures, t.success, t.success_ns],
                "group": list(self.group), "group_id": self.group_id,
                "canary": self.canary.to_record() if self.canary is not None else None,
                "judged": list(self.judged) if self.judged is not None else None}

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Bake:
        """A bake read back from `bakes.json`; ValueError (or KeyError, TypeError) for a record that is not one
        or holds a value out of range (controlplane/base/bounds.py): the caller drops it, never serves it."""
        requests, failures, success, success_ns = (check_count(n) for n in record["tally"])
        started = check_moment(record["started"])
        ended = record.get("ended")
        state = str(record["state"])
        if state not in (BAKING, *AUDIT_OUTCOME):
            raise ValueError(f"state: {state!r} is not a bake's")
        return cls(str(record["model"]), str(record["digest"]), record.get("previous"), Limits(**record["limits"]),
                   started, Tally(requests, failures, success, success_ns),
                   _latency(record.get("baseline_latency_ms")), state, str(record.get("reason") or ""),
                   None if ended is None else check_moment(ended), _latency(record.get("baseline_p99_ms")),
                   _latency(record.get("p99_ms")), bool(record.get("warned", True)), tuple(record.get("group") or ()),
                   str(record.get("group_id") or ""),
                   Canary.from_record(record["canary"]) if record.get("canary") else None,
                   tuple(record["judged"]) if record.get("judged") else None)  # type: ignore[arg-type]


def bakes_from_records(records: Any) -> tuple[list[Bake], str]:
    """`bakes.json` read back: its bakes, and what was dropped in one line ("" when nothing: a record that is not a
    bake, or holds a value out of range, controlplane/base/bounds.py). ValueError when it is no list at all."""
    if not isinstance(records, list):
        raise ValueError("expected a list of bakes")
    bakes, dropped = [], []
    for record in records:
        try:
            bakes.append(Bake.from_record(record))
        except (ValueError, KeyError, TypeError, AttributeError, OverflowError) as exc:
            model = record.get("model") if isinstance(record, dict) else None
            dropped.append(f"{model or '?'}: {type(exc).__name__}: {exc}")
    if not dropped:
        return bakes, ""
    return bakes, f"{len(dropped)} record(s) out of range or unreadable dropped ({'; '.join(dropped)[:500]})"


def _latency(value: Any) -> float | None:
    """A latency in ms read back from a record: None, or a finite number from 0 to a week."""
    return None if value is None else check(value, 0.0, 7 * 24 * 3600 * 1000.0)


def verdict(bake: Bake, now: float) -> tuple[str, str, bool] | None:
    """How the bake ends on its figures so far at `now`: (state, reason, whether it rolls back), or None:
    it bakes on (a fleet's leader judges its pooled figures with it too: controlplane/fleet/bake.py)."""
    which, latency, baseline = bake.latency()
    return judge(bake.limits, bake.tally.requests, bake.tally.failures, bake.tally.success, (which, latency, baseline),
                 bake.until, now, bake.figures)


def judge(limits: Limits, requests: int, failures: int, success: int,
          latency: tuple[str, float | None, float | None], until: float, now: float,
          figures: Callable[[], str]) -> tuple[str, str, bool] | None:
    """The limits on figures: (state, reason, whether it rolls back), or None: on until `until`. A bake judges
    its whole figures; a canary step (controlplane/bake/canary.py) the new digest's in the step's window."""
    ratio = failures / requests if requests else None
    if ratio is not None and requests >= limits.min_requests and ratio > limits.max_failure_ratio:
        return (FAILED, f"failure ratio {ratio:.2f} > {limits.max_failure_ratio:g} over {requests} "
                        f"requests ({failures} failed)", True)
    which, ms, baseline = latency
    if (limits.max_latency_ratio is not None and baseline and ms is not None
            and success >= limits.min_requests and ms / baseline > limits.max_latency_ratio):
        return (FAILED, f"latency ratio {ms / baseline:.2f} > {limits.max_latency_ratio:g}"
                        f" ({which} {ms:.1f} ms, before {baseline:.1f} ms) over {success} requests", True)
    if now < until:
        return None
    if requests < limits.min_requests:
        reason = f"inconclusive: {requests} requests < bake_min_requests {limits.min_requests}"
        if limits.inconclusive == "rollback":
            return INCONCLUSIVE, reason, True
        return INCONCLUSIVE, f"{reason}; kept", False
    return PASSED, f"passed: {figures()}", False


def _utc(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, timezone.utc).replace(tzinfo=None)
