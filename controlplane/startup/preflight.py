"""The daemon's arguments checked before it creates or starts anything.

A bad repository, port, file or flag stops `tritonctl daemon` with one line naming it (a ConfigError:
exit 2) before the state directory, its registry or a tritonserver exist: the user fixes the
command and runs it again with nothing to clean up. Only what can be known without side effects is
checked here; the start itself still refuses what it meets later (an s3:// bucket it cannot list is a
logged line, as before: the credentials may be fixed while it runs).
"""

from __future__ import annotations

import fcntl
import os
import socket
from pathlib import Path

from controlplane.api.protocol import read_token
from controlplane.api.server import insecure_listen_refusal, parse_listen, socket_group_id
from controlplane.errors import ConfigError, LauncherError, StateDirInUseError
from controlplane.gateway import launcher as gateway_launcher
from controlplane.settings.config import Settings
from controlplane.source.local import check_repository
from controlplane.startup import gateway
from controlplane.triton import launcher
from controlplane.triton.ports import HOST, PORT_FLAGS, check_port_free, gateway_ports, requested_ports

LOCK_FILE = "daemon.lock"


def in_use_error(state_dir: Path, holder: str) -> StateDirInUseError:
    return StateDirInUseError(f"state directory {state_dir} is in use by another tritonctl daemon (pid {holder}): "
                              "stop it, or give another --state-dir")


def check(settings: Settings) -> None:
    """Raise the first problem of the settings, as one line; create nothing."""
    check_repository(settings)  # a directory source's own check (source/local.py)
    if not settings.triton_url and not settings.launch_triton:
        raise ConfigError("no tritonserver: give --triton-url HOST:PORT or --launch-triton")
    gateway.check_settings(settings)
    _check_state_dir(settings.state_dir)
    _check_files(settings)
    _check_ports(settings)


def _check_state_dir(state: Path) -> None:
    if state.exists():
        if not state.is_dir():
            raise ConfigError(f"state_dir {state}: not a directory")
        if not os.access(state, os.W_OK | os.X_OK):
            raise ConfigError(f"state_dir {state}: cannot write to it (permission denied)")
        holder = _lock_holder(state / LOCK_FILE)
        if holder is not None:
            raise in_use_error(state, holder)
        return
    parent = state.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"state_dir {state}: cannot create it ({parent} is not a writable directory)")


def _lock_holder(path: Path) -> str | None:
    """The pid in a state directory's lock file while another daemon holds it; None when it is free
    (the lock file is opened, never created)."""
    try:
        handle = os.fdopen(os.open(path, os.O_RDWR | os.O_CLOEXEC), "r+")
    except OSError:
        return None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return handle.read().strip() or "?"
        fcntl.flock(handle, fcntl.LOCK_UN)
    return None


def _check_files(settings: Settings) -> None:
    if settings.launch_triton:
        try:
            launcher.find_tritonserver(settings.tritonserver)
        except LauncherError as exc:
            raise ConfigError(str(exc)) from None
    for key, path in (("tls_cert", settings.tls_cert), ("tls_key", settings.tls_key)):
        if path is not None and not os.access(path, os.R_OK):
            raise ConfigError(f"{key} {path}: cannot read it (missing or permission denied)")
    if settings.token_file is not None and (settings.listen or settings.web_address):
        read_token(settings.token_file, private=True)
    tls = bool(settings.tls_cert and settings.tls_key)
    for key, address in (("listen", settings.listen), ("web_address", settings.web_address)):
        if address:
            host, _port = parse_listen(address)
            refusal = insecure_listen_refusal(key, address, host, tls, settings.allow_insecure_http)
            if refusal is not None:
                raise refusal
    if settings.socket_group:
        socket_group_id(settings.socket_group)  # an unknown group stops the start here


def _check_ports(settings: Settings) -> None:
    """The ports this start binds, free now. A launched tritonserver's record (a crash or keep_triton left
    it serving) means the start adopts it, ports and all: those are not checked."""
    if settings.launch_triton and settings.routes_traffic and not (
            settings.state_dir / "gateway" / gateway_launcher.RECORD_FILE).exists():
        for flag, port in zip(PORT_FLAGS, gateway_ports(settings), strict=True):  # the gateway's, now
            if port:
                try:
                    check_port_free(port, flag)
                except LauncherError as exc:
                    raise ConfigError(str(exc)) from None
    if settings.launch_triton and not (settings.state_dir / "triton" / launcher.RECORD_FILE).exists():
        for flag, port in zip(PORT_FLAGS, requested_ports(settings), strict=True):
            if port:
                try:
                    check_port_free(port, flag)
                except LauncherError as exc:
                    raise ConfigError(str(exc)) from None
    if settings.metrics_port:  # the same lines the servers would write when they bind
        _check_bind(HOST, settings.metrics_port, f"metrics_port: cannot listen on {HOST}:{settings.metrics_port}")
    for key, address in (("listen", settings.listen), ("web_address", settings.web_address)):
        if address:
            host, port = parse_listen(address)
            _check_bind(host, port, f"{key}: cannot bind {address}")


def _check_bind(host: str, port: int, refusal: str) -> None:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise ConfigError(f"{refusal}: {exc.strerror or exc}") from None
