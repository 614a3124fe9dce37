"""The launched tritonserver's ports: Triton's defaults, 0 for a free one, a taken one named with its holder."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from controlplane.errors import ConfigError, LauncherError
from controlplane.settings.config import Settings, load_settings
from controlplane.triton.ports import launch_ports, port_holder, unlike_requested


def test_defaults_are_tritons_own() -> None:
    settings = Settings()
    assert (settings.triton_grpc_port, settings.triton_http_port, settings.triton_metrics_port) == (8001, 8000, 8002)


def test_zero_picks_free_ports() -> None:
    grpc, http, metrics = launch_ports(Settings(triton_grpc_port=0, triton_http_port=0, triton_metrics_port=0))
    assert len({grpc, http, metrics}) == 3 and all(p > 0 for p in (grpc, http, metrics))


def test_a_taken_port_is_named_with_its_flag() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(LauncherError) as err:
            launch_ports(Settings(triton_grpc_port=0, triton_http_port=port, triton_metrics_port=0))
    assert str(err.value).startswith(f"port {port} (--triton-http-port) is taken on 127.0.0.1 by pid {os.getpid()} (")
    assert "\n" not in str(err.value)


def _ipv6() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::", 0))
        return True
    except OSError:
        return False


# [::] only where the machine has IPv6 (a skip would fail the suite under tests.tiers)
LISTEN_ON = [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET, "0.0.0.0")]
LISTEN_ON += [(socket.AF_INET6, "::")] if _ipv6() else []


@pytest.mark.parametrize("family,address", LISTEN_ON)
def test_the_holder_of_a_port_is_found_by_its_socket(family: int, address: str) -> None:
    """A listener on loopback, on every IPv4 address or on [::] (which takes IPv4 too) is found with the
    pid and command line of the process that has it open: here, this test's own process."""
    with socket.socket(family, socket.SOCK_STREAM) as taken:
        taken.bind((address, 0))
        taken.listen()
        holder = port_holder(taken.getsockname()[1])
    assert holder is not None and holder.pid == os.getpid()
    assert holder.command.split()[0] == Path(f"/proc/{os.getpid()}/cmdline").read_bytes().split(b"\0")[0].decode()


def test_a_port_nobody_holds_has_no_holder() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert port_holder(port) is None


def test_ports_an_adopted_server_does_not_use_are_named() -> None:
    settings = Settings(triton_grpc_port=9001, triton_http_port=0, triton_metrics_port=8002)
    assert unlike_requested(settings, (8001, 8000, 8002)) == ["--triton-grpc-port 9001 (serves on 8001)"]
    assert unlike_requested(settings, (9001, 41234, 8002)) == []


def test_config_keys_and_flags() -> None:
    settings = load_settings({"triton_grpc_port": "9001"}, env={"TRITONCTL_TRITON_HTTP_PORT": "0"})
    assert (settings.triton_grpc_port, settings.triton_http_port) == (9001, 0)
    with pytest.raises(ConfigError, match="triton_metrics_port"):
        load_settings({"triton_metrics_port": "70000"}, env={})


def test_zero_never_picks_the_same_port_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel may hand the same free port to two binds in a row; tritonserver then refuses to start
    ("cannot listen to GRPC requests and metrics requests at the same address and port")."""
    from controlplane.triton import launcher

    offered = iter([40001, 40001, 40001, 40002, 40003])

    class KernelSocket:
        """What the kernel answers to bind(port 0): the next port of `offered` (a stand-in: a real kernel
        repeats a port only now and then, and this test needs it to every time)."""

        def __init__(self, *_: object) -> None:
            self.port = 0

        def __enter__(self) -> KernelSocket:
            return self

        def __exit__(self, *_: object) -> None:
            pass

        def bind(self, _address: tuple[str, int]) -> None:
            self.port = next(offered)

        def getsockname(self) -> tuple[str, int]:
            return ("127.0.0.1", self.port)

    monkeypatch.setattr(launcher.socket, "socket", KernelSocket)
    settings = Settings(triton_grpc_port=0, triton_http_port=0, triton_metrics_port=0)
    assert launch_ports(settings) == (40001, 40002, 40003)
