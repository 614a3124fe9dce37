"""What the target tritonserver can run, and Triton's real reason when a load fails.

Unit tests read log lines and answers captured from the real tritonserver 2.51 (tests/data); the
integration tests load broken models into the session's real server.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from controlplane.errors import EnvironmentFault, HostCapabilityError, TritonError
from controlplane.triton.capabilities import (
    Capabilities,
    HostProbe,
    check,
    from_triton_reason,
    gpus_from_metrics,
    local_gpu_count,
)
from controlplane.triton.client import TritonClient
from controlplane.triton.host import TritonHost, host_for
from controlplane.triton.launcher import TritonServer
from controlplane.triton.serverlog import LoadExplainer, LogCursor, is_bare, parse_lines, reasons_for

DATA = Path(__file__).parent / "data"
CAPTURED_LOG = DATA / "tritonserver-2.51-failed-loads.log"
URL = "127.0.0.1:8001"

# gRPC answers of tritonserver 2.51 to the loads whose log lines are in CAPTURED_LOG
BARE = "load 'syn': failed to load 'syn', failed to poll from model repository"
GPU_ANSWER = ("load 'gpu0': load failed for model 'gpu0': version 1 is at UNAVAILABLE state: Invalid argument: "
              "instance group gpu0_0 of model gpu0 has kind KIND_GPU but no GPUs are available;")
BACKEND_ANSWER = ("load 'onnx': load failed for model 'onnx': version 1 is at UNAVAILABLE state: Invalid argument: "
                  "unable to find backend library for backend 'onnxruntime', try specifying runtime on the model "
                  "configuration.;")


# ------------------------------------------------------------------ the server log


def test_reasons_are_the_error_lines_that_name_the_model() -> None:
    lines = parse_lines(CAPTURED_LOG.read_text())
    assert all(line.severity in "IWE" for line in lines) and len(lines) == 18  # tables and banners skipped
    assert reasons_for("syn", lines) == [
        "Poll failed for model directory 'syn': failed to read text proto from /tmp/cap/repo/syn/config.pbtxt"
    ]
    assert reasons_for("mism", lines) == [
        "Poll failed for model directory 'mism': unexpected directory name 'mism' for model 'other', "
        "directory name must equal model name"
    ]
    assert reasons_for("seq", lines) == [
        "Poll failed for model directory 'seq': sequence batching control 'fp32_false_true' must have exactly "
        "2 entries for CONTROL_SEQUENCE_START for seq"
    ]
    assert reasons_for("ens", lines) == [  # named as a word, not quoted
        "Invalid argument: ensemble ens contains models that are not available or ambiguous: missing_step"
    ]
    assert reasons_for("gpu", lines) == [  # not gpu0's lines
        "failed to load 'gpu' version 1: Invalid argument: instance group gpu_0 of model gpu specifies invalid "
        "or unsupported gpu id 1. GPUs with at least the minimum required CUDA compute compatibility of "
        "6.000000 are:"
    ]
    assert reasons_for("linear", lines) == []


def test_only_answers_without_a_reason_are_explained() -> None:
    assert is_bare(BARE)
    assert is_bare("load 'm': load failed")
    assert not is_bare(GPU_ANSWER)
    assert not is_bare("load 'm': load failed for model 'm': version 1 is at UNAVAILABLE state: Internal: "
                       "RuntimeError: boom")


def test_explainer_reads_only_what_the_load_appended(tmp_path: Path) -> None:
    log = tmp_path / "tritonserver.log"
    captured = CAPTURED_LOG.read_text().splitlines(keepends=True)
    seq_line = next(line for line in captured if "'seq'" in line)
    log.write_text(seq_line)  # an earlier failure of the same model: not this load's reason
    explainer = LoadExplainer(log)
    cursor = explainer.start()
    assert explainer.explain("seq", "load 'seq': failed to load 'seq', failed to poll from model repository",
                             cursor) == "load 'seq': failed to load 'seq', failed to poll from model repository"
    cursor = explainer.start()
    with open(log, "a") as handle:
        handle.writelines(captured)
    explained = explainer.explain("syn", BARE, cursor)
    assert explained == (f"{BARE} (tritonserver log: Poll failed for model directory 'syn': failed to read "
                         "text proto from /tmp/cap/repo/syn/config.pbtxt)")
    assert explainer.explain("gpu0", GPU_ANSWER, cursor) == GPU_ANSWER  # Triton already said why


def test_without_a_log_the_repository_index_reason_is_used() -> None:
    explainer = LoadExplainer(None, lambda model: "Internal: failed to open text file for read labels.txt")
    assert explainer.explain("lbl", "load 'lbl': load failed", None) == (
        "load 'lbl': load failed (repository index: Internal: failed to open text file for read labels.txt)"
    )
    assert LoadExplainer(None, lambda model: "unloaded").explain("m", BARE, None) == BARE


def test_log_cursor_survives_a_truncated_log(tmp_path: Path) -> None:
    log = tmp_path / "log"
    log.write_text("x" * 1000)
    cursor = LogCursor(log)
    log.write_text("E1201 00:51:17.766544 1 f.cc:1] \"new\"\n")
    assert parse_lines(cursor.read_new())[0].message == "new"


# ------------------------------------------------------------------ capabilities


def config(**fields: object) -> dict[str, object]:
    return {"name": "m", "backend": "python", **fields}


def test_gpu_and_backend_checks_name_what_is_missing() -> None:
    cpu_only = Capabilities(URL, frozenset({"python"}), 0)
    gpu = {"instance_group": [{"kind": "KIND_CPU", "count": 2}, {"kind": "KIND_GPU", "count": 1, "gpus": [1]}]}
    with pytest.raises(HostCapabilityError) as caught:
        check(config(**gpu), cpu_only)
    assert str(caught.value) == f"instance_group[1] needs GPU 1; the tritonserver at {URL} has 0 GPUs"
    assert isinstance(caught.value, EnvironmentFault)
    with pytest.raises(HostCapabilityError, match=r"needs GPU 1; the tritonserver at .* has 1 GPU$"):
        check(config(**gpu), Capabilities(URL, None, 1))
    check(config(**gpu), Capabilities(URL, None, 2))
    with pytest.raises(HostCapabilityError, match=r"instance_group\[0\] needs a GPU \(KIND_GPU\); .* has 0 GPUs"):
        check(config(instance_group=[{"kind": "KIND_GPU"}]), cpu_only)
    check(config(instance_group=[{"kind": "KIND_GPU"}]), Capabilities(URL, None, None))  # unknown: Triton decides

    with pytest.raises(HostCapabilityError) as caught:
        check({"name": "m", "platform": "onnxruntime_onnx"}, cpu_only)
    assert str(caught.value).startswith("backend 'onnxruntime' is not installed in this tritonserver")
    check({"name": "e", "platform": "ensemble"}, cpu_only)
    check(config(backend="onnxruntime"), Capabilities(URL, None, 0))


def test_a_backend_shipped_in_the_model_directory_counts(tmp_path: Path) -> None:
    (tmp_path / "1").mkdir()
    (tmp_path / "1" / "libtriton_custom.so").write_bytes(b"")
    check(config(backend="custom"), Capabilities(URL, frozenset({"python"}), 0), tmp_path)


def env_config(path: str, **fields: object) -> dict[str, object]:
    return config(parameters={"EXECUTION_ENV_PATH": {"string_value": path}}, **fields)


def test_an_absolute_execution_env_path_is_checked_only_where_the_host_is_this_one(tmp_path: Path) -> None:
    launched, external = Capabilities(URL, None, None, host_files=True), Capabilities(URL, None, None)
    archive = tmp_path / "env.tar.gz"
    archive.write_bytes(b"")
    check(env_config(str(archive)), launched)
    check(env_config(str(tmp_path)), launched)  # an unpacked environment: Triton 2.51 loads it (differential)
    missing = str(tmp_path / "gone" / "env.tar.gz")
    with pytest.raises(HostCapabilityError) as caught:
        check(env_config(missing), launched)
    assert str(caught.value) == (f'config.pbtxt: parameters["EXECUTION_ENV_PATH"]: "{missing}" does not exist on '
                                 f"the host of the tritonserver at {URL}")
    assert isinstance(caught.value, EnvironmentFault)
    check(env_config(missing), external)  # its host's files are not visible from here: Triton decides
    check(env_config("$$TRITON_MODEL_DIRECTORY/env.tar.gz"), launched)  # inside the model: validated offline
    check(env_config(missing, backend="onnxruntime"), Capabilities(URL, None, None, host_files=True))  # python only


def test_triton_own_reasons_become_the_same_error() -> None:
    assert str(from_triton_reason(BACKEND_ANSWER, URL)) == (
        f"backend 'onnxruntime' is not installed in this tritonserver ({URL})"
    )
    assert str(from_triton_reason(GPU_ANSWER, URL)) == (
        f"instance_group gpu0_0 needs a GPU (KIND_GPU); the tritonserver at {URL} has 0 GPUs"
    )
    assert from_triton_reason(BARE, URL) is None


def test_gpu_count_from_triton_metrics() -> None:
    page = (
        '# TYPE nv_gpu_utilization gauge\n'
        'nv_gpu_utilization{gpu_uuid="GPU-aaaa"} 0.0\n'
        'nv_gpu_utilization{gpu_uuid="GPU-bbbb"} 0.5\n'
        'nv_gpu_memory_total_bytes{gpu_uuid="GPU-aaaa"} 1e9\n'
        'nv_inference_count{model="m",version="1"} 3\n'
    )
    assert gpus_from_metrics(page) == 2
    assert gpus_from_metrics('nv_cpu_utilization 0.1\nnv_inference_count{model="m",version="1"} 3\n') == 0


def test_local_gpus_are_counted_from_the_nvidia_driver(tmp_path: Path) -> None:
    proc, dev = tmp_path / "proc-gpus", tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "null"):
        (dev / name).touch()
    assert local_gpu_count(proc, dev) == 2  # no /proc/driver/nvidia: the device nodes
    proc.mkdir()
    (proc / "0000:3b:00.0").mkdir()
    assert local_gpu_count(proc, dev) == 1  # the driver's own list wins
    assert local_gpu_count(tmp_path / "none", tmp_path / "none") == 0


# ------------------------------------------------------------------ against the real server

BROKEN_CONFIG = 'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\ninput [ {{ name: "x" data_type: TYPE_FP32'
MODEL_PY = "class TritonPythonModel:\n    def execute(self, requests):\n        return []\n"


def write_model(repo: Path, name: str, config_text: str) -> Path:
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    (repo / name / "config.pbtxt").write_text(config_text)
    (repo / name / "1" / "model.py").write_text(MODEL_PY)
    return repo / name


def test_a_bare_load_failure_carries_the_reason_from_the_launched_server_log(triton: TritonServer) -> None:
    write_model(triton.model_repository, "host_broken", BROKEN_CONFIG.format(name="host_broken"))
    client = TritonClient(triton.grpc_url)
    try:
        host = host_for(client, triton, metrics_url=None, log_path=None)
        with pytest.raises(TritonError) as caught:
            host.load("host_broken", lambda: client.load("host_broken", 30))
        message = str(caught.value)
        assert "failed to poll from model repository (tritonserver log: Poll failed for model directory " \
               "'host_broken': failed to read text proto from" in message, message
    finally:
        client.close()


def test_the_launched_server_host_must_hold_an_absolute_execution_env_path(triton: TritonServer,
                                                                          tmp_path: Path) -> None:
    client = TritonClient(triton.grpc_url)
    try:
        launched = host_for(client, triton, metrics_url=None, log_path=None)
        missing = "/nonexistent/tritonctl-env.tar.gz"
        with pytest.raises(HostCapabilityError, match=r'^config\.pbtxt: parameters\["EXECUTION_ENV_PATH"\]: '
                           r'"/nonexistent/tritonctl-env\.tar\.gz" does not exist on the host of the tritonserver'):
            launched.check(env_config(missing))
        (tmp_path / "env.tar.gz").write_bytes(b"")
        launched.check(env_config(str(tmp_path / "env.tar.gz")))
        host_for(client, None, metrics_url=None, log_path=None).check(env_config(missing))  # external: not checkable
    finally:
        client.close()


def test_the_launched_server_lacks_onnxruntime_and_gpus(triton: TritonServer) -> None:
    client = TritonClient(triton.grpc_url)
    try:
        host = host_for(client, triton, metrics_url=None, log_path=None)
        caps = host.probe.capabilities()
        assert caps.backends is not None and "python" in caps.backends and "onnxruntime" not in caps.backends
        with pytest.raises(HostCapabilityError, match="^backend 'onnxruntime' is not installed in this tritonserver"):
            host.check(config(backend="onnxruntime"))
        if caps.gpus == 0:  # this machine (CI): Triton's own refusal is recognised too, after the load
            write_model(triton.model_repository, "host_gpu", BROKEN_CONFIG.format(name="host_gpu")
                        + " dims: [ 1 ] } ]\noutput [ { name: \"y\" data_type: TYPE_FP32 dims: [ 1 ] } ]\n"
                        "instance_group [ { kind: KIND_GPU } ]\n")
            blind = TritonHost(HostProbe(client.url), host.explainer)  # no pre-check: Triton answers
            with pytest.raises(HostCapabilityError, match="needs a GPU"):
                blind.load("host_gpu", lambda: client.load("host_gpu", 30))
    finally:
        client.close()
