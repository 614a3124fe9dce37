"""A client facade over `tritonclient.grpc` with deadlines, bounded retries and the project's errors.

Every call carries a client timeout (a broken model can make Triton's load hang; see
shared/TRITON_NOTES.md "Traps"). Only transport failures (UNAVAILABLE, connection refused) are retried
with backoff; a refused model-repository call ("This protocol is restricted") is not a transport
failure. Triton's own message is kept in every error.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from controlplane.errors import PermissionDeniedError, TritonError, TritonTimeoutError, TritonUnavailableError
from controlplane.triton.launcher import RESTRICTED_HEADER

T = TypeVar("T")
DIGEST_PARAMETER = "tritonctl.digest"
_KEEPALIVE = grpcclient.KeepAliveOptions()
# tritonclient's own channel arguments (messages of any size, its keepalive defaults), and a subchannel of
# the channel's own: gRPC shares one connection per address among a process's channels, so a channel made
# after the server came up would inherit the reconnect backoff of one that tried while nothing listened,
# and fail fast with its stale "Connection refused" (a first start's verification, seen under load)
CHANNEL_ARGS = [("grpc.max_send_message_length", grpcclient.MAX_GRPC_MESSAGE_SIZE),
                ("grpc.max_receive_message_length", grpcclient.MAX_GRPC_MESSAGE_SIZE),
                ("grpc.keepalive_time_ms", _KEEPALIVE.keepalive_time_ms),
                ("grpc.keepalive_timeout_ms", _KEEPALIVE.keepalive_timeout_ms),
                ("grpc.keepalive_permit_without_calls", _KEEPALIVE.keepalive_permit_without_calls),
                ("grpc.http2.max_pings_without_data", _KEEPALIVE.http2_max_pings_without_data),
                ("grpc.use_local_subchannel_pool", 1)]


@dataclass(frozen=True)
class IndexEntry:
    """One row of Triton's repository index: a model version and its state."""

    name: str
    version: str
    state: str
    reason: str


@dataclass(frozen=True)
class RequestCounts:
    """Triton's cumulative figures of one model version: requests that succeeded, that failed (Triton's
    own count: an exception in a python model's `execute`, not an error response it returns), and the
    nanoseconds the successful ones took."""

    success: int
    failure: int
    success_ns: int


@dataclass(frozen=True)
class Timeouts:
    """Deadlines in seconds for each kind of call."""

    call_s: float = 5.0
    load_s: float = 120.0
    infer_s: float = 10.0


def _status_name(exc: InferenceServerException) -> str:
    status = exc.status() or ""
    return status.replace("StatusCode.", "")


def _message(exc: InferenceServerException) -> str:
    return " ".join((exc.message() or str(exc)).split())


def _is_transport_failure(exc: InferenceServerException) -> bool:
    return _status_name(exc) == "UNAVAILABLE" and "restricted" not in _message(exc)


