"""A single host (no --fleet) through an outage of its registry (docs/fleet.md "When the database is down"):
a SQLite registry (`--db-url`) on a small filesystem that fills and frees (tests/test_storage_faults.py's
fixture; the state directory, and so the journal, on another), with clients sending throughout.

What must hold: 0 failed inferences; a rollback made while the registry cannot be written serves at once
and is kept in the host's journal (a reconcile never undoes it); `status` answers (exit 0, a first line
naming the outage); /v1/ready 503 with `registry_reachable: false` during it and 200 after; when the
disk frees, the rollback is in `audit` once, at the time it happened, and `audit --at` shows it; the log
says it in two lines (one WARNING, one INFO with the outage's length and the journal entries written).
"""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest

from controlplane.store.journaled import JOURNAL_NAME
from tests.harness import DaemonProcess, api_get, request_loop, wait_for, write_gen_model
from tests.pg import PostgresServer, own_postgres  # noqa: F401 - the fixture
from tests.test_registry_outage import fill_up
from tests.test_storage_faults import small_fs  # noqa: F401 - the fixture

pytestmark = [pytest.mark.slow, pytest.mark.triton]  # ~23 s: a daemon, two deploys, the outage, a stop

MODEL = "steady"


def test_a_rollback_during_a_full_registry_disk_is_kept_and_written_once(tmp_path: Path,
                                                                         small_fs: Path) -> None:  # noqa: F811
    repo = tmp_path / "repo"
    repo.mkdir()
    write_gen_model(repo, MODEL, 1)
    daemon = DaemonProcess(repo, tmp_path / "state",
                           extra_args=["--db-url", f"sqlite:///{small_fs / 'registry.db'}"]).start()
    try:
        wait_for(lambda: daemon.model_status(MODEL).get("digest"), 60, what="generation 1 serving")
        first = daemon.model_status(MODEL)["digest"]
        write_gen_model(repo, MODEL, 2)
        wait_for(lambda: daemon.model_status(MODEL).get("digest") not in (None, first), 60,
                 what="generation 2 serving")
        wait_for(lambda: api_get(daemon, "/v1/ready")[0] == 200, 30, what="ready")
        with request_loop(daemon.triton_url(), MODEL) as stats:
            wait_for(lambda: stats["ok"] > 0, 30, what="answers")
            filler = fill_up(small_fs)
            began = datetime.now(timezone.utc).replace(tzinfo=None)
            result = daemon.run("rollback", MODEL, "--json")  # its records cannot be written: journaled
            assert result.exit_code == 0, result.output
            wait_for(lambda: stats["gens"].get(1.0, 0) > 0, 30, what="generation 1 answering again")
            second = stats["gens"].get(2.0, 0)
            journal = daemon.state_dir / JOURNAL_NAME
            assert journal.exists()
            code, document = api_get(daemon, "/v1/ready")
            assert code == 503 and document["registry_reachable"] is False, document
            assert "full" in document["reason"], document
            shown = daemon.run("status")
            assert shown.exit_code == 0, shown.output
            assert shown.output.splitlines()[0].startswith("registry unreachable since"), shown.output
            row = daemon.model_status(MODEL)
            assert row["digest"] == first and row["state"] == "serving", row  # the journal's, over the rows
            ok_before = stats["ok"]
            wait_for(lambda: stats["ok"] > ok_before + 20, 30, what="answers during the outage")
            filler.unlink()
            wait_for(lambda: api_get(daemon, "/v1/ready")[0] == 200, 30, what="ready again")
            freed = datetime.now(timezone.utc).replace(tzinfo=None)
            assert not journal.exists()
        assert stats["failed"] == 0, stats["errors"]
        assert stats["gens"].get(2.0, 0) <= second + 2, stats  # no reconcile undid the rollback meanwhile
        events = daemon.audit("--model", MODEL, "--action", "rollback")
        assert len(events) == 1 and events[0]["outcome"] == "ok", events
        when = datetime.fromisoformat(events[0]["time"].rstrip("Z"))
        assert began <= when <= freed, (began, when, freed)  # the time it happened, not the time it was written
        at = daemon.json("audit", "--at", events[0]["time"], "--model", MODEL)
        assert [(r["model"], r["digest"]) for r in at["models"]] == [(MODEL, first)], at
        lines = daemon.log_path.read_text(errors="replace").splitlines()
        told = [x for x in lines if "registry sqlite" in x or "disk is full" in x]
        assert len(told) == 2, told
        assert " WARNING " in told[0] and "unreachable: database or disk is full" in told[0], told
        assert " INFO " in told[1] and "reachable again after" in told[1], told
        assert "journal entries written" in told[1] and "; 0 journal" not in told[1], told
    finally:
        assert daemon.stop() == 0


@pytest.mark.postgres
def test_a_postgresql_restart_under_a_single_host_is_two_lines_and_status_answers(
        tmp_path: Path, own_postgres: PostgresServer) -> None:  # noqa: F811
    """The same host on a PostgreSQL that crashes and starts again: tritonserver serves throughout, `status`
    answers from what the host read (exit 0, the outage named first), /v1/ready 503 then 200, and the log
    has one WARNING and one INFO about it."""
    repo = tmp_path / "repo"
    repo.mkdir()
    write_gen_model(repo, MODEL, 1)
    daemon = DaemonProcess(repo, tmp_path / "state", extra_args=["--db-url", own_postgres.new_database("host")]).start()
    try:
        wait_for(lambda: daemon.model_status(MODEL).get("digest"), 60, what="serving")  # and read by status
        wait_for(lambda: api_get(daemon, "/v1/ready")[0] == 200, 60, what="ready")
        with request_loop(daemon.triton_url(), MODEL) as stats:
            wait_for(lambda: stats["ok"] > 0, 30, what="answers")
            own_postgres.crash()
            try:
                wait_for(lambda: api_get(daemon, "/v1/ready")[0] == 503, 30, what="not ready")
                document = api_get(daemon, "/v1/ready")[1]
                assert document["registry_reachable"] is False and "registry postgresql" in document["reason"], document
                shown = daemon.run("status")
                assert shown.exit_code == 0, shown.output
                assert shown.output.splitlines()[0].startswith("registry unreachable since"), shown.output
                assert MODEL in shown.output
                ok_before = stats["ok"]
                wait_for(lambda: stats["ok"] > ok_before + 20, 30, what="answers during the outage")
            finally:
                own_postgres.start_again()
            wait_for(lambda: api_get(daemon, "/v1/ready")[0] == 200, 30, what="ready again")
        assert stats["failed"] == 0, stats["errors"]
        lines = daemon.log_path.read_text(errors="replace").splitlines()
        told = [x for x in lines if "registry postgresql" in x or "onnection refused" in x]
        assert [x.split(" ", 2)[1] for x in told] == ["WARNING", "INFO"], told
        assert "reachable again after" in told[1] and "journal entries written" in told[1], told
    finally:
        assert daemon.stop() == 0
