"""Shared fixtures: a real tritonserver (explicit mode, loopback, free ports) for every test that needs one.

`triton` is one server for the whole session (its repository is a temp dir tests copy models into);
`fresh_triton` starts a server of its own for a test that needs isolation (kills, restarts, restricted
protocol). Nothing here fakes Triton.

Tiers (markers registered in pyproject.toml, applied here at collection): a test that uses a
tritonserver fixture, or is marked `triton` because it starts a daemon or server itself, is `triton`;
one that uses the PostgreSQL fixtures is `postgres`; one that uses the S3 server fixtures is `s3`; every
other test is `unit`. `pytest -m unit` needs no server, and a `unit` test that starts one anyway fails
(`_refuse_servers`), so a missing marker cannot hide in the fast tier.
"""

from __future__ import annotations

import os

os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "0")  # before grpc's first import (controlplane/__init__.py)

import shutil
import subprocess
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import pytest

from controlplane.store.registry import Registry
from controlplane.triton.launcher import TritonServer
from tests.harness import TEST_DEFAULTS_ENV
from tests.pg import pg_url, postgres  # noqa: F401 - fixtures: a throwaway PostgreSQL server

# Every daemon the suite starts switches a deploy at once, and launches tritonserver without auto-complete,
# unless its test opts out (tests/harness.py SWITCH_AT_ONCE_ENV, NO_AUTO_COMPLETE_ENV: the safe defaults of
# issue 55 and auto-completed configs are tested where a test asks for them).
for _name, _value in TEST_DEFAULTS_ENV.items():
    os.environ.setdefault(_name, _value)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "model_repository"

