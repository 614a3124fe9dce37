"""The HTTP control API itself: its OpenAPI document, who may call it, how it listens, curl.

The server is the real `ApiServer` (uvicorn on a Unix socket, FastAPI routes) over the stand-in plane of
tests/test_cli_daemon_commands.py (canned outcomes, chosen errors); the daemon end to end is
tests/test_security.py (token on TCP) and the e2e tests. Regenerate the golden OpenAPI document after
an intended change to the routes: `UPDATE_GOLDEN=1 pytest tests/test_api_http.py`, review the diff.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import pytest
from fastapi.routing import APIRoute

from controlplane.api.app import OPENAPI_PATH
from controlplane.api.client import ControlClient
from controlplane.api.server import ApiServer
from controlplane.errors import ConfigError, NotFoundError, PermissionDeniedError
from controlplane.settings.config import Settings
from controlplane.triton.launcher import free_port
from tests.test_cli_daemon_commands import StandInPlane

GOLDEN = Path(__file__).resolve().parent.parent / "docs" / "openapi.json"  # linked from the README
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"
TOKEN = "0123456789abcdef0123456789abcdef"


def _server(state: Path, **settings: Any) -> ApiServer:
    executor = futures.ThreadPoolExecutor(max_workers=2)
    server = ApiServer(StandInPlane(), executor, Settings(state_dir=state, **settings))  # type: ignore[arg-type]
    return server


@pytest.fixture
def state() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="tctl-api-"))  # Unix socket paths are limited to ~107 bytes
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def served(state: Path) -> Iterator[ApiServer]:
    server = _server(state)
    server.start()
    yield server
    server.stop(0.1)


def _token_file(state: Path, mode: int = 0o600) -> Path:
    path = state / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(mode)
    return path


def test_openapi_document_is_the_golden_one(served: ApiServer) -> None:
    client = ControlClient(socket=served.settings.socket_path)
    document = client.call("GET", OPENAPI_PATH.removeprefix("/v1"))
    if UPDATE:
        GOLDEN.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    assert document == json.loads(GOLDEN.read_text()), "the routes changed: UPDATE_GOLDEN=1, review the diff"
    assert document["openapi"].startswith("3.")


def _routes(routes: list[Any]) -> Iterator[APIRoute]:
    for route in routes:
        if isinstance(route, APIRoute):
            yield route
        elif hasattr(route, "original_router"):  # FastAPI >= 0.120 keeps an included router as one node
            yield from _routes(route.original_router.routes)


def test_every_route_is_in_the_openapi_document_and_back(served: ApiServer) -> None:
    routes = {(method.lower(), route.path) for route in _routes(served.app.routes) for method in route.methods}
    assert len(routes) > 15
    routes.add(("get", OPENAPI_PATH))  # served by FastAPI itself, documented by controlplane/api/app.py
    golden = json.loads(GOLDEN.read_text())
    documented = {(method, path) for path, ops in golden["paths"].items() for method in ops}
    assert routes == documented
    assert all(path.startswith("/v1/") for _, path in routes)


def test_curl_reads_the_models_on_the_socket(served: ApiServer) -> None:
    curl = shutil.which("curl")
    if curl is None:
        pytest.skip("curl is not installed")
    out = subprocess.run([curl, "-sS", "--unix-socket", str(served.settings.socket_path), "http://x/v1/models"],
                         capture_output=True, text=True, timeout=30, check=True).stdout
    data = json.loads(out)
    assert data["triton_url"] == "127.0.0.1:8001"
    assert [m["model"] for m in data["models"]] == ["linear", "broken"]


def test_errors_are_one_document_with_the_class_and_exit_code(served: ApiServer) -> None:
    conn = _unix(served.settings.socket_path)
    conn.request("GET", "/v1/models/ghost")
    answer = conn.getresponse()
    assert answer.status == 404
    assert json.loads(answer.read()) == {"error": {
        "class": "NotFoundError", "message": "model 'ghost' is unknown to the registry", "exit_code": 2}}
    conn.request("PUT", "/v1/models/linear/policy", body=b'{"policy": 3}', headers={"Content-Type": "application/json"})
    answer = conn.getresponse()
    assert answer.status == 400 and json.loads(answer.read())["error"]["class"] == "UsageError"
    conn.request("GET", "/v1/nothing")
    answer = conn.getresponse()
    assert answer.status == 404 and json.loads(answer.read())["error"]["class"] == "NotFoundError"
    with pytest.raises(NotFoundError, match="ghost"):
        ControlClient(socket=served.settings.socket_path).status(["ghost"])


def test_fleet_resources_need_a_fleet(served: ApiServer) -> None:
    for path in ("/v1/hosts", "/v1/rollouts?open=true", "/v1/models?fleet=true"):
        conn = _unix(served.settings.socket_path)
        conn.request("GET", path)
        answer = conn.getresponse()
        error = json.loads(answer.read())["error"]
        assert (answer.status, error["class"], error["exit_code"]) == (404, "NotFoundError", 2), path
        assert "not in a fleet" in error["message"]


def test_the_socket_actor_is_the_peers_uid_and_a_declared_one_only_a_claim(served: ApiServer) -> None:
    import pwd

    client = ControlClient(socket=served.settings.socket_path)
    client._headers["x-tritonctl-actor"] = "someone-else"  # declared on the socket: a claim, not the actor
    client.set_pin("linear", True)
    _, _, _, actor = served.plane.calls[-1]  # type: ignore[attr-defined]
    assert actor == f"uid:{os.getuid()}({pwd.getpwuid(os.getuid()).pw_name})"
    assert actor.claimed == "someone-else"


def test_load_streams_each_step_then_the_result(served: ApiServer) -> None:
    conn = _unix(served.settings.socket_path)
    conn.request("POST", "/v1/models/flaky/load", body=b"{}", headers={"Content-Type": "application/json"})
    answer = conn.getresponse()
    assert answer.status == 200 and answer.getheader("content-type") == "application/x-ndjson"
    lines = [json.loads(line) for line in answer.read().splitlines()]
    assert [next(iter(line)) for line in lines] == ["progress"] * 5 + ["result"]
    assert lines[-1]["result"]["outcome"] == "rolled_back"


def _unix(path: Path) -> http.client.HTTPConnection:
    from controlplane.api.client import UnixHTTPConnection

    return UnixHTTPConnection(str(path), 30)


# --- the TCP listener --------------------------------------------------------------------------------------


def test_tcp_needs_the_token_and_audits_it_as_the_default_token(state: Path) -> None:
    address = f"127.0.0.1:{free_port()}"
    server = _server(state, listen=address, token_file=_token_file(state))
    server.start()
    try:
        with pytest.raises(PermissionDeniedError, match="token"):
            ControlClient(address=address, token="x" * 20).status()
        conn = http.client.HTTPConnection(*address.split(":"), timeout=10)  # type: ignore[arg-type]
        conn.request("GET", "/v1/models")  # no token at all
        assert conn.getresponse().status == 401
        client = ControlClient(address=address, token=TOKEN)
        assert client.status()["triton_url"] == "127.0.0.1:8001"
        client._headers["x-tritonctl-actor"] = "alice"  # the shared token's holder says who they are: a claim
        client.set_pin("linear", False)
        assert server.plane.calls[-1] == ("pin", "linear", False, "token:default")  # type: ignore[attr-defined]
        assert server.plane.calls[-1][-1].claimed == "alice"  # type: ignore[attr-defined]
    finally:
        server.stop(0.1)


@pytest.mark.parametrize("mode", [0o644, 0o660, 0o604])
def test_a_token_file_others_may_read_or_its_group_change_is_refused(state: Path, mode: int) -> None:
    """As strict as a webhook's secret file: 0600 or 0640 only."""
    server = _server(state, listen=f"127.0.0.1:{free_port()}", token_file=_token_file(state, mode))
    with pytest.raises(ConfigError, match=f"has mode {mode:04o}: others \\(or its group\\) may read or change it"):
        server.start()
    server.stop(0.1)


