"""Who may see the web view: everyone on a loopback listener; elsewhere only a holder of the daemon's token.

The token is typed once into the login form; the browser then keeps a session cookie (HttpOnly,
SameSite=Strict, Secure when the listener serves TLS) whose value is an HMAC of the token, not the token
itself: the cookie opens the read-only view and nothing else (the control API wants the token). A
`authorization: Bearer <token>` header is accepted too (curl). Static files and the login form are open.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import Any

COOKIE = "tritonctl_web"
OPEN_PREFIXES = ("/ui/login", "/ui/static/")
COOKIE_CONTEXT = b"tritonctl web view session"


def session_value(token: str) -> str:
    return hmac.new(token.encode(), COOKIE_CONTEXT, hashlib.sha256).hexdigest()


def cookie_header(token: str, secure: bool) -> str:
    """The Set-Cookie value of a session (a browser session: it ends when the browser closes)."""
    return f"{COOKIE}={session_value(token)}; Path=/ui/; HttpOnly; SameSite=Strict" + ("; Secure" if secure else "")


def logout_header(secure: bool) -> str:
    return f"{COOKIE}=; Path=/ui/; Max-Age=0; HttpOnly; SameSite=Strict" + ("; Secure" if secure else "")


def _cookie(headers: dict[bytes, bytes], name: str) -> str:
    for part in headers.get(b"cookie", b"").decode("latin-1").split(";"):
        key, _, value = part.strip().partition("=")
        if key == name:
            return value
    return ""


def allowed(scope: Mapping[str, Any], token: str | None) -> bool:
    """Whether this request may see the view (`token` None: no login, a loopback listener)."""
    if token is None or str(scope.get("path", "")).startswith(OPEN_PREFIXES):
        return True
    headers = dict(scope.get("headers") or ())
    if hmac.compare_digest(_cookie(headers, COOKIE).encode(), session_value(token).encode()):
        return True
    return hmac.compare_digest(headers.get(b"authorization", b""), f"Bearer {token}".encode())


def token_matches(given: str, token: str) -> bool:
    return hmac.compare_digest(given.strip().encode(), token.encode())
