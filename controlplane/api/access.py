"""Who is calling, and may they: the identity of every control API request and the role its route needs.

Identities (docs/operations.md "Identities and roles"):
- on the Unix socket, the peer's uid and groups as the kernel reports them when the connection is made
  (SO_PEERCRED, SO_PEERGROUPS; controlplane/api/server.py reads them): `uid:1000(alice)`, its role from
  its groups through `socket_roles` (`SocketRoles`; root and the daemon's own user are admin);
- on TCP (and the web view), `authorization: Bearer`: a personal token (`token:alice`,
  controlplane/api/tokens.py), the shared token of `token_file` (`token:default`, admin) or an OIDC JWT
  (`oidc:alice@example.com`, controlplane/api/oidc.py). None, or a wrong, expired or revoked one: 401.

Roles: every route declares the role it needs in its OpenAPI operation (`x-tritonctl-role`, `needs()`), and
`AccessGate` compares it with the caller's before the app runs: short of it, 403 with one line naming the
role needed and the caller's. A route that declares none is refused at build time (`check_roles`).

Wrong bearers are throttled per client address and per token id (the web login's `LoginThrottle`): after
5 free failures, 429 and a wait that doubles; a bearer whose check costs nothing (the shared token, a
personal token checked lately) is not held up by someone else's guesses. The actor a route audits is the
identity, always (`actor_of`); what the caller declares in `x-tritonctl-actor` is kept beside it as
`claimed` when it differs.
"""

from __future__ import annotations

import asyncio
import grp
import hmac
import json
import os
import pwd
import time
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from math import ceil
from typing import Any

from starlette.routing import Match

from controlplane import errors
from controlplane.api.oidc import OidcVerifier
from controlplane.api.protocol import ACTOR_HEADER, TOKEN_HEADER, error_document
from controlplane.api.tokens import SHARED_NAME, CredentialEnded, Identity, TokenBook, looks_like_token
from controlplane.api.web.gate import LoginThrottle
from controlplane.store.records import Actor
from controlplane.vocab import Role

IDENTITY_SCOPE_KEY = "tritonctl.identity"
PEER_SCOPE_KEY = "tritonctl.peer"  # (uid, gids) of a socket peer, set when the connection is made
ROLE_KEY = "x-tritonctl-role"
GROUPS_TTL_S = 10.0
Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]


def needs(role: Role) -> dict[str, Any]:
    """A route decorator's keywords declaring the role the route needs (in the OpenAPI document too)."""
    return {"openapi_extra": {ROLE_KEY: role.value}}


class Authenticator:
    """A bearer → its Identity: the shared token, a personal token, or an OIDC JWT."""

    def __init__(self, book: TokenBook | None = None, shared_token: str | None = None,
                 oidc: OidcVerifier | None = None) -> None:
        self.book = book
        self.shared_token = shared_token
        self.oidc = oidc

    def identify(self, bearer: str) -> Identity:
        if self.shared_token is not None and hmac.compare_digest(bearer.encode(), self.shared_token.encode()):
            return Identity(f"token:{SHARED_NAME}", Role.ADMIN, "token")
        if self.book is not None and looks_like_token(bearer):
            return self.book.identify(bearer)
        if self.oidc is not None and bearer.count(".") == 2:
            return self.oidc.identify(bearer)
        raise errors.PermissionDeniedError("missing or wrong token")

    def cheap(self, bearer: str) -> bool:
        """Whether checking this bearer costs nothing (the shared token, a personal token checked lately):
        such a check is not throttled."""
        if self.shared_token is not None and hmac.compare_digest(bearer.encode(), self.shared_token.encode()):
            return True
        return self.book is not None and looks_like_token(bearer) and self.book.checked_lately(bearer)

    def failure_keys(self, bearer: str) -> list[str]:
        """What a failure of this bearer is counted against besides the client: its token's id."""
        token_id = self.book.token_id(bearer) if self.book is not None else None
        return [f"token:{token_id}"] if token_id else []