def _non_loopback_address() -> str | None:
    """An address of this machine that is not loopback (the route to a public address; no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: only picks the outgoing interface
            address = str(probe.getsockname()[0])
        except OSError:
            return None
    return None if address.startswith("127.") else address


def test_non_loopback_tcp_refuses_plain_http_unless_allowed(state: Path) -> None:
    host = _non_loopback_address() or "0.0.0.0"
    listen = f"{host}:{free_port()}"
    refused = _server(state, listen=listen, token_file=_token_file(state))
    with pytest.raises(ConfigError, match="not a loopback address.*--allow-insecure-http"):
        refused.start()
    refused.stop(0.1)
    allowed = _server(state, listen=listen, token_file=_token_file(state), allow_insecure_http=True)
    allowed.start()
    try:
        connect = "127.0.0.1" if host == "0.0.0.0" else host
        client = ControlClient(address=f"{connect}:{listen.rsplit(':', 1)[1]}", token=TOKEN)
        assert client.status()["triton_url"] == "127.0.0.1:8001"
    finally:
        allowed.stop(0.1)


def test_tls_on_a_non_loopback_listener(state: Path) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is not installed")
    cert, key = state / "tls.crt", state / "tls.key"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    port = free_port()
    server = _server(state, listen=f"0.0.0.0:{port}", token_file=_token_file(state), tls_cert=cert, tls_key=key)
    server.start()
    try:
        client = ControlClient(address=f"https://127.0.0.1:{port}", token=TOKEN, ca_file=cert)
        assert client.status()["triton_url"] == "127.0.0.1:8001"
        plain = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        with pytest.raises((http.client.HTTPException, OSError)):
            plain.request("GET", "/v1/models", headers={"Authorization": f"Bearer {TOKEN}"})
            plain.getresponse()
        untrusted = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=ssl.create_default_context())
        with pytest.raises(ssl.SSLCertVerificationError):
            untrusted.request("GET", "/v1/models")
    finally:
        server.stop(0.1)


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)


def test_the_served_document_is_self_contained(served: ApiServer) -> None:
    """Every `$ref` points inside the document (the published --json schemas are bundled under components), so a
    client generator or a validator needs nothing but `GET /v1/openapi.json`."""
    document = ControlClient(socket=served.settings.socket_path).call("GET", OPENAPI_PATH.removeprefix("/v1"))
    refs = set(_refs(document))
    assert refs and all(ref.startswith("#/components/schemas/") for ref in refs), sorted(refs)
    assert all(ref.rsplit("/", 1)[1] in document["components"]["schemas"] for ref in refs)
    versions = document["paths"]["/v1/models/{model}/versions"]["get"]["responses"]["200"]["content"]
    assert versions["application/json"]["schema"] == {"$ref": "#/components/schemas/Versions"}
    load = document["paths"]["/v1/models/{model}/load"]["post"]["responses"]["200"]["content"]["application/x-ndjson"]
    assert [ref["$ref"].rsplit("/", 1)[1] for ref in load["schema"]["oneOf"]] == ["ProgressLine", "LoadLine",
                                                                                  "ErrorLine"]
    events = document["paths"]["/v1/events"]["get"]["responses"]["200"]["content"]["text/event-stream"]
    assert set(events["x-events"]) == {"audit", "state"}


def test_parameters_carry_the_constraints_the_core_enforces(served: ApiServer) -> None:
    import re

    from controlplane.api.params import DIGEST_PATTERN, MODEL_NAME_PATTERN, REF_PATTERN, TAG_NAME_PATTERN
    from controlplane.errors import UsageError
    from controlplane.intake.tags import validate_tag_name
    from controlplane.names import validate_digest, validate_model_name

    def accepts(check: Callable[[str], Any], value: str) -> bool:
        try:
            check(value)
        except UsageError:
            return False
        return True

    cases = [(validate_model_name, MODEL_NAME_PATTERN, ("linear", "a.b-c_1", "_x", "x" * 128, "a__deadbeef", ".x",
                                                        "-x", "a..b", "a b", "é", "x" * 129, "__deadbeef", "a/b", "")),
             (validate_tag_name, TAG_NAME_PATTERN, ("stable", "v-1.2", "abcdef", "abcde", "Stable", "-x", "x" * 63,
                                                    "x" * 64, "deadbeefg")),
             (validate_digest, DIGEST_PATTERN, ("abcdef", "ABCDEF", "sha256:" + "a" * 64, "SHA256:abcdef", "abcde",
                                                "a" * 65, "xyzxyz"))]
    for check, pattern, values in cases:
        for value in values:
            assert bool(re.search(pattern, value)) == accepts(check, value), (pattern, value)
            if check is validate_digest and accepts(check, value):
                assert re.search(REF_PATTERN, value), value


@pytest.mark.parametrize("path", ["/v1/webhooks/deliveries?state=delivered&limit=36893488147419103231",
                                  "/v1/audit?limit=36893488147419103231", "/v1/rollouts?limit=0",
                                  "/v1/events?after=36893488147419103231", "/v1/audit?model=",
                                  "/v1/models/a..b", "/v1/models/a%20b", "/v1/models/linear/diff?a=&b="])
def test_an_out_of_range_or_malformed_parameter_is_a_400_json_error(served: ApiServer, path: str) -> None:
    conn = _unix(served.settings.socket_path)
    conn.request("GET", path)
    answer = conn.getresponse()
    assert (answer.status, answer.getheader("content-type")) == (400, "application/json"), path
    assert json.loads(answer.read())["error"]["class"] == "UsageError"


def test_a_405_names_every_method_the_path_answers(served: ApiServer) -> None:
    conn = _unix(served.settings.socket_path)
    conn.request("TRACE", "/v1/models/linear/pin")
    answer = conn.getresponse()
    assert answer.status == 405 and json.loads(answer.read())["error"]["class"] == "UsageError"
    assert answer.getheader("allow") == "DELETE, PUT"


def test_an_unexpected_exception_is_a_500_json_error(served: ApiServer, monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(model: str) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(served.plane, "versions", boom, raising=False)
    conn = _unix(served.settings.socket_path)
    conn.request("GET", "/v1/models/linear/versions")
    answer = conn.getresponse()
    assert (answer.status, answer.getheader("content-type")) == (500, "application/json")
    assert json.loads(answer.read())["error"] == {"class": "TritonctlError", "exit_code": 1,
                                                  "message": "internal error: RuntimeError: a bug"}


def test_a_state_refusal_is_a_409_with_the_usage_exit_code() -> None:
    """A well-formed request the model's state refuses (pinned, serves nothing, ...) is not a malformed one:
    409, and still exit 2 in the CLI."""
    from controlplane.api.protocol import error_document, error_from_document, exit_code_for, status_for
    from controlplane.errors import ConflictError, UsageError

    refusal = ConflictError("model 'linear' serves nothing to pin")
    assert (status_for(refusal), exit_code_for(refusal)) == (409, 2)
    assert (status_for(UsageError("bad")), exit_code_for(UsageError("bad"))) == (400, 2)
    assert isinstance(error_from_document(error_document(refusal), ""), ConflictError)