class TritonClient:
    """tritonserver over gRPC. Thread-safe for concurrent calls (grpc channels are)."""

    def __init__(
        self,
        url: str,
        *,
        restricted_key: str | None = None,
        timeouts: Timeouts | None = None,
        retries: int = 2,
        backoff_s: float = 0.2,
    ) -> None:
        self.url = url
        self.timeouts = timeouts or Timeouts()
        self.retries = retries
        self.backoff_s = backoff_s
        self._headers = {f"triton-grpc-protocol-{RESTRICTED_HEADER}": restricted_key} if restricted_key else None
        self._client = grpcclient.InferenceServerClient(url, channel_args=CHANNEL_ARGS)
        self.load_requests = 0  # load requests sent (metric tritonctl_triton_load_requests)
        self._index_memo: tuple[bytes, list[IndexEntry]] | None = None  # the last index: its bytes, its list
        # each model's last successful load request, in seconds (a bake compares a digest's with the previous
        # digest's: controlplane/bake/warn.py)
        self.load_seconds: dict[str, float] = {}

    def close(self) -> None:
        self._client.close()

    def reconnect(self) -> None:
        """A fresh channel, for a server that has just started listening: the old one tried to connect
        while nothing listened, and gRPC's reconnect backoff made its next calls fail for seconds."""
        old, self._client = self._client, grpcclient.InferenceServerClient(self.url, channel_args=CHANNEL_ARGS)
        old.close()

    def _call(self, what: str, fn: Callable[[], T], retry: bool = True) -> T:
        attempts = self.retries + 1 if retry else 1
        for attempt in range(attempts):
            try:
                return fn()
            except InferenceServerException as exc:
                status, message = _status_name(exc), _message(exc)
                if _is_transport_failure(exc):
                    if attempt + 1 < attempts:
                        time.sleep(self.backoff_s * (2**attempt))
                        continue
                    raise TritonUnavailableError(
                        f"tritonserver at {self.url} unreachable ({what}): {message}", status
                    ) from exc
                if "restricted" in message:
                    raise PermissionDeniedError(f"tritonserver at {self.url} refused {what}: {message}") from exc
                if status == "DEADLINE_EXCEEDED" or "Deadline Exceeded" in message:
                    raise TritonTimeoutError(f"{what}: no answer within the deadline ({message})", status) from exc
                raise TritonError(f"{what}: {message}", status) from exc
        raise AssertionError("unreachable")

    # -- health ---------------------------------------------------------------------------------

    def server_live(self) -> bool:
        """True when the server answers; never raises."""
        try:
            return bool(self._client.is_server_live(client_timeout=self.timeouts.call_s))
        except Exception:  # noqa: BLE001 - any failure means "not live"
            return False

    # -- model repository -----------------------------------------------------------------------

    def load(self, model: str, timeout_s: float | None = None) -> None:
        deadline = timeout_s or self.timeouts.load_s
        self.load_requests += 1
        started = time.monotonic()
        self._call(
            f"load '{model}'",
            lambda: self._client.load_model(model, headers=self._headers, client_timeout=deadline),
            retry=False,  # a load is not idempotent in cost; the caller decides to try again
        )
        self.load_seconds[model] = time.monotonic() - started

    def unload(self, model: str, dependents: bool = False) -> None:
        self._call(
            f"unload '{model}'",
            lambda: self._client.unload_model(
                model, headers=self._headers, unload_dependents=dependents, client_timeout=self.timeouts.call_s
            ),
        )

    def index(self) -> list[IndexEntry]:
        """Triton's repository index. An index equal to the last one is the same list (shared: do not change it)."""
        data = self._call(
            "repository index",
            lambda: self._client.get_model_repository_index(
                headers=self._headers, client_timeout=self.timeouts.call_s
            ),
        )  # the message itself, not as_json: protobuf's pure-Python JSON printer was two thirds of this call
        raw = data.SerializeToString()  # in C: the same bytes, the same list (controlplane/deploy/servedview.py)
        memo = self._index_memo
        if memo is not None and memo[0] == raw:
            return memo[1]
        entries = [IndexEntry(m.name, m.version, m.state, m.reason) for m in data.models]
        self._index_memo = (raw, entries)
        return entries

    def ready_versions(self, model: str) -> list[str]:
        """Versions of `model` that Triton has READY: its metadata's versions, which list exactly the READY
        ones (measured on 2.51: a model not loaded, or unloaded, answers NOT_FOUND "has no available
        versions"). Not read out of the repository index: that lists every model of the repository, so a
        verify per deploy cost Triton and this process O(models) each, O(N²) over a start-up (issue 26)."""
        try:
            data = self._call(
                f"metadata of '{model}'",
                lambda: self._client.get_model_metadata(model, client_timeout=self.timeouts.call_s),
            )
        except TritonError as exc:
            if exc.status == "NOT_FOUND":  # not loaded: no version READY
                return []
            raise
        return sorted((str(v) for v in data.versions), key=lambda v: int(v) if v.isdigit() else -1)

    def version_ready(self, model: str, version: str = "") -> bool:
        return bool(
            self._call(
                f"readiness of '{model}'",
                lambda: self._client.is_model_ready(model, version, client_timeout=self.timeouts.call_s),
            )
        )

    def served_config(self, model: str) -> dict[str, Any]:
        data = self._call(
            f"config of '{model}'",
            lambda: self._client.get_model_config(model, as_json=True, client_timeout=self.timeouts.call_s),
        )
        return dict(data.get("config", {}))

    def served_digest(self, model: str) -> str | None:
        """The snapshot digest stamped into the config Triton serves (None if not stamped): read from the
        message itself, not its JSON form (protobuf's pure-Python printer of the whole config)."""
        data = self._call(
            f"config of '{model}'",
            lambda: self._client.get_model_config(model, client_timeout=self.timeouts.call_s),
        )
        params = data.config.parameters
        value = params[DIGEST_PARAMETER].string_value if DIGEST_PARAMETER in params else ""
        return str(value) if value else None

    def last_inferences(self, model: str = "") -> dict[str, float]:
        """model → its last inference (seconds since the epoch; 0: none yet), over every version, from
        Triton's inference statistics; `model` "" asks for every loaded model in one call."""
        data = self._call(
            "inference statistics",
            lambda: self._client.get_inference_statistics(model, client_timeout=self.timeouts.call_s),
        )  # the message itself: every loaded model's statistics through the pure-Python JSON printer is not free
        last: dict[str, float] = {}
        for row in data.model_stats:
            last[row.name] = max(last.get(row.name, 0.0), row.last_inference / 1000.0)
        return last

    def request_counts(self, model: str) -> dict[tuple[str, str], RequestCounts]:
        """(model, version) → Triton's cumulative request figures (its inference statistics) of `model` ("":
        every loaded model): successes, failures, and the time successful requests took. A reload or a
        restarted server starts them at 0."""
        data = self._call(
            "inference statistics",
            lambda: self._client.get_inference_statistics(model, client_timeout=self.timeouts.call_s),
        )
        counts: dict[tuple[str, str], RequestCounts] = {}
        for row in data.model_stats:
            if not model or row.name == model:
                stats = row.inference_stats
                counts[(row.name, row.version)] = RequestCounts(stats.success.count, stats.fail.count,
                                                                stats.success.ns)
        return counts

    # -- inference ------------------------------------------------------------------------------

    def infer(
        self,
        model: str,
        version: str,
        inputs: Sequence[tuple[str, str, np.ndarray]],
        output_names: Sequence[str],
        timeout_s: float | None = None,
    ) -> dict[str, np.ndarray]:
        """One inference: inputs as (name, datatype, array); returns the named outputs."""
        infer_inputs = []
        for name, datatype, array in inputs:
            tensor = grpcclient.InferInput(name, list(array.shape), datatype)
            tensor.set_data_from_numpy(array)
            infer_inputs.append(tensor)
        outputs = [grpcclient.InferRequestedOutput(name) for name in output_names] or None
        result = self._call(
            f"infer '{model}'",
            lambda: self._client.infer(
                model,
                infer_inputs,
                model_version=version,
                outputs=outputs,
                client_timeout=timeout_s or self.timeouts.infer_s,
            ),
            retry=False,
        )
        return {name: result.as_numpy(name) for name in output_names}

