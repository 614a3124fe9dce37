"""The tier runner (tests/tiers.py, README command (b)): both tiers together are the whole suite, and
its exit code is a failing tier's."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests import tiers
from tests.tiers import NO_TESTS, TierRun


def collected(*args: str) -> set[str]:
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
                         cwd=tiers.ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode in (0, NO_TESTS), out.stdout[-2000:] + out.stderr[-2000:]  # a phase may select none
    return {line for line in out.stdout.splitlines() if "::" in line}


def test_the_two_tiers_are_the_whole_suite_and_do_not_overlap() -> None:
    everything = collected("-m", "")  # no marker filter: every test there is
    default = collected()
    slow = collected("-m", "slow")
    assert default and slow
    assert default.isdisjoint(slow)
    assert default | slow == everything, sorted(everything - default - slow)[:10]
    assert [t.marker for t in tiers.TIERS] == ["not slow", "slow"]
    for tier in tiers.TIERS:  # each tier's two phases split it: every test runs in exactly one
        side_by_side, alone = (collected(*phase[:2]) for phase in tier.phases())
        assert side_by_side.isdisjoint(alone)
        assert side_by_side | alone == collected("-m", tier.marker)


def test_verdict_is_a_failing_tiers_code_and_empty_passes_only_beside_tests() -> None:
    def runs(*codes: int) -> list[TierRun]:
        return [TierRun(name, code, 1.0) for name, code in zip(("default", "slow"), codes, strict=True)]

    assert tiers.verdict(runs(0, 0)) == 0
    assert tiers.verdict(runs(0, 1)) == 1 and tiers.verdict(runs(1, 0)) == 1
    assert tiers.verdict(runs(2, 1)) == 2  # the first failing tier's code
    assert tiers.verdict(runs(0, NO_TESTS)) == 0 and tiers.verdict(runs(NO_TESTS, 0)) == 0
    assert tiers.verdict(runs(NO_TESTS, NO_TESTS)) == NO_TESTS  # nothing ran: not a pass
    assert tiers.verdict(runs(NO_TESTS, 1)) == 1


def test_summary_prints_each_tier_and_the_total_against_the_budget() -> None:
    text = tiers.summary([TierRun("default", 0, 905.4), TierRun("slow", 1, 1066.0)])
    assert "default      0  15 min 05 s" in text and "slow         1  17 min 46 s" in text
    assert "total" in text and "32 min 51 s (within the 45 min budget)" in text
    assert "OVER the 45 min budget" in tiers.summary([TierRun("slow", 0, 45 * 60 + 1)])


def test_the_runner_runs_both_tiers_and_fails_with_a_failing_one(tmp_path: Path) -> None:
    """Through `python -m tests.tiers` on a throwaway test file: one passing default test, one failing
    slow test; both tiers run, their times are printed, and the exit code is the slow tier's failure."""
    case = tmp_path / "test_case.py"
    case.write_text("import pytest\n\ndef test_fast():\n    pass\n\n@pytest.mark.slow\ndef test_long():\n"
                    "    assert False\n")
    command = [sys.executable, "-m", "tests.tiers", str(case), "-p", "no:cacheprovider",
               "-c", str(tiers.ROOT / "pyproject.toml")]  # the project's markers and addopts
    out = subprocess.run(command, cwd=tiers.ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 1, out.stdout[-3000:]
    assert "== tier default: exit 0 after" in out.stdout and "== tier slow: exit 1 after" in out.stdout
    assert "1 passed" in out.stdout and "1 failed" in out.stdout and "total" in out.stdout


def test_under_the_runner_a_skip_fails_unless_knowingly_opted_out(tmp_path: Path) -> None:
    """TRITONCTL_TEST_NO_SKIP=1 (what the runner sets) turns a skip, in a fixture or a test, into a
    failure; a skip naming a set opt-out variable (TRITONCTL_TEST_NO_MOUNT=1) stays a skip."""
    case = tmp_path / "test_case.py"
    case.write_text("import pytest\n\n@pytest.fixture\ndef fuse():\n    pytest.skip('/dev/fuse is absent')\n\n"
                    "def test_fuse(fuse):\n    pass\n\ndef test_mount():\n"
                    "    pytest.skip('cannot mount (set TRITONCTL_TEST_NO_MOUNT=1 to skip it knowingly)')\n")

    def run(**env: str) -> str:
        command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
                   "-c", str(tiers.ROOT / "pyproject.toml"), str(case)]
        clean = {k: v for k, v in os.environ.items() if not k.startswith("TRITONCTL_TEST_")}
        out = subprocess.run(command, cwd=tiers.ROOT, capture_output=True, text=True, timeout=300,
                             env={**clean, **env})
        return out.stdout

    assert "2 skipped" in run()
    strict = run(TRITONCTL_TEST_NO_SKIP="1")
    assert "1 failed, 1 error" in strict and "/dev/fuse is absent" in strict, strict[-2000:]  # error: in setup
    assert "1 skipped, 1 error" in run(TRITONCTL_TEST_NO_SKIP="1", TRITONCTL_TEST_NO_MOUNT="1")
