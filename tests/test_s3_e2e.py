"""End to end with the source repository in a bucket: the real daemon (`tritonctl daemon --repository
s3://BUCKET/models`, its launched tritonserver) against moto_server on loopback, driven by uploads.

- an example model uploaded to the bucket is served, as `tritonctl status` shows (the whole example
  repository behind `-m slow`);
- object-storage edit torture: a probe model whose answer shows the generation of its config and of
  its code, rewritten object by object (`aws s3 sync` order, pauses longer than the poll interval)
  under a request loop: 0 mixed answers and every edit served (20 edits behind `-m slow`);
- (slow) the endpoint down for a while: what serves keeps serving, the edit made meanwhile is served after;
- (slow) the daemon restarted with wrong credentials: one error line, every model still serving.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as grpcclient

from tests.harness import DaemonProcess, infer_gen, request_loop, wait_for
from tests.s3server import MotoServer, s3server, upload_tree  # noqa: F401 - fixtures

# ruff: noqa: F811 - the fixtures imported above are parameters below

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "model_repository"
PROBE = "s3probe"
PROBE_CONFIG = """name: "s3probe"
backend: "python"
max_batch_size: 8
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "gen" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
parameters {{ key: "config_gen" value {{ string_value: "{gen}" }} }}
"""
# Answers code generation * 1000 + config generation: a mix of two uploads is visible in every answer.
PROBE_MODEL = """import json

import numpy as np
import triton_python_backend_utils as pb_utils

CODE_GEN = {gen}


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.answer = CODE_GEN * 1000 + int(config["parameters"]["config_gen"]["string_value"])

    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("gen", np.full_like(x, self.answer,
                                                                                       dtype=np.float32))]))
        return out
