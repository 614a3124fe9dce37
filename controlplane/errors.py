"""The project's error classes.

Every failure a user can cause or meet is one of these, with a one-line message that names the file,
field or model involved. Adapters (store, triton, watcher) wrap third-party exceptions at their edge;
the CLI renders them in one place and maps each class to an exit code.
"""

from __future__ import annotations

import errno

# errnos that say the host, not a model's content, failed: out of descriptors, space, memory; an I/O error
ENVIRONMENT_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOSPC, errno.EDQUOT, errno.ENOMEM, errno.EIO})


class TritonctlError(Exception):
    """Root of every error tritonctl raises on purpose."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:  # one line, always
        return " ".join(self.message.split("\n")).strip()


class ConfigError(TritonctlError):
    """A setting (flag, environment variable, config file key) is invalid."""


class UsageError(TritonctlError):
    """The request itself is malformed: a bad model name, digest or path."""


class ConflictError(UsageError):
    """The request is well formed but the model's state refuses it now (it serves nothing to pin or tag, it
    has no valid content): the CLI's exit 2 like any usage error, HTTP 409 on the control API."""


class ModelConfigError(TritonctlError):
    """A model directory fails offline validation."""


class NotFoundError(TritonctlError):
    """A model, snapshot or digest that the request names does not exist."""


class SnapshotError(TritonctlError):
    """A model's content could not be captured (still changing, unreadable, on hold).

    Each refusal is a subclass; `retryable` says whether capturing again later can succeed without
    anyone fixing anything (the writer is not done yet), so callers reschedule instead of auditing a
    failure. Code that only needs "capture failed" keeps catching SnapshotError."""

    retryable: bool = False


class SnapshotChangingError(SnapshotError):
    """The content moved during the capture or the settle window (a writer is still at work)."""

    retryable = True


class SnapshotOnHoldError(SnapshotError):
    """The hold file is present: the writer asked tritonctl to wait."""

    retryable = True


class SnapshotAwaitingMarkerError(SnapshotError):
    """The commit marker is missing or older than the content: the writer has not committed yet."""

    retryable = True


class SnapshotSourceGoneError(SnapshotError):
    """The model directory (or its objects) is gone or is not a directory."""


class SnapshotUnreadableError(SnapshotError):
    """A file or directory of the model cannot be read (permissions, I/O error)."""


class SnapshotTooLargeError(SnapshotError):
    """config.pbtxt is over its size limit, or the model's files over `max_model_bytes`: refused before
    copying them."""


class SnapshotUnsupportedError(SnapshotError):
    """Content tritonctl refuses to capture: a symlink leaving the model or dangling, a directory
    loop, a fifo or device, an unsafe or clashing object key."""


class SnapshotEnvironmentError(SnapshotError):
    """The host, not the content, failed a capture or its validation: out of file descriptors (EMFILE,
    ENFILE), space (ENOSPC, EDQUOT) or memory (ENOMEM), or an I/O error (EIO). Tried again later, never
    recorded as the content's fault."""

    retryable = True


def is_environment_error(exc: BaseException) -> bool:
    """An OSError the host caused (ENVIRONMENT_ERRNOS), which must never be taken for bad content."""
    return isinstance(exc, OSError) and exc.errno in ENVIRONMENT_ERRNOS


def unreadable(message: str, exc: OSError) -> SnapshotError:
    """The error for a model file or directory that could not be read: SnapshotEnvironmentError (retried)
    when the host is at fault, SnapshotUnreadableError (reported) otherwise."""
    return SnapshotEnvironmentError(message) if is_environment_error(exc) else SnapshotUnreadableError(message)


class SnapshotStoreWriteError(SnapshotError):
    """The content store cannot be created or written (the state filesystem)."""


class SnapshotCorruptError(SnapshotError):
    """A stored manifest is malformed or does not hold the snapshot its name says."""


class SnapshotDigestError(SnapshotError):
    """A digest that is not 64 lowercase hex digits was asked of the store."""


class SnapshotCollectedError(SnapshotError):
    """The snapshot (or an object it needs) is no longer in the content store: gc collected it."""


