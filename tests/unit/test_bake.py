"""controlplane.bake's arithmetic on Triton's cumulative counters (the bake itself runs against a real
tritonserver in tests/test_bake_e2e.py): a counter that went down is a reset, never a negative figure."""

from __future__ import annotations

from controlplane.bake import Limits, Tally
from controlplane.config import Settings
from controlplane.triton.client import RequestCounts

V1, V2 = ("m", "1"), ("m", "2")


def test_figures_count_from_the_bakes_start_and_a_reset_counts_from_zero() -> None:
    tally = Tally.starting_at({V1: RequestCounts(100, 5, 100_000_000)})  # the smoke requests and before
    assert tally.requests == 0
    tally.add({V1: RequestCounts(140, 15, 140_000_000)})
    assert (tally.requests, tally.failures, tally.success) == (50, 10, 40)
    assert tally.mean_ms() == 1.0
    # a reload or a restarted tritonserver: the counters start again at 0 and what they count is added
    tally.add({V1: RequestCounts(6, 4, 12_000_000)})
    assert (tally.requests, tally.failures, tally.success, tally.success_ns) == (60, 14, 46, 52_000_000)
    tally.add({V1: RequestCounts(6, 4, 12_000_000)})  # nothing new
    assert tally.requests == 60


def test_every_version_of_the_model_is_summed() -> None:
    tally = Tally()
    tally.add({V1: RequestCounts(3, 0, 3_000_000), V2: RequestCounts(1, 1, 2_000_000)})
    assert (tally.requests, tally.failures, tally.success) == (5, 1, 4)
    assert tally.mean_ms() == 1.25


def test_a_deploys_own_bake_overrides_the_daemons_and_zero_turns_it_off() -> None:
    settings = Settings(bake_s=60.0, bake_max_failure_ratio=0.05, bake_min_requests=10)
    assert Limits.of(settings) == Limits(60.0, 0.05, None, 10, "keep")
    assert Limits.of(settings, 300.0).bake_s == 300.0
    assert Limits.of(settings, 0.0).bake_s == 0.0
