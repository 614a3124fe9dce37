"""The control API's listeners: uvicorn on the Unix socket (mode 0660, group `socket_group`) and, with --listen,
on TCP with a token.

The sockets are bound here, not by uvicorn: the Unix socket is born 0600 under a restrictive umask, given
to `socket_group` when set, then made 0660 (no window with wider permissions; uvicorn's own `uds=`
chmods 0666), and a TCP bind failure is a ConfigError instead of uvicorn's exit. Each listener runs one
uvicorn server in a thread of its own, its connections capped (controlplane/api/connections.py).

Who acts (controlplane/api/access.py): on the socket, the peer's uid and groups read with SO_PEERCRED and
SO_PEERGROUPS when the connection is made (the kernel's word, not the client's), its role from its groups
(`socket_roles`; default: the socket file's group deployer, root and the daemon's user admin); on TCP, the
bearer: a personal token, the shared token of `token_file` (`token:default`, admin) or an OIDC JWT. A TCP
listener on a non-loopback address serves TLS (`tls_cert`, `tls_key`) or is refused unless
`allow_insecure_http` says plain HTTP is meant.
"""

from __future__ import annotations

import grp
import logging
import os
import socket
import threading
import time
from collections.abc import Awaitable, Callable, MutableMapping
from concurrent import futures
from typing import Any

import uvicorn
from fastapi import APIRouter

from controlplane import errors
from controlplane.api.access import PEER_SCOPE_KEY, AccessGate, Authenticator, SocketRoles, peer_groups
from controlplane.api.app import build_app
from controlplane.api.connections import (
    ConnectionTable,
    GuardedH11Protocol,
    GuardedListener,
    guarded_protocol,
    quiet_exception_handler,
)
from controlplane.api.health import health_routes
from controlplane.api.hooks import webhook_routes
from controlplane.api.oidc import verifier_from
from controlplane.api.protocol import read_token
from controlplane.api.quietloop import QuietServer
from controlplane.api.stream import EventHub, events_routes
from controlplane.api.tokenroutes import token_routes
from controlplane.api.tokens import TokenBook
from controlplane.api.web.gate import is_loopback
from controlplane.control_plane import ControlPlane
from controlplane.settings.config import Settings

log = logging.getLogger("tritonctl.api")

SOCKET_MODE = 0o660
Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]


class PeerCredentialsProtocol(GuardedH11Protocol):
    """uvicorn's h11 protocol (its connections counted, controlplane/api/connections.py) that reads the peer's
    uid and groups once per connection and hands them to the app."""

    def connection_made(self, transport: Any) -> None:  # type: ignore[override]
        super().connection_made(transport)
        peer, app = peer_groups(transport.get_extra_info("socket")), self.app

        async def with_peer(scope: Scope, receive: Any, send: Any) -> None:
            scope[PEER_SCOPE_KEY] = peer
            await app(scope, receive, send)

        self.app = with_peer  # type: ignore[assignment]


def socket_group_id(group: str) -> int:
    """The gid of `socket_group` (a name, or a number); ConfigError when there is no such group."""
    if group.isdigit():
        return int(group)
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise errors.ConfigError(f"socket_group: no group named {group}") from None


def parse_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise errors.ConfigError(f"listen: '{listen}' is not HOST:PORT")
    return host.strip("[]") or "0.0.0.0", int(port)


def insecure_listen_refusal(key: str, listen: str, host: str, tls: bool, allow_insecure_http: bool
                            ) -> errors.ConfigError | None:
    """The error for plain HTTP on a non-loopback address without --allow-insecure-http; None when allowed."""
    if tls or is_loopback(host) or allow_insecure_http:
        return None
    return errors.ConfigError(f"{key}: {listen} is not a loopback address: give tls_cert and tls_key "
                              "(--tls-cert, --tls-key), or allow plain HTTP with --allow-insecure-http")


class _Listener:
    """One uvicorn server on one bound socket, run in a thread; its connections capped and closed when they
    send no whole request in time (controlplane/api/connections.py)."""

    def __init__(self, app: Any, sock: socket.socket, name: str,
                 protocol: type[GuardedH11Protocol] = GuardedH11Protocol, **config: Any) -> None:
        self.table = ConnectionTable(name)
        self.sock = GuardedListener.wrap(sock, self.table)
        # loop="asyncio": the cap is the guarded socket's `accept`, which only asyncio's own loop calls (uvloop,
        # installed for the gateway and uvicorn's "auto" choice, accepts on the descriptor and bypasses it)
        self.server = QuietServer(uvicorn.Config(app, lifespan="off", log_config=None, log_level="warning",
                                                    access_log=False, timeout_graceful_shutdown=1, backlog=128,
                                                    loop="asyncio", http=guarded_protocol(protocol, self.table),
                                                    **config))
        self.server.housekeeping = self.table.sweep
        self.server.exception_handler = quiet_exception_handler(name)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, name=name,
                                       daemon=True)

    def start(self, timeout_s: float = 10.0) -> None:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise errors.ConfigError(f"control API: the listener {self.thread.name} did not start")
            time.sleep(0.005)

    def stop(self, grace_s: float) -> None:
        self.server.stop()
        self.thread.join(grace_s + 1)
        if self.thread.is_alive():
            self.server.force_exit = True
            self.thread.join(1)
        self.sock.close()


def token_registry(plane: ControlPlane) -> Any:
    """Where tokens live: a fleet's shared registry (they work on every host), else this daemon's; None for a
    plane without one (a test's stand-in: personal tokens are then unknown)."""
    fleet = getattr(plane, "fleet", None)
    return getattr(fleet, "registry", None) if fleet is not None else getattr(plane, "registry", None)


