"""OIDC bearer JWTs on the control API: `oidc_issuer`, `oidc_audience` and `oidc_jwks` set, a JWT an identity
provider issued is a caller (`oidc:<email or sub>`), its role taken from a claim (`oidc_role_claim`) through
`oidc_roles`. PyJWT (with cryptography) checks the signature and the claims; this module decides which
keys and algorithms count.

Only RS256 and ES256 are accepted, each with a key of its own kind: `alg: none` and every HS* (an HMAC
"signed" with the public key, the classic confusion) are refused before any key is looked at. `iss`, `aud`,
`exp` are required and checked, `nbf` when present, with LEEWAY_S of clock skew. The keys (`Jwks`) come from
a file or an https:// URL: read at the first token, again after REFRESH_S, and at once when a token names
an unknown `kid` (at most once every MIN_REFETCH_S, so made-up key ids cannot hammer the provider); a
fetch is bounded (MAX_JWKS_BYTES, FETCH_TIMEOUT_S, https only, redirects too) and a failed one keeps the
keys it had.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jwt

from controlplane import errors
from controlplane.api.tokens import CredentialEnded, Identity
from controlplane.vocab import ROLES, Role

ALGORITHMS = {"RS256": "RSA", "ES256": "EC"}  # algorithm -> the key type it must be verified with
LEEWAY_S = 30.0
REFRESH_S = 3600.0
MIN_REFETCH_S = 10.0
FETCH_TIMEOUT_S = 5.0
MAX_JWKS_BYTES = 1024 * 1024
MAX_ACTOR = 64  # the audit's actor column


class _HttpsOnly(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> Any:
        if not newurl.startswith("https://"):
            raise errors.PermissionDeniedError(f"oidc_jwks: a redirect to {newurl[:100]} is not https")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def fetch_jwks(source: str) -> dict[str, Any]:
    """The JWKS document of a file or an https:// URL, bounded in size and time."""
    if source.startswith("https://"):
        deadline = time.monotonic() + FETCH_TIMEOUT_S
        opener = urllib.request.build_opener(_HttpsOnly)
        with opener.open(urllib.request.Request(source, headers={"Accept": "application/json"}),
                         timeout=FETCH_TIMEOUT_S) as answer:
            body = bytearray()
            while len(body) <= MAX_JWKS_BYTES:
                if time.monotonic() > deadline:
                    raise OSError(f"no whole answer within {FETCH_TIMEOUT_S:g} s")
                chunk = answer.read(65536)
                if not chunk:
                    break
                body += chunk
    else:
        with open(source, "rb") as handle:
            body = bytearray(handle.read(MAX_JWKS_BYTES + 1))
    if len(body) > MAX_JWKS_BYTES:
        raise ValueError(f"over {MAX_JWKS_BYTES} bytes")
    document = json.loads(body)
    if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
        raise ValueError("not a JWKS document (no \"keys\" list)")
    return document


class Jwks:
    """The issuer's public keys by key id."""

    def __init__(self, source: str, clock: Callable[[], float] = time.monotonic,
                 fetch: Callable[[str], dict[str, Any]] = fetch_jwks) -> None:
        self.source = source
        self.clock = clock
        self.fetch = fetch
        self.keys: dict[str | None, jwt.PyJWK] = {}
        self.fetched_at: float | None = None  # the last try, successful or not
        self.fetches = 0
        self._lock = threading.Lock()

    def _refresh(self) -> None:
        self.fetched_at, self.fetches = self.clock(), self.fetches + 1
        try:
            document = self.fetch(self.source)
        except (OSError, ValueError, errors.TritonctlError) as exc:
            if not self.keys:
                raise errors.PermissionDeniedError(f"oidc_jwks {self.source}: cannot read the keys: {exc}") from None
            return  # keep the keys we had
        keys: dict[str | None, jwt.PyJWK] = {}
        for entry in document["keys"]:
            if not isinstance(entry, dict) or entry.get("use", "sig") != "sig":
                continue
            try:
                key = jwt.PyJWK(entry)
            except jwt.PyJWTError:
                continue  # a key of a kind this library does not take: not ours to use
            keys[entry.get("kid")] = key
        self.keys = keys

    def key(self, kid: str | None) -> jwt.PyJWK:
        with self._lock:
            now = self.clock()
            stale = self.fetched_at is None or now - self.fetched_at >= REFRESH_S
            unknown = kid not in self.keys and (self.fetched_at is None or now - self.fetched_at >= MIN_REFETCH_S)
            if stale or unknown:
                self._refresh()
            if kid is None and len(self.keys) == 1:
                return next(iter(self.keys.values()))
            found = self.keys.get(kid)
        if found is None:
            raise errors.PermissionDeniedError(f"OIDC token: unknown key id {str(kid)[:64]!r}")
        return found


