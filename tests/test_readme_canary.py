"""README "A bad edit meets a canary" runs as written in a clone of the examples, against a daemon with the
safe defaults (canary steps [10, 100], a 60 s bake): the edit of `linear` that fails a fifth of its inputs
never gets past its first step, the client counts at most 20 failed requests, all of them within 10 s, and
`versions` notes the rollout `canary 10% rolled back`. The daemon's gateway carries the traffic (issue 54):
without it the run skips, saying so; the block's shape is checked either way."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import DaemonProcess, wait_for
from tests.test_canary_e2e import GATEWAY, client_urls

ROOT = Path(__file__).resolve().parent.parent
MODELS = ("linear",)
DEFAULT_HTTP = "http://127.0.0.1:8000"  # the client's default: the gateway's port in the README's main job


def canary_block() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("### A bad edit meets a canary"):]
    block = re.search(r"```sh\n(.*?)```", section, flags=re.S)
    assert block is not None
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_the_block_sends_traffic_edits_linear_and_asks_tritonctl() -> None:
    client, edit, *rest = canary_block()
    assert client.startswith("python3 examples/canary/client.py ") and client.split("#")[0].strip().endswith("&")
    assert edit.startswith("cp examples/canary/linear_failing.py examples/model_repository/linear/1/model.py")
    assert [line.split()[:2] for line in rest] == [["tritonctl", "status"], ["tritonctl", "versions"]]
    assert (ROOT / "examples" / "canary" / "client.py").exists() and (ROOT / "examples" / "canary" /
                                                                       "linear_failing.py").exists()


@pytest.mark.slow
@pytest.mark.triton
@pytest.mark.skipif(not GATEWAY, reason="the gateway process (controlplane.gateway, issue 54) is not here: canary "
                                        "steps need it to carry and count the traffic")
def test_a_bad_edit_never_gets_past_its_first_step(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    repo = clone / "examples" / "model_repository"
    repo.mkdir(parents=True)
    for name in MODELS:
        shutil.copytree(ROOT / "examples" / "model_repository" / name, repo / name)
    shutil.copytree(ROOT / "examples" / "canary", clone / "examples" / "canary")
    daemon = DaemonProcess(repo, clone / ".state", switch_at_once=False).start()
    client = None
    try:
        wait_for(lambda: daemon.model_status("linear").get("state") == "serving", 90, 0.5, "linear serving")
        good = daemon.model_status("linear")["digest"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRITONCTL_")}
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"  # what `. .venv/bin/activate` does
        _, http = client_urls(daemon)
        for line in canary_block():
            command = line.split("  #")[0].strip()
            if command.endswith("&"):  # the client, in the background: its summary read at the end
                words = command.rstrip("&").split() + ["--json", "--url", f"http://{http}"]
                client = subprocess.Popen([sys.executable, *words[1:]], cwd=clone, env=env, stdout=subprocess.PIPE,
                                          text=True)
                wait_for(lambda: daemon.model_status("linear").get("state") == "serving", 5, 0.5, "still serving")
                continue
            result = subprocess.run(["bash", "-c", command], cwd=clone, env=env, capture_output=True, text=True,
                                    timeout=120)
            assert result.returncode == 0, f"{line}: exit {result.returncode}: {result.stderr}{result.stdout}"
        wait_for(lambda: "canary 10% rolled back" in daemon.run("versions", "linear").output, 120, 0.5,
                 "the bad edit rolled back at its first step")
        assert daemon.model_status("linear")["digest"] == good
        assert client is not None
        out, _ = client.communicate(timeout=150)
        summary = json.loads(out.strip().splitlines()[-1])
        assert 0 < summary["failed"] <= 20, summary
        assert summary["last_failure_s"] - summary["first_failure_s"] <= 10.0, summary
    finally:
        if client is not None and client.poll() is None:
            client.kill()
        daemon.stop()
