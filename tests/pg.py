"""A real, throwaway PostgreSQL server for the tests (no mocks, no shared server).

`PostgresServer` runs initdb into a fresh temporary directory, starts the server on 127.0.0.1 with a
free port and its Unix socket inside that directory, and hands out one fresh database per caller
(`new_database()` → a `postgresql+psycopg://` URL). Tests run as root in CI, and PostgreSQL refuses
to run as root, so the cluster then belongs to the `postgres` user that Debian's package creates and
every server command runs through `runuser -u postgres --`.

Where the PostgreSQL binaries or psycopg are missing, `skip_reason()` says why and the `postgres`
fixture skips (locally); `.ci/run` installs both, so CI runs these tests.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

SERVER_USER = "postgres"


def pg_bindir() -> Path | None:
    """Where initdb/pg_ctl live: PATH first, then Debian's /usr/lib/postgresql/<version>/bin (newest)."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(os.path.realpath(found)).parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                        key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    return Path(candidates[-1]).parent if candidates else None


def skip_reason() -> str | None:
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install -e '.[test]' installs it)"
    if pg_bindir() is None:
        return "PostgreSQL server binaries (initdb, pg_ctl) not found: apt-get install postgresql"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SERVER_USER)
        except KeyError:
            return "running as root and there is no 'postgres' user to own the test cluster"
        if shutil.which("runuser") is None:
            return "running as root without runuser(1) to drop to the 'postgres' user"
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PostgresServer:
    """One PostgreSQL cluster in a temp dir; `stop()` removes it."""

    def __init__(self) -> None:
        bindir = pg_bindir()
        assert bindir is not None
        self.bindir = bindir
        # Under /tmp directly: pytest's tmp dirs are 0700 root, which the postgres user cannot enter.
        self.base = Path(tempfile.mkdtemp(prefix="tritonctl-pg-"))
        self.data = self.base / "data"
        self.port = free_port()
        self.as_root = os.geteuid() == 0
        self.started = False

    def _cmd(self, *args: str) -> list[str]:
        return (["runuser", "-u", SERVER_USER, "--"] if self.as_root else []) + list(args)

    def _run(self, *args: str, timeout_s: float = 60.0) -> None:
        result = subprocess.run(self._cmd(*args), capture_output=True, text=True, timeout=timeout_s)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(args[:2])} failed ({result.returncode}): {result.stderr}{result.stdout}")

    def start(self) -> PostgresServer:
        if self.as_root:
            entry = pwd.getpwnam(SERVER_USER)
            os.chown(self.base, entry.pw_uid, entry.pw_gid)
        os.chmod(self.base, 0o700)
        self._run(str(self.bindir / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust",
                  "-E", "UTF8", "--locale=C", "--no-sync")
        self.start_again()
        return self

    def start_again(self) -> None:
        """Start the initialised cluster (again, after `crash`: it recovers on the same data)."""
        options = (f"-c listen_addresses=127.0.0.1 -p {self.port} -c unix_socket_directories={self.base} "
                   "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.base / "server.log"),
                  "-o", options, "-w", "-t", "60", "start", timeout_s=90)
        self.started = True

    def crash(self) -> None:
        """`pg_ctl stop -m immediate`: every backend dies at once, as in a crash (no clean shutdown)."""
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop", timeout_s=60)
        self.started = False

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def new_database(self, prefix: str = "t") -> str:
        """A fresh, empty database; returns its SQLAlchemy URL."""
        import psycopg

        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres",
                             autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return (self.base / "server.log").read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.started:
            try:
                self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop",
                          timeout_s=60)
            except (RuntimeError, subprocess.TimeoutExpired):
                pass
            self.started = False
        shutil.rmtree(self.base, ignore_errors=True)


def _served() -> Iterator[PostgresServer]:
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    server = PostgresServer()
    try:
        server.start()
    except Exception:
        server.stop()
        raise
    yield server
    server.stop()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """The session's PostgreSQL server (skips where PostgreSQL or psycopg is missing)."""
    yield from _served()


@pytest.fixture(scope="module")
def own_postgres() -> Iterator[PostgresServer]:
    """A server of the module's own, which its tests may crash (`crash`, `start_again`)."""
    yield from _served()


@pytest.fixture
def pg_url(postgres: PostgresServer) -> str:
    """A fresh database on the session's server, for one test."""
    return postgres.new_database()


def wait_port(port: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"port {port} not listening")
