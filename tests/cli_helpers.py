"""What the CLI test suites share: running `tritonctl` in process and the one-line-error contract."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result

from cli.main import cli

ROOT = Path(__file__).resolve().parent.parent
NOW = datetime(2026, 11, 29, 12, 0, 0)  # the fixed "now" of the CLI tests


def invoke(args: list[str], **kwargs: Any) -> Result:
    # A wide terminal so table rows do not fold (the CLI's own width comes from the terminal).
    return CliRunner(env={"COLUMNS": "240"}).invoke(cli, args, **kwargs)


def assert_one_line_error(result: Result, code: int, *fragments: str) -> None:
    assert result.exit_code == code, result.output
    assert result.stderr.startswith("error: "), result.stderr
    assert result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in result.stderr


@contextmanager
def serving_registry(state: Path) -> Iterator[None]:
    """The daemon's control API (the real ApiServer and ControlPlane) on `<state>/tritonctl.sock`, answering from
    the registry and content store in `state`, so the CLI's read verbs make their one HTTP call as they do
    against a daemon. No tritonserver: the read routes never ask it (its URL is a closed port)."""
    from concurrent import futures

    from controlplane.api.server import ApiServer
    from controlplane.control_plane import ControlPlane
    from controlplane.deploy.publish import ServingRepository
    from controlplane.parts import build_parts
    from controlplane.settings.config import Settings
    from controlplane.snapshot import ContentStore
    from controlplane.source.protocol import NoSource
    from controlplane.store.registry import Registry
    from controlplane.triton.client import TritonClient

    settings = Settings(repository=state / "repository", state_dir=state, policy="manual")
    registry = Registry(f"sqlite:///{state / 'registry.db'}")
    triton = TritonClient("127.0.0.1:1")
    plane = ControlPlane(build_parts(settings, registry, ContentStore(state / "store", fsync=False),
                         ServingRepository(state / "serving", state / "published"), triton,
                         source=NoSource()))  # the read routes never look at a source
    executor = futures.ThreadPoolExecutor(max_workers=2)
    server = ApiServer(plane, executor, settings)
    server.start()
    try:
        yield
    finally:
        server.stop(0.1)
        executor.shutdown(wait=False)
        triton.close()
        registry.close()