class ApiServer:
    """The Unix-socket listener and, with --listen, the TCP one, serving one app behind the access gate."""

    def __init__(self, plane: ControlPlane, executor: futures.Executor, settings: Settings,
                 routers: tuple[APIRouter, ...] = (), loop_age_s: Callable[[], float | None] = lambda: None) -> None:
        """`loop_age_s`: seconds since the daemon's main loop last turned (/v1/live); `routers`: more routes."""
        self.plane = plane
        self.executor = executor
        self.settings = settings
        self.hub = EventHub(plane)
        registry = token_registry(plane)
        # a token revoked on another host of a fleet is refused here within liveness_s
        self.tokens = TokenBook(registry, ttl_s=settings.liveness_s / 2) if registry is not None else None
        self.app = build_app(plane, executor, health_routes(plane, loop_age_s), webhook_routes(plane),
                             events_routes(plane, self.hub), token_routes(self.tokens), *routers)
        self.listeners: list[_Listener] = []
        self._authenticator: Authenticator | None = None

    def authenticator(self) -> Authenticator:
        """Personal tokens, the shared token of token_file, OIDC: read once, at the first listener that needs it."""
        if self._authenticator is None:
            shared = read_token(self.settings.token_file, private=True) if self.settings.token_file else None
            self._authenticator = Authenticator(self.tokens, shared, verifier_from(self.settings))
        return self._authenticator

    def _unix_socket(self) -> socket.socket:
        path = self.settings.socket_path
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() or path.is_symlink():
            path.unlink()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)  # born 0600: no window in which the wrong group may connect
        try:
            sock.bind(str(path))
        finally:
            os.umask(old_umask)
        if self.settings.socket_group:  # its own group (issue 58): not the one tritonserver reads serving/ with
            gid = socket_group_id(self.settings.socket_group)
            try:
                os.chown(path, -1, gid)
            except OSError as exc:
                sock.close()
                raise errors.ConfigError(
                    f"socket_group: cannot give the control socket to group {self.settings.socket_group} "
                    f"({exc.strerror}): the daemon's user must be a member of it (systemd: SupplementaryGroups=)"
                ) from None
        os.chmod(path, SOCKET_MODE)
        sock.listen(128)
        return sock

    def _tcp_socket(self, listen: str, key: str = "listen") -> socket.socket:
        """`key`: the setting that named the address (listen, web_address), for the error."""
        host, port = parse_listen(listen)
        tls = bool(self.settings.tls_cert and self.settings.tls_key)
        if bool(self.settings.tls_cert) != bool(self.settings.tls_key):
            raise errors.ConfigError("tls_cert and tls_key: give both (TLS on the TCP listener) or neither")
        refusal = insecure_listen_refusal(key, listen, host, tls, self.settings.allow_insecure_http)
        if refusal is not None:
            raise refusal
        try:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            return socket.create_server((host, port), family=family, backlog=128)
        except OSError as exc:
            raise errors.ConfigError(f"{key}: cannot bind {listen}: {exc.strerror}") from None

    def _tls(self) -> dict[str, Any]:
        if self.settings.tls_cert and self.settings.tls_key:
            return {"ssl_certfile": str(self.settings.tls_cert), "ssl_keyfile": str(self.settings.tls_key)}
        return {}

    def _start_web(self, address: str) -> None:
        """The read-only web view (controlplane/api/web) on a listener of its own: no login on a loopback
        address, the daemon's token elsewhere (or with web_require_token)."""
        from controlplane.api.web.gate import HostCheck
        from controlplane.api.web.pages import build_web_app

        host, _port = parse_listen(address)
        login = self.authenticator() if self.settings.web_require_token or not is_loopback(host) else None
        if login is not None and login.book is None and login.shared_token is None and login.oidc is None:
            raise errors.ConfigError(f"web_address: {address} needs a login: personal tokens (the registry), "
                                     "token_file (--token-file) or OIDC (oidc_issuer, oidc_audience, oidc_jwks)")
        sock = self._tcp_socket(address, "web_address")
        tls = self._tls()
        app = build_web_app(self.plane, login, secure=bool(tls), events=events_routes(self.plane, self.hub))
        # only the Host names of its own address (and web_host_names): no DNS rebinding (421 before any page)
        web = _Listener(HostCheck(app, host, self.settings.web_host_names), sock, "web", **tls)
        web.start()
        self.listeners.append(web)
        bound_host, bound_port = web.sock.getsockname()[:2]
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        log.info("web view: %s://%s:%d/ui/%s", "https" if tls else "http", shown, bound_port,
                 "" if login is None else " (log in with a token)")

    def start(self) -> None:
        unix_sock = self._unix_socket()
        roles = SocketRoles(self.settings.socket_roles, os.stat(self.settings.socket_path).st_gid)
        unix = _Listener(AccessGate(self.app, socket_roles=roles), unix_sock, "api-unix",
                         protocol=PeerCredentialsProtocol)
        unix.start()
        self.listeners.append(unix)
        if self.settings.listen:
            authenticator = self.authenticator()
            sock = self._tcp_socket(self.settings.listen)
            tcp = _Listener(AccessGate(self.app, authenticator), sock, "api-tcp", **self._tls())
            tcp.start()
            self.listeners.append(tcp)
        if self.settings.web_address:
            self._start_web(self.settings.web_address)

    def stop(self, grace_s: float = 1.0) -> None:
        self.hub.close()  # event streams end; their followers resume with Last-Event-ID
        for listener in self.listeners:
            listener.stop(grace_s)
        self.listeners.clear()
        try:
            self.settings.socket_path.unlink()
        except FileNotFoundError:
            pass
