"""Requests load models (issue 55 item 5; docs/ondemand.md "Requests load models"), against the real daemon, its
gateway and tritonserver, with real clients sending through the gateway.

- 1,000 requests arriving at once for an evicted model (unloaded for idleness) cause ONE load, and every one
  is answered; `ensure` and leases still work beside it; an operator's `unload` is not undone by a request
  (the client gets NOT_FOUND, nothing loads) until `ensure` serves it again.
- The memory budget's LRU follows the requests the gateway sees: a model requested through the gateway
  more recently is kept; one whose only recent requests went to tritonserver directly (past the gateway)
  is evicted (Triton's last-inference stamps would have chosen the other). The evicted model's next request
  loads it again (evicting the gateway's least recently used); a model the budget cannot hold (every
  holder pinned) gets UNAVAILABLE / 503 at once, the holders named.
- A load that outlasts `gateway_load_wait_s`: its requests get UNAVAILABLE / 503 naming the wait, the load
  goes on, and the next request is served by it.

The gateway's side alone (parked requests driven on its control channel): tests/test_gateway_parking_e2e.py.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from tritonclient.utils import InferenceServerException

from controlplane.api.client import ControlClient
from controlplane.gateway.control import GatewayControl
from tests.harness import DaemonProcess, gen_config, python_model, wait_for, write_gen_model

pytestmark = pytest.mark.triton

ALLOC = "self.hold = np.ones(60 * 1024 * 1024 // 8)"  # about 100 MB measured with its stub (test_budget_e2e)


def write_big(repo: Path, name: str, gen: int) -> None:
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    (repo / name / "config.pbtxt").write_text(gen_config(name, gen))
    (repo / name / "1" / "model.py").write_text(
        python_model("np.full_like(x, GEN, dtype=np.float32)", init=ALLOC, prelude=f"\nGEN = {gen}\n"))


def gateway_urls(daemon: DaemonProcess) -> tuple[str, str]:
    """(gRPC, HTTP) HOST:PORT of the daemon's gateway, from its record (docs/gateway.md)."""
    ports = json.loads((daemon.state_dir / "gateway" / "gateway.json").read_text())["ports"]
    return f"127.0.0.1:{ports['grpc']}", f"127.0.0.1:{ports['http']}"


def x_input(module: Any = grpcclient) -> Any:
    x = module.InferInput("x", [1, 1], "FP32")
    x.set_data_from_numpy(np.zeros((1, 1), dtype=np.float32))
    return x


