"""/v1/events against a real daemon: audit records and state changes as they happen, `audit --follow`, and a
follower that resumes across a daemon restart with no event lost or repeated (Last-Event-ID)."""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controlplane.api.client import ControlClient, Event
from tests.harness import TRITONCTL, DaemonProcess, wait_for, write_gen_model


class Follower:
    """Follows the daemon's events in a thread (reconnecting, as `audit --follow` does) and keeps them."""

    def __init__(self, socket: Path, after: int | None = None) -> None:
        self.events: list[Event] = []
        self._client = ControlClient(socket=socket)
        self._thread = threading.Thread(target=self._run, args=(after,), daemon=True)
        self._thread.start()

    def _run(self, after: int | None) -> None:
        for event in self._client.events(after=after):
            self.events.append(event)

    def audits(self) -> list[dict[str, Any]]:
        return [e.data for e in self.events if e.kind == "audit"]

    def states(self, model: str) -> list[str]:
        return [e.data["state"] for e in self.events if e.kind == "state" and e.data["model"] == model]


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[DaemonProcess]:
    repo = tmp_path / "repo"
    repo.mkdir()
    write_gen_model(repo, "gen", 1)
    proc = DaemonProcess(repo, tmp_path / "state", settle_s=0.3).start()
    wait_for(lambda: proc.model_status("gen").get("state") == "serving", 60, 0.2, "serving")
    yield proc
    proc.stop()


def _audit_ids(daemon: DaemonProcess) -> list[int]:
    return sorted(e["id"] for e in daemon.json("audit", "--limit", "100000"))


def test_events_and_states_as_they_happen_and_resumed_after_a_restart(daemon: DaemonProcess) -> None:
    start = _audit_ids(daemon)[-1]
    follower = Follower(daemon.state_dir / "tritonctl.sock", after=start)
    write_gen_model(daemon.repository, "gen", 2)
    wait_for(lambda: any(a["action"] == "deploy" and a["model"] == "gen" for a in follower.audits()), 60, 0.1,
             "the deploy event")
    # the end of the deploy is sampled (every 50 ms), the deploy's audit record may come first
    wait_for(lambda: follower.states("gen")[-1:] == ["serving"], 10, 0.05, "the state back to serving")
    states = follower.states("gen")
    assert "settling" in states and "deploying" in states, states
    daemon.cli("rollback", "gen")
    wait_for(lambda: any(a["action"] == "rollback" for a in follower.audits()), 30, 0.1, "the rollback event")
    daemon.stop()  # the stream ends; the follower waits for the daemon and resumes after the last id it saw
    write_gen_model(daemon.repository, "gen", 3)  # captured and deployed by the next start
    daemon.start()
    wait_for(lambda: any(a["action"] == "daemon_start" for a in follower.audits()[-10:]), 60, 0.1,
             "events of the new daemon")
    wait_for(lambda: [a["id"] for a in follower.audits()] == [i for i in _audit_ids(daemon) if i > start], 30,
             0.2, "every event once, in order")
    received = [a["id"] for a in follower.audits()]
    assert len(received) == len(set(received)), "an event was repeated"
    assert received == sorted(received)
    assert {"snapshot", "deploy", "rollback", "daemon_stop", "daemon_start"} <= {a["action"] for a in
                                                                               follower.audits()}
    document = follower.audits()[0]
    assert {"id", "time", "actor", "action", "model", "digest", "outcome", "message"} <= set(document)


def test_audit_follow_prints_each_new_event(daemon: DaemonProcess) -> None:
    proc = subprocess.Popen([TRITONCTL, "audit", "--follow", "--json", "--model", "gen", "--state-dir",
                             str(daemon.state_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        wait_for(lambda: (daemon.state_dir / "tritonctl.sock").exists(), 10)
        threading.Timer(1.0, lambda: daemon.cli("pin", "gen")).start()
        line = proc.stdout.readline()
        event = json.loads(line)
        assert (event["action"], event["model"], event["outcome"]) == ("pin", "gen", "ok")
    finally:
        proc.terminate()
        proc.wait(10)
