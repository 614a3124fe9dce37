"""A bake's latency baseline: the previous digest's latency before the switch (docs/bake.md, "p99 or mean").

With `bake_max_latency_ratio` set, every round samples every loaded model's cumulative successes and their
time (one statistics call for all models) and, every P99_SAMPLE_S, Triton's p99s (its metrics' summaries,
controlplane/triton/summaries.py); the samples are kept `bake_s` long, so a bake that begins knows what its
model's previous digest did before the deploy: the mean over the last `bake_s` before it, the p99 as
Triton reported it last. Without a gateway only: a canary judges the previous digest in the same window on
the gateway's figures (controlplane/bake/rollout.py).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable

from controlplane.errors import TritonctlError
from controlplane.settings.config import Settings
from controlplane.triton.client import TritonClient
from controlplane.triton.summaries import fetch_request_p99_ms

P99_SAMPLE_S = 2.0  # how often every model's p99 is read for the latency baselines (Triton's window: a minute)
P99_KEEP_S = 20.0  # the baseline samples are kept at least this long: a deploy's p99 baseline is read before it


class Baselines:
    """The samples (see the module docstring). `asked()`: the bake times deploys asked for (`load --bake`),
    kept as long as the longest; `metrics_url()`: Triton's metrics endpoint (None: the means only)."""

    def __init__(self, triton: TritonClient, settings: Callable[[], Settings], clock: Callable[[], float],
                 asked: Callable[[], Iterable[float]], metrics_url: Callable[[], str | None]) -> None:
        self.triton = triton
        self.settings = settings
        self.clock = clock
        self.asked = lambda: list(asked())
        self.metrics_url = metrics_url
        self._history: dict[str, deque[tuple[float, int, int, float | None]]] = {}
        self._p99_read = float("-inf")  # when Triton's metrics were last read (time.monotonic)
        self._lock = threading.Lock()

    def round(self, baking: bool) -> dict[str, float] | None:
        """One round: Triton's whole metrics text each round while a bake runs (its p99s, returned), every
        P99_SAMPLE_S for the baselines; and the samples."""
        sampling = self.settings().bake_max_latency_ratio is not None and (
            time.monotonic() - self._p99_read >= P99_SAMPLE_S)
        p99s = self.p99s() if baking or sampling else None
        self.sample(p99s)
        return p99s

    def p99s(self) -> dict[str, float] | None:
        """model → its request p99 in ms over Triton's last minute (its metrics' summaries); None without them."""
        self._p99_read = time.monotonic()
        url = self.metrics_url()
        return fetch_request_p99_ms(url) if url else None

    def sample(self, p99s: dict[str, float] | None) -> None:
        """With `bake_max_latency_ratio` and `bake_s` set: every serving model's cumulative successes and
        their time, and its p99 when Triton reports one (`p99s`), kept for `bake_s`, so a bake knows the
        previous digest's latency before the switch."""
        settings = self.settings()
        if settings.bake_max_latency_ratio is None:
            self._history.clear()
            return
        keep_s = max(settings.bake_s, P99_KEEP_S, *self.asked())
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

    def before(self, model: str, window_s: float, deployed_from: float) -> tuple[float | None, float | None]:
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
