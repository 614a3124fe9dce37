"""The embedded tritonserver: found, assembled, started live on loopback, stopped within its bound."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from controlplane.errors import LauncherError
from controlplane.triton.launcher import RESTRICTED_HEADER, TritonServer, find_tritonserver

SUM_MODEL = {
    "config.pbtxt": """
name: "summer"
backend: "python"
max_batch_size: 4
input [ { name: "x" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]
""",
    "1/model.py": """
import numpy as np
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            y = x.sum(axis=1, keepdims=True).astype(np.float32)
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", y)]))
        return out
""",
}


def write_model(repo: Path, files: dict[str, str], name: str = "summer") -> None:
    for rel, text in files.items():
        path = repo / name / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_finds_the_wheel_binary() -> None:
    assert find_tritonserver().name == "tritonserver"


def test_explicit_path_that_is_not_a_binary_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(LauncherError, match="not an executable file"):
        find_tritonserver(tmp_path / "nope")


def test_server_serves_a_python_model_in_explicit_mode(triton: TritonServer) -> None:
    write_model(triton.model_repository, SUM_MODEL)
    client = grpcclient.InferenceServerClient(triton.grpc_url)
    assert client.is_server_live()
    # explicit mode: nothing is loaded until asked
    assert not client.is_model_ready("summer")
    client.load_model("summer", client_timeout=60)
    x = grpcclient.InferInput("x", [2, 3], "FP32")
    x.set_data_from_numpy(np.array([[1, 2, 3], [4, 5, 6]], dtype=np.float32))
    result = client.infer("summer", [x]).as_numpy("y")
    assert result.tolist() == [[6.0], [15.0]]
    client.unload_model("summer")


@pytest.mark.triton
def test_restricted_key_refuses_model_repository_calls_without_it(tmp_path: Path) -> None:
    server = TritonServer(tmp_path / "repo", tmp_path / "work", restricted_key="s3cret")
    write_model(server.model_repository, SUM_MODEL)
    with server:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        with pytest.raises(InferenceServerException, match="restricted"):
            client.load_model("summer", client_timeout=60)
        header = {f"triton-grpc-protocol-{RESTRICTED_HEADER}": "s3cret"}
        client.load_model("summer", headers=header, client_timeout=60)
        assert client.is_model_ready("summer")  # inference-side protocols stay open


@pytest.mark.triton
def test_the_key_also_guards_shared_memory_logging_and_trace(tmp_path: Path) -> None:
    """A local user without the key can neither map Triton's shared memory nor rewrite its log or trace
    settings (gRPC and HTTP); the daemon, with it, can."""
    import tritonclient.http as httpclient

    server = TritonServer(tmp_path / "repo", tmp_path / "work", restricted_key="s3cret")
    with server:
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        http = httpclient.InferenceServerClient(server.http_url)
        calls = {
            "grpc shared memory": lambda h: grpc.get_system_shared_memory_status(headers=h),
            "grpc logging": lambda h: grpc.update_log_settings({"log_verbose_level": 1}, headers=h),
            "grpc trace": lambda h: grpc.get_trace_settings(headers=h),
            "http shared memory": lambda h: http.get_cuda_shared_memory_status(headers=h),
            "http logging": lambda h: http.get_log_settings(headers=h),
            "http trace": lambda h: http.update_trace_settings(settings={"trace_rate": "5"}, headers=h),
        }
        for name, call in calls.items():
            with pytest.raises(InferenceServerException, match="restricted|403|[Pp]ermission"):
                call(None)
                pytest.fail(f"{name} answered without the key")
            header = {f"triton-grpc-protocol-{RESTRICTED_HEADER}" if name.startswith("grpc") else RESTRICTED_HEADER:
                      "s3cret"}
            call(header)


@pytest.mark.triton
def test_stop_kills_a_server_that_ignores_sigterm(tmp_path: Path) -> None:
    server = TritonServer(tmp_path / "repo", tmp_path / "work")
    server.start()
    assert server.pid is not None
    os.kill(server.pid, signal.SIGSTOP)  # a stopped process cannot act on SIGTERM
    started = time.monotonic()
    server.stop(timeout_s=1.0)
    assert time.monotonic() - started < 10
    assert not server.is_running()


@pytest.mark.triton
def test_start_failure_reports_the_log_tail(tmp_path: Path) -> None:
    server = TritonServer(tmp_path / "repo", tmp_path / "work", extra_args=["--no-such-flag"])
    with pytest.raises(LauncherError, match="exited with code"):
        server.start(live_timeout_s=20)


@pytest.mark.slow  # the load is given 20 s to show it never ends
@pytest.mark.triton
def test_a_python_model_under_a_path_with_a_space_never_starts(tmp_path: Path) -> None:
    """Triton is the oracle for the daemon's refusal of a state directory with whitespace
    (controlplane/startup/launch.py `new_server`): tritonserver 2.51's python backend never finishes
    starting a model instance under such a path (measured: the load request hangs; here the client
    gives up after 20 s), where the same model under a plain path loads in about a second
    (test_server_serves_a_python_model_in_explicit_mode)."""
    spaced = tmp_path / "with space"
    server = TritonServer(spaced / "repo", spaced / "work")
    write_model(server.model_repository, SUM_MODEL)
    with server:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        with pytest.raises(InferenceServerException):
            client.load_model("summer", client_timeout=20)
        assert not client.is_model_ready("summer")


@pytest.mark.triton  # it would launch one, were it not refused
def test_a_state_directory_with_whitespace_is_refused_before_anything_launches(tmp_path: Path) -> None:
    """Exit 2 and one line naming `state_dir` and why, instead of every python model hanging in its load."""
    import subprocess
    import sys

    repo = tmp_path / "repo"
    write_model(repo, SUM_MODEL)
    state = tmp_path / "state dir"
    result = subprocess.run(
        [sys.executable, "-m", "cli.main", "daemon", "--repository", str(repo), "--state-dir", str(state),
         "--launch-triton", "--triton-grpc-port", "0", "--triton-http-port", "0", "--triton-metrics-port", "0"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "TRITONCTL_LAUNCH_TRITON_EXPOSED_KEY": "warn"})
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.strip().splitlines() if line.startswith("error:")]
    assert lines == [f"error: state_dir: {state}: a launched tritonserver cannot start python models under a path "
                     "with whitespace; choose a state directory (--state-dir) without any"], result.stderr
    assert not (state / "triton" / "server.json").exists()  # nothing was launched


@pytest.mark.triton
def test_a_client_reconnected_once_the_server_listens_answers_at_once(tmp_path: Path) -> None:
    """The daemon's Triton client is made before the first start's deferred launch and reconnected once
    the server is live (controlplane/startup/launch.py). gRPC shares one connection per address among a
    process's channels with the same arguments: while any channel that tried before the server listened
    is still open (here a plain tritonclient, as the daemon's own was; there, a call still in flight on
    the replaced channel), a new channel joins its reconnect backoff and fails at once with the stale
    "Connection refused" (a first start's deploys then failed as "tritonserver unreachable", under
    load). The client's channel has a subchannel of its own."""
    from controlplane.triton.client import TritonClient
    from controlplane.triton.launcher import free_port

    port = free_port()
    url = f"127.0.0.1:{port}"
    other = grpcclient.InferenceServerClient(url)  # tritonclient's default arguments
    client = TritonClient(url, retries=0)
    with pytest.raises(InferenceServerException):
        other.is_server_live(client_timeout=2)  # nothing listens yet: it fails and backs off
    with pytest.raises(Exception, match="unreachable"):
        client.index()
    server = TritonServer(tmp_path / "repo", tmp_path / "work", grpc_port=port)
    with server:
        client.reconnect()
        assert client.index() == []  # at once, not after gRPC's backoff
    client.close()
    other.close()