"""


class S3Daemon:
    def __init__(self, server: MotoServer, base: Path) -> None:
        self.server = server
        self.bucket = f"e2e-{uuid.uuid4().hex[:10]}"
        self.client = server.client()
        self.client.create_bucket(Bucket=self.bucket)
        self.base = base
        self.daemon = self.new_daemon(server.env)

    def new_daemon(self, env: dict[str, str]) -> DaemonProcess:
        return DaemonProcess(f"s3://{self.bucket}/models", self.base / "state",  # type: ignore[arg-type]
                             settle_s=1.0, env=env, extra_args=["--poll-interval", "0.2"])

    def put(self, model: str, rel: str, data: str | bytes) -> None:
        body = data.encode() if isinstance(data, str) else data
        self.client.put_object(Bucket=self.bucket, Key=f"models/{model}/{rel}", Body=body)

    def upload_probe(self, gen: int, pause_s: float, config_first: bool) -> None:
        """One object at a time, like `aws s3 sync`, with pauses longer than the poll interval."""
        steps = [("config.pbtxt", PROBE_CONFIG.format(gen=gen)), ("1/model.py", PROBE_MODEL.format(gen=gen))]
        for rel, text in steps if config_first else reversed(steps):
            self.put(PROBE, rel, text)
            time.sleep(pause_s)


@pytest.fixture(scope="module")
def s3d(s3server: MotoServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Daemon]:
    d = S3Daemon(s3server, tmp_path_factory.mktemp("s3e2e"))
    upload_tree(d.client, d.bucket, "models/linear/", EXAMPLES / "linear")
    d.upload_probe(1, 0.0, True)
    d.daemon.start()
    yield d
    assert d.daemon.stop() == 0, d.daemon.log_tail()


@pytest.fixture(scope="module")
def client(s3d: S3Daemon) -> Iterator[grpcclient.InferenceServerClient]:
    c = grpcclient.InferenceServerClient(s3d.daemon.triton_url())
    yield c
    c.close()


def expected(gen: int) -> float:
    return float(gen * 1000 + gen)


def answers(client: grpcclient.InferenceServerClient, value: float) -> bool:
    try:
        return infer_gen(client, PROBE) == value
    except Exception:  # noqa: BLE001 - not loaded yet
        return False


def serving(s3d: S3Daemon, names: list[str], timeout_s: float) -> dict[str, Any]:
    def all_serving() -> Any:
        rows = {r["model"]: r for r in s3d.daemon.status()["models"]}
        return all(rows.get(n, {}).get("state") == "serving" for n in names) and rows

    try:
        rows = wait_for(all_serving, timeout_s, 0.5, f"{names} serving from the bucket")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{s3d.daemon.status()}\n{s3d.daemon.log_tail()}") from None
    assert all(rows[n]["versions"] and rows[n]["versions"][0]["state"] == "READY" for n in names)
    result = s3d.daemon.cli("status", "--json")  # the installed `tritonctl`, as an operator runs it
    assert {r["model"]: r["state"] for r in json.loads(result.stdout)["models"]}.items() >= \
        {n: "serving" for n in names}.items()
    return dict(rows)


def answers_any(client: grpcclient.InferenceServerClient) -> float | None:
    try:
        return infer_gen(client, PROBE)
    except Exception:  # noqa: BLE001 - not loaded yet
        return None


def test_example_model_served_from_the_bucket(s3d: S3Daemon) -> None:
    serving(s3d, ["linear", PROBE], 60)


@pytest.mark.slow
def test_example_repository_served_from_the_bucket(s3d: S3Daemon) -> None:
    upload_tree(s3d.client, s3d.bucket, "models/", EXAMPLES)  # `aws s3 sync examples/model_repository ...`
    serving(s3d, sorted(p.name for p in EXAMPLES.iterdir() if p.is_dir()), 180)


def torture(s3d: S3Daemon, client: grpcclient.InferenceServerClient, edits: int) -> dict[str, Any]:
    wait_for(lambda: answers(client, expected(1)), 60, 0.1, "probe generation 1")
    served, started = [], time.monotonic()
    with request_loop(s3d.daemon.triton_url(), PROBE) as stats:
        for gen in range(2, edits + 2):
            s3d.upload_probe(gen, pause_s=0.5, config_first=gen % 2 == 0)
            wait_for(lambda g=gen: answers(client, expected(g)), 60, 0.05, f"probe generation {gen} served")
            served.append(gen)
    mixed = {v: n for v, n in stats["gens"].items() if int(v) // 1000 != int(v) % 1000}
    result = {"edits": edits, "served": len(served), "requests": stats["ok"], "failed": stats["failed"],
              "mixed": sum(mixed.values()), "seconds": round(time.monotonic() - started, 1)}
    print(f"object-storage edit torture: {result}")
    assert not mixed, f"mixed answers (code*1000+config): {mixed}"
    assert stats["failed"] == 0, stats["errors"]
    assert stats["ok"] > 0 and len(served) == edits
    return result


def test_object_storage_edit_torture_short(s3d: S3Daemon, client: grpcclient.InferenceServerClient) -> None:
    torture(s3d, client, 2)


@pytest.mark.slow
def test_object_storage_edit_torture_20_edits(s3d: S3Daemon, client: grpcclient.InferenceServerClient) -> None:
    torture(s3d, client, 20)


@pytest.mark.slow  # the same, without the daemon, in tests/test_s3_source.py
def test_endpoint_down_serving_unchanged_then_resumes(s3d: S3Daemon,
                                                     client: grpcclient.InferenceServerClient) -> None:
    serving(s3d, [PROBE], 60)
    current = wait_for(lambda: answers_any(client), 30, 0.1, "the probe answering")
    gen = int(current) // 1000 + 1
    unreachable = s3d.daemon.log_tail(10_000_000).count("object storage unreachable")
    s3d.server.relay.down()
    try:
        s3d.upload_probe(gen, 0.0, True)  # written while the daemon cannot see the endpoint
        # the daemon's own word that a poll ran and could not see the endpoint: nothing to deploy
        wait_for(lambda: s3d.daemon.log_tail(10_000_000).count("object storage unreachable") > unreachable, 30, 0.1,
                 "a poll refused by the endpoint that is down")
        assert infer_gen(client, PROBE) == current
        assert s3d.daemon.model_status(PROBE)["state"] == "serving"
    finally:
        s3d.server.relay.up()
    wait_for(lambda: answers(client, expected(gen)), 60, 0.1, "the edit made while the endpoint was down")
    assert "object storage unreachable" in s3d.daemon.log_tail(20000)


@pytest.mark.slow
def test_restart_with_wrong_credentials_changes_nothing(s3d: S3Daemon) -> None:
    before = {r["model"]: r["digest"] for r in s3d.daemon.status()["models"] if r["state"] == "serving"}
    assert s3d.daemon.stop() == 0
    s3d.daemon = s3d.new_daemon({**s3d.server.env, "AWS_SECRET_ACCESS_KEY": "wrong"})
    s3d.daemon.start()

    def refused() -> list[str]:
        return [line for line in s3d.daemon.log_tail(20000).splitlines() if "SignatureDoesNotMatch" in line]

    wait_for(refused, 60, 0.2, "the refused listing in the daemon's log")
    time.sleep(2.0)  # several polls, every one refused
    after = {r["model"]: r["digest"] for r in s3d.daemon.status()["models"] if r["state"] == "serving"}
    assert after == before
    lines = refused()
    assert all("Traceback" not in line and line.count("SignatureDoesNotMatch") == 1 for line in lines)
    assert len(lines) <= 3  # logged once (start-up check, start-up scan, first poll), not once per poll
