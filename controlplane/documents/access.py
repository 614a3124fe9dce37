"""The `--json` documents of `tritonctl token create | list | revoke` (docs/schemas/token-*.schema.json).

A module of its own beside documents/results.py (which holds the other verbs' documents and is near its
size limit): the tokens are a concern apart, the control API's callers, not the models. The secret is
in `TokenCreated` alone, the one answer that shows it; a listed or revoked token never carries it.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from controlplane.store.records import TokenRecord, iso

ACTIVE, EXPIRED, REVOKED = "active", "expired", "revoked"


def token_state(record: TokenRecord, now: datetime) -> str:
    if record.revoked_at is not None:
        return REVOKED
    if record.expires_at is not None and now >= record.expires_at:
        return EXPIRED
    return ACTIVE


def token_document(record: TokenRecord, now: datetime) -> dict[str, Any]:
    """A token as `token list` shows it: name, role, creator, times, state; never its secret."""
    return {"name": record.name, "role": record.role, "creator": record.creator, "created_at": iso(record.created_at),
            "expires_at": iso(record.expires_at) if record.expires_at else None,
            "revoked_at": iso(record.revoked_at) if record.revoked_at else None, "revoked_by": record.revoked_by,
            "state": token_state(record, now)}


@dataclass(frozen=True)
class TokenCreated:
    """`token create --json`: the new token's row, and the token itself (shown this once)."""

    record: TokenRecord
    token: str
    now: datetime

    def to_json(self) -> dict[str, Any]:
        return {**token_document(self.record, self.now), "token": self.token}


@dataclass(frozen=True)
class TokenRow:
    """`token revoke --json`: the token's row after the revocation."""

    record: TokenRecord
    now: datetime

    def to_json(self) -> dict[str, Any]:
        return token_document(self.record, self.now)


@dataclass(frozen=True)
class TokenList:
    """`token list --json`: every token, revoked and expired ones too, by name."""

    tokens: list[TokenRecord]
    now: datetime

    def to_json(self) -> list[dict[str, Any]]:
        return [token_document(record, self.now) for record in self.tokens]