def http_infer(url: str, model: str, timeout_s: float = 90.0) -> tuple[int, dict[str, Any]]:
    body = json.dumps({"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [0.0]}]}).encode()
    request = urllib.request.Request(f"http://{url}/v2/models/{model}/infer", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def grpc_infer(url: str, model: str) -> float:
    client = grpcclient.InferenceServerClient(url)
    try:
        return float(client.infer(model, [x_input()], client_timeout=90).as_numpy("gen")[0][0])
    finally:
        client.close()


def grpc_error(url: str, model: str) -> InferenceServerException:
    client = grpcclient.InferenceServerClient(url)
    try:
        with pytest.raises(InferenceServerException) as raised:
            client.infer(model, [x_input()], client_timeout=90)
        return raised.value
    finally:
        client.close()


def loads(daemon: DaemonProcess, model: str) -> list[dict[str, Any]]:
    """The on-demand loads of `model` that served (audit action `ondemand`), oldest first."""
    return [e for e in reversed(daemon.audit("--model", model, "--action", "ondemand", "--limit", "1000"))
            if e["outcome"] == "ok"]


def evictions(daemon: DaemonProcess) -> list[str]:
    return [e["model"] for e in reversed(daemon.audit("--action", "evict")) if e["outcome"] == "ok"]


def route_state(daemon: DaemonProcess, model: str) -> str | None:
    """The state of `model`'s route in the gateway (None: no route), asked on its control channel."""
    route = GatewayControl(daemon.state_dir / "gateway" / "gateway.sock", 10.0).routes().routes.get(model)
    return None if route is None else route.state


def burst(url: str, model: str, n: int, channels: int = 4) -> tuple[list[Any], float]:
    """`n` inferences of `model` sent at once over `channels` asyncio gRPC channels: (each answer's value or
    exception, seconds until the last one)."""
    async def go() -> list[Any]:
        clients = [aioclient.InferenceServerClient(url) for _ in range(channels)]
        try:
            calls = [clients[i % channels].infer(model, [x_input(aioclient)], client_timeout=120) for i in range(n)]
            answers = await asyncio.gather(*calls, return_exceptions=True)
            return [a if isinstance(a, BaseException) else float(a.as_numpy("gen")[0][0]) for a in answers]
        finally:
            for client in clients:
                await client.close()

    started = time.monotonic()
    results = asyncio.run(go())
    return results, time.monotonic() - started


def test_a_thousand_requests_for_an_evicted_model_cause_one_load_and_no_failure(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    write_gen_model(repo, "m", 7)
    write_gen_model(repo, "other", 3)
    daemon = DaemonProcess(repo, tmp_path / "state", env={"TRITONCTL_IDLE_UNLOAD_S": "3"},
                           extra_args=["--policy", "ondemand"]).start()
    try:
        grpc_url, http_url = gateway_urls(daemon)
        wait_for(lambda: route_state(daemon, "m") == "loadable" and route_state(daemon, "other") == "loadable",
                 60, 0.2, "on-demand models routed loadable")
        assert daemon.model_status("m")["ondemand"]["state"] == "standby"

        # one request loads a model never loaded
        assert http_infer(http_url, "m") == (200, {"model_name": "m", "model_version": "1", "outputs": [
            {"name": "gen", "datatype": "FP32", "shape": [1, 1], "data": [7.0]}]})
        first = loads(daemon, "m")
        assert len(first) == 1 and first[0]["actor"] == "tritonctl:gateway", first

        # unloaded for idleness: its route is loadable again
        wait_for(lambda: "m" in evictions(daemon), 60, 0.3, "m unloaded for idleness")
        assert route_state(daemon, "m") == "loadable" and daemon.model_status("m")["state"] == "unloaded"

        # 1,000 requests at once: one load, every one answered, within gateway_load_wait_s (60 s)
        results, took = burst(grpc_url, "m", 1000)
        failed = [r for r in results if not isinstance(r, float)]
        assert failed == [] and results == [7.0] * 1000, failed[:3]
        assert took < 60.0, took
        after = loads(daemon, "m")
        assert len(after) == 2, after  # the first request's, and ONE for the thousand
        print(f"1000 requests for the evicted model: one load, all answered in {took:.2f} s")

        # ensure and leases still work beside it
        client = ControlClient(socket=daemon.state_dir / "tritonctl.sock")
        lease = client.ensure("other", 600)
        assert lease["loaded"] is True
        assert grpc_infer(grpc_url, "other") == 3.0
        time.sleep(5)  # past idle_unload_s: the lease holds it
        assert daemon.model_status("other")["state"] == "serving"
        assert [e for e in loads(daemon, "other") if e["actor"] == "tritonctl:gateway"] == []
        client.release_lease("other", lease["lease"])

        # an operator's unload is not undone by a request
        assert daemon.run("unload", "m").exit_code == 0
        assert route_state(daemon, "m") is None
        error = grpc_error(grpc_url, "m")
        assert error.status() == "StatusCode.NOT_FOUND", error
        assert http_infer(http_url, "m")[0] == 404
        time.sleep(4)  # a route sync and a poll or two later: still nothing loads it
        assert route_state(daemon, "m") is None and len(loads(daemon, "m")) == 2
        assert daemon.model_status("m")["state"] == "unloaded"
        lease = client.ensure("m", 60)  # the operator's way back
        assert grpc_infer(grpc_url, "m") == 7.0
        client.release_lease("m", lease["lease"])
    finally:
        assert daemon.stop() == 0, daemon.log_tail()


def test_the_budget_follows_the_gateways_requests_and_names_the_holders_when_it_cannot_load(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    for gen, name in enumerate("abc", start=1):
        write_big(repo, name, gen)
    daemon = DaemonProcess(repo, tmp_path / "state", extra_args=["--memory-budget-mb", "350"]).start()
    try:
        wait_for(lambda: all(daemon.model_status(m).get("state") == "serving" for m in "abc"), 90, 0.3,
                 "a, b and c serving")
        grpc_url, http_url = gateway_urls(daemon)
        for name, gen in (("c", 3), ("a", 1), ("b", 2)):  # through the gateway: c is its least recently used
            assert grpc_infer(grpc_url, name) == gen
            time.sleep(0.3)
        # c's only recent requests go to tritonserver directly, past the gateway: Triton's stamps would make a
        # the least recently used, the gateway's make it c
        private = GatewayControl(daemon.state_dir / "gateway" / "gateway.sock").routes().routes["c"].targets[0].name
        direct = grpcclient.InferenceServerClient(daemon.status()["gateway"]["upstream_grpc_url"])
        try:
            for _ in range(3):
                assert direct.infer(private, [x_input()]).as_numpy("gen")[0][0] == 3.0
        finally:
            direct.close()

        write_big(repo, "d", 4)  # needs room: evicts the gateway's least recently used
        wait_for(lambda: daemon.model_status("d").get("state") == "serving", 90, 0.3, "d serving")
        assert evictions(daemon) == ["c"]
        assert route_state(daemon, "c") == "loadable"

        # c's next request loads it again, evicting the gateway's least recently used (a; d was loaded after
        # b's request, and counts from its load)
        assert grpc_infer(grpc_url, "c") == 3.0
        assert evictions(daemon) == ["c", "a"]
        assert [e["actor"] for e in loads(daemon, "c")] == ["tritonctl:gateway"]

        # every loaded model pinned: a request for a cannot be loaded, and says who holds the budget
        for name in "bcd":
            assert daemon.run("pin", name).exit_code == 0
        started = time.monotonic()
        error = grpc_error(grpc_url, "a")
        took = time.monotonic() - started
        assert error.status() == "StatusCode.UNAVAILABLE" and took < 15, (error, took)
        message = error.message()
        assert message.startswith("model 'a' could not be loaded: a ") and "memory_budget_mb = 350 MB" in message
        listed = message.rsplit("(pinned, protected, leased or busy): ", 1)[-1]
        assert sorted(re.findall(r"(\w+) [\d.,]+ MB", listed)) == ["b", "c", "d"], message
        status, body = http_infer(http_url, "a")
        assert status == 503 and "memory_budget_mb = 350 MB" in body["error"], body
        assert evictions(daemon) == ["c", "a"] and loads(daemon, "a") == []
        assert route_state(daemon, "a") == "loadable"  # room may come: the next request tries again
    finally:
        assert daemon.stop() == 0, daemon.log_tail()


def test_a_load_longer_than_the_wait_answers_unavailable_naming_it(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    write_gen_model(repo, "slow", 5, init="import time; time.sleep(8)")
    daemon = DaemonProcess(repo, tmp_path / "state", env={"TRITONCTL_GATEWAY_LOAD_WAIT_S": "2"},
                           extra_args=["--policy", "ondemand"]).start()
    try:
        grpc_url, http_url = gateway_urls(daemon)
        wait_for(lambda: route_state(daemon, "slow") == "loadable", 60, 0.2, "slow routed loadable")
        answers: list[Any] = []
        sender = threading.Thread(target=lambda: answers.append(http_infer(http_url, "slow")))
        started = time.monotonic()
        sender.start()
        error = grpc_error(grpc_url, "slow")
        took = time.monotonic() - started
        sender.join(30)
        assert error.status() == "StatusCode.UNAVAILABLE" and 1.5 < took < 8, (error, took)
        assert error.message().startswith("model 'slow' is not loaded: it did not load within "
                                          "gateway_load_wait_s = 2 s (tritonctl is loading "), error.message()
        assert answers[0][0] == 503 and "gateway_load_wait_s = 2 s" in answers[0][1]["error"], answers
        # the load went on: the next request is served by it, and there was one load
        wait_for(lambda: daemon.model_status("slow").get("state") == "serving", 90, 0.3, "slow serving")
        assert grpc_infer(grpc_url, "slow") == 5.0
        assert len(loads(daemon, "slow")) == 1
    finally:
        assert daemon.stop() == 0, daemon.log_tail()
