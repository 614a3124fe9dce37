"""Who may see the web view: the Host it is asked by, then the login (docs/web.md, docs/operations.md "Security").

Host names. Every request (http and websocket alike) first shows a Host header the view answers to, or
gets 421 before any page is built: the names of its own address, so a page elsewhere that rebinds its
own DNS name to this address (DNS rebinding) reads nothing through a visitor's browser. A loopback address
answers to `localhost`, `127.0.0.1` and `[::1]`; any address to its own IP literal; a wildcard address
(0.0.0.0, ::) to any IP literal and the loopback names; and every address to the names of the config key
`web_host_names` (the name a browser uses for a non-loopback view). The port is not compared.

Login. On a loopback listener without `web_require_token` everyone is let in. Elsewhere a personal token,
the shared token or an OIDC JWT (controlplane/api/access.py's `Authenticator`) is typed once into the
login form (a body of at most LOGIN_BODY_LIMIT bytes: 413 beyond, unread); a client's wrong tokens slow it
down (`LoginThrottle`: after FREE_FAILURES, 429 for a wait that doubles with each further failure). A right
one, of an identity with a role, opens a session: a random id (not derived from the token) kept in this
process's memory with the credential, for SESSION_LIFETIME_S at most (and no longer than the credential),
ended at logout (and by a restart of the daemon). Every request checks the credential again (cached for a
personal token: controlplane/api/tokens.py), so a revoked or expired token ends its sessions. The browser
keeps the id in a cookie (HttpOnly, SameSite=Strict, Secure when the listener serves TLS) that opens this
read-only view and nothing else. `authorization: Bearer <token>` is accepted too (curl, a reverse proxy
such as oauth2-proxy handing on the user's token). Static files and the login form are open.
"""

from __future__ import annotations

import ipaddress
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

from controlplane.api.tokens import Identity
from controlplane.errors import PermissionDeniedError

COOKIE = "tritonctl_web"
OPEN_PREFIXES = ("/ui/login", "/ui/static/")
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARDS = frozenset({"0.0.0.0", "::", ""})
SESSION_LIFETIME_S = 8 * 3600  # a working day; then the token is asked for again
MAX_SESSIONS = 1000  # the oldest session ends when more are opened (only token holders open one)
LOGIN_BODY_LIMIT = 4096  # the form holds a token and a path: 4 KiB is plenty
FREE_FAILURES = 5  # wrong tokens a client may send before it waits
MAX_WAIT_S = 300.0  # the longest wait between tries after wrong tokens
FAILURES_FORGOTTEN_S = 900.0  # a client's wrong tokens are forgotten after this long without another
# What a page may load: its own scripts and styles (style attributes: the timeline's positions), images
# of its own or data: (the empty icon), fetches and the event stream of its own origin (the stream in a worker
# of its own script, static/events.js); no frames, no plugins, forms posted to itself only.
CONTENT_SECURITY_POLICY = ("default-src 'none'; script-src 'self'; worker-src 'self'; style-src 'self'; "
                           "style-src-attr 'unsafe-inline'; "
                           "img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; "
                           "base-uri 'none'")
SECURITY_HEADERS = ((b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
                    (b"x-content-type-options", b"nosniff"), (b"x-frame-options", b"DENY"),
                    (b"referrer-policy", b"no-referrer"))

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]


# --- Host names --------------------------------------------------------------------------------------


def host_names(bound_host: str, configured: str | None) -> frozenset[str]:
    """The names (lower case, IPv6 without brackets) a view bound to `bound_host` answers to; a wildcard
    address answers to any IP literal too (`host_allowed`)."""
    names = {n.strip().lower().rstrip(".") for n in (configured or "").split(",") if n.strip()}
    bound = bound_host.strip("[]").lower()
    if bound in WILDCARDS or is_loopback(bound):
        names |= LOOPBACK_NAMES
    if bound not in WILDCARDS:
        names.add(bound)
    return frozenset(names)


def is_loopback(host: str) -> bool:
    """`localhost` or a loopback IP literal (the TCP listeners' rule too: controlplane/api/server.py)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_of(header: str) -> str:
    """The name of a Host header without its port: `[::1]:8080` -> `::1`, `Example.COM.:80` -> `example.com`."""
    value = header.strip().lower()
    if value.startswith("["):
        return value[1:].partition("]")[0]
    if value.count(":") == 1:
        value = value.partition(":")[0]
    return value.rstrip(".")


def host_allowed(scope: Mapping[str, Any], names: frozenset[str], any_ip: bool) -> bool:
    """Whether the request's Host header (exactly one) names this view; `any_ip`: a wildcard listener."""
    hosts = [value for key, value in scope.get("headers") or () if key.lower() == b"host"]
    if len(hosts) != 1:
        return False
    name = host_of(hosts[0].decode("latin-1"))
    if name in names:
        return True
    if any_ip:
        try:
            ipaddress.ip_address(name)
        except ValueError:
            return False
        return True
    return False


