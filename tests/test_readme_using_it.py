"""README "Using it" runs verbatim from a second terminal: the CLI finds the daemon that the main job
started in ./.state (no --state-dir, no TRITONCTL_STATE_DIR), every line exits 0."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import DaemonProcess, wait_for

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("linear", "sentiment_tokenizer", "sentiment_classifier", "sentiment_pipeline")


def using_it_block() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Using it"):]
    block = re.search(r"```sh\n(.*?)```", section, flags=re.S)
    assert block is not None
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_the_block_starts_in_the_clone_with_the_venv() -> None:
    lines = using_it_block()
    assert lines[0] == ". .venv/bin/activate"
    assert all(line.startswith("tritonctl ") for line in lines[1:])
    assert not any("--state-dir" in line or "DIGEST" in line.split("#")[0] for line in lines)


@pytest.mark.slow
def test_using_it_runs_verbatim_against_a_daemon(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    repo = clone / "examples" / "model_repository"
    repo.mkdir(parents=True)
    for name in MODELS:
        shutil.copytree(ROOT / "examples" / "model_repository" / name, repo / name)
    daemon = DaemonProcess(repo, clone / ".state").start()
    try:
        for name in MODELS:
            wait_for(lambda n=name: daemon.model_status(n).get("state") == "serving", 90, 0.5, f"{name} serving")
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRITONCTL_")}
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # what `. .venv/bin/activate` does
        for line in using_it_block()[1:]:
            result = subprocess.run(["bash", "-c", line], cwd=clone, env=env, capture_output=True, text=True,
                                    timeout=300)
            assert result.returncode == 0, f"{line}: exit {result.returncode}: {result.stderr}{result.stdout}"
    finally:
        daemon.stop()
