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

import errno
import os
import stat
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
    """The bearer token in `path`: at least 16 characters, in a regular file (a FIFO is refused, never waited
    on: it is opened non-blocking and checked on the open file). `private` (the daemon's own token file): not a
    symbolic link either, owned by the daemon's user or root, and neither open to others nor writable by its
    group (as a webhook's secret file), or the daemon refuses to start (issue 58, item 7)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (os.O_NOFOLLOW if private else 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP and private:
            raise errors.ConfigError(f"token_file {path}: is a symbolic link; give the file itself") from None
        raise errors.ConfigError(f"token_file {path}: cannot read: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise errors.ConfigError(f"token_file {path}: is a {_kind(info.st_mode)}, not a regular file")
        if private:
            _check_private(path, info)
        data = os.read(fd, MAX_TOKEN_BYTES + 1)
    except OSError as exc:
        raise errors.ConfigError(f"token_file {path}: cannot read: {exc.strerror}") from None
    finally:
        os.close(fd)
    token = data.decode("utf-8", "replace").strip()
    if len(data) > MAX_TOKEN_BYTES:
        raise errors.ConfigError(f"token_file {path}: over {MAX_TOKEN_BYTES} bytes: not a token")
    if len(token) < 16:
        raise errors.ConfigError(f"token_file {path}: the token must be at least 16 characters")
    return token


MAX_TOKEN_BYTES = 4096


def _check_private(path: os.PathLike[str] | str, info: os.stat_result) -> None:
    """The daemon's token file: its owner (whoever owns it decides who may deploy) and its mode."""
    if info.st_uid not in (os.geteuid(), 0):
        raise errors.ConfigError(f"token_file {path}: owned by uid {info.st_uid} ({_user(info.st_uid)}), not by the "
                                 f"daemon's user ({_user(os.geteuid())}) or root; chown {_user(os.geteuid())} {path}")
    problem = private_file_problem(path, info.st_mode)
    if problem:  # as strict as a webhook's secret file: whoever changes it changes who may deploy
        raise errors.ConfigError(f"token_file {problem}")


def _user(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "FIFO"), (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device"), (stat.S_ISDIR, "directory")):
        if test(mode):
            return name
    return "special file"
