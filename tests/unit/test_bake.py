"""controlplane.bake.baker's arithmetic on Triton's cumulative counters (the bake itself runs against a real
tritonserver in tests/test_bake_e2e.py): a counter that went down is a reset, never a negative figure;
the latency compared is Triton's p99 where its metrics report one, else the mean; a load or footprint over
`bake_warn_load_ratio` times the previous digest's is one warning line."""

from __future__ import annotations

from collections import deque
from datetime import datetime
from pathlib import Path

from controlplane.bake.baker import Baker
from controlplane.bake.figures import Bake, Limits, Tally
from controlplane.bake.warn import LoadTimes, warning
from controlplane.settings.config import Settings
from controlplane.store.records import FootprintRecord
from controlplane.triton.client import RequestCounts
from controlplane.triton.summaries import request_quantiles_ms

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


# What tritonserver 2.51 exports with --metrics-config=summary_latencies=true (measured here: a reload keeps
# the series; a minute without requests turns its quantiles to Nan).
METRICS = """\
# TYPE nv_inference_request_summary_us summary
nv_inference_request_summary_us_count{model="m",version="1"} 85
nv_inference_request_summary_us_sum{model="m",version="1"} 2404550
nv_inference_request_summary_us{model="m",version="1",quantile="0.5"} 11234
nv_inference_request_summary_us{model="m",version="1",quantile="0.99"} 61772
nv_inference_request_summary_us{model="m",version="2",quantile="0.99"} 12000
nv_inference_request_summary_us{model="idle",version="1",quantile="0.99"} Nan
nv_inference_request_duration_us{model="other",version="1"} 773991
"""


def test_the_p99_is_read_from_tritons_summaries_per_model() -> None:
    assert request_quantiles_ms(METRICS) == {"m": 61.772}  # the highest version's; an empty window is no figure
    assert request_quantiles_ms(METRICS, "0.5") == {"m": 11.234}
    assert request_quantiles_ms("nv_inference_request_duration_us{model=\"m\",version=\"1\"} 5\n") == {}


def test_a_bake_compares_p99s_where_triton_reports_them_else_means() -> None:
    tally = Tally(requests=40, success=40, success_ns=40 * 2_000_000)  # a 2 ms mean
    limits = Limits.of(Settings(bake_s=60.0))
    bake = Bake("m", "d2", "d1", limits, 0.0, tally, baseline_latency_ms=1.0)
    assert bake.latency() == ("mean", 2.0, 1.0)  # no p99 read
    bake.p99_ms = 9.0
    assert bake.latency() == ("mean", 2.0, 1.0)  # the baseline is a mean only: means compared
    bake.baseline_p99_ms = 3.0
    assert bake.latency() == ("p99", 9.0, 3.0)
    assert "p99 latency 9.0 ms (before: 3.0 ms)" in bake.figures()
    assert bake.to_json()["latency_stat"] == "p99"
    assert Bake.from_record(bake.to_record()).latency() == ("p99", 9.0, 3.0)  # kept across a restart
    unbased = Bake("m", "d2", None, limits, 0.0, tally, p99_ms=9.0)  # no baseline (a first version): its p99
    assert unbased.to_json()["latency_ms"] == 9.0 and unbased.to_json()["baseline_latency_ms"] is None


def _footprint(memory_mb: float | None, gpu_mb: float | None = None) -> FootprintRecord:
    return FootprintRecord("m", "d", memory_mb, gpu_mb, "measured", datetime(2026, 1, 1))


def test_a_load_or_footprint_over_the_ratio_is_one_warning_line_and_anything_else_none() -> None:
    assert warning(2.0, 1.9, 1.0, _footprint(190), _footprint(100)) is None  # under the ratio on both
    assert warning(2.0, 3.0, None, _footprint(300), None) is None  # nothing to compare with (a first digest)
    assert warning(2.0, 2.5, 1.0, None, None) == \
        "load 2.50 s, 2.5 x the previous digest's 1.00 s (bake_warn_load_ratio 2)"
    both = warning(2.0, 2.5, 1.0, _footprint(450, 3000), _footprint(100, 1000))
    assert both == ("load 2.50 s, 2.5 x the previous digest's 1.00 s; memory 450 MB, 4.5 x the previous digest's "
                    "100 MB; GPU memory 3000 MB, 3.0 x the previous digest's 1000 MB (bake_warn_load_ratio 2)")
    assert warning(5.0, 2.5, 1.0, _footprint(450), _footprint(100)) is None  # a ratio of 5 tolerates both


def test_load_times_are_kept_per_digest_across_a_restart(tmp_path: Path) -> None:
    times = LoadTimes(tmp_path / "loads.json")
    for n in range(12):
        times.note("m", f"d{n}", 0.5 + n)
    times.note("m", "d0-again", None)  # no timing (a stand-in Triton): nothing kept
    again = LoadTimes(tmp_path / "loads.json")
    assert again.of("m", "d11") == 11.5 and again.of("m", "d3") is None  # the newest 8 digests only
    assert again.of("m", "d0-again") is None and again.of("other", "d1") is None
    (tmp_path / "loads.json").write_text("{not json")
    assert LoadTimes(tmp_path / "loads.json").of("m", "d11") is None  # unreadable: afresh, no error


def test_the_baselines_are_the_previous_digests_before_the_switch() -> None:
    """Both from before the deploy began: the mean over the last bake_s of it, the p99 as last read (the reload
    keeps Triton's summaries, which then hold the new digest's smoke requests too)."""
    baker = Baker(None, None, None, lambda: Settings(bake_s=10.0, bake_max_latency_ratio=2.0))  # type: ignore[arg-type]
    baselines = baker.baselines
    baselines._history["m"] = deque([(90.0, 10, 500_000_000, 9.0),  # out of the window (bake_s 10 before the deploy)
                                 (100.0, 100, 100_000_000, 5.0), (101.0, 150, 200_000_000, None),
                                 (102.0, 200, 250_000_000, 6.0),  # the last p99 before the deploy began
                                 (103.0, 1, 90_000_000, 90.0),  # after the reload: the smoke request, slow
                                 (103.5, 3, 95_000_000, None)])
    mean_ms, p99_ms = baselines.before("m", 10.0, deployed_from=102.5)
    assert (mean_ms, p99_ms) == (1.5, 6.0)  # 150 ms over 100 requests; not the smoke's 90 ms, nor the new digest's
    baselines._history["m"] = deque([(100.0, 5, 5_000_000, None), (101.0, 5, 5_000_000, 4.0)])
    assert baselines.before("m", 10.0, deployed_from=101.5) == (None, None)  # no request: no baseline
