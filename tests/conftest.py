"""Shared fixtures: a real tritonserver (explicit mode, loopback, free ports) for every test that needs one.

`triton` is one server for the whole session (its repository is a temp dir tests copy models into);
`fresh_triton` starts a server of its own for a test that needs isolation (kills, restarts, restricted
protocol). Nothing here fakes Triton.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane.triton.launcher import TritonServer
from tests.pg import pg_url, postgres  # noqa: F401 - fixtures: a throwaway PostgreSQL server

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "model_repository"


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
