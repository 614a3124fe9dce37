"""docs/cli.md "Memory budget and on-demand models" (the README links it) runs verbatim in a clone: the
daemon line in the first terminal, the others in a second; `ensure` returns with the model READY under
its lease, and `status -o wide` shows it loaded with the lease and a measured footprint."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import SWITCH_AT_ONCE_ENV, wait_for

ROOT = Path(__file__).resolve().parent.parent


def ondemand_block() -> list[str]:
    text = (ROOT / "docs" / "cli.md").read_text()  # the CLI reference, linked from the README
    section = text[text.index("## Memory budget and on-demand models"):]
    block = re.search(r"```sh\n(.*?)```", section, flags=re.S)
    assert block is not None
    return [line.split("  #")[0].strip() for line in block.group(1).splitlines() if line.strip()]


def test_the_block_starts_the_daemon_where_the_cli_finds_it() -> None:
    daemon, *rest = ondemand_block()
    assert daemon.startswith("tritonctl daemon ") and "--state-dir .state" in daemon
    assert "--policy ondemand" in daemon and "--memory-budget-mb" in daemon
    assert rest and all(line.startswith("tritonctl ") and "--state-dir" not in line for line in rest)


@pytest.mark.slow
def test_the_ondemand_block_runs_verbatim(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    shutil.copytree(ROOT / "examples" / "model_repository", clone / "examples" / "model_repository")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRITONCTL_")}
    env.update(SWITCH_AT_ONCE_ENV)  # the suite's daemons switch at once (tests/harness.py)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # the venv, activated
    daemon_line, *lines = ondemand_block()
    log = (tmp_path / "daemon.log").open("w")
    daemon = subprocess.Popen(["bash", "-c", f"exec {daemon_line}"], cwd=clone, env=env, stdout=log,
                              stderr=subprocess.STDOUT, start_new_session=True)

    def answers() -> bool:
        assert daemon.poll() is None, (tmp_path / "daemon.log").read_text()[-3000:]
        return subprocess.run(["tritonctl", "status", "--json"], cwd=clone, env=env,
                              capture_output=True).returncode == 0

    try:
        wait_for(answers, 120, 0.5, "the daemon answers in ./.state")
        # at once: the models are still settling (just copied) or in the start-up scan, and `ensure`
        # waits for one on its way to the registry instead of calling it unknown
        outputs = []
        for line in lines:
            result = subprocess.run(["bash", "-c", line], cwd=clone, env=env, capture_output=True, text=True,
                                    timeout=300)
            assert result.returncode == 0, f"{line}: exit {result.returncode}: {result.stderr}{result.stdout}"
            outputs.append(result.stdout)
        ensured, wide = outputs[0], outputs[-1]
        assert ensured.startswith("linear ") and "lease" in ensured, ensured
        row = next(r for r in wide.splitlines() if r.startswith("linear "))
        assert "loaded (leases: 1" in row and " MB" in row, wide


        def pipeline_standby() -> bool:  # the ensemble is recorded once its steps are (it may settle later)
            rows = subprocess.run(["tritonctl", "status", "-o", "wide"], cwd=clone, env=env, capture_output=True,
                                  text=True).stdout.splitlines()[1:]
            return any(r.split()[0] == "sentiment_pipeline" and "standby" in r for r in rows if r.split())

        wait_for(pipeline_standby, 60, 0.5, "sentiment_pipeline standby")
    finally:
        os.killpg(daemon.pid, signal.SIGTERM)
        assert daemon.wait(60) == 0, (tmp_path / "daemon.log").read_text()[-3000:]
        log.close()
