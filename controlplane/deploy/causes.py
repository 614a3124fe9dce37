"""Whose fault a failed deploy is: the content's (quarantine it) or the environment's (retry later).

Quarantine is for content Triton refused: initialize raised, the config was rejected, READY never
came (cause `content`), or its own smoke requests failed (cause `smoke`: a wrong answer, or a failure
no other request shared). A smoke request that failed only in batches other requests failed too is
nobody's proven fault (cause `smoke_shared`, issue 57): retried like an environment fault. Everything
else that can end a deploy (tritonserver unreachable or restarting, a backend missing on that server,
an ensemble member not loaded, content collected by gc, the state filesystem full, or any
`EnvironmentFault` raised by other code) says nothing about the content: the deploy ends `failed` and
is retried with a capped exponential backoff (`RetryBook`). A restore (reconcile: Triton does not serve
what the registry says) that keeps failing backs off the same way, in a book of its own, so `status`
says why and when it is tried again.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace

from controlplane.errors import EnvironmentFault, SmokeError, SmokeSharedError, TritonUnavailableError
from controlplane.vocab import Cause

# Substrings of Triton's (or the OS's) messages that name an environment fault, with a short cause.
_ENVIRONMENT_PATTERNS: tuple[tuple[str, str], ...] = (
    ("unable to find backend library", "a backend is missing on this tritonserver"),
    ("unable to find backend", "a backend is missing on this tritonserver"),
    ("has no loaded version", "an ensemble member is not loaded"),
    ("contains models that are not available", "an ensemble member is not loaded"),
    ("which is not loaded", "an ensemble member is not loaded"),
    ("unknown snapshot", "the content was collected by gc"),
    ("is missing from the store", "the content was collected by gc"),
    ("no space left on device", "the state filesystem is full"),
    ("database or disk is full", "the state filesystem is full"),
    ("server is shutting down", "tritonserver is restarting"),
    ("connection refused", "tritonserver is unreachable"),
    ("failed to connect", "tritonserver is unreachable"),
)

SMOKE_SHARED_REASON = "its smoke requests failed only in batches other requests failed too"
RETRY_BASE_S = 5.0
RETRY_CAP_S = 300.0


def environment_cause(exc: BaseException) -> str | None:
    """A short cause when `exc` is not the content's fault; None when it is (quarantine it)."""
    if isinstance(exc, TritonUnavailableError):
        return "tritonserver is unreachable"
    if isinstance(exc, SmokeSharedError):
        return SMOKE_SHARED_REASON
    if isinstance(exc, SmokeError):
        return None
    if isinstance(exc, EnvironmentFault):
        return "environment fault"
    text = str(exc).lower()
    for pattern, cause in _ENVIRONMENT_PATTERNS:
        if pattern in text:
            return cause
    return None


@dataclass(frozen=True)
class Fault:
    """Whose fault one failure is, decided once where it is caught (it travels on the Outcome)."""

    cause: Cause  # CONTENT, ENVIRONMENT or TRITON_UNREACHABLE
    reason: str | None  # the environment's short cause; None for the content's fault


def classify(exc: BaseException) -> Fault:
    """The rule above as a value: an unreachable tritonserver, another environment fault, or the content."""
    reason = environment_cause(exc)
    if isinstance(exc, TritonUnavailableError):
        return Fault(Cause.TRITON_UNREACHABLE, reason)
    if isinstance(exc, SmokeSharedError):
        return Fault(Cause.SMOKE_SHARED, reason)
    if isinstance(exc, SmokeError):
        return Fault(Cause.SMOKE, None)
    return Fault(Cause.CONTENT, None) if reason is None else Fault(Cause.ENVIRONMENT, reason)


def backoff_s(attempt: int, base_s: float = RETRY_BASE_S, cap_s: float = RETRY_CAP_S) -> float:
    """Delay before retry number `attempt` (1, 2, ...): base, 2·base, 4·base ... capped."""
    return float(min(cap_s, base_s * (2 ** max(0, attempt - 1))))


@dataclass(frozen=True)
class Retry:
    """A model whose last deploy failed for an environment fault, and when it is tried again."""

    model: str
    digest: str
    reason: str
    attempt: int
    due_at: float  # time.time()
    action: str = "deploy"  # what failed and is retried: deploy, or restore (reconcile)

    def seconds_left(self, now: float | None = None) -> int:
        return max(0, int(round(self.due_at - (now if now is not None else time.time()))))


class RetryBook:
    """The retries the daemon owes (in memory: a restart re-checks every model anyway)."""

    def __init__(self, base_s: float = RETRY_BASE_S, cap_s: float = RETRY_CAP_S) -> None:
        self.base_s = base_s
        self.cap_s = cap_s
        self._retries: dict[str, Retry] = {}
        self._lock = threading.Lock()

    def failed(self, model: str, digest: str, reason: str, action: str = "deploy") -> Retry:
        with self._lock:
            previous = self._retries.get(model)
            attempt = previous.attempt + 1 if previous is not None and previous.digest == digest else 1
            retry = Retry(model, digest, reason, attempt, time.time() + backoff_s(attempt, self.base_s, self.cap_s),
                          action)
            self._retries[model] = retry
            return retry

    def clear(self, model: str) -> None:
        with self._lock:
            self._retries.pop(model, None)

    def get(self, model: str) -> Retry | None:
        with self._lock:
            return self._retries.get(model)

    def all(self) -> dict[str, Retry]:
        with self._lock:
            return dict(self._retries)

    def due(self, now: float | None = None) -> list[Retry]:
        moment = now if now is not None else time.time()
        with self._lock:
            return sorted((r for r in self._retries.values() if r.due_at <= moment), key=lambda r: r.model)

    def take_due(self, now: float | None = None) -> list[Retry]:
        """The retries due now, each taken: not due again until its outcome records the next (`failed`) or
        ends it (`clear`), or, should none come, after the longest wait (`cap_s`). The daemon asks every
        supervision round (a second), so a retry fires when the log said, and a slow one is not sent twice."""
        moment = now if now is not None else time.time()
        with self._lock:
            due = sorted((r for r in self._retries.values() if r.due_at <= moment), key=lambda r: r.model)
            for retry in due:
                self._retries[retry.model] = replace(retry, due_at=moment + self.cap_s)
            return due
