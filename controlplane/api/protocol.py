"""What the control API's client and server agree on, apart from the messages in control.proto.

The metadata keys, how core error classes travel (class name in trailing metadata, a gRPC status code)
and how a token file is read. It exists so the client never imports the server: the server pulls in the
service, the deploy code, SQLAlchemy and tritonclient, which a `tritonctl status` process must not pay
for. Imports only the standard library, `grpc` and `controlplane.errors`.
"""

from __future__ import annotations

import os

import grpc

from controlplane import errors

ACTOR_KEY = "x-tritonctl-actor"
TOKEN_KEY = "authorization"
ERROR_CLASS_KEY = "tritonctl-error-class"

# The gRPC status a core error class travels with; anything else is ABORTED.
STATUS_FOR_ERROR: list[tuple[type[errors.TritonctlError], grpc.StatusCode]] = [
    (errors.NotFoundError, grpc.StatusCode.NOT_FOUND),
    (errors.UsageError, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.PermissionDeniedError, grpc.StatusCode.PERMISSION_DENIED),
    (errors.TritonUnavailableError, grpc.StatusCode.FAILED_PRECONDITION),
]


def status_for(exc: errors.TritonctlError) -> grpc.StatusCode:
    for cls, code in STATUS_FOR_ERROR:
        if isinstance(exc, cls):
            return code
    return grpc.StatusCode.ABORTED


def error_from_name(name: str, details: str) -> errors.TritonctlError:
    """The core error a server reported by class name (unknown names: the root class)."""
    cls = getattr(errors, name, None)
    if isinstance(cls, type) and issubclass(cls, errors.TritonctlError):
        return cls(details)
    return errors.TritonctlError(details)


def read_token(path: os.PathLike[str] | str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            token = handle.read().strip()
    except OSError as exc:
        raise errors.ConfigError(f"token_file {path}: cannot read: {exc.strerror}") from None
    if len(token) < 16:
        raise errors.ConfigError(f"token_file {path}: the token must be at least 16 characters")
    return token