class HostCheck:
    """ASGI middleware: a request whose Host is not one of the view's names gets 421, before anything else
    runs (a websocket is closed before it is accepted: 403)."""

    def __init__(self, app: ASGIApp, bound_host: str, configured: str | None) -> None:
        self.app = app
        self.names = host_names(bound_host, configured)
        self.any_ip = bound_host.strip("[]") in WILDCARDS

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket") or host_allowed(scope, self.names, self.any_ip):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        body = b"421 Misdirected Request: this web view does not answer to that Host name\n"
        await send({"type": "http.response.start", "status": 421,
                    "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                                (b"content-length", str(len(body)).encode()), *SECURITY_HEADERS]})
        await send({"type": "http.response.body", "body": body})


# --- sessions and the login ----------------------------------------------------------------------------


class Sessions:
    """Random session ids in memory, each with the credential it was opened with: each expires
    SESSION_LIFETIME_S after login (or sooner, `lifetime_s=`) and ends at logout."""

    def __init__(self, lifetime_s: float = SESSION_LIFETIME_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.lifetime_s = lifetime_s
        self.clock = clock
        self._open: OrderedDict[str, tuple[float, str]] = OrderedDict()  # session -> (expiry, credential)
        self._lock = threading.Lock()

    def open(self, credential: str = "", lifetime_s: float | None = None) -> str:
        session = secrets.token_urlsafe(32)
        lifetime = self.lifetime_s if lifetime_s is None else min(self.lifetime_s, lifetime_s)
        with self._lock:
            self._open[session] = (self.clock() + lifetime, credential)
            while len(self._open) > MAX_SESSIONS:
                self._open.popitem(last=False)
        return session

    def credential(self, session: str) -> str | None:
        """The credential a live session was opened with (None: no such session, or it expired)."""
        if not session:
            return None
        with self._lock:
            found = self._open.get(session)
            if found is None:
                return None
            if self.clock() >= found[0]:
                del self._open[session]
                return None
            return found[1]

    def valid(self, session: str) -> bool:
        return self.credential(session) is not None

    def end(self, session: str) -> None:
        with self._lock:
            self._open.pop(session, None)


class LoginThrottle:
    """Per client address: FREE_FAILURES wrong tokens, then a wait of 1 s, 2 s, 4 s ... (MAX_WAIT_S at
    most) after each further one; forgotten FAILURES_FORGOTTEN_S after the last, or at a right token."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, max_clients: int = 10_000) -> None:
        self.clock = clock
        self.max_clients = max_clients
        self._failures: OrderedDict[str, tuple[int, float]] = OrderedDict()  # client -> (count, last failure)
        self._lock = threading.Lock()

    def wait_s(self, client: str) -> float:
        """Seconds `client` must wait before its next try (0: it may try now)."""
        with self._lock:
            count, last = self._failures.get(client, (0, 0.0))
            now = self.clock()
            if count and now - last > FAILURES_FORGOTTEN_S:
                del self._failures[client]
                return 0.0
            if count < FREE_FAILURES:
                return 0.0
            return max(0.0, last + min(MAX_WAIT_S, 2.0 ** (count - FREE_FAILURES)) - now)

    def failed(self, client: str) -> None:
        with self._lock:
            count, _ = self._failures.pop(client, (0, 0.0))
            self._failures[client] = (count + 1, self.clock())
            while len(self._failures) > self.max_clients:
                self._failures.popitem(last=False)

    def succeeded(self, client: str) -> None:
        with self._lock:
            self._failures.pop(client, None)


def cookie_header(session: str, secure: bool) -> str:
    """The Set-Cookie value of a session: a browser-session cookie (no Max-Age: it goes when the browser
    closes); the session itself ends at logout or after its lifetime, on the server."""
    return f"{COOKIE}={session}; Path=/ui/; HttpOnly; SameSite=Strict" + ("; Secure" if secure else "")


def logout_header(secure: bool) -> str:
    return f"{COOKIE}=; Path=/ui/; Max-Age=0; HttpOnly; SameSite=Strict" + ("; Secure" if secure else "")


def session_of(scope: Mapping[str, Any]) -> str:
    """The session id the request's cookie carries ('' when none)."""
    for key, value in scope.get("headers") or ():
        if key.lower() != b"cookie":
            continue
        for part in value.decode("latin-1").split(";"):
            name, _, content = part.strip().partition("=")
            if name == COOKIE:
                return content
    return ""


Identify = Callable[[str], Identity]  # a credential -> who it is (PermissionDeniedError: nobody)


def caller(scope: Mapping[str, Any], identify: Identify, sessions: Sessions) -> Identity | None:
    """Who this request comes from, checked now: its session's credential or its bearer; None when neither
    proves an identity with a role (a session whose token was revoked or expired ends here)."""
    session = session_of(scope)
    credential = sessions.credential(session)
    if credential is None:
        header = dict(scope.get("headers") or ()).get(b"authorization", b"").decode("latin-1")
        scheme, _, credential = header.partition(" ")
        if scheme.lower() != "bearer" or not credential.strip():
            return None
        credential, session = credential.strip(), ""
    try:
        identity = identify(credential)
    except PermissionDeniedError:
        if session:
            sessions.end(session)
        return None
    return identity if identity.role is not None else None


def allowed(scope: Mapping[str, Any], identify: Identify | None, sessions: Sessions) -> bool:
    """Whether this request may see the view (`identify` None: no login, a loopback listener)."""
    if identify is None or str(scope.get("path", "")).startswith(OPEN_PREFIXES):
        return True
    return caller(scope, identify, sessions) is not None