def short_actor(value: str) -> str:
    """`oidc:VALUE`, cut to the audit's 64 characters with a hash of the whole when longer (still one name each)."""
    actor = f"oidc:{value}"
    if len(actor) <= MAX_ACTOR:
        return actor
    return f"{actor[:MAX_ACTOR - 9]}~{hashlib.sha256(value.encode()).hexdigest()[:8]}"


class OidcVerifier:
    """Bearer JWT → Identity, for one issuer and audience."""

    def __init__(self, issuer: str, audience: str, jwks: Jwks, role_claim: str = "groups",
                 roles: tuple[tuple[str, str], ...] = ()) -> None:
        self.issuer = issuer
        self.audience = audience
        self.jwks = jwks
        self.role_claim = role_claim
        self.roles = dict(roles)

    def identify(self, bearer: str) -> Identity:
        try:
            header = jwt.get_unverified_header(bearer)
        except jwt.PyJWTError as exc:
            raise errors.PermissionDeniedError(f"not a token: {exc}") from None
        alg = header.get("alg")
        if alg not in ALGORITHMS:
            raise errors.PermissionDeniedError(f"OIDC token: algorithm {str(alg)[:16]!r} is refused "
                                               f"(accepted: {', '.join(ALGORITHMS)})")
        key = self.jwks.key(header.get("kid"))
        if key.key_type != ALGORITHMS[alg]:
            raise errors.PermissionDeniedError(f"OIDC token: {alg} with a {key.key_type} key is refused")
        try:
            claims = jwt.decode(bearer, key.key, algorithms=[alg], audience=self.audience, issuer=self.issuer,
                                leeway=LEEWAY_S, options={"require": ["exp", "iss", "aud"]})
        except jwt.ExpiredSignatureError as exc:  # signed by the provider: not a guess
            raise CredentialEnded(f"OIDC token: {exc}") from None
        except jwt.PyJWTError as exc:
            raise errors.PermissionDeniedError(f"OIDC token: {exc}") from None
        subject = claims.get("email") if claims.get("email_verified", True) is not False else None
        subject = subject or claims.get("sub")
        if not isinstance(subject, str) or not subject:
            raise errors.PermissionDeniedError("OIDC token: neither email nor sub names the caller")
        return Identity(short_actor(subject), self.role(claims), "oidc")

    def role(self, claims: dict[str, Any]) -> Role | None:
        """The highest role among the role claim's values (through `roles`, or a value that is a role's name)."""
        value = claims.get(self.role_claim)
        values = [value] if isinstance(value, str) else value if isinstance(value, list) else []
        found = [self.roles.get(v) if self.roles else v for v in values if isinstance(v, str)]
        ranked = [Role(r) for r in found if r in ROLES]
        return max(ranked, key=lambda r: r.rank) if ranked else None


def verifier_from(settings: Any) -> OidcVerifier | None:
    """The daemon's verifier, or None when OIDC is not configured."""
    if not (settings.oidc_issuer and settings.oidc_audience and settings.oidc_jwks):
        return None
    source = settings.oidc_jwks
    if not source.startswith("https://") and not Path(source).is_file():
        raise errors.ConfigError(f"oidc_jwks: {source} is not a file (or an https:// URL)")
    return OidcVerifier(settings.oidc_issuer, settings.oidc_audience, Jwks(source), settings.oidc_role_claim,
                        settings.oidc_roles)