class ObjectStoreError(SnapshotError):
    """S3-compatible object storage (a source repository or the fleet's shared store) refused or did
    not answer a request; `auth` when retrying cannot help (credentials, permissions, no such bucket)."""

    auth: bool = False


class MLflowError(ObjectStoreError):
    """An MLflow tracking server (an `mlflow+http://` source) refused or did not answer a request; `auth`
    when retrying cannot help (401/403), `missing` when it answered that the model or alias does not exist,
    `answered` when it answered at all (an HTTP error, not an unreachable server)."""

    missing: bool = False
    answered: bool = False


class StoreError(TritonctlError):
    """The registry database failed (locked, unreachable, out of space)."""


class MigrationError(StoreError):
    """A schema migration failed and changed nothing: the message names the migration and, for a SQLite
    registry, the copy taken before it (`backup`)."""

    def __init__(self, message: str, revision: str = "", backup: object = None) -> None:
        super().__init__(message)
        self.revision = revision
        self.backup = backup


class TritonError(TritonctlError):
    """tritonserver answered with an error; `status` is its gRPC status name."""

    def __init__(self, message: str, status: str = "") -> None:
        super().__init__(message)
        self.status = status


class TritonUnavailableError(TritonError):
    """tritonserver cannot be reached (not started, crashed, wrong address)."""


class TritonTimeoutError(TritonError):
    """tritonserver did not answer within the call's deadline."""


class LauncherError(TritonctlError):
    """The embedded tritonserver could not be found, assembled or started."""


class StateDirInUseError(ConfigError):
    """Another daemon runs on this state directory (its lock file is held): a start-up refusal like a bad
    setting, exit 2 (docs/cli.md "Exit codes")."""


class DeployError(TritonctlError):
    """A deploy failed; `outcome` is 'failed' or 'rolled_back', `cause` whose fault it was (the value of
    controlplane.vocab.Cause: 'content', 'environment', 'triton_unreachable'; '' when not known)."""

    def __init__(self, message: str, outcome: str = "failed", cause: str = "") -> None:
        super().__init__(message)
        self.outcome = outcome
        self.cause = cause


class DaemonUnavailableError(TritonctlError):
    """The CLI cannot reach the daemon's control API."""


class PermissionDeniedError(TritonctlError):
    """The control API does not know the caller: no token, or a wrong, expired or revoked one (HTTP 401)."""


class ForbiddenError(PermissionDeniedError):
    """The control API knows the caller, whose role may not do this (HTTP 403): the message names the role
    needed and the caller's (docs/operations.md "Identities and roles")."""


class EnvironmentFault(TritonctlError):
    """A failure that is not the content's fault: the tritonserver is unreachable or restarting, a
    backend or GPU the model needs is missing on that server, an ensemble member is not loaded, the
    content was collected, the state filesystem is full. A deploy that ends with one is `failed` and
    retried later; its digest is never quarantined."""


class BudgetError(EnvironmentFault):
    """A deploy would exceed this host's memory budget and eviction cannot make room (controlplane/memory/budget.py):
    `failed`, retried when room appears."""


class SmokeError(TritonctlError):
    """A deploy's smoke requests (smoke.json) failed by themselves: a wrong answer, or a failure no other request
    shared (controlplane/deploy/smoke.py). Rolled back and held back, cause `smoke`: the content validates, so
    `status` says its smoke test failed, never that it is invalid."""


class SmokeSharedError(EnvironmentFault):
    """A deploy's smoke requests failed only in batches where other requests failed too, while other requests
    passed meanwhile (issue 57: a client's request that fails its whole dynamic batch). Nothing shows the content
    at fault: rolled back, never quarantined, cause `smoke_shared`, retried with backoff."""


class HostCapabilityError(EnvironmentFault):
    """The target tritonserver lacks what the model needs (a backend, a GPU): found before the load."""


class GatewayError(EnvironmentFault):
    """The gateway (controlplane/gateway/, the data path in front of tritonserver) cannot be reached over its
    control socket, refused a request (`update` with invalid routes) or answered out of protocol: nothing was
    switched, what it routed before still answers (an environment fault: retried)."""


class TagError(UsageError):
    """A tag request is refused: a bad tag name, a tag on invalid or collected content, an unknown tag
    (exit 2, like every UsageError)."""
