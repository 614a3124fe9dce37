"""A hostile or broken MLflow tracking server cannot take the token elsewhere, nor the daemon's disk, memory
or poller (issue 58, items 2 and 3).

The tracking server here is a stand-in (`HostileMLflow`, loopback only): a real `mlflow server` cannot be
made to redirect to another origin, to list a file at one size and send another, to list a negative size,
to answer 40 MiB of JSON or to trickle its answer, which is what these tests need. It answers the few REST
calls the source makes, the way MLflow answers them (tests/test_mlflow_e2e.py runs the source against a
real server).
"""

from __future__ import annotations

import http.server
import json
import shutil
import ssl
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from controlplane.errors import ConfigError, MLflowError, SnapshotChangingError, SnapshotUnsupportedError
from controlplane.remote import mlflowrest
from controlplane.remote.mlflowrest import MLflowRest, insecure_refusal
from controlplane.settings.config import load_settings
from controlplane.snapshot.content import ContentStore
from controlplane.source.mlflowsource import MLflowSource
from controlplane.startup import preflight

TOKEN = "secret-mlflow-token"
ROOT = "0/r1/artifacts/model"
FILES = {"config.pbtxt": b'name: "m"\nbackend: "python"\n', "1/model.py": b"print('model')\n"}
Handler = Callable[[http.server.BaseHTTPRequestHandler], bool]  # True: it answered the request


class HostileMLflow:
    """MLflow's REST answers for one model `m` (alias champion -> version 1, artifacts FILES), on loopback;
    `fault` answers a request first when it returns True. Every request is recorded with its
    Authorization header; `sent` counts the body bytes written."""

    def __init__(self, tls: tuple[Path, Path] | None = None) -> None:
        self.requests: list[tuple[str, str | None]] = []
        self.fault: Handler | None = None
        self.listed_sizes: dict[str, Any] = {}
        self.sent = 0
        owner = self

        class Handle(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                owner.requests.append((self.path, self.headers.get("Authorization")))
                if owner.fault is not None and owner.fault(self):
                    return
                owner.answer(self)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handle)
        self.server.daemon_threads = True
        scheme = "http"
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(str(tls[0]), str(tls[1]))
            self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
            scheme = "https"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def answer(self, handler: http.server.BaseHTTPRequestHandler) -> None:
        url = urllib.parse.urlsplit(handler.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        api = "/api/2.0/mlflow/"
        version = {"name": "m", "version": "1", "run_id": "r1", "source": f"mlflow-artifacts:/{ROOT}"}
        if url.path == api + "registered-models/search":
            aliases = [{"alias": "champion", "version": "1"}]
            self.json(handler, {"registered_models": [{"name": "m", "aliases": aliases}]})
        elif url.path == api + "registered-models/alias":
            self.json(handler, {"model_version": version})
        elif url.path == api + "model-versions/get-download-uri":
            self.json(handler, {"artifact_uri": f"mlflow-artifacts:/{ROOT}"})
        elif url.path == "/api/2.0/mlflow-artifacts/artifacts":
            rel = query.get("path", "").removeprefix(ROOT).strip("/")
            self.json(handler, {"files": self.listing(rel)})
        elif url.path.startswith("/api/2.0/mlflow-artifacts/artifacts/"):
            name = urllib.parse.unquote(url.path.removeprefix("/api/2.0/mlflow-artifacts/artifacts/"))
            self.body(handler, FILES[name.removeprefix(ROOT + "/")])
        else:
            self.body(handler, b"{}", 404)

    def listing(self, rel: str) -> list[dict[str, Any]]:
        prefix = rel + "/" if rel else ""
        seen: dict[str, dict[str, Any]] = {}
        for name, data in FILES.items():
            if name.startswith(prefix):
                head, sep, _ = name[len(prefix):].partition("/")
                size = self.listed_sizes.get(name, len(data))
                seen[head] = {"path": head, "is_dir": True} if sep else {"path": head, "is_dir": False,
                                                                        "file_size": size}
        return list(seen.values())

    def json(self, handler: http.server.BaseHTTPRequestHandler, document: Any) -> None:
        self.body(handler, json.dumps(document).encode())

    def body(self, handler: http.server.BaseHTTPRequestHandler, data: bytes, status: int = 200) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)
        self.sent += len(data)

    def stream(self, handler: http.server.BaseHTTPRequestHandler, total: int, chunk: bytes, *,
               pause_s: float = 0.0, length: int | None = None) -> None:
        """Send `total` bytes of `chunk`s (announcing `length`, default `total`), pausing between them;
        stops when the client goes away."""
        handler.send_response(200)
        handler.send_header("Content-Length", str(total if length is None else length))
        handler.end_headers()
        try:
            while self.sent < total:
                handler.wfile.write(chunk)
                handler.wfile.flush()
                self.sent += len(chunk)
                time.sleep(pause_s)
        except OSError:
            pass