def peer_groups(sock: Any) -> tuple[int, tuple[int, ...]]:
    """(uid, gids) of a Unix socket's peer as the kernel saw them at connect (SO_PEERCRED's uid and gid,
    SO_PEERGROUPS's supplementary groups); (-1, ()) when unknown."""
    import socket
    import struct

    try:
        _pid, uid, gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                             struct.calcsize("3i")))
    except (OSError, AttributeError):
        return -1, ()
    gids = {gid}
    for size in (256, 65536):
        try:
            raw = sock.getsockopt(socket.SOL_SOCKET, getattr(socket, "SO_PEERGROUPS", 59), 4 * size)
        except OSError:
            continue
        gids.update(struct.unpack(f"{len(raw) // 4}I", raw[: len(raw) // 4 * 4]))
        break
    return uid, tuple(sorted(gids))


class SocketRoles:
    """Unix groups → roles on the control socket: `socket_roles`, or by default the socket file's group
    `deployer`; root and the daemon's own user `admin` whatever the map says (they own the state anyway)."""

    def __init__(self, mapping: tuple[tuple[str, str], ...], socket_gid: int, own_uid: int | None = None) -> None:
        self.own_uid = os.getuid() if own_uid is None else own_uid
        self.by_gid: dict[int, Role] = {}
        for group, role in mapping or ((str(socket_gid), Role.DEPLOYER.value),):
            gid = _gid(group)
            if gid not in self.by_gid or Role(role).rank > self.by_gid[gid].rank:
                self.by_gid[gid] = Role(role)
        self._names: dict[int, tuple[str, float]] = {}

    def identity(self, uid: int, gids: tuple[int, ...]) -> Identity:
        if uid < 0:
            return Identity("uid:unknown", None, "socket")
        name = self._user(uid)
        if uid in (0, self.own_uid):
            return Identity(name, Role.ADMIN, "socket")
        roles = [self.by_gid[g] for g in gids if g in self.by_gid]
        return Identity(name, max(roles, key=lambda r: r.rank) if roles else None, "socket")

    def _user(self, uid: int) -> str:
        cached = self._names.get(uid)
        if cached is None or time.monotonic() - cached[1] > GROUPS_TTL_S:
            try:
                text = f"uid:{uid}({pwd.getpwuid(uid).pw_name})"
            except KeyError:
                text = f"uid:{uid}"
            cached = self._names[uid] = (text, time.monotonic())
        return cached[0]


def _gid(group: str) -> int:
    if group.isdigit():
        return int(group)
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise errors.ConfigError(f"socket_roles: group '{group}' is unknown on this host") from None


def _flat(routes: list[Any]) -> Iterator[Any]:
    for route in routes:
        if hasattr(route, "original_router"):  # FastAPI >= 0.120 keeps an included router as one node
            yield from _flat(route.original_router.routes)
        else:
            yield route


def route_role(route: Any) -> Role | None:
    extra = getattr(route, "openapi_extra", None) or {}
    return Role(extra[ROLE_KEY]) if ROLE_KEY in extra else None


def check_roles(app: Any, open_paths: tuple[str, ...]) -> None:
    """Every route of the app declares its role (the OpenAPI document's own route: `open_paths`, viewer)."""
    for route in _flat(app.routes):
        if getattr(route, "path", None) in open_paths or not hasattr(route, "endpoint"):
            continue
        if getattr(route, "include_in_schema", True) and route_role(route) is None:
            raise AssertionError(f"route {route.path} declares no role (access.needs(Role.X))")


def needed_role(app: Any, scope: Scope) -> Role:
    """The role the route a request goes to needs: the matching route's (a path without one: viewer, the
    app answers 404 or 405)."""
    for route in _flat(getattr(app, "routes", [])):
        match, _ = route.matches(scope)
        if match is Match.FULL:
            return route_role(route) or Role.VIEWER
    return Role.VIEWER


def refusal_text(needed: Role, identity: Identity) -> str:
    has = f"role {identity.role.value}" if identity.role is not None else "no role"
    return f"{identity.name} has {has}; this needs role {needed.value}"


def actor_of(request: Any) -> Actor:
    """The audit actor of a request: its identity, with what it declared (x-tritonctl-actor) as `claimed`
    when that is not one of the identity's own names (`Identity.aliases`)."""
    identity = request.scope.get(IDENTITY_SCOPE_KEY)
    name = identity.name if identity is not None else "unknown"
    declared = (request.headers.get(ACTOR_HEADER) or "").strip()[:64]
    honest = not declared or (identity is not None and declared in identity.aliases)
    return Actor(name, None if honest else declared)


class AccessGate:
    """ASGI middleware of both listeners: `socket_roles` given, the socket's (the peer's identity);
    otherwise TCP's (the bearer's). Then the route's role."""

    def __init__(self, app: Any, authenticator: Authenticator | None = None,
                 socket_roles: SocketRoles | None = None, throttle: LoginThrottle | None = None) -> None:
        self.app = app
        self.authenticator = authenticator or Authenticator()
        self.socket_roles = socket_roles
        self.throttle = throttle or LoginThrottle()

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            if self.socket_roles is not None:  # lifespan: only the socket's app has one
                await self.app(scope, receive, send)
            return
        if self.socket_roles is not None:
            identity = self.socket_roles.identity(*scope.get(PEER_SCOPE_KEY, (-1, ())))
        else:
            found = await self._bearer_identity(scope, send)
            if found is None:
                return
            identity = found
        needed = needed_role(self.app, scope)
        if not identity.may(needed):
            await _refuse(scope, send, 403, errors.ForbiddenError(refusal_text(needed, identity)))
            return
        scope[IDENTITY_SCOPE_KEY] = identity
        await self.app(scope, receive, send)

    async def _bearer_identity(self, scope: Scope, send: Any) -> Identity | None:
        headers = dict(scope.get("headers") or ())
        value = headers.get(TOKEN_HEADER.encode(), b"").decode("latin-1")
        scheme, _, bearer = value.partition(" ")
        if scheme.lower() != "bearer" or not bearer.strip():
            await _refuse(scope, send, 401, errors.PermissionDeniedError("missing or wrong token"))
            return None
        bearer = bearer.strip()
        client = (scope.get("client") or ("", 0))[0]
        keys = [client, *self.authenticator.failure_keys(bearer)]
        wait_s = 0.0 if self.authenticator.cheap(bearer) else max(self.throttle.wait_s(key) for key in keys)
        if wait_s > 0:
            await _refuse(scope, send, 429, errors.PermissionDeniedError(
                f"too many wrong tokens: try again in {ceil(wait_s)} s"), retry_after=ceil(wait_s))
            return None
        try:  # scrypt and a registry read: off the event loop
            identity = await asyncio.to_thread(self.authenticator.identify, bearer)
        except errors.PermissionDeniedError as exc:
            if not isinstance(exc, CredentialEnded):  # a wrong secret or signature: a guess, counted
                for key in keys:
                    self.throttle.failed(key)
            await _refuse(scope, send, 401, errors.PermissionDeniedError(str(exc)))
            return None
        except errors.StoreError as exc:  # the registry is down: nobody can be checked
            await _refuse(scope, send, 503, exc)
            return None
        self.throttle.succeeded(client)
        return identity


async def _refuse(scope: Scope, send: Any, status: int, exc: errors.TritonctlError, retry_after: int = 0) -> None:
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008})
        return
    body = json.dumps(error_document(exc)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    if retry_after:
        headers.append((b"retry-after", str(retry_after).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
