"""Personal tokens of the control API: minted once, kept as a slow hash, checked on every request.

A token reads `tct_<id>_<secret>`: the id (16 hex digits) finds its row in the registry
(controlplane/store/tokens.py), the secret (32 random bytes) is checked against the row's scrypt hash
(hashlib's, the standard library's) in constant time. The secret is shown once, by `tritonctl token
create`; the registry never holds it. In a fleet the rows live in the shared registry, so a token works on
every host.

scrypt is slow on purpose (74 ms and 16 MiB a check on this 2-core machine): a stolen registry does not give the tokens
away. So each host keeps what it checked in `TokenBook`'s cache, keyed by the token's sha256, for
`ttl_s` (the daemon's `liveness_s` / 2): within that a request costs a dictionary look-up; after it the
row is read again (a primary-key read, no scrypt), so a token revoked on another host of a fleet is
refused here within `liveness_s`. Expiry is checked on every request against the clock, and a
revocation through this host empties its entries at once.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol

from controlplane import errors
from controlplane.base.clock import utcnow
from controlplane.store.records import TokenRecord
from controlplane.vocab import ROLES, Role

PREFIX = "tct_"
TOKEN_RE = re.compile(r"^tct_([0-9a-f]{16})_([A-Za-z0-9_-]{43})$")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,57}$")  # token:NAME fits the 64-character actor
SHARED_NAME = "default"  # the token of token_file (role admin): reserved
SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1
CACHE_SIZE = 10_000
MAX_EXPIRY_S = 10 * 365 * 86400.0


class CredentialEnded(errors.PermissionDeniedError):
    """A credential whose proof held (the secret or the signature checked) but that expired or was revoked:
    refused (401) without counting as a guess (controlplane/api/access.py's throttle counts the others)."""


@dataclass(frozen=True)
class Identity:
    """Who a request comes from, proven: `name` is the audit actor (`token:alice`, `uid:1000(alice)`,
    `oidc:alice@example.com`), `role` what it may do (None: no role), `credential` how it was proven
    (`token`, `socket`, `oidc`), `expires_at` when a token's proof ends (naive UTC; None: never or unknown)."""

    name: str
    role: Role | None
    credential: str
    expires_at: datetime | None = None

    def may(self, needed: Role) -> bool:
        return self.role is not None and self.role.allows(needed)

    @property
    def aliases(self) -> frozenset[str]:
        """What a client honestly declares as itself: the name, the part after its kind (`alice` of
        `token:alice`), and for a uid its user name and `uid:1000` (controlplane/api/client.py sends $USER,
        or `uid:N` without one). A declaration outside these is a claim (`claimed` in the audit)."""
        kind, _, rest = self.name.partition(":")
        inner = re.fullmatch(r"(\d+)\((.+)\)", rest)
        if inner:
            return frozenset({self.name, inner.group(2), f"{kind}:{inner.group(1)}"})
        return frozenset({self.name, rest})


def hash_secret(secret: str, salt: bytes | None = None) -> str:
    salt = salt or secrets.token_bytes(16)
    digest = hashlib.scrypt(secret.encode(), salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P, dklen=32)
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${salt.hex()}${digest.hex()}"


def secret_matches(secret: str, stored: str) -> bool:
    try:
        kind, n, r, p, salt, digest = stored.split("$")
        if kind != "scrypt":
            return False
        again = hashlib.scrypt(secret.encode(), salt=bytes.fromhex(salt), n=int(n), r=int(r), p=int(p),
                               dklen=len(digest) // 2)
    except (ValueError, MemoryError):
        return False
    return hmac.compare_digest(again.hex(), digest)


def looks_like_token(bearer: str) -> bool:
    return bearer.startswith(PREFIX)


def check_name(name: str) -> str:
    if not NAME_RE.match(name or ""):
        raise errors.UsageError(f"token name {name!r}: letters, digits, '.', '_', '@' or '-', at most 58, "
                                "starting with a letter or digit")
    if name == SHARED_NAME:
        raise errors.UsageError(f"token name '{SHARED_NAME}' is the shared token of token_file: choose another")
    return name


def role_of(text: str) -> Role:
    if text not in ROLES:
        raise errors.UsageError(f"role {text!r}: expected one of {', '.join(ROLES)}")
    return Role(text)


class TokenRows(Protocol):
    """What the book uses of a registry (controlplane/store/tokens.py): in a fleet, the shared one."""

    def create_token(self, token_id: str, name: str, role: str, secret_hash: str, creator: str,
                     expires_at: datetime | None) -> TokenRecord: ...

    def token_row(self, token_id: str) -> tuple[TokenRecord, str] | None: ...

    def list_tokens(self) -> list[TokenRecord]: ...

    def revoke_token(self, name: str, actor: str) -> TokenRecord: ...


@dataclass
class _Checked:
    record: TokenRecord
    secret_hash: str
    token_id: str
    checked: float  # monotonic: when the row was last read


class TokenBook:
    """Mints, lists and revokes tokens in `rows`, and says who a bearer token is (`identify`)."""

    def __init__(self, rows: TokenRows, ttl_s: float = 5.0, clock: Callable[[], float] = time.monotonic,
                 now: Callable[[], datetime] = utcnow) -> None:
        self.rows = rows
        self.ttl_s = ttl_s
        self.clock = clock
        self.now = now
        self._cache: OrderedDict[str, _Checked] = OrderedDict()
        self._lock = threading.Lock()

    def create(self, name: str, role: str, creator: str, expires_s: float | None) -> tuple[TokenRecord, str]:
        """A new token: its record and the token itself (shown once, never stored)."""
        check_name(name)
        role_of(role)
        expires_at = None
        if expires_s is not None:
            if not 0 < expires_s <= MAX_EXPIRY_S:
                raise errors.UsageError(f"expires: {expires_s:g} s: expected more than 0 and at most 10 years")
            expires_at = self.now() + timedelta(seconds=expires_s)
        token_id, secret = secrets.token_hex(8), secrets.token_urlsafe(32)
        record = self.rows.create_token(token_id, name, role, hash_secret(secret), creator, expires_at)
        return record, f"{PREFIX}{token_id}_{secret}"

    def list(self) -> list[TokenRecord]:
        return self.rows.list_tokens()

    def revoke(self, name: str, actor: str) -> TokenRecord:
        record = self.rows.revoke_token(name, actor)
        with self._lock:  # refused here at once; elsewhere within ttl_s
            for key in [k for k, v in self._cache.items() if v.record.name == name]:
                del self._cache[key]
        return record

    def token_id(self, bearer: str) -> str | None:
        """The public id of a well-formed token (what failures are counted by), else None."""
        match = TOKEN_RE.match(bearer)
        return match.group(1) if match else None

    def checked_lately(self, bearer: str) -> bool:
        """Whether this token's proof is in the cache, fresh: `identify` then reads nothing and runs no scrypt
        (so a caller that guesses tokens is not slowing down one who holds a right one)."""
        with self._lock:
            checked = self._cache.get(hashlib.sha256(bearer.encode()).hexdigest())
        return checked is not None and self.clock() - checked.checked < self.ttl_s

    def identify(self, bearer: str) -> Identity:
        """The identity of a personal token; PermissionDeniedError for a wrong, unknown, expired or revoked one."""
        match = TOKEN_RE.match(bearer)
        if match is None:
            raise errors.PermissionDeniedError("not a tritonctl token (tct_...)")
        key = hashlib.sha256(bearer.encode()).hexdigest()
        with self._lock:
            checked = self._cache.get(key)
        if checked is None or self.clock() - checked.checked >= self.ttl_s:
            checked = self._read(match.group(1), match.group(2), checked)
            with self._lock:
                self._cache[key] = checked
                self._cache.move_to_end(key)
                while len(self._cache) > CACHE_SIZE:
                    self._cache.popitem(last=False)
        record = checked.record
        if record.revoked_at is not None:
            raise CredentialEnded(f"token '{record.name}' was revoked")
        if record.expires_at is not None and self.now() >= record.expires_at:
            raise CredentialEnded(f"token '{record.name}' expired at "
                                               f"{record.expires_at.isoformat(timespec='seconds')}Z")
        return Identity(f"token:{record.name}", Role(record.role), "token", record.expires_at)

    def _read(self, token_id: str, secret: str, before: _Checked | None) -> _Checked:
        found = self.rows.token_row(token_id)
        if found is None:
            raise errors.PermissionDeniedError("unknown token")
        record, stored = found
        if before is None or before.secret_hash != stored:  # scrypt only for a token not checked before
            if not secret_matches(secret, stored):
                raise errors.PermissionDeniedError("wrong token")
        return _Checked(record, stored, token_id, self.clock())
