"""No number from outside takes a model's reads down (issue 57 item 2, issue 58 item 6), against a real daemon
and its tritonserver.

What was found: `POST /v1/models/linear/load` with `"bake_s": 1e15` was accepted, and from then on
`GET /v1/models`, `/v1/ready`, `/v1/models/linear/ready` and `promote` answered `500 internal error: ValueError:
year 31690765 is out of range`, across restarts through `bakes.json`; a model's own `tritonctl.bake_s` of
"100000000000000000000" did the same. Here:
- the request is refused (400, one line naming `bake_s`), and every read keeps answering;
- the model parameter is refused by validation, naming it (`status`: invalid), and every read keeps answering;
- a `bakes.json` holding a bake out of range (what a daemon before the bound left) is dropped at the start with
  one WARNING line, never served: `status`, `/v1/ready` and `promote` answer; the next start says nothing more.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from controlplane.api.client import UnixHTTPConnection
from tests.harness import DaemonProcess, copy_example, wait_for

HUGE_BAKE_S = 1e15  # the request schemathesis made (year 31690765)
HUGE_PARAMETER = "100000000000000000000"  # issue 58's model parameter


def _call(daemon: DaemonProcess, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
    conn = UnixHTTPConnection(str(daemon.state_dir / "tritonctl.sock"), 120)
    try:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
        answer = conn.getresponse()
        return answer.status, answer.read()
    finally:
        conn.close()


def _reads_answer(daemon: DaemonProcess) -> None:
    """Every read the issue saw fail answers as documented (never 500: readiness may say 503, not ready yet, while
    a deploy or a sweep runs), and the CLI's `status` too."""
    for path in ("/v1/models", "/v1/models/linear", "/v1/ready", "/v1/models/linear/ready"):
        status, raw = _call(daemon, "GET", path)
        assert status == 200 or status == 503 and path.endswith("/ready"), f"{path}: {status} {raw[:300]!r}"
        assert b"internal error" not in raw, raw[:300]
    status, raw = _call(daemon, "POST", "/v1/models/linear/promote", {})
    assert status == 404 and b"no bake in progress" in raw, (status, raw[:300])
    result = daemon.cli("status")
    assert "linear" in result.stdout


def test_no_duration_from_a_request_a_model_or_a_record_takes_the_reads_down(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    copy_example("linear", repo)
    copy_example("linear", tmp_path).rename(repo / "selfbaked")
    config = repo / "selfbaked" / "config.pbtxt"
    config.write_text(config.read_text().replace('name: "linear"', 'name: "selfbaked"')
                      + f'parameters {{ key: "tritonctl.bake_s" value {{ string_value: "{HUGE_PARAMETER}" }} }}\n')
    daemon = DaemonProcess(repo, tmp_path / "state").start()
    try:
        wait_for(lambda: daemon.model_status("linear").get("state") == "serving", 90, 0.3, "linear serving")
        row = wait_for(lambda: (r := daemon.model_status("selfbaked")).get("sync") == "invalid" and r, 60, 0.3,
                       "selfbaked refused")
        assert 'parameters["tritonctl.bake_s"]' in str(row.get("sync_reason") or row.get("last_error")), row
        assert "at most 604800 seconds" in str(row.get("sync_reason") or row.get("last_error")), row

        # the request of issue 57: refused before anything is deployed
        status, raw = _call(daemon, "POST", "/v1/models/linear/load", {"bake_s": HUGE_BAKE_S, "force": True})
        assert status == 400, (status, raw[:300])
        assert b"bake_s" in raw
        _reads_answer(daemon)
        digest = str(daemon.model_status("linear")["digest"])
    finally:
        assert daemon.stop() == 0, daemon.log_tail()

    # What a daemon before the bound left in bakes.json: linear baking for 10^15 s, and a second record that is
    # not one at all; the start drops both with one WARNING line and serves neither.
    bakes = tmp_path / "state" / "bakes.json"
    limits = {"bake_s": HUGE_BAKE_S, "max_failure_ratio": 0.01, "max_latency_ratio": None, "min_requests": 20,
              "inconclusive": "keep"}
    bakes.write_text(json.dumps([
        {"model": "linear", "digest": digest, "previous": None, "limits": limits, "started": 1_700_000_000.0,
         "baseline_latency_ms": None, "state": "baking", "reason": "", "ended": None, "baseline_p99_ms": None,
         "p99_ms": None, "warned": True, "tally": [0, 0, 0, 0], "group": [], "group_id": ""},
        {"model": "selfbaked", "tally": [1e400, 0, 0, 0]},
    ]))
    for _ in range(2):
        again = DaemonProcess(repo, tmp_path / "state").start()
        try:
            wait_for(lambda d=again: d.model_status("linear").get("state") == "serving", 90, 0.3, "linear serving")
            _reads_answer(again)
            assert again.model_status("linear").get("bake") in (None, {}), again.model_status("linear")
        finally:
            assert again.stop() == 0, again.log_tail()
        warned = [line for line in again.log_path.read_text().splitlines()
                  if "WARNING" in line and "bakes.json" in line]
        # both starts write to one log: the first start's one line, none from the second
        assert len(warned) == 1, warned
        assert "2 record(s) out of range or unreadable dropped" in warned[0], warned
