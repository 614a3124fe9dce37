"""The settings of who may do what on the control API (docs/operations.md "Identities and roles"):
`socket_roles` (Unix groups → roles on the control socket), and the OIDC settings that let bearer JWTs in
(`oidc_issuer`, `oidc_audience`, `oidc_jwks`, `oidc_role_claim`, `oidc_roles`).

A module of its own so controlplane/settings/config.py, which declares every setting, keeps to one
screen per concern: these parse and check the access settings' values, config.py names them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from controlplane.errors import ConfigError
from controlplane.vocab import ROLES

RoleMap = tuple[tuple[str, str], ...]  # (group or claim value, role) pairs, in the order given


def role_map(value: Any) -> RoleMap:
    """`{ "tritonctl-admin" = "admin", "tritonctl" = "deployer" }` (TOML), or `tritonctl-admin=admin,tritonctl=deployer`
    (a variable or a flag): each key a name, each value viewer, deployer or admin."""
    if isinstance(value, dict):
        items = list(value.items())
    elif isinstance(value, str):
        items = []
        for part in (p.strip() for p in value.split(",")):
            if part:
                key, sep, role = part.partition("=")
                if not sep:
                    raise ValueError(f"expected NAME=ROLE pairs, got {part!r}")
                items.append((key.strip(), role.strip()))
    else:
        raise ValueError("expected a table of NAME = ROLE")
    pairs = []
    for key, role in items:
        if not isinstance(key, str) or not key or not isinstance(role, str):
            raise ValueError("expected NAME = ROLE with text on both sides")
        if role.strip().lower() not in ROLES:
            raise ValueError(f"{key}: expected a role ({', '.join(ROLES)}), got {role!r}")
        pairs.append((key, role.strip().lower()))
    return tuple(pairs)


def _jwks(value: Any) -> str:
    """A JWKS file's path or an https:// URL."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError("expected a JWKS file or an https:// URL")
    text = value.strip()
    if "://" in text and not text.startswith("https://"):
        raise ValueError("expected a JWKS file or an https:// URL (keys over plain http could be swapped)")
    return text


def _nonempty(value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError("expected a non-empty string")
    return value.strip()


ACCESS_PARSERS: dict[str, Callable[[Any], Any]] = {
    "socket_roles": role_map,
    "oidc_issuer": _nonempty,
    "oidc_audience": _nonempty,
    "oidc_jwks": _jwks,
    "oidc_role_claim": _nonempty,
    "oidc_roles": role_map,
}


def check_access(settings: Any) -> None:
    """OIDC takes its issuer, audience and keys together, or none of them."""
    given = {k: getattr(settings, k) for k in ("oidc_issuer", "oidc_audience", "oidc_jwks")}
    missing = [k for k, v in given.items() if not v]
    if missing and len(missing) < len(given):
        raise ConfigError(f"{missing[0]}: OIDC needs oidc_issuer, oidc_audience and oidc_jwks together "
                          f"(given: {', '.join(k for k, v in given.items() if v)})")