@pytest.fixture
def stand_in() -> Iterator[HostileMLflow]:
    server = HostileMLflow()
    yield server
    server.close()


@pytest.fixture
def store(tmp_path: Path) -> ContentStore:
    return ContentStore(tmp_path / "store", fsync=False)


def source_for(server: HostileMLflow, env: dict[str, str] | None = None) -> MLflowSource:
    return MLflowSource(f"mlflow+{server.url}", env={"MLFLOW_TRACKING_TOKEN": TOKEN} if env is None else env)


def redirect(to: str) -> Handler:
    def fault(handler: http.server.BaseHTTPRequestHandler) -> bool:
        handler.send_response(302)
        handler.send_header("Location", to + handler.path)
        handler.send_header("Content-Length", "0")
        handler.end_headers()
        return True

    return fault


# -- item 2: the token follows no redirect out of the tracking server's origin ----------------------------

def test_a_redirect_to_another_origin_is_refused_and_the_token_never_reaches_it(
        stand_in: HostileMLflow, store: ContentStore) -> None:
    elsewhere = HostileMLflow()  # another port: another origin
    try:
        stand_in.fault = redirect(elsewhere.url)
        with pytest.raises(MLflowError, match="redirected to http://127.0.0.1:.*another origin: not followed"):
            source_for(stand_in).capture("m", store)
        assert stand_in.requests and stand_in.requests[0][1] == f"Bearer {TOKEN}"
        assert elsewhere.requests == []
    finally:
        elsewhere.close()


def test_a_redirect_within_the_origin_is_followed_with_the_token(stand_in: HostileMLflow, store: ContentStore) -> None:
    def same_origin(handler: http.server.BaseHTTPRequestHandler) -> bool:
        if handler.path.startswith("/old"):
            return False
        handler.send_response(307)
        handler.send_header("Location", "/old" + handler.path)
        handler.send_header("Content-Length", "0")
        handler.end_headers()
        return True

    def strip_old(handler: http.server.BaseHTTPRequestHandler) -> bool:
        if not handler.path.startswith("/old"):
            return same_origin(handler)
        handler.path = handler.path.removeprefix("/old")
        stand_in.answer(handler)
        return True

    stand_in.fault = strip_old
    snapshot = source_for(stand_in).capture("m", store)
    assert {e.path for e in snapshot.entries if e.kind == "file"} == set(FILES)
    followed = [auth for path, auth in stand_in.requests if path.startswith("/old")]
    assert followed and set(followed) == {f"Bearer {TOKEN}"}


def test_https_is_never_downgraded_to_http(tmp_path: Path, store: ContentStore) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    secure, plain = HostileMLflow(tls=(cert, key)), HostileMLflow()
    try:
        secure.fault = redirect(plain.url)  # the same host, plain HTTP
        env = {"MLFLOW_TRACKING_TOKEN": TOKEN, "MLFLOW_TRACKING_SERVER_CERT_PATH": str(cert)}
        with pytest.raises(MLflowError, match="another origin: not followed"):
            source_for(secure, env).capture("m", store)
        assert secure.requests and plain.requests == []
    finally:
        secure.close()
        plain.close()


