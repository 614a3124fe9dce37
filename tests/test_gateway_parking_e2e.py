"""The gateway's side of "requests load models" (docs/ondemand.md), against a real tritonserver: requests for a
model whose route is `loadable` wait in the gateway and go on when the route serves.

The test plays the daemon on the gateway's control channel (`wanted`, `note`, `refuse`, `update`), so each
outcome is driven on purpose: the route flips to serving (every waiting request answered by the model, gRPC
and HTTP, a chunked body held meanwhile), the load is refused (UNAVAILABLE / 503 with the reason), nothing
comes within the wait (the wait named, with the daemon's note), a client that gives up leaves no waiter,
and the bounds (requests per model, bytes held) refuse at once. The daemon's side, a real load through the
real daemon: tests/test_request_loads_e2e.py.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.utils import InferenceServerException

from controlplane.gateway.launcher import GatewayProcess
from controlplane.gateway.routes import Route
from tests.gateway_harness import GatewayRig, route

pytestmark = pytest.mark.triton  # a tritonserver and gateways of the module's own

LOADABLE = Route("gen", (), state="loadable")


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayRig]:
    rig = GatewayRig.start(tmp_path_factory.mktemp("parking"))
    yield rig
    rig.stop()


@pytest.fixture
def loadable(rig: GatewayRig) -> Iterator[GatewayRig]:
    """`gen` not loaded (its route loadable) for the test; served by digest a again after it."""
    rig.control.update(set={"gen": LOADABLE})
    yield rig
    rig.control.update(set={"gen": route("gen", ("a", 100))})
    rig.control.wanted(0, 0, load_wait_s=60)


def x_input(module: Any = grpcclient, value: float = 0.0) -> Any:
    x = module.InferInput("x", [1, 1], "FP32")
    x.set_data_from_numpy(np.full((1, 1), value, dtype=np.float32))
    return x


def http_infer(url: str, model: str = "gen", *, chunked: bool = False, body: bytes | None = None,
               timeout_s: float = 60.0) -> tuple[int, dict[str, Any]]:
    """POST an inference (JSON) to the gateway's HTTP port; (status, the JSON answer)."""
    payload = body if body is not None else json.dumps(
        {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [0.0]}]}).encode()
    data: Any = iter([payload[:10], payload[10:]]) if chunked else payload
    request = urllib.request.Request(f"http://{url}/v2/models/{model}/infer", data=data, method="POST",
                                     headers={"Content-Type": "application/json"})
    if not chunked:
        request.add_header("Content-Length", str(len(payload)))
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def waiting(rig: GatewayRig) -> dict[str, Any]:
    return rig.control.wanted(0, 0)[1]


