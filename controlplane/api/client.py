"""The control API client the CLI uses: one method per RPC, core errors re-raised by class name."""

from __future__ import annotations

import getpass
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc

from controlplane import errors
from controlplane.api import control_pb2 as pb
from controlplane.api import control_pb2_grpc as pb_grpc
from controlplane.api.protocol import ACTOR_KEY, ERROR_CLASS_KEY, TOKEN_KEY, error_from_name


def _current_user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no passwd entry (containers): fall back to the uid
        import os

        return f"uid:{os.getuid()}"


class ControlClient:
    """Talks to a daemon on a Unix socket path or, with a token, on HOST:PORT."""

    def __init__(self, socket: Path | None = None, address: str | None = None, token: str | None = None,
                 timeout_s: float = 600.0) -> None:
        if address:
            if not token:
                raise errors.UsageError("--address needs --token-file (the TCP listener requires a token)")
            self.target = address
        else:
            assert socket is not None
            self.target = f"unix:{socket}"
        self._socket = socket
        self.timeout_s = timeout_s
        self._metadata: list[tuple[str, str]] = [(ACTOR_KEY, _current_user())]
        if token:
            self._metadata.append((TOKEN_KEY, f"Bearer {token}"))
        self._channel = grpc.insecure_channel(self.target)
        self._stub = pb_grpc.ControlStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def _translate(self, exc: grpc.RpcError) -> errors.TritonctlError:
        trailing = dict(exc.trailing_metadata() or ())  # type: ignore[attr-defined]
        name = trailing.get(ERROR_CLASS_KEY)
        details = exc.details() or str(exc)  # type: ignore[attr-defined]
        if name:
            return error_from_name(str(name), details)
        code = exc.code()  # type: ignore[attr-defined]
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            where = self._socket if self._socket else self.target
            if self._socket:
                return errors.DaemonUnavailableError(
                    f"no daemon at {where}; start one (`tritonctl daemon`) or set TRITONCTL_STATE_DIR / --state-dir")
            return errors.DaemonUnavailableError(f"no daemon at {where}; start one (`tritonctl daemon --listen`) "
                                                 "or fix TRITONCTL_ADDRESS / --address")
        if code == grpc.StatusCode.UNAUTHENTICATED:
            return errors.PermissionDeniedError(details)
        return errors.TritonctlError(f"control API: {details}")

    def _unary(self, method: Callable[..., pb.JsonReply], request: Any, timeout_s: float = 30.0) -> Any:
        try:
            reply = method(request, metadata=self._metadata, timeout=timeout_s)
        except grpc.RpcError as exc:
            raise self._translate(exc) from None
        return json.loads(reply.json)

    def _stream(self, method: Callable[..., Iterator[pb.Progress]], request: Any,
                on_progress: Callable[[pb.Progress], None] | None) -> dict[str, Any]:
        try:
            for message in method(request, metadata=self._metadata, timeout=self.timeout_s):
                if message.final:
                    return dict(json.loads(message.result_json))
                if on_progress:
                    on_progress(message)
        except grpc.RpcError as exc:
            raise self._translate(exc) from None
        raise errors.TritonctlError("control API: the stream ended without an outcome")

    def ping(self) -> dict[str, Any]:
        return dict(self._unary(self._stub.Ping, pb.PingRequest(), timeout_s=5.0))

    def load(self, model: str, digest: str = "", force: bool = False, wait: bool = True,
             on_progress: Callable[[pb.Progress], None] | None = None, host: str = "", tag: str = "",
             models: list[str] | None = None) -> dict[str, Any]:
        request = pb.LoadRequest(model=model, digest=digest, force=force, wait=wait, host=host, tag=tag,
                                 models=models or [])
        return self._stream(self._stub.Load, request, on_progress)

    def rollback(self, model: str, to_digest: str = "",
                 on_progress: Callable[[pb.Progress], None] | None = None, force: bool = False,
                 host: str = "", to_tag: str = "") -> dict[str, Any]:
        request = pb.RollbackRequest(model=model, to_digest=to_digest, force=force, host=host, to_tag=to_tag)
        return self._stream(self._stub.Rollback, request, on_progress)

    def unload(self, model: str, dependents: bool = False,
               on_progress: Callable[[pb.Progress], None] | None = None, force: bool = False,
               host: str = "") -> dict[str, Any]:
        request = pb.UnloadRequest(model=model, dependents=dependents, force=force, host=host)
        return self._stream(self._stub.Unload, request, on_progress)

    def status(self, models: list[str] | None = None) -> dict[str, Any]:
        return dict(self._unary(self._stub.Status, pb.StatusRequest(models=models or [])))

    def set_policy(self, model: str, policy: str, host: str = "") -> dict[str, Any]:
        return dict(self._unary(self._stub.SetPolicy, pb.PolicyRequest(model=model, policy=policy, host=host)))

    def set_pin(self, model: str, pinned: bool, host: str = "") -> dict[str, Any]:
        return dict(self._unary(self._stub.SetPin, pb.PinRequest(model=model, pinned=pinned, host=host)))

    def gc(self, keep: int) -> dict[str, Any]:
        return dict(self._unary(self._stub.Gc, pb.GcRequest(keep=keep), timeout_s=600.0))

    def tag(self, model: str, name: str, digest: str = "", delete: bool = False,
            on_progress: Callable[[pb.Progress], None] | None = None) -> dict[str, Any]:
        request = pb.TagRequest(model=model, name=name, digest=digest, delete=delete)
        return self._stream(self._stub.Tag, request, on_progress)
