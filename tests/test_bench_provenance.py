"""A results file names the commit of the run it measured (issue 57 item 6): `bench/first_start_phases.py` parses a
daemon's log and recorded the commit of the tree that parsed it; it records the log's own, as told, or refuses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import common  # noqa: E402
import first_start_phases  # noqa: E402

LOG = """2026-12-03T18:00:00.000Z INFO tritonctl.daemon: initial scan: 3 models
2026-12-03T18:00:01.500Z INFO tritonctl.startrecord: start-up scan: 3 models recorded in batches
2026-12-03T18:00:02.000Z INFO tritonctl.startbulk: launching tritonserver with the 3 staged deploys
2026-12-03T18:00:03.000Z INFO tritonctl.daemon: launched tritonserver pid 42
2026-12-03T18:00:04.250Z INFO tritonctl.startbulk: start-up: 3 models deployed through tritonserver's start-up
"""


def test_the_phases_record_the_commit_of_the_run_that_wrote_the_log(tmp_path: Path) -> None:
    log, out = tmp_path / "daemon.log", tmp_path / "phases.json"
    log.write_text(LOG)
    elsewhere = tmp_path / "tree"  # the checkout the daemon ran from: another commit than this one
    elsewhere.mkdir()
    for command in (["init", "-q"], ["-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "--allow-empty",
                                      "-m", "the run's tree"]):
        subprocess.run(["git", *command], cwd=elsewhere, check=True, capture_output=True)
    theirs = subprocess.run(["git", "rev-parse", "HEAD"], cwd=elsewhere, check=True, capture_output=True,
                            text=True).stdout.strip()
    assert first_start_phases.main([str(log), "--log-tree", str(elsewhere), "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["git_commit"] == report["log"]["git_commit"] == theirs
    assert report["parsed_by"]["git_commit"] == common.git_commit() != theirs
    assert report["phases"]["total_s"] == 4.25
    assert first_start_phases.main([str(log), "--log-commit", "1b765bc7", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["git_commit"] == "1b765bc7"
    with pytest.raises(SystemExit) as refused:  # not told: no commit is guessed
        first_start_phases.main([str(log), "--out", str(out)])
    assert refused.value.code == 2
