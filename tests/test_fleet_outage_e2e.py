"""The fleet through a database outage (docs/fleet.md "When the database is down"): three
`tritonctl daemon --fleet --launch-triton` hosts on a PostgreSQL of this module's own, which is crashed
(`pg_ctl stop -m immediate`) while the canary deploys an edit, kept down ~15 s, and started again on
the same data.

What must hold: 0 failed inferences on any host; no host judged dead for the outage (no step skipped)
and the rollout finishing in its own order (canary, then each wave); the canary's deploy, finished while
the database was down, in the shared audit once (the host's journal wrote it when the database came
back); /v1/ready 503 with `registry_reachable: false` during the outage and 200 after; `tritonctl
status` answering on a host during the outage (exit 0, a first line naming the outage); and the log
saying it in a few lines per host (not one a second per thread).
"""

from __future__ import annotations

import json
import re
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from controlplane.api.client import UnixHTTPConnection
from tests.harness import DaemonProcess, request_loop, wait_for, write_gen_model
from tests.pg import PostgresServer, own_postgres  # noqa: F401 - the fixture
from tests.test_fleet_e2e import MODEL, Fleet, running_fleet

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.triton]

HOSTS = ["h1", "h2", "h3"]
OUTAGE_S = 15.0
# every line the daemon logs about the shared database, in the old words and the new ones
DB_LINES = re.compile(r"fleet heartbeat:|fleet agent_tick:|fleet leader_tick:|placed models:|leader election:"
                      r"|registry postgresql")


def ready(daemon: DaemonProcess) -> tuple[int, dict[str, Any]]:
    conn = UnixHTTPConnection(str(daemon.state_dir / "tritonctl.sock"), 30)
    try:
        conn.request("GET", "/v1/ready")
        answer = conn.getresponse()
        return answer.status, json.loads(answer.read())
    finally:
        conn.close()


def log_lines(fleet: Fleet, host: str) -> list[str]:
    return fleet.daemons[host].log_path.read_text(errors="replace").splitlines()


def test_a_crashed_database_mid_rollout_loses_nothing(tmp_path: Path, own_postgres: PostgresServer) -> None:  # noqa: F811
    database = own_postgres
    url = database.new_database("outage")

    def configure(fl: Fleet) -> None:
        write_gen_model(fl.repo, MODEL, 1)
        for host in HOSTS:
            fl.daemon(host).extra_args[fl.daemon(host).extra_args.index("--wave-size") + 1] = "1"

    with running_fleet(tmp_path, url, HOSTS, configure) as fleet:
        fleet.wait_gen(1, HOSTS, 90)
        with ExitStack() as stack:
            loops = {h: stack.enter_context(request_loop(fleet.daemons[h].triton_url(), MODEL, threads=1))
                     for h in HOSTS}
            marks = {h: len(log_lines(fleet, h)) for h in HOSTS}
            write_gen_model(fleet.repo, MODEL, 2, init="import time; time.sleep(2)")  # the canary's load: 2 s
            [rollout] = wait_for(lambda: fleet.cli_json("rollouts", "--open"), 60, 0.1, "the rollout")

            def canary_deploying() -> bool:  # its step claimed: it imports the snapshot (milliseconds), loads it
                return any(f"{MODEL}: rollout {rollout['id']} step" in line and "deploy" in line
                           for line in log_lines(fleet, "h1")[marks["h1"]:])

            wait_for(canary_deploying, 60, 0.05, "the canary deploying the edit")
            time.sleep(0.5)  # imported by now; tritonserver loads it for 2 s more
            database.crash()
            crashed = time.monotonic()
            try:
                wait_for(lambda: ready(fleet.daemons["h2"])[0] == 503, 10, 0.2, "h2 not ready")
                code, document = ready(fleet.daemons["h2"])
                assert document["registry_reachable"] is False and "registry postgresql" in document["reason"]
                assert document["registry_unreachable_since"]
                out = fleet.daemons["h2"].cli("status")  # exit 0: what the host knows
                first = out.stdout.splitlines()[0]
                assert first.startswith("registry unreachable since "), out.stdout
                assert MODEL in out.stdout
                status = fleet.daemons["h3"].json("status")
                assert status["registry_reachable"] is False and status["models"][0]["model"] == MODEL
                # the canary finishes its deploy while the database is down
                wait_for(lambda: fleet.gen("h1") == 2.0, 30, 0.1, "the canary serving gen 2 during the outage")
                time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - crashed)))
            finally:
                outage = time.monotonic() - crashed
                database.start_again()
            back = time.monotonic()
            fleet.wait_gen(2, HOSTS, 60)
            converged = time.monotonic() - back
            wait_for(lambda: all(ready(fleet.daemons[h])[0] == 200 for h in HOSTS), 30, 0.2, "ready again")
        for host, stats in loops.items():
            assert stats["failed"] == 0, (host, stats["errors"])
        done = wait_for(lambda: [r for r in fleet.cli_json("rollouts") if r["id"] == rollout["id"]
                                 and r["state"] == "done"], 30, 0.2, "the rollout done")[0]
        deploys = sorted((s for s in done["steps"] if s["action"] == "deploy"), key=lambda s: s["wave"])
        assert [(s["host"], s["state"]) for s in deploys] == [("h1", "ok"), ("h2", "ok"), ("h3", "ok")], deploys
        for earlier, later in zip(deploys, deploys[1:], strict=False):
            assert earlier["finished_at"] <= later["started_at"], "in wave order"
        # the canary's deploy during the outage: in the shared audit once, and `audit --at` says so
        events = [e for e in fleet.cli_json("audit", "--model", MODEL, "--limit", "500")
                  if e["action"] == "deploy" and e["digest"] == rollout["digest"]]
        assert sorted(e["host"] for e in events) == HOSTS, events
        at = fleet.cli_json("audit", "--at", "0s")
        assert {m["host"]: m["digest"] for m in at["models"] if m["model"] == MODEL} == dict.fromkeys(
            HOSTS, rollout["digest"])
        journaled = 0
        for host in HOSTS:
            said = [line for line in log_lines(fleet, host)[marks[host]:] if DB_LINES.search(line)]
            assert len(said) <= 3, (host, said)  # unreachable, (a minute later: still), reachable again
            assert any("unreachable" in line for line in said) and any("reachable again" in line for line in said)
            journaled += sum(int(m.group(1)) for line in said if (m := re.search(r"(\d+) journal entr", line)))
        assert journaled >= 1
        print(f"outage {outage:.1f}s; every host on the edit {converged:.1f}s after the database returned; "
              f"{journaled} journal entr{'y' if journaled == 1 else 'ies'} written")
