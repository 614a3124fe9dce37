"""Leader election: a PostgreSQL session advisory lock held on a dedicated connection.

Exactly one daemon holds `pg_try_advisory_lock(LEADER_LOCK)`. The others try again every interval.
When the leader dies its connection dies and PostgreSQL releases the lock, so another daemon takes it
within an interval (plus the TCP keepalive time when the leader's machine vanishes without a reset).
The leader checks its connection every interval and steps down at once when it is lost.

The same connection holds this host's session lock `pg_try_advisory_lock(HOST_LOCK_CLASS, crc32(host))`
for as long as the daemon lives: the moment its session ends (the process dies, the kernel closes the
socket) PostgreSQL drops the lock, and `FleetStore.live_hosts` counts the host dead at once instead of
waiting for its heartbeat to age. A machine that vanishes without closing its connection is bounded
by TCP keepalive (`keepalives_idle` 5 s + 3 × `keepalives_interval` 2 s on the daemon's side; the
server's `tcp_keepalives_*` settings on PostgreSQL's) and, at worst, by the heartbeat age.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from controlplane.store.fleet import (  # connect, take_host_lock: imported from here by tests
    APPLICATION_PREFIX,
    check_session,
    connect,
    take_host_lock,
    try_leader_lock,
)
from controlplane.store.health import RegistryHealth

__all__ = ["APPLICATION_PREFIX", "LeaderElection", "connect", "take_host_lock"]

log = logging.getLogger("tritonctl.fleet.election")

# The lock keys live with the fleet's tables (controlplane.store.fleet reads pg_locks for them).


class LeaderElection:
    """Runs in its own thread; `is_leader` says whether this daemon holds the lock right now."""

    def __init__(self, url: str, host: str, on_change: Callable[[bool], None], interval_s: float = 1.0,
                 health: RegistryHealth | None = None) -> None:
        self.url = url
        self.health = health  # the shared registry's: this connection's failures and answers count there too
        self.host = host
        self.on_change = on_change
        self.interval_s = interval_s
        self._leader = threading.Event()
        self._stop = threading.Event()
        self._conn: Any = None
        self._host_locked = False
        self._thread = threading.Thread(target=self._run, name="fleet-election", daemon=True)

    @property
    def is_leader(self) -> bool:
        return self._leader.is_set()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._drop()

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        self._host_locked = False
        if conn is not None:
            try:
                conn.close()  # closing the session releases the lock
            except Exception:  # noqa: BLE001 - it is gone either way
                pass
        if self._leader.is_set():
            self._leader.clear()
            log.warning("%s is no longer the fleet leader", self.host)
            self.on_change(False)

    def _tick(self) -> None:
        if self._conn is None:
            self._conn = connect(self.url, APPLICATION_PREFIX + self.host)
        if not self._host_locked:
            self._host_locked = take_host_lock(self._conn, self.host)
            if not self._host_locked:
                log.error("host %s: another live daemon holds this host name; liveness goes by heartbeat only",
                          self.host)
        if self._leader.is_set():
            check_session(self._conn)  # raises when the session (and so the lock) is gone
            return
        if try_leader_lock(self._conn):
            self._leader.set()
            log.info("%s is now the fleet leader", self.host)
            self.on_change(True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._tick()
                if self.health is not None:
                    self.health.answered()
            except Exception as exc:  # noqa: BLE001 - any database trouble: step down, reconnect later
                reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                if self.health is not None:
                    self.health.failed(reason)  # tells the outage (once, then at most once a minute)
                else:
                    log.warning("leader election: %s", reason)
                self._drop()
            self._stop.wait(self.interval_s)
