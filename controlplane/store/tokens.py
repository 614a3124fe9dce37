"""Personal tokens in the registry (migration 0011): the rows `tritonctl token create | list | revoke` write
and the control API reads to authenticate a caller (controlplane/api/tokens.py mints and checks them; this
module only records and reads). In a fleet they are rows of the shared registry, so a token works on every
host. `Registry` (controlplane/store/registry.py) is a `Tokens`; each method is one short transaction of
the registry's, and creating or revoking a token is audited in the same transaction.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from controlplane.errors import ConflictError, NotFoundError, StoreError
from controlplane.store import schema
from controlplane.store.records import Actor, AuditEntry, TokenRecord

TOKEN_ACTION = "token"  # the audit action of a token's creation and revocation


def token_record(row: schema.Token) -> TokenRecord:
    return TokenRecord(row.name, row.role, row.creator, row.created_at, row.expires_at, row.revoked_at,
                       row.revoked_by)


class Tokens:
    """The tokens table, over the registry's transactions."""

    clock: Callable[[], datetime]

    def _session(self) -> AbstractContextManager[Session]:
        raise NotImplementedError  # the registry's transaction

    def _add_audit(self, session: Session, entry: AuditEntry, now: datetime) -> None:
        raise NotImplementedError  # History's: the event and its webhook outbox row

    def create_token(self, token_id: str, name: str, role: str, secret_hash: str, creator: str,
                     expires_at: datetime | None) -> TokenRecord:
        """Record a new token (its secret's hash only) and audit it. A name in use, revoked or not, is a
        ConflictError: a name means one token in the audit for ever."""
        now = self.clock()
        until = f", expires {expires_at.isoformat(timespec='seconds')}Z" if expires_at else ", never expires"
        try:
            with self._session() as session:
                if session.scalar(select(schema.Token.id).where(schema.Token.name == name)) is not None:
                    raise ConflictError(f"token '{name}' exists (revoked tokens keep their names): choose another name")
                row = schema.Token(id=token_id, name=name, role=role, secret_hash=secret_hash, creator=str(creator),
                                   created_at=now, expires_at=expires_at)
                session.add(row)
                self._add_audit(session, AuditEntry(creator, TOKEN_ACTION, None, None, "ok",
                                                    f"created token '{name}', role {role}{until}"), now)
                session.flush()
                return token_record(row)
        except StoreError as exc:
            if isinstance(exc.__cause__, IntegrityError):  # created at the same moment elsewhere
                raise ConflictError(f"token '{name}' exists: choose another name") from None
            raise

    def token_row(self, token_id: str) -> tuple[TokenRecord, str] | None:
        """A token and its secret's hash, by its public id (None: no such token)."""
        with self._session() as session:
            row = session.get(schema.Token, token_id)
            return (token_record(row), row.secret_hash) if row is not None else None

    def list_tokens(self) -> list[TokenRecord]:
        """Every token, revoked ones too, by name."""
        with self._session() as session:
            return [token_record(row) for row in session.scalars(select(schema.Token).order_by(schema.Token.name))]

    def revoke_token(self, name: str, actor: str | Actor) -> TokenRecord:
        """Revoke a token from now on, and audit it; revoking it again changes nothing (and audits nothing)."""
        with self._session() as session:
            row = session.scalar(select(schema.Token).where(schema.Token.name == name))
            if row is None:
                raise NotFoundError(f"token '{name}' is unknown (tritonctl token list)")
            if row.revoked_at is None:
                now = self.clock()
                row.revoked_at, row.revoked_by = now, str(actor)
                self._add_audit(session, AuditEntry(actor, TOKEN_ACTION, None, None, "ok",
                                                    f"revoked token '{name}' (role {row.role})"), now)
            return token_record(row)
