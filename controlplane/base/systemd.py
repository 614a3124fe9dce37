"""sd_notify over $NOTIFY_SOCKET with the standard library: READY, STATUS, WATCHDOG, RELOADING, STOPPING.

A no-op outside systemd, and it never raises: a failure to notify must not take the daemon down.
"""

from __future__ import annotations

import os
import socket
import time


def _address() -> str | None:
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return None
    if address.startswith("@"):  # abstract namespace
        return "\0" + address[1:]
    return address


def notify(*lines: str) -> bool:
    """Send `KEY=VALUE` lines to systemd; returns whether anything was sent."""
    address = _address()
    if address is None:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            sock.sendall("\n".join(lines).encode("utf-8", "replace"))
        return True
    except OSError:
        return False


def ready(status: str = "") -> bool:
    return notify("READY=1", *([f"STATUS={' '.join(status.split())}"] if status else []))


def status(text: str) -> bool:
    return notify(f"STATUS={' '.join(text.split())}")


def reloading() -> bool:
    monotonic_us = int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1_000_000)
    return notify("RELOADING=1", f"MONOTONIC_USEC={monotonic_us}")


def stopping() -> bool:
    return notify("STOPPING=1")


def watchdog_ping() -> bool:
    return notify("WATCHDOG=1")


def watchdog_interval_s() -> float | None:
    """Half of WATCHDOG_USEC when systemd set it for this process, else None."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    try:
        value = int(usec)
    except ValueError:
        return None
    return max(0.05, value / 1_000_000 / 2) if value > 0 else None
