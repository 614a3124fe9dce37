"""An upgrade as a user makes it: the daemon of an earlier release (commit 01e9cc7, registry schema 0005)
runs on the example `linear`, records an edit, a rollback and a `stable` tag, and stops; the current
daemon then starts on the same state directory, copies the registry aside, migrates it, and answers
`versions`, `audit`, `audit --at` and `tags` with every version, audit event and tag the old one
recorded.

The old release is `git archive 01e9cc7` of this repository, run by this venv's interpreter with
PYTHONPATH on it (its dependencies are this release's). Slow: two daemons, two tritonservers.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.harness import FREE_PORTS, DaemonProcess, copy_example, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.triton]

ROOT = Path(__file__).resolve().parent.parent
OLD_COMMIT = "01e9cc7"  # registry schema 0005
MODEL = "linear"


def _old_tree(dest: Path) -> Path:
    try:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", OLD_COMMIT], capture_output=True, check=True,
                                 timeout=120).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.fail(f"cannot read commit {OLD_COMMIT} of this repository (a full clone is needed): {exc}")
    dest.mkdir()
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True, timeout=120)
    return dest


class OldRelease:
    """The old tree's CLI and daemon, run as processes by this interpreter."""

    def __init__(self, tree: Path, state: Path) -> None:
        self.tree, self.state = tree, state
        # the earlier release refuses TRITONCTL_* settings it does not know (the tiers set TRITONCTL_TEST_NO_SKIP)
        self.env = {**{k: v for k, v in os.environ.items() if not k.startswith("TRITONCTL_")},
                    "PYTHONPATH": str(tree), "TRITONCTL_RECONCILE_INTERVAL_S": "1"}
        self.env.pop("NOTIFY_SOCKET", None)
        self.proc: subprocess.Popen[bytes] | None = None

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        result = subprocess.run([sys.executable, "-m", "cli.main", *args, "--state-dir", str(self.state)],
                                cwd=self.tree, env=self.env, capture_output=True, text=True, timeout=120)
        if check and result.returncode != 0:
            raise AssertionError(f"old {' '.join(args)} exited {result.returncode}: {result.stderr}{result.stdout}")
        return result

    def json(self, *args: str) -> Any:
        return json.loads(self.cli(*args, "--json").stdout)

    def start(self, repo: Path, log: Path) -> None:
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "cli.main", "daemon", "--repository", str(repo), "--state-dir", str(self.state),
                 "--settle", "0.2", "--launch-triton", *FREE_PORTS],
                cwd=self.tree, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

        def ready() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"old daemon exited {self.proc.returncode}: {log.read_text()[-3000:]}")
            return self.cli("status", "--json", check=False).returncode == 0

        wait_for(ready, 120, 0.3, "old daemon ready")

    def stop(self) -> int | None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait()


def _serving(reader: Any) -> str | None:
    for row in reader.json("status")["models"]:
        if row["model"] == MODEL and row["state"] == "serving":
            return str(row["digest"])
    return None


def test_a_registry_written_by_the_earlier_release_opens_with_every_record(tmp_path: Path) -> None:
    tree = _old_tree(tmp_path / "old")
    repo, state = tmp_path / "repo", tmp_path / "state"
    repo.mkdir()
    copy_example(MODEL, repo)
    old = OldRelease(tree, state)
    stopped_old = False
    try:
        old.start(repo, tmp_path / "old-daemon.log")
        first = wait_for(lambda: _serving(old), 90, 0.3, "the old daemon serves linear")
        # an edit: the new content deploys
        model_py = repo / MODEL / "1" / "model.py"
        model_py.write_text(model_py.read_text() + "\n# edited before the upgrade\n")
        edited = wait_for(lambda: (d := _serving(old)) != first and d, 90, 0.3, "the edit serves")
        old.cli("rollback", MODEL)  # back to the first content
        assert wait_for(lambda: _serving(old) == first and first, 60, 0.3, "the rollback serves")
        old.cli("tag", MODEL, "stable")
        versions = old.json("versions", MODEL)
        audit = old.json("audit", "--limit", "1000")
        tags = old.json("tags", MODEL)["tags"]
        moment = audit[0]["time"]  # after the last event: what served then
        served_at = old.json("audit", "--at", moment)
        tags_at = old.json("tags", MODEL, "--at", moment)
        assert {v["digest"] for v in versions} == {first, edited}
        assert {e["action"] for e in audit} >= {"deploy", "rollback", "tag"}
        assert [(t["name"], t["digest"]) for t in tags] == [("stable", first)]
        assert old.stop() == 0, (tmp_path / "old-daemon.log").read_text()[-3000:]
        stopped_old = True
        DaemonProcess(repo, state).kill_tritonserver()  # the old daemon's server, if it left one

        new = DaemonProcess(repo, state).start()
        try:
            assert (state / "registry.db.before-0005").is_file()
            assert "copied the registry to" in new.log_tail(20000)
            new_versions = new.json("versions", MODEL)
            assert {v["digest"]: v["active"] for v in new_versions} == {v["digest"]: v["active"] for v in versions}
            new_audit = new.json("audit", "--limit", "1000")
            keys = ("id", "time", "actor", "action", "model", "digest", "outcome", "message")
            old_events = [tuple(e[k] for k in keys) for e in audit]
            assert [tuple(e[k] for k in keys) for e in new_audit][-len(old_events):] == old_events
            assert new.json("audit", "--at", moment) == served_at
            assert new.json("tags", MODEL)["tags"] == tags
            assert new.json("tags", MODEL, "--at", moment) == tags_at
        finally:
            assert new.stop() == 0, new.log_tail()
    finally:
        if not stopped_old and old.proc is not None and old.proc.poll() is None:
            old.stop()
        DaemonProcess(repo, state).kill_tritonserver()