def wait_until(predicate: Any, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def in_threads(*calls: Any) -> tuple[list[threading.Thread], list[Any]]:
    results: list[Any] = []

    def run(call: Any) -> None:
        try:
            results.append(call())
        except Exception as exc:  # noqa: BLE001 - the test asserts on what each call got
            results.append(exc)

    threads = [threading.Thread(target=run, args=(c,)) for c in calls]
    for thread in threads:
        thread.start()
    return threads, results


def test_waiting_requests_go_on_when_the_route_serves(loadable: GatewayRig) -> None:
    rig = loadable
    generation, wanted = rig.control.wanted(0, 0)
    assert wanted == {}
    grpc = grpcclient.InferenceServerClient(rig.grpc_url)
    try:
        assert not grpc.is_model_ready("gen")  # readiness is a question about now: it loads nothing
        index = {m.name: (m.state, m.reason) for m in grpc.get_model_repository_index().models}
        assert index["gen"] == ("UNAVAILABLE", "loadable")
    finally:
        grpc.close()
    assert waiting(rig) == {}

    # a poll waiting for a wanted model answers as soon as the first request arrives
    poll: list[Any] = []
    poller = threading.Thread(target=lambda: poll.append((time.monotonic(), rig.gateway.control(15).wanted(
        generation, 10.0))))
    poller.start()
    time.sleep(0.2)
    sent = time.monotonic()

    async def grpc_calls(n: int) -> list[Any]:
        client = aioclient.InferenceServerClient(rig.grpc_url)
        try:
            return list(await asyncio.gather(*(client.infer("gen", [x_input(aioclient)]) for _ in range(n)),
                                             client.get_model_metadata("gen"), return_exceptions=True))
        finally:
            await client.close()

    threads, results = in_threads(lambda: asyncio.run(grpc_calls(50)), lambda: http_infer(rig.http_url),
                                  lambda: http_infer(rig.http_url, chunked=True))
    poller.join(15)
    answered_at, (after, wanted) = poll[0]
    assert answered_at - sent < 2.0 and after > generation and set(wanted) == {"gen"}
    wait_until(lambda: waiting(rig).get("gen", {}).get("waiting") == 53)  # 50 + metadata + 2 HTTP
    metrics = urllib.request.urlopen(rig.metrics_url, timeout=10).read().decode()
    assert 'tritonctl_gateway_waiting_requests{model="gen"} 53' in metrics
    assert all(t.is_alive() for t in threads)  # nothing answered while the model is not loaded

    rig.control.update(set={"gen": route("gen", ("b", 100))})  # the load's switch
    for thread in threads:
        thread.join(30)
    grpc_results, *http_results = sorted(results, key=lambda r: isinstance(r, tuple))
    assert not [r for r in grpc_results if isinstance(r, Exception)], grpc_results
    assert [r.as_numpy("gen")[0][0] for r in grpc_results[:50]] == [2.0] * 50
    assert grpc_results[50].name == "gen"
    assert [(status, body["model_name"], body["outputs"][0]["data"]) for status, body in http_results] == \
        [(200, "gen", [2.0])] * 2
    assert waiting(rig) == {}


def test_a_refused_load_answers_every_waiting_request_with_its_reason(loadable: GatewayRig) -> None:
    rig = loadable
    grpc = grpcclient.InferenceServerClient(rig.grpc_url)
    try:
        threads, results = in_threads(lambda: grpc.infer("gen", [x_input()]), lambda: http_infer(rig.http_url))
        wait_until(lambda: waiting(rig).get("gen", {}).get("waiting") == 2)
        reason = "gen 0123abcd needs 100 MB but memory_budget_mb = 150 MB and 120 MB is held by models that " \
                 "cannot be evicted (pinned, protected, leased or busy): big 120 MB"
        assert rig.control.refuse("gen", reason) == 2
        for thread in threads:
            thread.join(10)
    finally:
        grpc.close()
    error = next(r for r in results if isinstance(r, InferenceServerException))
    assert error.status() == "StatusCode.UNAVAILABLE"
    assert error.message() == f"model 'gen' could not be loaded: {reason}"
    status, body = next(r for r in results if isinstance(r, tuple))
    assert (status, body) == (503, {"error": f"model 'gen' could not be loaded: {reason}"})
    assert waiting(rig) == {}


def test_past_the_wait_requests_get_unavailable_naming_it(loadable: GatewayRig) -> None:
    rig = loadable
    rig.control.wanted(0, 0, load_wait_s=1.5)  # gateway_load_wait_s, as the daemon sets it
    grpc = grpcclient.InferenceServerClient(rig.grpc_url)
    try:
        started = time.monotonic()
        threads, results = in_threads(lambda: grpc.infer("gen", [x_input()]), lambda: http_infer(rig.http_url))
        wait_until(lambda: waiting(rig).get("gen", {}).get("waiting") == 2)
        assert rig.control.note("gen", "loading 0123abcd: tritonserver is loading it")
        for thread in threads:
            thread.join(10)
        took = time.monotonic() - started
    finally:
        grpc.close()
    assert 1.4 < took < 6.0, took
    wanted = ("model 'gen' is not loaded: it did not load within gateway_load_wait_s = 1.5 s (loading 0123abcd: "
              "tritonserver is loading it)")
    error = next(r for r in results if isinstance(r, InferenceServerException))
    assert (error.status(), error.message()) == ("StatusCode.UNAVAILABLE", wanted)
    assert next(r for r in results if isinstance(r, tuple)) == (503, {"error": wanted})
    assert waiting(rig) == {}


def test_a_client_that_gives_up_leaves_no_waiter(loadable: GatewayRig) -> None:
    rig = loadable
    grpc = grpcclient.InferenceServerClient(rig.grpc_url)
    try:
        with pytest.raises(InferenceServerException) as raised:
            grpc.infer("gen", [x_input()], client_timeout=0.5)
        assert raised.value.status() == "StatusCode.DEADLINE_EXCEEDED"
        with pytest.raises(OSError):  # urllib's own timeout: the client closes its connection
            http_infer(rig.http_url, timeout_s=0.5)
        wait_until(lambda: waiting(rig) == {})
        # the connection is still good: its window got the dropped request's bytes back
        rig.control.update(set={"gen": route("gen", ("a", 100))})
        for _ in range(50):
            assert grpc.infer("gen", [x_input()]).as_numpy("gen")[0][0] == 1.0
    finally:
        grpc.close()


def test_the_bounds_refuse_at_once(tmp_path: Path, rig: GatewayRig) -> None:
    gateway = GatewayProcess(tmp_path / "bounded", rig.triton.grpc_url, rig.triton.http_url,
                             grpc_address="127.0.0.1:0", http_address="127.0.0.1:0", drain_s=5.0,
                             extra_args=["--waiting-per-model", "2", "--waiting-bytes", "4096"])
    gateway.start()
    control = gateway.control(10.0)
    grpc_url, http_url = f"127.0.0.1:{gateway.ports['grpc']}", f"127.0.0.1:{gateway.ports['http']}"
    grpc = grpcclient.InferenceServerClient(grpc_url)
    try:
        control.update(set={"gen": LOADABLE})
        threads, results = in_threads(lambda: grpc.infer("gen", [x_input()]), lambda: grpc.infer("gen", [x_input()]))
        wait_until(lambda: control.wanted(0, 0)[1].get("gen", {}).get("waiting") == 2)
        with pytest.raises(InferenceServerException) as raised:
            grpc.infer("gen", [x_input()])
        assert raised.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
        assert "2 requests already wait for it" in raised.value.message()
        control.update(set={"gen": route("gen", ("a", 100))})
        for thread in threads:
            thread.join(10)
        assert [r.as_numpy("gen")[0][0] for r in results] == [1.0, 1.0]

        control.update(set={"gen": LOADABLE})
        big = json.dumps({"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [0.0]}],
                          "parameters": {"pad": "p" * 8192}}).encode()
        status, body = http_infer(http_url, body=big, chunked=True)
        assert status == 503 and "hold" in body["error"] and "bound is 0 MiB" in body["error"], body
        assert all(w["waiting"] == 0 for w in control.wanted(0, 0)[1].values())  # nothing waits (still wanted)
    finally:
        grpc.close()
        gateway.stop(5.0)


def test_a_wait_of_zero_answers_at_once_and_still_asks_for_the_load(loadable: GatewayRig) -> None:
    """gateway_load_wait_s = 0: the request is answered at once, and its model is still wanted (the daemon's
    next poll loads it for the requests after it), as is one whose client gave up before the poll."""
    rig = loadable
    generation, _ = rig.control.wanted(0, 0, load_wait_s=0)
    started = time.monotonic()
    status, body = http_infer(rig.http_url)
    assert status == 503 and time.monotonic() - started < 2.0
    assert body["error"].startswith("model 'gen' is not loaded: it did not load within gateway_load_wait_s = 0 s")
    after, wanted = rig.control.wanted(generation, 5.0)
    assert after > generation and wanted["gen"]["waiting"] == 0, wanted
    assert waiting(rig) == {}  # reported once
