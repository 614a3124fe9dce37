"""What the gateway counted for each digest of a model, as a bake judges it (docs/bake.md, "What each figure
counts").

Where a gateway carries a model's traffic, a bake reads the gateway's figures instead of Triton's: they
are what the clients saw, per digest, so a canary step judges the new digest alone against the previous
one in the same window, and a python model's `InferenceResponse(error=...)` (which Triton counts as a
success) is a failure here. `TrafficFigures` is the protocol the bake reads; `GatewayFigures` implements
it over the figures document the gateway's control channel answers (controlplane/gateway/figures.py:
per model, per digest, per protocol, cumulative since the gateway started).

`Counts` are cumulative. A window is `now.minus(zero)`; a figure that went down (the gateway restarted)
is a reset, and what was counted from then on is the window, never a negative figure. Latency is a
histogram with fixed buckets (seconds, upper bounds, as Prometheus' `le`): the p99 is interpolated
within its bucket, as Prometheus' `histogram_quantile` does; without buckets, the mean.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

FIGURES_MAX_AGE_S = 0.2  # one figures document serves every model judged in the same round


@dataclass(frozen=True)
class Counts:
    """One digest's figures: `requests` the model answered (its successes and its own errors: the clients'
    own errors and an unreachable tritonserver are not the version's), `failures` its own errors (error
    responses included), and the latency of every inference request as a histogram."""

    requests: int = 0
    failures: int = 0
    latency_s: float = 0.0  # the sum of the observed latencies
    observed: int = 0  # how many latencies the histogram holds
    buckets: tuple[float, ...] = ()  # upper bounds, seconds
    cumulative: tuple[int, ...] = ()  # observations at or under each bound

    def minus(self, zero: Counts | None) -> Counts:
        """The figures counted since `zero` (a reset: since the reset)."""
        if zero is None or self.requests < zero.requests or self.failures < zero.failures \
                or self.observed < zero.observed or zero.buckets != self.buckets:
            return self
        return Counts(self.requests - zero.requests, self.failures - zero.failures,
                      max(0.0, self.latency_s - zero.latency_s), self.observed - zero.observed, self.buckets,
                      tuple(max(0, a - b) for a, b in zip(self.cumulative, zero.cumulative, strict=True)))

    def plus(self, other: Counts) -> Counts:
        if self.buckets == other.buckets:
            buckets, cumulative = self.buckets, tuple(a + b for a, b in zip(self.cumulative, other.cumulative,
                                                                             strict=True))
        elif not self.buckets or not other.buckets:  # one of them has no histogram (nothing observed)
            buckets, cumulative = (self.buckets, self.cumulative) if self.buckets else (other.buckets, other.cumulative)
        else:  # histograms of other bounds: the means only
            buckets, cumulative = (), ()
        return Counts(self.requests + other.requests, self.failures + other.failures,
                      self.latency_s + other.latency_s, self.observed + other.observed, buckets, cumulative)

    @property
    def successes(self) -> int:
        return self.requests - self.failures

    def mean_ms(self) -> float | None:
        return self.latency_s / self.observed * 1000 if self.observed else None

    def quantile_ms(self, q: float = 0.99) -> float | None:
        """The q-quantile of the latency, interpolated within its bucket (None: no histogram or nothing in it)."""
        if not self.buckets or not self.observed or len(self.cumulative) != len(self.buckets):
            return None
        rank = q * self.observed
        i = bisect_left(self.cumulative, rank)
        if i >= len(self.buckets):  # above the largest bound: that bound is all a histogram can say
            return self.buckets[-1] * 1000
        lower = self.buckets[i - 1] if i > 0 else 0.0
        below = self.cumulative[i - 1] if i > 0 else 0
        inside = self.cumulative[i] - below
        fraction = (rank - below) / inside if inside else 1.0
        return (lower + (self.buckets[i] - lower) * fraction) * 1000

    def latency(self) -> tuple[str, float | None]:
        """("p99", ms) where the histogram has buckets, else ("mean", ms)."""
        p99 = self.quantile_ms()
        return ("p99", p99) if p99 is not None else ("mean", self.mean_ms())


class TrafficFigures(Protocol):
    """What a bake reads where a gateway carries the model: digest → its cumulative `Counts` (every protocol
    together); a shadow's figures by its id (controlplane/gateway/shadow.py `ShadowState.to_json`, None before
    its first copy). TritonctlError when the figures cannot be read this round."""

    def counts(self, model: str) -> Mapping[str, Counts]: ...

    def shadow(self, ident: str) -> Mapping[str, Any] | None: ...


class GatewayFigures:
    """`TrafficFigures` over the gateway's figures document (`figures()`: its control channel's answer, read
    at most every FIGURES_MAX_AGE_S for all models)."""

    def __init__(self, figures: Callable[[], Mapping[str, Any]], clock: Callable[[], float] = time.monotonic) -> None:
        self._figures = figures
        self._clock = clock
        self._lock = threading.Lock()
        self._read: tuple[float, Mapping[str, Any]] | None = None

    def _document(self) -> Mapping[str, Any]:
        with self._lock:
            if self._read is None or self._clock() - self._read[0] > FIGURES_MAX_AGE_S:
                self._read = (self._clock(), self._figures())
            return self._read[1]

    def shadow(self, ident: str) -> Mapping[str, Any] | None:
        found = (self._document().get("shadows") or {}).get(ident)
        return found if isinstance(found, Mapping) else None

    def counts(self, model: str) -> dict[str, Counts]:
        document = self._document()
        entry = (document.get("models") or {}).get(model) or {}
        out: dict[str, Counts] = {}
        for digest, slot in (entry.get("digests") or {}).items():
            total = out.get(digest, Counts())
            for protocol in ("grpc", "http"):
                if isinstance(slot.get(protocol), Mapping):
                    total = total.plus(of_figure(slot[protocol]))
            out[digest] = total
        return out


def of_figure(fig: Mapping[str, Any]) -> Counts:
    """One protocol's figure as the gateway writes it: {"requests", "failures": {"model", "unavailable",
    "client"}, "latency": {"buckets", "cumulative", "count", "sum_s"}}."""
    failures = fig.get("failures") or {}
    model, unavailable, client = (int(failures.get(k, 0)) for k in ("model", "unavailable", "client"))
    latency = fig.get("latency") or {}
    buckets = tuple(float(b) for b in latency.get("buckets") or ())
    cumulative = tuple(int(c) for c in latency.get("cumulative") or ())
    if len(cumulative) != len(buckets):
        buckets, cumulative = (), ()
    return Counts(max(0, int(fig.get("requests", 0)) - unavailable - client), model,
                  float(latency.get("sum_s", 0.0)), int(latency.get("count", 0)), buckets, cumulative)
