"""What the control API's client and server agree on: paths, headers, the error document, the stream.

Errors travel as one JSON document, `{"error": {"class": "NotFoundError", "message": "...",
"exit_code": 2}}`, with an HTTP status per class; the client re-raises the same core class, so the
CLI exits with the same code as if the core had raised it in-process. Operations that take time
(load, rollback, unload, tag) answer `application/x-ndjson`: one `{"progress": {...}}` line per step,
then one `{"result": {...}}` (the `--json` document) or one `{"error": {...}}` line.

It exists so the client never imports the server (FastAPI, uvicorn, the service, SQLAlchemy,
tritonclient), which a `tritonctl status` process must not pay for. Imports only the standard library
and `controlplane.errors`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from controlplane import errors
from controlplane.settings.config import private_file_problem

API_PREFIX = "/v1"
ACTOR_HEADER = "x-tritonctl-actor"  # who the caller says they are: audited as `claimed` beside the identity
TOKEN_HEADER = "authorization"
NDJSON = "application/x-ndjson"

# The HTTP status each core error class travels with (the first match wins); anything else is 409.
STATUS_FOR_ERROR: list[tuple[type[errors.TritonctlError], int]] = [
    (errors.NotFoundError, 404),
    (errors.ConflictError, 409),
    (errors.UsageError, 400),
    (errors.ConfigError, 400),
    (errors.ForbiddenError, 403),
    (errors.PermissionDeniedError, 401),
    (errors.TritonUnavailableError, 503),
]
DEFAULT_ERROR_STATUS = 409

# The CLI's exit code for each class (docs/cli.md "Exit codes"; cli/main.py uses this table).
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_DAEMON_UNREACHABLE = 3
EXIT_TRITON_UNREACHABLE = 4
EXIT_FORBIDDEN = 5  # the caller's role may not do this (HTTP 403)
EXIT_CODES: list[tuple[type[errors.TritonctlError], int]] = [
    (errors.DaemonUnavailableError, EXIT_DAEMON_UNREACHABLE),
    (errors.TritonUnavailableError, EXIT_TRITON_UNREACHABLE),
    (errors.ForbiddenError, EXIT_FORBIDDEN),
    (errors.UsageError, EXIT_USAGE),
    (errors.NotFoundError, EXIT_USAGE),  # an unknown model or digest
    (errors.ConfigError, EXIT_USAGE),
    (errors.MigrationError, EXIT_USAGE),  # nothing changed: the registry is as it was
]


def exit_code_for(exc: errors.TritonctlError) -> int:
    for cls, code in EXIT_CODES:
        if isinstance(exc, cls):
            return code
    return EXIT_FAILED


def status_for(exc: errors.TritonctlError) -> int:
    for cls, code in STATUS_FOR_ERROR:
        if isinstance(exc, cls):
            return code
    return DEFAULT_ERROR_STATUS


def error_document(exc: errors.TritonctlError) -> dict[str, Any]:
    """The one error shape of the API: the core class's name, its one-line message, the CLI's exit code."""
    return {"error": {"class": type(exc).__name__, "message": str(exc), "exit_code": exit_code_for(exc)}}


def error_from_document(document: Any, fallback: str) -> errors.TritonctlError:
    """The core error a server reported (unknown or missing class names: the root class)."""
    body = document.get("error") if isinstance(document, dict) else None
    if not isinstance(body, dict):
        return errors.TritonctlError(f"control API: {fallback}")
    name, message = str(body.get("class", "")), str(body.get("message", fallback))
    cls = getattr(errors, name, None)
    if isinstance(cls, type) and issubclass(cls, errors.TritonctlError):
        return cls(message)
    return errors.TritonctlError(message)


@dataclass(frozen=True)
class ProgressMessage:
    """One streamed step as the client sees it (the server's controlplane.documents.results.Progress)."""

    model: str
    step: str
    state: str
    message: str = ""
    digest: str = ""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProgressMessage:
        return cls(str(data.get("model", "")), str(data.get("step", "")), str(data.get("state", "")),
                   str(data.get("message", "")), str(data.get("digest", "")))


def read_token(path: os.PathLike[str] | str, private: bool = False) -> str:
    """The bearer token in `path`: at least 16 characters. `private` (the daemon's own token file): a regular
    file that other users cannot read and its group cannot change (as a webhook's secret file), or the
    daemon refuses to start."""
    try:
        with open(path, encoding="utf-8") as handle:
            mode = os.fstat(handle.fileno()).st_mode
            token = handle.read().strip()
    except OSError as exc:
        raise errors.ConfigError(f"token_file {path}: cannot read: {exc.strerror}") from None
    problem = private_file_problem(path, mode) if private else None
    if problem:  # as strict as a webhook's secret file: whoever changes it changes who may deploy
        raise errors.ConfigError(f"token_file {problem}")
    if len(token) < 16:
        raise errors.ConfigError(f"token_file {path}: the token must be at least 16 characters")
    return token
