"""The gateway in front of a real tritonserver: what clients see through it (issue 54 items 1, 4, 6).

One tritonserver serves the test models under private names (tests/gateway_harness.py) and one gateway
process routes the public names to them. Each test drives real clients through the gateway —
tritonclient gRPC (sync, asyncio, streaming), tritonclient HTTP, curl — and checks what a user relies
on: answers carry public names only, errors carry Triton's own words with the client's name, the
routes decide which digest answers, and the figures count what the client saw.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.gateway_harness import GatewayRig, digest, private, route
from tests.gateway_traffic import decoupled_square


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayRig]:
    rig = GatewayRig.start(tmp_path_factory.mktemp("gateway"))
    yield rig
    rig.stop()


@pytest.fixture
def grpc(rig: GatewayRig) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(rig.grpc_url)
    yield client
    client.close()


@pytest.fixture
def http(rig: GatewayRig) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(rig.http_url)
    yield client
    client.close()


def gen_input(module: Any = grpcclient, value: float = 0.0) -> Any:
    x = module.InferInput("x", [1, 1], "FP32")
    x.set_data_from_numpy(np.full((1, 1), value, dtype=np.float32))
    return x


def figures(rig: GatewayRig, model: str, char: str, protocol: str) -> dict[str, Any]:
    return dict(rig.control.figures()["models"][model]["digests"][digest(char)][protocol])


def curl(*args: str) -> tuple[int, bytes, dict[str, str]]:
    out = subprocess.run(["curl", "-s", "-i", *args], capture_output=True, timeout=30, check=True).stdout
    head, _, body = out.partition(b"\r\n\r\n")
    while head.startswith(b"HTTP/1.1 100"):
        head, _, body = body.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), body, headers


# -- gRPC -------------------------------------------------------------------------------------------


def test_grpc_sync_answers_name_the_public_model(grpc: grpcclient.InferenceServerClient) -> None:
    result = grpc.infer("gen", [gen_input()])
    assert result.get_response().model_name == "gen"
    assert result.as_numpy("gen")[0][0] == 1.0
    assert grpc.get_model_metadata("gen").name == "gen"
    assert grpc.get_model_config("gen").config.name == "gen"
    assert grpc.is_model_ready("gen") and grpc.is_server_ready() and grpc.is_server_live()
    assert [m.name for m in grpc.get_inference_statistics("gen").model_stats] == ["gen"]
    every = {m.name for m in grpc.get_inference_statistics("").model_stats}
    assert "gen" in every and not any("__" in name for name in every)  # no private name, public ones only


def test_grpc_asyncio_client(rig: GatewayRig) -> None:
    async def go() -> list[str]:
        client = aioclient.InferenceServerClient(rig.grpc_url)
        try:
            x = aioclient.InferInput("x", [1, 1], "FP32")
            x.set_data_from_numpy(np.zeros((1, 1), dtype=np.float32))
            results = await asyncio.gather(*(client.infer("gen", [x]) for _ in range(20)))
            return [r.get_response().model_name for r in results]
        finally:
            await client.close()

    assert asyncio.run(go()) == ["gen"] * 20


def test_grpc_stream_of_a_decoupled_model(rig: GatewayRig) -> None:
    """python_backend's decoupled square example's client, through the gateway: n answers per request."""
    by_id = decoupled_square(rig.grpc_url)
    assert by_id == {"0": [4] * 4, "1": [2] * 2, "3": [1]}


def test_bytes_tensors_and_one_mib(grpc: grpcclient.InferenceServerClient,
                                   http: httpclient.InferenceServerClient) -> None:
    words = np.array([["我爱你".encode()], [b"hello"], [b""]], dtype=np.object_)
    for module, client in ((grpcclient, grpc), (httpclient, http)):
        t = module.InferInput("TEXT", [3, 1], "BYTES")
        t.set_data_from_numpy(words)
        result = client.infer("text", [t])
        assert list(result.as_numpy("UPPER").reshape(-1)) == ["我爱你".encode(), b"HELLO", b""]
        big = np.arange(1 << 18, dtype=np.float32)  # 1 MiB
        x = module.InferInput("INPUT0", [big.size], "FP32")
        x.set_data_from_numpy(big)
        answer = client.infer("ident", [x])
        assert np.array_equal(answer.as_numpy("OUTPUT0"), big)


def test_errors_name_the_public_model_in_tritons_words(grpc: grpcclient.InferenceServerClient,
                                                      http: httpclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as raised:
        grpc.infer("boom", [gen_input(value=-1)])
    assert "negative input refused by boom" in raised.value.message()
    assert "model 'boom_0_0'" in raised.value.message() and private("boom", "e") not in raised.value.message()
    with pytest.raises(InferenceServerException) as raised:
        grpc.infer("boom", [gen_input(value=1)])
    assert "boom answers an error for 1" in raised.value.message()
    bad = grpcclient.InferInput("nope", [1, 1], "FP32")
    bad.set_data_from_numpy(np.zeros((1, 1), dtype=np.float32))
    with pytest.raises(InferenceServerException) as raised:
        grpc.infer("gen", [bad])
    assert raised.value.message() == "unexpected inference input 'nope' for model 'gen'"
    with pytest.raises(InferenceServerException) as raised:
        http.infer("gen", [gen_input(httpclient)], outputs=[httpclient.InferRequestedOutput("missing")])
    assert "'gen'" in raised.value.message() and "__" not in raised.value.message()


def test_unknown_and_private_names_are_not_found(rig: GatewayRig, grpc: grpcclient.InferenceServerClient) -> None:
    for name in ("nope", private("gen", "a")):
        with pytest.raises(InferenceServerException) as raised:
            grpc.infer(name, [gen_input()])
        assert raised.value.status() == "StatusCode.NOT_FOUND"
        assert raised.value.message() == f"Request for unknown model: '{name}' is not found"
        status, body, _ = curl("-X", "POST", f"http://{rig.http_url}/v2/models/{name}/infer", "-d", "{}")
        assert (status, json.loads(body)) == (404, {"error": f"Request for unknown model: '{name}' is not found"})
    assert not grpc.is_model_ready(private("gen", "a"))
    status, body, _ = curl(f"http://{rig.http_url}/v2/models/nope/stats")
    assert (status, json.loads(body)) == (400, {"error": "requested model 'nope' is not available"})


def test_an_ensemble_over_private_steps_answers_publicly(grpc: grpcclient.InferenceServerClient,
                                                         http: httpclient.InferenceServerClient) -> None:
    assert grpc.infer("pipe", [gen_input()]).get_response().model_name == "pipe"
    for config in (grpc.get_model_config("pipe", as_json=True)["config"], http.get_model_config("pipe")):
        assert config["name"] == "pipe"
        assert [s["model_name"] for s in config["ensemble_scheduling"]["step"]] == ["gen"]


# -- HTTP -------------------------------------------------------------------------------------------


def test_http_client_json_and_binary(http: httpclient.InferenceServerClient) -> None:
    for binary in (False, True):
        x = httpclient.InferInput("x", [1, 1], "FP32")
        x.set_data_from_numpy(np.zeros((1, 1), dtype=np.float32), binary_data=binary)
        result = http.infer("gen", [x], outputs=[httpclient.InferRequestedOutput("gen", binary_data=binary)])
        assert result.get_response()["model_name"] == "gen"
        assert result.as_numpy("gen")[0][0] == 1.0
    assert http.get_model_metadata("gen")["name"] == "gen"
    assert http.get_model_config("gen")["name"] == "gen"
    assert http.is_model_ready("gen") and http.is_server_ready()
    assert [m["name"] for m in http.get_inference_statistics("gen")["model_stats"]] == ["gen"]


def test_curl_json_binary_chunked_and_expect(rig: GatewayRig) -> None:
    url = f"http://{rig.http_url}/v2/models/gen/infer"
    body = json.dumps({"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [0]}]})
    for extra in ((), ("-H", "Transfer-Encoding: chunked"), ("-H", "Expect: 100-continue")):
        status, answer, _ = curl("-X", "POST", url, "-d", body, *extra)
        assert status == 200 and json.loads(answer)["model_name"] == "gen", answer
    header = json.dumps({"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32",
                                     "parameters": {"binary_data_size": 4}}],
                         "outputs": [{"name": "gen", "parameters": {"binary_data": True}}]}).encode()
    payload = header + np.zeros(1, dtype=np.float32).tobytes()
    path = rig.base / "binary.req"
    path.write_bytes(payload)
    status, answer, headers = curl("-X", "POST", url, "--data-binary", f"@{path}", "-H",
                                   f"Inference-Header-Content-Length: {len(header)}")
    size = int(headers["inference-header-content-length"])
    assert status == 200 and int(headers["content-length"]) == len(answer)
    assert json.loads(answer[:size])["model_name"] == "gen"
    assert np.frombuffer(answer[size:], dtype=np.float32).tolist() == [1.0]


def test_http_generate_stream_is_renamed_event_by_event(rig: GatewayRig) -> None:
    status, body, headers = curl("-N", "-X", "POST", f"http://{rig.http_url}/v2/models/square_int32/generate_stream",
                                 "-d", json.dumps({"IN": [3]}))
    events = [json.loads(line[5:]) for line in body.decode().splitlines() if line.startswith("data:")]
    assert status == 200 and headers.get("transfer-encoding") == "chunked", body
    assert [(e["model_name"], e["OUT"]) for e in events] == [("square_int32", 3)] * 3


def test_repository_index_and_load_refused(rig: GatewayRig, grpc: grpcclient.InferenceServerClient) -> None:
    index = {m.name: m.state for m in grpc.get_model_repository_index().models}
    assert index["gen"] == "READY" and not any("__" in name for name in index)
    status, body, _ = curl("-X", "POST", f"http://{rig.http_url}/v2/repository/index")
    assert status == 200 and {"name": "gen", "state": "READY"} in json.loads(body)
    with pytest.raises(InferenceServerException) as raised:
        grpc.load_model("gen")
    assert "tritonctl load" in raised.value.message()
    status, body, _ = curl("-X", "POST", f"http://{rig.http_url}/v2/repository/models/gen/load")
    assert status == 403 and "tritonctl load" in json.loads(body)["error"]


def test_python_backend_add_sub_and_bls_clients(rig: GatewayRig) -> None:
    """python_backend's add_sub and bls sync clients (their steps, written here) through the gateway. The
    BLS model calls `add_sub` by name inside tritonserver, past the gateway: the rig loads add_sub under
    its public name as well (docs/gateway.md, "BLS")."""
    a, b = np.random.rand(4).astype(np.float32), np.random.rand(4).astype(np.float32)
    with httpclient.InferenceServerClient(rig.http_url) as client:
        inputs = [httpclient.InferInput("INPUT0", [4], "FP32"), httpclient.InferInput("INPUT1", [4], "FP32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        outputs = [httpclient.InferRequestedOutput("OUTPUT0"), httpclient.InferRequestedOutput("OUTPUT1")]
        answer = client.infer("add_sub", inputs, request_id="1", outputs=outputs)
        assert answer.get_response()["model_name"] == "add_sub" and answer.get_response()["id"] == "1"
        assert np.allclose(answer.as_numpy("OUTPUT0"), a + b) and np.allclose(answer.as_numpy("OUTPUT1"), a - b)
        name = httpclient.InferInput("MODEL_NAME", [1], "BYTES")
        name.set_data_from_numpy(np.array(["add_sub"], dtype=np.object_))
        answer = client.infer("bls_sync", [*inputs, name], request_id="1", outputs=outputs)
        assert np.allclose(answer.as_numpy("OUTPUT0"), a + b) and np.allclose(answer.as_numpy("OUTPUT1"), a - b)
        name.set_data_from_numpy(np.array(["undefined_model"], dtype=np.object_))
        with pytest.raises(InferenceServerException) as raised:
            client.infer("bls_sync", [*inputs, name], request_id="1", outputs=outputs)
        assert "undefined_model" in raised.value.message() and private("bls_sync", "2") not in raised.value.message()


# -- routes, figures, metrics -----------------------------------------------------------------------


def test_pin_and_sticky_and_weights(rig: GatewayRig, grpc: grpcclient.InferenceServerClient) -> None:
    control = rig.control
    control.update(set={"gen": route("gen", ("a", 50), ("b", 50))})
    try:
        seen = [grpc.infer("gen", [gen_input()]).as_numpy("gen")[0][0] for _ in range(300)]
        assert 90 <= seen.count(1.0) <= 210 and seen.count(1.0) + seen.count(2.0) == 300  # 50 % ± 7 sigma
        pinned = {grpc.infer("gen", [gen_input()], headers={"x-tritonctl-route": digest("b")[:8]})
                  .as_numpy("gen")[0][0] for _ in range(20)}
        assert pinned == {2.0}
        with pytest.raises(InferenceServerException) as raised:
            grpc.infer("gen", [gen_input()], headers={"x-tritonctl-route": "ffffff"})
        assert digest("a")[:12] in raised.value.message() and digest("b")[:12] in raised.value.message()
        control.update(set={"gen": route("gen", ("a", 50), ("b", 50), sticky="x-user-id")})
        for user in ("alice", "bob", "carol", "dave"):
            answers = {grpc.infer("gen", [gen_input()], headers={"x-user-id": user}).as_numpy("gen")[0][0]
                       for _ in range(15)}
            assert len(answers) == 1, (user, answers)
        users = {grpc.infer("gen", [gen_input()], headers={"x-user-id": f"u{i}"}).as_numpy("gen")[0][0]
                 for i in range(40)}
        assert users == {1.0, 2.0}
    finally:
        control.update(set={"gen": route("gen", ("a", 100))})


def test_figures_count_each_failure_class(rig: GatewayRig, grpc: grpcclient.InferenceServerClient,
                                          http: httpclient.InferenceServerClient) -> None:
    before = {p: figures(rig, "boom", "e", p) if "boom" in rig.control.figures()["models"] else None
              for p in ("grpc", "http")}
    for value in (0, -1, 1):  # ok, raises, error response
        for module, client in ((grpcclient, grpc), (httpclient, http)):
            try:
                client.infer("boom", [gen_input(module, value)])
            except InferenceServerException:
                pass
    bad = grpcclient.InferInput("nope", [1, 1], "FP32")
    bad.set_data_from_numpy(np.zeros((1, 1), dtype=np.float32))
    with pytest.raises(InferenceServerException):
        grpc.infer("boom", [bad])
    for protocol, client_failures in (("grpc", 1), ("http", 0)):
        now = figures(rig, "boom", "e", protocol)
        old = before[protocol] or {"requests": 0, "failures": {"model": 0, "unavailable": 0, "client": 0}}
        assert now["requests"] - old["requests"] == 3 + client_failures
        assert now["failures"]["model"] - old["failures"]["model"] == 2  # the raise AND the error response
        assert now["failures"]["client"] - old["failures"]["client"] == client_failures
        assert now["latency"]["count"] == now["requests"]


def test_unavailable_tritonserver_counts_and_answers(tmp_path: Path, rig: GatewayRig) -> None:
    """A gateway whose tritonserver is gone: UNAVAILABLE / 503 naming the address, counted `unavailable`."""
    from controlplane.gateway.launcher import GatewayProcess, free_port

    dead = f"127.0.0.1:{free_port()}"
    other = GatewayProcess(tmp_path / "gw", dead, dead, grpc_address="127.0.0.1:0", http_address="127.0.0.1:0")
    other.routes_file.parent.mkdir(parents=True)
    other.routes_file.write_text(rig.gateway.routes_file.read_text())
    other.start()
    try:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{other.ports['grpc']}")
        with pytest.raises(InferenceServerException) as raised:
            client.infer("gen", [gen_input()])
        assert raised.value.status() == "StatusCode.UNAVAILABLE" and dead in raised.value.message()
        status, body, _ = curl("-X", "POST", f"http://127.0.0.1:{other.ports['http']}/v2/models/gen/infer", "-d", "{}")
        assert status == 503 and dead in json.loads(body)["error"]
        grpc_figs = other.control().figures()["models"]["gen"]["digests"][digest("a")]
        assert grpc_figs["grpc"]["failures"]["unavailable"] == 1 and grpc_figs["http"]["failures"]["unavailable"] == 1
    finally:
        other.stop(5.0)


def test_metrics_are_relabelled(rig: GatewayRig, grpc: grpcclient.InferenceServerClient) -> None:
    grpc.infer("gen", [gen_input()])
    text = urllib.request.urlopen(rig.metrics_url, timeout=10).read().decode()
    samples = [line for line in text.splitlines() if not line.startswith("#")]
    assert any(line.startswith(f'nv_inference_request_success{{model="gen",digest="{digest("a")[:12]}"')
               for line in samples), text[:2000]
    assert not any("__" in line.split("}")[0] for line in samples if line.startswith("nv_"))
    assert any(line.startswith(f'tritonctl_gateway_requests_total{{model="gen",digest="{digest("a")[:12]}",'
                               'protocol="grpc"}') for line in samples)
    assert "tritonctl_gateway_request_seconds_bucket" in text and "tritonctl_gateway_in_flight" in text


# -- switches, restarts, stops ----------------------------------------------------------------------


def test_route_flip_under_load_fails_nothing(rig: GatewayRig) -> None:
    """Clients send throughout a flip gen: a -> b. No request fails, every answer is 1 or 2, every
    request that starts once `update` has returned is answered by b, every one that ended before it
    began by a."""
    stop = threading.Event()
    results: list[tuple[float, float, float]] = []
    errors: list[Exception] = []

    def send(module: Any) -> None:
        client = module.InferenceServerClient(rig.grpc_url if module is grpcclient else rig.http_url)
        try:
            while not stop.is_set():
                began = time.monotonic()
                try:
                    value = float(client.infer("gen", [gen_input(module)]).as_numpy("gen")[0][0])
                except Exception as exc:  # noqa: BLE001 - every failure is what the test counts
                    errors.append(exc)
                    continue
                results.append((began, time.monotonic(), value))
        finally:
            client.close()

    threads = [threading.Thread(target=send, args=(m,)) for m in (grpcclient, grpcclient, httpclient)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(1.0)
        flip_began = time.monotonic()
        rig.control.update(set={"gen": route("gen", ("b", 100))})
        flip_done = time.monotonic()
        time.sleep(1.0)
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
        rig.control.update(set={"gen": route("gen", ("a", 100))})
    assert errors == []
    assert {value for _, _, value in results} == {1.0, 2.0}
    assert {value for began, _, value in results if began > flip_done} == {2.0}
    assert {value for _, ended, value in results if ended < flip_began} == {1.0}
    assert len(results) > 100


def test_restart_keeps_the_routes_of_its_file(tmp_path: Path, rig: GatewayRig) -> None:
    gateway = GatewayRig.new_gateway(tmp_path, rig.triton)
    gateway.start()
    try:
        assert gateway.control().update(set={"gen": route("gen", ("b", 100))}, version=7) == 7
        assert oct(gateway.routes_file.stat().st_mode & 0o777) == "0o600"
        assert oct(gateway.control_socket.stat().st_mode & 0o777) == "0o600"
        gateway.kill()  # a crash: nothing written at exit
        assert not gateway.adopt()
        gateway.start()
        assert gateway.control().hello()["version"] == 7
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{gateway.ports['grpc']}")
        assert client.infer("gen", [gen_input()]).as_numpy("gen")[0][0] == 2.0
        client.close()
    finally:
        gateway.stop(5.0)


def test_sigterm_lets_calls_in_flight_finish(tmp_path: Path, rig: GatewayRig) -> None:
    gateway = GatewayRig.new_gateway(tmp_path, rig.triton)
    gateway.start()
    gateway.control().update(set={"boom": route("boom", ("e", 100))})
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{gateway.ports['grpc']}")
    answer: list[Any] = []
    slow = threading.Thread(target=lambda: answer.append(client.infer("boom", [gen_input(value=8)])))
    slow.start()  # boom sleeps 0.8 s for 8
    for _ in range(100):
        if gateway.control().inflight([private("boom", "e")])[private("boom", "e")] == 1:
            break
        time.sleep(0.02)
    assert gateway.stop() == 0
    slow.join(10)
    client.close()
    assert answer and answer[0].as_numpy("y")[0][0] == 8.0


def test_a_client_cancel_cancels_tritonservers_side(rig: GatewayRig, grpc: grpcclient.InferenceServerClient) -> None:
    name = private("boom", "e")
    with pytest.raises(InferenceServerException) as raised:
        grpc.infer("boom", [gen_input(value=10)], client_timeout=0.3)  # boom would take 1 s
    assert raised.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    deadline = time.monotonic() + 5
    while rig.control.inflight([name])[name] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert rig.control.inflight([name])[name] == 0
    assert grpc.infer("boom", [gen_input()]).as_numpy("y")[0][0] == 0.0


# -- hostile HTTP/2 ---------------------------------------------------------------------------------


def _h2_exchange(rig: GatewayRig, payload: bytes) -> list[tuple[int, int, int, bytes]]:
    """Send raw bytes to the gRPC port; the frames the gateway answers until it closes (or 5 s)."""
    import socket

    from controlplane.gateway import frames as f

    host, port = rig.grpc_url.split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(payload)
        data = b""
        try:
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
        except TimeoutError:
            pass
    out, pos = [], 0
    while len(data) - pos >= 9:
        hi, lo, ftype, flags, sid = f.FRAME_HEADER.unpack_from(data, pos)
        length = (hi << 8) | lo
        out.append((ftype, flags, sid & 0x7FFFFFFF, data[pos + 9 : pos + 9 + length]))
        pos += 9 + length
    return out


def _goaway_code(frames_: list[tuple[int, int, int, bytes]]) -> int | None:
    from controlplane.gateway import frames as f

    return next((f.u32(p, 4) for t, _, _, p in frames_ if t == f.GOAWAY), None)


def test_hostile_http2_costs_only_its_own_connection(rig: GatewayRig, grpc: grpcclient.InferenceServerClient) -> None:
    import hpack

    from controlplane.gateway import frames as f

    settings = f.settings_frame({})
    # not HTTP/2 at all; garbage after the preface; a header block over the limit
    assert _goaway_code(_h2_exchange(rig, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")) == f.PROTOCOL_ERROR
    assert _goaway_code(_h2_exchange(rig, f.PREFACE + settings + b"\xff" * 64)) == f.FRAME_SIZE_ERROR
    block = b"\x00\x05x-big" + b"\x7f\x81\xff\x03" + b"v" * 65535  # one literal header of 64 KiB
    frames_ = [f.frame(f.HEADERS, 0, 1, block[:16384])]
    frames_ += [f.frame(f.CONTINUATION, 0, 1, block[i : i + 16384]) for i in range(16384, len(block), 16384)]
    assert _goaway_code(_h2_exchange(rig, f.PREFACE + settings + b"".join(frames_))) == f.ENHANCE_YOUR_CALM
    # a request that declares a 1 GiB message: refused on its stream, the connection lives
    encoder = hpack.Encoder()
    head = encoder.encode([(":method", "POST"), (":scheme", "http"),
                           (":path", "/inference.GRPCInferenceService/ModelInfer"), (":authority", "x"),
                           ("content-type", "application/grpc"), ("te", "trailers")])
    one_gib = b"\x00\x40\x00\x00\x00"
    request = f.frame(f.HEADERS, f.FLAG_END_HEADERS, 1, head) + f.frame(f.DATA, 0, 1, one_gib + b"\n\x03gen")
    answer = _h2_exchange(rig, f.PREFACE + settings + request + f.goaway(0, 0))
    decoder = hpack.Decoder()
    trailers = [dict(decoder.decode(p)) for t, _, sid, p in answer if t == f.HEADERS and sid == 1]
    assert trailers and trailers[-1]["grpc-status"] == "8", answer
    assert "limit" in trailers[-1]["grpc-message"]
    # meanwhile and after, other clients are served
    assert grpc.infer("gen", [gen_input()]).as_numpy("gen")[0][0] == 1.0
    assert rig.gateway.is_running()


def test_hostile_http_costs_only_its_own_connection(rig: GatewayRig, http: httpclient.InferenceServerClient) -> None:
    import socket

    host, port = rig.http_url.split(":")

    def exchange(payload: bytes) -> bytes:
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(payload)
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
            return data

    assert exchange(b"NOT HTTP AT ALL\r\n\r\n").startswith(b"HTTP/1.1 400 ")
    assert exchange(b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n").startswith(b"HTTP/1.1 414 ")
    huge = b"".join(b"X-H%d: %s\r\n" % (i, b"v" * 1000) for i in range(70))
    assert exchange(b"GET /v2 HTTP/1.1\r\nHost: x\r\n" + huge + b"\r\n").startswith(b"HTTP/1.1 431 ")
    assert http.infer("gen", [gen_input(httpclient)]).as_numpy("gen")[0][0] == 1.0
