"""README "Using it" runs verbatim from a second terminal: the CLI finds the daemon that the main job
started in ./.state (no --state-dir, no TRITONCTL_STATE_DIR), every line exits 0; each inference request
the README shows by curl gets the answer printed under it. The README is short (at most 250 lines)."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.harness import DaemonProcess, wait_for

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("linear", "sentiment", "sentiment_tokenizer", "sentiment_classifier", "sentiment_pipeline")
MAIN_JOB_HTTP = "127.0.0.1:8000"  # Triton's default HTTP port, which the README's main job takes


def using_it_block() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Using it"):]
    block = re.search(r"```sh\n(.*?)```", section, flags=re.S)
    assert block is not None
    return [line for line in block.group(1).splitlines() if line.strip()]


def inference_requests() -> list[tuple[str, dict[str, Any]]]:
    """Each `curl` command of "Using it" and the JSON answer the README prints under it."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Using it"):text.index("\n## ", text.index("## Using it") + 1)]
    pairs = re.findall(r"```sh\n(curl [^\n]*)\n```\s*```json\n(.*?)```", section, flags=re.S)
    return [(command, json.loads(answer)) for command, answer in pairs]


def same_answer(got: Any, want: Any) -> bool:
    """Equal, floats to 1e-5 (the probabilities printed are Triton's FP32 values as JSON numbers)."""
    if isinstance(want, float) or isinstance(got, float):
        return isinstance(got, (int, float)) and math.isclose(got, want, rel_tol=1e-5, abs_tol=1e-6)
    if isinstance(want, dict):
        return isinstance(got, dict) and got.keys() == want.keys() and all(same_answer(got[k], want[k]) for k in want)
    if isinstance(want, list):
        return isinstance(got, list) and len(got) == len(want) and all(map(same_answer, got, want))
    return bool(got == want)


def test_the_readme_is_short_and_shows_the_first_inferences() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250
    requests = inference_requests()
    assert [answer["model_name"] for _, answer in requests] == ["linear", "sentiment"]
    assert all(MAIN_JOB_HTTP in command for command, _ in requests)
    sentiment = {o["name"]: o for o in requests[1][1]["outputs"]}
    assert sentiment["prob"]["data"] == ["正向", "负面", "正向"] and sentiment["probabilities"]["shape"] == [3, 3]


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
        # The curl requests as printed, but for the port: the test's tritonserver takes a free one, never
        # the main job's 8000 (other tests and daemons share this machine).
        http = daemon.status()["triton_http_url"].removeprefix("http://")
        for command, answer in inference_requests():
            result = subprocess.run(["bash", "-c", command.replace(MAIN_JOB_HTTP, http)], cwd=clone, env=env,
                                    capture_output=True, text=True, timeout=120)
            assert result.returncode == 0, f"{command}: exit {result.returncode}: {result.stderr}"
            assert same_answer(json.loads(result.stdout), answer), f"{command}: {result.stdout}"
    finally:
        daemon.stop()
