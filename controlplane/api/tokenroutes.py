"""The personal tokens' routes: `POST /v1/tokens` (`token create`), `GET /v1/tokens` (`token list`),
`DELETE /v1/tokens/{name}` (`token revoke`), each for role admin.

Each route is one call of the daemon's `TokenBook` (controlplane/api/tokens.py), which writes to the
registry where tokens live (a fleet's shared one) and audits the creation and the revocation with the
caller as actor; the documents are controlplane/documents/access.py's.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Path, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from controlplane import errors
from controlplane.api.access import actor_of, needs
from controlplane.api.params import STRICT
from controlplane.api.protocol import API_PREFIX
from controlplane.api.tokens import MAX_EXPIRY_S, NAME_RE, TokenBook
from controlplane.base.clock import utcnow
from controlplane.documents.access import TokenCreated, TokenList, TokenRow
from controlplane.vocab import Role

NAME_PATTERN = NAME_RE.pattern


class TokenBody(BaseModel):
    model_config = STRICT

    name: Annotated[str, Field(pattern=NAME_PATTERN, max_length=58, description="the token's name: token:NAME")]
    role: Literal["viewer", "deployer", "admin"]
    expires_s: Annotated[float | None, Field(gt=0, le=MAX_EXPIRY_S, description="seconds until it expires; "
                                             "null: never")] = None


TokenName = Annotated[str, Path(pattern=NAME_PATTERN, max_length=58, description="a token's name")]


def token_routes(book: TokenBook | None) -> APIRouter:
    """`book` None: a daemon without a registry of tokens (a test's stand-in plane): 404."""
    router = APIRouter(prefix=f"{API_PREFIX}/tokens", tags=["tokens"])

    def tokens() -> TokenBook:
        if book is None:
            raise errors.NotFoundError("this daemon keeps no personal tokens")
        return book

    @router.post("", summary="token create: a personal token, shown once (the registry keeps a hash)",
                 **needs(Role.ADMIN))
    def create(body: TokenBody, request: Request) -> JSONResponse:
        record, token = tokens().create(body.name, body.role, actor_of(request), body.expires_s)
        return JSONResponse(TokenCreated(record, token, utcnow()).to_json())

    @router.get("", summary="token list: every token (never a secret), revoked and expired ones too",
                **needs(Role.ADMIN))
    def list_tokens() -> JSONResponse:
        return JSONResponse(TokenList(tokens().list(), utcnow()).to_json())

    @router.delete("/{name}", summary="token revoke: refused from now on (on every fleet host within liveness_s)",
                   **needs(Role.ADMIN))
    def revoke(name: TokenName, request: Request) -> JSONResponse:
        return JSONResponse(TokenRow(tokens().revoke(name, actor_of(request)), utcnow()).to_json())

    return router
