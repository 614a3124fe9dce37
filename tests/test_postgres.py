"""What only PostgreSQL shows: upgrading a 0001 registry widens 32-bit sizes in place, concurrent first
sight of a model from several hosts, and the daemon end to end with `--db-url postgresql+psycopg://...`.

The registry's semantics and migrations run on PostgreSQL as well as SQLite in tests/test_registry.py
(one suite, parametrized over both). The server is the session's throwaway cluster (tests/pg.py); every
test gets a database of its own. Where PostgreSQL is not installed these tests skip with the reason;
CI (.ci/run) installs it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane.errors import StoreError
from controlplane.store import migrate
from controlplane.store.registry import Registry
from tests.harness import DaemonProcess, infer_gen, wait_for, write_gen_model
from tests.test_registry import D1, D2


@pytest.fixture
def registry(pg_url: str) -> Iterator[Registry]:
    reg = Registry(pg_url, host="h1")
    migrate.upgrade(reg)
    yield reg
    reg.close()


def record(reg: Registry, model: str, digest: str, total_bytes: int = 10) -> tuple[object, bool]:
    return reg.record_snapshot(model, digest, "{}", config=None, versions=[1], served_versions=[1], valid=True,
                               problems=[], total_bytes=total_bytes)


# --- migrations ------------------------------------------------------------------------------------


def test_upgrade_from_0001_keeps_rows_and_widens_sizes(pg_url: str) -> None:
    """A registry created at 0001 (32-bit sizes) upgrades in place; a > 2 GiB model then fits."""
    reg = Registry(pg_url)
    try:
        migrate.upgrade(reg, "0001")
        record(reg, "linear", D1, total_bytes=2**31 - 1)
        with pytest.raises(StoreError, match="out of range"):
            record(reg, "big", D2, total_bytes=5 * 2**30)
        migrate.upgrade(reg)
        record(reg, "big", D2, total_bytes=5 * 2**30)
        assert reg.get_snapshot("big", D2).total_bytes == 5 * 2**30
        assert reg.get_snapshot("linear", D1).total_bytes == 2**31 - 1
    finally:
        reg.close()


# --- several hosts at once -------------------------------------------------------------------------


def test_concurrent_first_sight_of_a_model_creates_it_once(registry: Registry) -> None:
    """Several hosts (here threads) meeting a new model at once: one row, no error."""
    errors: list[Exception] = []

    def ensure() -> None:
        try:
            registry.ensure_model("raced")
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=ensure) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert [m.name for m in registry.list_models()] == ["raced"]


# --- the daemon end to end -------------------------------------------------------------------------


@pytest.mark.triton
def test_daemon_deploys_and_rolls_back_with_the_registry_on_postgres(tmp_path: Path, pg_url: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITONCTL_DB_URL", pg_url)  # the harness's in-process CLI reads PostgreSQL too
    repo = tmp_path / "repo"
    write_gen_model(repo, "pgmodel", 1)
    daemon = DaemonProcess(repo, tmp_path / "state", extra_args=["--db-url", pg_url, "--host", "pg-host"]).start()
    try:
        import tritonclient.grpc as grpcclient

        client = grpcclient.InferenceServerClient(daemon.triton_url())

        def serving(gen: int) -> bool:
            try:
                return infer_gen(client, "pgmodel") == gen
            except Exception:  # noqa: BLE001 - not loaded yet
                return False

        wait_for(lambda: serving(1), 60, 0.1, "generation 1")
        # Triton answers as soon as the load is verified; the deploy commits (the digest) just after
        first = wait_for(lambda: daemon.model_status("pgmodel").get("digest"), 30, 0.1, "generation 1 committed")
        write_gen_model(repo, "pgmodel", 2)
        wait_for(lambda: serving(2), 30, 0.1, "generation 2")
        # A broken version is rolled back, quarantined and never answers.
        write_gen_model(repo, "pgmodel", 3, init="raise RuntimeError('weights missing')")
        wait_for(lambda: daemon.audit("--model", "pgmodel", "--outcome", "rolled_back"), 30, what="rollback")
        assert serving(2)
        # An operator rollback to the first version.
        back = daemon.json("rollback", "pgmodel", "--to", first[:12])
        assert back["outcome"] == "ok" and back["digest"] == first
        assert serving(1)
        client.close()
        # No registry file was created: everything went to PostgreSQL.
        assert not (tmp_path / "state" / "registry.db").exists()
    finally:
        assert daemon.stop() == 0, daemon.log_tail()
    # Read back with the daemon stopped, through the CLI, from PostgreSQL only.
    nowhere = str(tmp_path / "no-state")
    audit = daemon.cli("audit", "--db-url", pg_url, "--model", "pgmodel", "--json", "--state-dir", nowhere)
    events = json.loads(audit.stdout)
    outcomes = [(e["action"], e["outcome"]) for e in events]
    assert ("rollback", "ok") in outcomes and ("deploy", "rolled_back") in outcomes
    assert outcomes.count(("deploy", "ok")) == 2
    assert {e["host"] for e in events} == {"pg-host"}
    versions = json.loads(daemon.cli("versions", "pgmodel", "--db-url", pg_url, "--json",
                                     "--state-dir", nowhere).stdout)
    assert len(versions) == 3 and sum(v["quarantined"] for v in versions) == 1
    assert [v["digest"] for v in versions if v["active"]] == [first]
    at = json.loads(daemon.cli("audit", "--db-url", pg_url, "--at", "0m", "--json", "--state-dir", nowhere).stdout)
    assert [(m["model"], m["digest"]) for m in at["models"]] == [("pgmodel", first)]
