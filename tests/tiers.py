"""The whole test suite in its two tiers, one after the other, each timed: `python -m tests.tiers`.

Why: pyproject's `addopts` leaves the `slow` tier out of a plain `pytest`, so that a developer's run
stays short; but the long variants (30 random kills, every crash step three times, the fleet's
later-wave rollback, ...) prove README promises, and CI must run them on every change. README
command (b) and `.ci/run` call this module, which runs

  1. the default tier: `pytest -q` (every test not marked `slow`), then
  2. the slow tier: `pytest -q -m slow`,

each in its own pytest processes (the same commands a developer types, with two test files at a time,
WORKERS, then the tier's `alone` tests one at a time), prints each tier's wall time
and the total against the 45-minute budget of the 2-core CI machine, and exits non-zero when either
tier fails. Extra arguments go to both tiers (`python -m tests.tiers tests/test_crash.py -x`). pytest's
exit 5 ("no tests collected") passes for one tier only when the other tier ran tests (a file with no
slow test); both empty is a failure: a selection that runs nothing proves nothing. The tiers run
with TRITONCTL_TEST_NO_SKIP=1: this command installed every dependency first, so a test that would
skip (no /dev/fuse for the FUSE repository test, no PostgreSQL) fails instead (tests/conftest.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUDGET_S = 45 * 60  # the whole suite on the 2-core CI machine (issue 25)
NO_TESTS = 5  # pytest.ExitCode.NO_TESTS_COLLECTED
DURATIONS = "--durations=15"  # the slowest tests of each tier, in CI's log
# Test files run side by side, two at a time (pytest-xdist, a file's tests on one worker: its module
# fixtures, a daemon or a fleet, are shared by its tests as in a plain run). Most of a test's time is
# waiting for a tritonserver and its python stubs to start, so two files at once fill the 2-core CI
# machine; `-n 0` after these (an extra argument wins) runs one file at a time.
WORKERS = ("-n", "2", "--dist", "loadfile")
# A test marked `alone` measures the CPU or memory of the processes it started, which another test's
# processes beside it would distort: each tier runs those afterwards, one at a time, with nothing beside them.
ALONE = "alone"
NO_SKIP_ENV = "TRITONCTL_TEST_NO_SKIP"  # tests/conftest.py: a skipped test fails (see there)


@dataclass(frozen=True)
class Tier:
    name: str
    marker: str  # the tier's `-m` expression (pyproject's addopts says `not slow`: a plain `pytest`)

    def phases(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The tier's two pytest runs: its tests side by side, then its `alone` tests one at a time."""
        return (("-m", f"({self.marker}) and not {ALONE}", *WORKERS), ("-m", f"({self.marker}) and {ALONE}"))


TIERS = (Tier("default", "not slow"), Tier("slow", "slow"))


@dataclass(frozen=True)
class TierRun:
    tier: str
    exit_code: int
    seconds: float


def clock(seconds: float) -> str:
    minutes, secs = divmod(int(round(seconds)), 60)
    return f"{minutes} min {secs:02d} s"


def verdict(runs: Sequence[TierRun]) -> int:
    """0 when every tier passed; an empty tier passes only beside one that ran tests; else the first
    failing tier's exit code (pytest's codes: 1 tests failed, 2 interrupted, 3 internal, 4 usage, 5 empty)."""
    if runs and all(r.exit_code == NO_TESTS for r in runs):
        return NO_TESTS
    for run in runs:
        if run.exit_code not in (0, NO_TESTS):
            return run.exit_code
    return 0


def summary(runs: Sequence[TierRun]) -> str:
    lines = ["", "tier      exit  wall time"]
    for run in runs:
        note = " (no tests selected)" if run.exit_code == NO_TESTS else ""
        lines.append(f"{run.tier:<9} {run.exit_code:>4}  {clock(run.seconds)}{note}")
    total = sum(r.seconds for r in runs)
    within = "within" if total <= BUDGET_S else "OVER"
    lines.append(f"{'total':<9} {'':>4}  {clock(total)} ({within} the {BUDGET_S // 60} min budget)")
    return "\n".join(lines)


def run_tier(tier: Tier, extra: Sequence[str]) -> TierRun:
    """Both phases of the tier; its exit code is verdict()'s over them (one phase may select nothing)."""
    started = time.monotonic()
    codes = []
    for args in tier.phases():
        command = [sys.executable, "-m", "pytest", "-q", DURATIONS, *args, *extra]
        print(f"== tier {tier.name}: {' '.join(command[1:])}", flush=True)
        codes.append(subprocess.call(command, cwd=ROOT, env={**os.environ, NO_SKIP_ENV: "1"}))
    code = verdict([TierRun(tier.name, c, 0.0) for c in codes])
    seconds = time.monotonic() - started
    print(f"== tier {tier.name}: exit {code} after {clock(seconds)}", flush=True)
    return TierRun(tier.name, code, seconds)


def main(argv: Sequence[str]) -> int:
    runs = [run_tier(tier, argv) for tier in TIERS]
    print(summary(runs), flush=True)
    return verdict(runs)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
