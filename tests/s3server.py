"""A real S3-protocol server for tests: moto's standalone server (`moto_server`) on a free loopback
port, with credential checks on (an IAM user created first, then auth enforced), and a TCP relay in
front of it that a test can switch off and on to take "the endpoint" down without losing the bucket.

The code under test talks to it exactly as to AWS: boto3 over HTTP, endpoint from AWS_ENDPOINT_URL,
credentials from AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

MOTO_SERVER = shutil.which("moto_server", path=str(Path(sys.executable).parent)) or shutil.which("moto_server")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Relay:
    """Forward 127.0.0.1:port to the server; `down()` refuses connections (and cuts open ones)."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.port = free_port()
        self._listener: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._lock = threading.Lock()
        self.up()

    def up(self) -> None:
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def down(self) -> None:
        with self._lock:
            listener, self._listener = self._listener, None
            conns, self._conns = self._conns, []
        if listener is not None:
            listener.close()
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                client.close()
                continue
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    upstream.close()
                    return
                self._conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(1 << 16):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


class MotoServer:
    """`moto_server` on loopback; `env` is what a process needs to reach it as an S3 endpoint."""

    def __init__(self, workdir: Path) -> None:
        if MOTO_SERVER is None:
            pytest.skip("moto_server not installed (pip install 'tritonctl[test]')")
        self.port = free_port()
        self.log = open(workdir / "moto.log", "ab")  # noqa: SIM115 - closed in stop()
        env = dict(os.environ, MOTO_ALLOW_NONEXISTENT_REGION="true")
        self.proc = subprocess.Popen([MOTO_SERVER, "-H", "127.0.0.1", "-p", str(self.port)], stdout=self.log,
                                     stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/moto-api/", timeout=2).read()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    tail = (workdir / "moto.log").read_text()[-2000:]
                    raise RuntimeError(f"moto_server did not start: {tail}") from None
                time.sleep(0.2)
        self.relay = Relay(self.port)
        self.endpoint = f"http://127.0.0.1:{self.relay.port}"
        self.key_id, self.secret = self._enforce_auth()

    def _enforce_auth(self) -> tuple[str, str]:
        """An IAM user allowed everything; then every request must be signed with its key."""
        import boto3

        iam = boto3.client("iam", endpoint_url=f"http://127.0.0.1:{self.port}", region_name="us-east-1",
                           aws_access_key_id="bootstrap", aws_secret_access_key="bootstrap")
        iam.create_user(UserName="tritonctl")
        policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
        iam.put_user_policy(UserName="tritonctl", PolicyName="all", PolicyDocument=json.dumps(policy))
        key = iam.create_access_key(UserName="tritonctl")["AccessKey"]
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/moto-api/reset-auth", data=b"0",
                                         method="POST", headers={"Content-Type": "text/plain"})
        urllib.request.urlopen(request, timeout=5).read()
        return key["AccessKeyId"], key["SecretAccessKey"]

    @property
    def env(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": self.key_id,
                "AWS_SECRET_ACCESS_KEY": self.secret, "AWS_DEFAULT_REGION": "us-east-1"}

    def client(self, **overrides: Any) -> Any:
        import boto3

        args = {"endpoint_url": f"http://127.0.0.1:{self.port}", "region_name": "us-east-1",
                "aws_access_key_id": self.key_id, "aws_secret_access_key": self.secret, **overrides}
        return boto3.client("s3", **args)

    def stop(self) -> None:
        self.relay.down()
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


@pytest.fixture(scope="session")
def s3server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    server = MotoServer(tmp_path_factory.mktemp("moto"))
    yield server
    server.stop()


@pytest.fixture
def s3env(s3server: MotoServer, monkeypatch: pytest.MonkeyPatch) -> MotoServer:
    """The AWS environment of this process points at the test server."""
    for name, value in s3server.env.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)
    return s3server


def upload_tree(client: Any, bucket: str, prefix: str, src: Path) -> None:
    """Put every file under `src` at `prefix/<relative path>` (what `aws s3 sync` does, in one go)."""
    for path in sorted(src.rglob("*")):
        if path.is_file():
            client.put_object(Bucket=bucket, Key=f"{prefix}{path.relative_to(src).as_posix()}", Body=path.read_bytes())