def test_plain_http_to_another_host_with_a_token_is_refused_unless_allowed(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    remote, local = "mlflow+http://192.0.2.10:5000", "mlflow+http://127.0.0.1:5000"
    token = {"MLFLOW_TRACKING_TOKEN": TOKEN}
    refusal = insecure_refusal(remote, token, False)
    assert refusal is not None and "MLFLOW_TRACKING_TOKEN would be sent in clear" in str(refusal)
    assert "--allow-insecure-http" in str(refusal)
    assert insecure_refusal(remote, token, True) is None
    assert insecure_refusal(local, token, False) is None
    assert insecure_refusal("mlflow+https://192.0.2.10", token, False) is None
    assert insecure_refusal(remote, {}, False) is None  # nothing to send
    assert insecure_refusal(remote, {"MLFLOW_TRACKING_USERNAME": "u", "MLFLOW_TRACKING_PASSWORD": "p"}, False)
    # the daemon's start refuses it before it creates anything: its settings are refused as they are read
    with pytest.raises(ConfigError, match="plain HTTP to a host that is not loopback"):
        load_settings({"repository": remote, "state_dir": str(tmp_path / "state"), "triton_url": "127.0.0.1:1"},
                      env=token)
    assert not (tmp_path / "state").exists()
    allowed = load_settings({"repository": remote, "state_dir": str(tmp_path / "state"), "triton_url": "127.0.0.1:1",
                             "allow_insecure_http": True}, env=token)
    preflight.check(allowed)


# -- item 3: sizes and times ------------------------------------------------------------------------------

def test_a_file_larger_than_listed_is_not_read_past_its_size(stand_in: HostileMLflow, store: ContentStore) -> None:
    total = 100 << 20

    def flood(handler: http.server.BaseHTTPRequestHandler) -> bool:
        if not handler.path.endswith("/1/model.py"):
            return False
        stand_in.sent = 0
        stand_in.stream(handler, total, b"#" * (64 << 10))
        return True

    stand_in.fault = flood
    started = time.monotonic()
    with pytest.raises(SnapshotChangingError, match=r"more than the 15 bytes the listing said; stopped reading"):
        source_for(stand_in).capture("m", store)
    assert time.monotonic() - started < 20
    time.sleep(0.5)  # the server notices the client has gone
    assert stand_in.sent < 32 << 20, f"{stand_in.sent} bytes were taken of a file listed at 15"
    assert list((store.root / "tmp").iterdir()) == []


@pytest.mark.parametrize("size", [-5, "-5", "abc", 1.5, True, [], "１２"])
def test_a_size_that_is_no_size_is_refused_before_any_download(stand_in: HostileMLflow, store: ContentStore,
                                                                size: Any) -> None:
    stand_in.listed_sizes["1/model.py"] = size
    with pytest.raises(SnapshotUnsupportedError, match=r"'1/model.py' is listed with size .*not a number of bytes"):
        source_for(stand_in).capture("m", store)
    assert not [path for path, _ in stand_in.requests if "/artifacts/0/" in path]


def test_a_size_as_protobuf_json_writes_it_is_taken(stand_in: HostileMLflow) -> None:
    stand_in.listed_sizes["1/model.py"] = "15"  # int64 as protobuf's JSON writes it
    stand_in.listed_sizes["config.pbtxt"] = None  # a 0 is left out
    files = source_for(stand_in).files.listing("m", ROOT)
    assert {f.path: f.size for f in files} == {"1/model.py": 15, "config.pbtxt": 0}


def test_a_huge_json_answer_is_refused_without_reading_it(stand_in: HostileMLflow) -> None:
    def huge(handler: http.server.BaseHTTPRequestHandler) -> bool:
        if "registered-models/search" not in handler.path:
            return False
        stand_in.sent = 0
        stand_in.stream(handler, 400 << 20, b'{"registered_models": [' + b" " * (1 << 20))
        return True

    stand_in.fault = huge
    rest = MLflowRest(stand_in.url, env={})
    with pytest.raises(MLflowError, match=f"answered more than {mlflowrest.MAX_ANSWER_BYTES} bytes"):
        list(rest.registered_models())
    time.sleep(0.5)
    assert stand_in.sent < mlflowrest.MAX_ANSWER_BYTES + (32 << 20)


@pytest.mark.parametrize("where", ["body", "headers"])
def test_a_trickling_answer_is_abandoned_at_its_deadline_and_status_says_when_it_was_last_read(
        stand_in: HostileMLflow, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    source = source_for(stand_in)
    assert "not read yet" in str(source.watch_info()["reason"])
    source.poll()
    assert "read every 2 s, last read " in str(source.watch_info()["reason"])
    read_at = str(source.watch_info()["reason"]).split("last read ")[1].split(" ")[0]

    def trickle(handler: http.server.BaseHTTPRequestHandler) -> bool:
        if "registered-models/search" not in handler.path:
            return False
        if where == "headers":  # the status line itself, a byte at a time
            try:
                for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}":
                    handler.wfile.write(bytes([byte]))
                    handler.wfile.flush()
                    time.sleep(0.5)
            except OSError:
                pass
            return True
        stand_in.sent = 0
        stand_in.stream(handler, 10_000, b" ", pause_s=0.5, length=10_000)
        return True

    stand_in.fault = trickle
    monkeypatch.setattr(mlflowrest, "ANSWER_S", 2.0)
    started = time.monotonic()
    assert source.poll() == []
    took = time.monotonic() - started
    assert took < 10, f"the poll took {took:.1f} s against a 2 s deadline"
    reason = str(source.watch_info()["reason"])
    assert "answered too slowly" in reason and f"last read {read_at}" in reason, reason
