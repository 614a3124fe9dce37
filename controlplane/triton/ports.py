"""The launched tritonserver's ports: which ones to use, and who holds one that is taken.

The daemon asks only after it has tried to adopt the tritonserver its state directory records
(launcher.TritonServer.adopt): a port that server holds is its own, not a conflict. Any other holder
stops the start-up before tritonserver would fail on the port, with one line that names the holder's
pid and command. The holder is found from the kernel's socket tables: /proc/net/tcp and tcp6 give
the inode of the socket bound to the port, /proc/<pid>/fd the process that has it open. A process
of another user (or outside this pid namespace) cannot be looked into; the line then says so.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from controlplane.errors import LauncherError
from controlplane.settings.config import Settings
from controlplane.triton import launcher

HOST = "127.0.0.1"  # where the launched tritonserver listens
PORT_FLAGS = ("--triton-grpc-port", "--triton-http-port", "--triton-metrics-port")
_LISTEN = "0A"  # socket states as /proc/net/tcp prints them (include/net/tcp_states.h)
_TIME_WAIT = "06"
_COMMAND_CHARS = 160
_PROC = Path("/proc")


@dataclass(frozen=True)
class PortHolder:
    """A process with a socket bound to the port."""

    pid: int
    command: str


def _address(hex_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address as /proc/net/tcp{,6} prints it: 32-bit words in host byte order, in hex."""
    raw = bytes.fromhex(hex_address)
    if sys.byteorder == "little":
        raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(raw)


def _conflicts_with_loopback(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether a socket on `address` keeps tritonserver from binding 127.0.0.1 on the same port."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.is_unspecified:
            return True  # [::] takes IPv4 too unless IPV6_V6ONLY, which /proc does not show
        mapped = address.ipv4_mapped
        if mapped is None:
            return False
        address = mapped
    return address.is_unspecified or str(address) == HOST


def _socket_inodes(port: int) -> list[str]:
    """Inodes of the sockets bound to `port`, the likeliest holder first: listeners on 127.0.0.1,
    0.0.0.0 or [::], then other listeners, then bound sockets that do not listen."""
    ranked: list[tuple[int, str]] = []
    for table in ("tcp", "tcp6"):
        try:
            lines = (_PROC / "net" / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10:
                continue
            address, _, hex_port = fields[1].partition(":")
            state, inode = fields[3], fields[9]
            if int(hex_port, 16) != port or inode == "0" or state == _TIME_WAIT:
                continue
            listening = state == _LISTEN
            rank = 0 if listening and _conflicts_with_loopback(_address(address)) else 1 if listening else 2
            ranked.append((rank, inode))
    return [inode for _, inode in sorted(ranked)]


def _command(pid: int) -> str:
    try:
        argv = (_PROC / str(pid) / "cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        command = " ".join(arg.decode(errors="replace") for arg in argv).strip()
        if not command:  # a kernel thread, or a process that cleared its arguments
            command = "[" + (_PROC / str(pid) / "comm").read_text().strip() + "]"
    except OSError:
        return "?"
    command = "".join(ch if ch.isprintable() else " " for ch in command)  # one line, whatever argv holds
    return command if len(command) <= _COMMAND_CHARS else command[: _COMMAND_CHARS - 3] + "..."


def port_holder(port: int) -> PortHolder | None:
    """The process whose socket holds TCP `port`, or None when no visible process has it open."""
    inodes = _socket_inodes(port)
    if not inodes:
        return None
    wanted = {f"socket:[{inode}]": rank for rank, inode in enumerate(inodes)}
    best: tuple[int, int] | None = None  # (rank of its socket, pid)
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fds = os.listdir(entry / "fd")
        except OSError:  # another user's process, or gone
            continue
        for fd in fds:
            try:
                rank = wanted.get(os.readlink(entry / "fd" / fd))
            except OSError:
                continue
            if rank is not None and (best is None or (rank, int(entry.name)) < best):
                best = (rank, int(entry.name))
    return None if best is None else PortHolder(best[1], _command(best[1]))


def taken_message(port: int, flag: str) -> str:
    """One line: which port is taken, by whom (pid and command) if that can be seen, what to do."""
    holder = port_holder(port)
    by = (f"by pid {holder.pid} ({holder.command})" if holder is not None
          else "by a process this user cannot see (another user's, or outside this pid namespace)")
    return f"port {port} ({flag}) is taken on {HOST} {by}: stop it, choose another port, or 0 for a free one"


def requested_ports(settings: Settings) -> tuple[int, int, int]:
    """The (gRPC, HTTP, metrics) ports the settings ask for the launched tritonserver; 0 means any free one.
    With the gateway the clients' ports are the gateway's, and tritonserver takes free loopback ones."""
    if settings.launch_triton and settings.routes_traffic:
        return 0, 0, 0
    return settings.triton_grpc_port, settings.triton_http_port, settings.triton_metrics_port


def gateway_ports(settings: Settings) -> tuple[int, int, int]:
    """The (gRPC, HTTP, metrics) ports a launched tritonserver's gateway takes: the clients' ports."""
    return settings.triton_grpc_port, settings.triton_http_port, settings.triton_metrics_port


def check_port_free(port: int, flag: str) -> None:
    """Raise LauncherError naming the holder when tritonserver could not bind `port` on loopback now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as tritonserver binds
        try:
            probe.bind((HOST, port))
        except OSError:
            raise LauncherError(taken_message(port, flag)) from None


def launch_ports(settings: Settings) -> tuple[int, int, int]:
    """The (gRPC, HTTP, metrics) ports to launch tritonserver on: 0 becomes a free one; a port that
    is taken is refused here, naming its holder, instead of as a tritonserver that never comes up."""
    chosen: list[int] = []
    for flag, port in zip(PORT_FLAGS, requested_ports(settings), strict=True):
        if port == 0:
            # never one already chosen: tritonserver refuses two protocols on one port
            chosen.append(launcher.free_port(besides=tuple(chosen)))
            continue
        check_port_free(port, flag)
        chosen.append(port)
    return chosen[0], chosen[1], chosen[2]


def unlike_requested(settings: Settings, serving: tuple[int, int, int | None]) -> list[str]:
    """The requested ports (not 0) that an adopted tritonserver does not use, as `FLAG N (serves on M)`."""
    return [f"{flag} {want} (serves on {have})"
            for flag, want, have in zip(PORT_FLAGS, requested_ports(settings), serving, strict=True)
            if want != 0 and want != have]