# The fixtures that start a server, by tier (their dependents inherit the tier: fixturenames is transitive).
TIER_FIXTURES = {
    "triton": frozenset({"triton", "fresh_triton", "triton_client"}),
    "postgres": frozenset({"postgres", "pg_url"}),
    "s3": frozenset({"s3server", "s3env"}),
    "mlflow": frozenset({"mlflow_server"}),
}
SERVER_TIERS = frozenset(TIER_FIXTURES)
# Modules whose every test starts a tritonctl daemon (and so a tritonserver), a tritonserver, or a
# benchmark that does, in the test body or a module fixture; a module that mixes tiers marks its
# server tests one by one with @pytest.mark.triton.
SERVER_MODULES = {
    "test_api_contract": ("triton",),
    "test_bench_quick": ("triton",),
    "test_bounds_e2e": ("triton",),
    "test_canary_e2e": ("triton",),
    "test_capture_at_once": ("triton",),
    "test_bench_smoke": ("triton",),  # the bench records the tritonserver version: it starts one briefly
    "test_changeset_kills": ("triton",),
    "test_changesets": ("triton",),
    "test_concurrency": ("triton",),
    "test_corpus_e2e": ("triton",),
    "test_crash": ("triton",),
    "test_daemon_e2e": ("triton",),
    "test_differential": ("triton",),
    "test_ensemble_daemon": ("triton",),
    "test_exit_codes": ("triton",),
    "test_gateway_e2e": ("triton",),
    "test_gateway_daemon_e2e": ("triton",),
    "test_gateway_kills": ("triton",),
    "test_gateway_shadow": ("triton",),
    "test_faults": ("triton",),
    "test_fleet_changesets": ("triton", "postgres"),
    "test_fleet_e2e": ("triton", "postgres"),
    "test_fleet_unpin_e2e": ("triton", "postgres"),
    "test_help_examples": ("triton",),
    "test_identity_e2e": ("triton",),
    "test_json_contract": ("triton", "postgres"),
    "test_operator_view": ("triton",),
    "test_readme_using_it": ("triton",),
    "test_ready_e2e": ("triton",),
    "test_events_e2e": ("triton",),
    "test_mlflow_e2e": ("triton", "mlflow"),
    "test_mlflow_fleet_e2e": ("triton", "postgres", "mlflow"),
    "test_s3_e2e": ("triton", "s3"),
    "test_s3_fleet_e2e": ("triton", "postgres", "s3"),
    "test_security": ("triton",),
    "test_shadow_e2e": ("triton",),
    "test_storage_faults": ("triton",),
    "test_supervision": ("triton",),
    "test_systemd": ("triton",),
    "test_tags_e2e": ("triton",),
    "test_tags_fleet_e2e": ("triton", "postgres"),
    "test_watch_modes": ("triton",),
    "test_web_e2e": ("triton",),
    "test_writer_patterns_daemon": ("triton",),
}
# Programs a unit test must not start, with the tier that would own the test.
SERVER_PROGRAMS = {"tritonserver": "triton", "initdb": "postgres", "pg_ctl": "postgres", "moto_server": "s3",
                   "mlflow": "mlflow"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        tiers = {tier for tier, names in TIER_FIXTURES.items() if used & names}
        tiers |= {m.name for m in item.iter_markers() if m.name in SERVER_TIERS}
        tiers |= set(SERVER_MODULES.get(Path(str(item.fspath)).stem, ()))
        for tier in sorted(tiers):
            item.add_marker(tier)
        if not tiers and item.get_closest_marker("slow") is None:
            item.add_marker("unit")


# Set by `python -m tests.tiers` (README command (b), CI) for its pytest runs: that command installed
# every dependency a test needs (.ci/install-test-deps), so a test that skips there (no /dev/fuse, no
# PostgreSQL, ...) proves nothing while CI stays green: it fails instead. A skip whose reason names an
# opt-out variable that is set (TRITONCTL_TEST_NO_MOUNT=1) is a knowing choice and stays a skip.
NO_SKIP_ENV = "TRITONCTL_TEST_NO_SKIP"
KNOWING_OPT_OUTS = ("TRITONCTL_TEST_NO_MOUNT",)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    if not report.skipped or hasattr(report, "wasxfail") or os.environ.get(NO_SKIP_ENV) != "1":
        return
    reason = str(report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr)
    if any(name in reason and os.environ.get(name) == "1" for name in KNOWING_OPT_OUTS):
        return
    report.outcome = "failed"
    report.longrepr = (f"skipped under {NO_SKIP_ENV}=1 (python -m tests.tiers: README command (b) installed every "
                       f"dependency), which makes a skip a failure: {reason}")


def _server_started_by(args: Any) -> str | None:
    """The tier of the server `args` would start (a tritonserver, `tritonctl daemon`, PostgreSQL, S3)."""
    argv = [os.fspath(a) for a in ([args] if isinstance(args, (str, bytes, os.PathLike)) else args)]
    argv = [a.decode() if isinstance(a, bytes) else a for a in argv]
    words = [w for a in argv for w in a.split()]
    for word in words:
        tier = SERVER_PROGRAMS.get(os.path.basename(word))
        if tier:
            return tier
    runs_cli = any(os.path.basename(w) == "tritonctl" or w == "cli.main" for w in words)
    return "triton" if runs_cli and "daemon" in words else None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    with _refuse_servers(item):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    with _refuse_servers(item):
        yield


class _refuse_servers:
    """While a `unit` test sets up and runs, starting a server fails the test and names its tier."""

    def __init__(self, item: pytest.Item) -> None:
        self.active = item.get_closest_marker("unit") is not None
        self.real = subprocess.Popen.__init__

    def __enter__(self) -> None:
        if not self.active:
            return
        real = self.real

        def guarded(popen: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> None:
            tier = _server_started_by(args)
            if tier:
                raise AssertionError(f"a unit-tier test started a server ({args!r}): mark it "
                                     f"@pytest.mark.{tier} or use a {tier} fixture")
            real(popen, args, *rest, **kwargs)

        subprocess.Popen.__init__ = guarded  # type: ignore[method-assign]

    def __exit__(self, *exc: object) -> None:
        if self.active:
            subprocess.Popen.__init__ = self.real  # type: ignore[method-assign]


# What a test starts lives under the session's base temp dir (its repository, state dir, served trees), and
# these are the commands that run long: a test that fails between starting one and stopping it, or kills a
# daemon on purpose, may leave it running, taking CPU from every later test.
LONG_RUNNING = ("tritonserver", "controlplane.gateway", "tritonctl daemon")


def leftover_processes(base: Path) -> list[tuple[int, str]]:
    """(pid, command line) of the long-running processes whose command line names a path under `base`."""
    from controlplane.gateway.launcher import cmdline

    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        command = " ".join(cmdline(int(proc.name)))
        if str(base) in command and any(kind in command for kind in LONG_RUNNING):
            found.append((int(proc.name), command))
    return found


@pytest.fixture(scope="session", autouse=True)
def _no_process_outlives_the_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """At the session's end (after every other fixture stopped what it started), SIGKILL what is left under
    the session's temp dir, and say so: a leak is visible in the log instead of slowing the next run."""
    yield
    import signal
    import sys

    for pid, command in leftover_processes(tmp_path_factory.getbasetemp()):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            continue
        print(f"\ntests/conftest.py: killed pid {pid} left running by a test: {command[:200]}", file=sys.stderr)


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    """A migrated SQLite registry of the test's own (a test file needing a host or a clock defines its own)."""
    from controlplane.store import migrate

    reg = Registry(f"sqlite:///{tmp_path / 'registry.db'}")
    migrate.upgrade(reg)
    yield reg
    reg.close()


@pytest.fixture(scope="session")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    base = tmp_path_factory.mktemp("triton-session")
    server = TritonServer(model_repository=base / "repo", workdir=base / "work")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def fresh_triton(tmp_path: Path) -> Iterator[TritonServer]:
    server = TritonServer(model_repository=tmp_path / "triton-repo", workdir=tmp_path / "triton-work")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def triton_client(triton: TritonServer) -> Iterator[object]:
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(triton.grpc_url)
    yield client
    client.close()


def install_model(server: TritonServer, src: Path, name: str | None = None) -> Path:
    """Copy a model directory into the server's repository (replacing any previous copy)."""
    dest = server.model_repository / (name or src.name)
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src, dest)
    return dest
