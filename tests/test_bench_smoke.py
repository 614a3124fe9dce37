"""CI smoke of bench/audit_query.py: it runs end to end on a small registry and writes its JSON.

A real subprocess, as a person runs it; the numbers are not judged here (CI machines vary), only that
every measurement ran and the report has the shape docs/benchmarks.md relies on.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_audit_query_bench_quick_runs_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "audit_query.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "audit_query.py"), "--quick", "--events", "5000",
         "--serving-changes", "500", "--models", "20", "--repetitions", "10", "--out", str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "audit: model + 24 h window" in proc.stdout and "results:" in proc.stdout
    report = json.loads(out.read_text())
    assert report["dataset"]["events"] == 5000
    assert report["dataset"]["serving_changes"] == 500
    assert {"nproc", "python", "sqlite"} <= set(report["machine"])
    names = [r["name"] for r in report["results"]]
    assert names[:4] == ["audit: model + 24 h window (CLI reader)", "audit --at T: every model (CLI reader)",
                         "audit: model + 24 h window (registry)", "audit --at T: every model (registry)"]
    assert any(name.startswith("CLI: ") for name in names)
    for result in report["results"]:
        assert result["median_ms"] > 0 and result["p95_ms"] >= result["median_ms"]
        assert result["repetitions"] >= 2
    assert [r["target_median_ms"] for r in report["results"][:4]] == [20.0] * 4
    assert report["git_commit"] and len(report["machine"]["load_average_end"]) == 3  # provenance
    at = report["results"][1]
    assert at["rows_returned"] <= 20
    assert any("ix_audit_model_time" in line for line in report["query_plans"]["audit: model + window"])
    assert any("ix_serving_model_host_time" in line for line in report["query_plans"]["CLI reader: audit --at T"])
