"""The fleet end to end with its shared store on S3: one PostgreSQL, two `tritonctl daemon --fleet
--shared-store s3://BUCKET/fleet` processes (each with its own tritonserver and state directory) and
moto_server on loopback. An edit of the source is recorded by the leader, its objects and then its
manifest put in the bucket, and served on both hosts after each verified every object it fetched."""

from __future__ import annotations

import json
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as grpcclient

from tests.harness import DaemonProcess, infer_gen, wait_for, write_gen_model
from tests.pg import PostgresServer
from tests.s3server import MotoServer, s3server  # noqa: F401 - fixture

# ruff: noqa: F811 - the fixture imported above is a parameter below

HOSTS = ["h1", "h2"]
MODEL = "s3fleetmodel"


class S3Fleet:
    def __init__(self, base: Path, url: str, server: MotoServer) -> None:
        self.repo = base / "repo"
        self.repo.mkdir()
        self.bucket = f"fleet-{uuid.uuid4().hex[:10]}"
        self.s3 = server.client()
        self.s3.create_bucket(Bucket=self.bucket)
        self.url = url
        self.daemons = {
            host: DaemonProcess(self.repo, base / f"state-{host}", settle_s=0.2, env=server.env,
                                extra_args=["--fleet", "--db-url", url, "--host", host,
                                            "--shared-store", f"s3://{self.bucket}/fleet"])
            for host in HOSTS
        }
        self.clients: dict[str, grpcclient.InferenceServerClient] = {}

    def gen(self, host: str) -> float | None:
        try:
            return infer_gen(self.clients[host], MODEL)
        except Exception:  # noqa: BLE001 - not loaded (yet)
            return None

    def wait_gen(self, gen: int, timeout_s: float = 90.0) -> None:
        wait_for(lambda: all(self.gen(h) == gen for h in HOSTS), timeout_s, 0.1,
                 f"generation {gen} on {HOSTS} (now {[self.gen(h) for h in HOSTS]})")

    def cli_json(self, *args: str) -> Any:
        from click.testing import CliRunner

        from cli.main import cli

        result = CliRunner().invoke(cli, [*args, "--db-url", self.url, "--json"])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    def stop_all(self) -> None:
        for client in self.clients.values():
            client.close()
        for proc in self.daemons.values():
            if proc.proc is not None and proc.proc.poll() is None:
                proc.proc.send_signal(signal.SIGTERM)
        for proc in self.daemons.values():
            proc.stop()


@pytest.fixture(scope="module")
def s3fleet(tmp_path_factory: pytest.TempPathFactory, postgres: PostgresServer,
            s3server: MotoServer) -> Iterator[S3Fleet]:
    fleet = S3Fleet(tmp_path_factory.mktemp("s3fleet"), postgres.new_database("s3fleet"), s3server)
    try:
        for proc in fleet.daemons.values():
            proc.start(wait=False)
        for host, proc in fleet.daemons.items():
            proc.wait_ready()
            fleet.clients[host] = grpcclient.InferenceServerClient(proc.triton_url())
        yield fleet
    finally:
        fleet.stop_all()


@pytest.mark.slow  # ~20-30 s (PostgreSQL, two daemons, two tritonservers); the default suite has the
# shared store's S3 round trip and corruption check in tests/test_s3_source.py
def test_edits_reach_every_host_through_the_bucket(s3fleet: S3Fleet) -> None:
    write_gen_model(s3fleet.repo, MODEL, 1)
    s3fleet.wait_gen(1)

    def settled() -> Any:
        rows = [m for m in s3fleet.cli_json("status", "--fleet")["models"] if m["model"] == MODEL]
        ok = rows and sorted(rows[0]["hosts"]) == HOSTS and not any(c["drift"] for c in rows[0]["hosts"].values())
        return rows[0] if ok else None

    digest = wait_for(settled, 30, 0.2, "the fleet settled")["target"]
    keys = {o["Key"] for o in s3fleet.s3.list_objects_v2(Bucket=s3fleet.bucket, Prefix="fleet/")["Contents"]}
    assert f"fleet/manifests/{digest}.json" in keys
    manifest = json.loads(s3fleet.s3.get_object(Bucket=s3fleet.bucket,
                                                Key=f"fleet/manifests/{digest}.json")["Body"].read())
    shas = {e["sha256"] for e in manifest["entries"] if e["kind"] == "file"}
    assert {f"fleet/objects/{s[:2]}/{s[2:]}" for s in shas} <= keys
    for host in HOSTS:  # every host holds the snapshot in its own store, imported from the bucket
        assert (s3fleet.daemons[host].state_dir / "store" / "trees" / f"{digest}.json").exists()
