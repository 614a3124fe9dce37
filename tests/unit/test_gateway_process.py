"""The daemon's side of the gateway process (controlplane/startup/gateway.py), against real gateway processes
(`python -m controlplane.gateway`) in front of a tritonserver address nothing answers (the control channel
needs none):

- a gateway that died is started again by supervision on the ports it had, the ones its clients use, even
  where the settings left the port to it (0);
- a gateway something else runs (`gateway_control_socket`: its own container in deploy/kubernetes) is used
  through its control socket and never started, restarted or stopped by the daemon;
- the gateway settings that do not go together are refused in one line, before anything starts.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from controlplane.errors import ConfigError, GatewayError
from controlplane.gateway.launcher import GatewayProcess, free_port
from controlplane.settings.config import load_settings
from controlplane.startup import gateway, preflight
from tests.harness import wait_for


def a_gateway(workdir: Path) -> GatewayProcess:
    dead = f"127.0.0.1:{free_port()}"
    return GatewayProcess(workdir, dead, dead, grpc_address="127.0.0.1:0", http_address="127.0.0.1:0",
                          metrics_address="127.0.0.1:0", drain_s=1.0)


def test_a_gateway_started_again_keeps_its_ports(tmp_path: Path) -> None:
    process = a_gateway(tmp_path / "gw").start()
    try:
        ports, pid = dict(process.ports), process.pid
        assert not gateway.restarted(process)  # running: nothing to do
        process.kill()
        assert gateway.restarted(process)
        assert process.pid != pid and process.ports == ports
        assert process.grpc_address == "127.0.0.1:0", "the settings' addresses are left as they were"
        record = process.read_record() or {}
        assert f"127.0.0.1:{ports['grpc']}" in record["command"]
    finally:
        process.stop(5.0)


def test_a_gateway_whose_ports_were_taken_starts_on_free_ones(tmp_path: Path) -> None:
    process = a_gateway(tmp_path / "gw").start()
    holder = socket.socket()
    try:
        ports = dict(process.ports)
        process.kill()
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as a server binds (past TIME_WAIT)
        # someone took its gRPC port meanwhile: once the killed gateway's threads have all exited (its
        # leader shows as a zombie before its last thread has closed the listening socket)
        wait_for(lambda: _binds(holder, ports["grpc"]), 10, 0.02, "the killed gateway's port free")
        holder.listen()
        assert gateway.restarted(process)
        assert process.ports["grpc"] != ports["grpc"] and process.is_running()
    finally:
        holder.close()
        process.stop(5.0)


def _binds(sock: socket.socket, port: int) -> bool:
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        return False
    return True


def settings_for(tmp_path: Path, **file: str) -> object:
    lines = "".join(f'{key} = "{value}"\n' for key, value in file.items())
    config = tmp_path / "tritonctl.toml"
    (tmp_path / "repo").mkdir(exist_ok=True)
    config.write_text(f'state_dir = "{tmp_path / "state"}"\nrepository = "{tmp_path / "repo"}"\n' + lines)
    return load_settings({}, {}, config)


def test_a_gateway_run_by_something_else_is_used_never_started_or_stopped(tmp_path: Path) -> None:
    ours = a_gateway(tmp_path / "theirs").start()  # as its own container would run it
    try:
        settings = settings_for(tmp_path, triton_url="127.0.0.1:1", gateway_control_socket=str(ours.control_socket))
        assert settings.routes_traffic  # type: ignore[attr-defined]
        process = gateway.gateway_process(settings, None)  # type: ignore[arg-type]
        assert isinstance(process, gateway.ExternalGateway)
        assert gateway.adopt_or_start(process) is process
        assert process.pid == ours.pid and process.ports == ours.ports
        assert gateway.GatewayPort(process).routes() == {}
        process.stop()
        assert ours.is_running(), "the daemon does not stop a gateway it does not run"
        ours.kill()
        assert not gateway.restarted(process), "nor start one: its own supervisor does"
        assert not (tmp_path / "state" / "gateway" / "gateway.json").exists()
        with pytest.raises(GatewayError, match="no gateway answers on"):
            process.start(timeout_s=0.5)
    finally:
        ours.stop(5.0)


@pytest.mark.parametrize(("file", "refusal"), [
    ({"launch_triton": "true", "gateway_control_socket": "/run/gw.sock"}, "gateway_control_socket: a gateway run by"),
    ({"triton_url": "127.0.0.1:8001", "gateway_control_socket": "/run/gw.sock",
      "gateway_grpc_address": "127.0.0.1:9001"}, "gateway_control_socket: a gateway run by"),
    ({"triton_url": "127.0.0.1:8001", "gateway_http_address": "127.0.0.1:9000"},
     "gateway_http_address: the gateway's HTTP side needs"),
])
def test_gateway_settings_that_do_not_go_together_are_refused_before_the_start(
        tmp_path: Path, file: dict[str, str], refusal: str) -> None:
    text = "".join(f"{k} = {v}\n" if v == "true" else f'{k} = "{v}"\n' for k, v in file.items())
    config = tmp_path / "tritonctl.toml"
    (tmp_path / "repo").mkdir()
    config.write_text(f'state_dir = "{tmp_path / "state"}"\nrepository = "{tmp_path / "repo"}"\n' + text)
    settings = load_settings({}, {}, config)
    with pytest.raises(ConfigError, match=refusal):
        preflight.check(settings)
    assert not (tmp_path / "state").exists(), "refused before anything was created"
