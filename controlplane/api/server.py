"""The control API server: gRPC on a Unix socket (mode 0660), optionally on TCP with a token.

Translates requests into `ControlPlane` calls and results into messages; decides nothing. Core errors
travel as a gRPC status with the error's class name in trailing metadata, so the CLI re-raises the
same class and exits with the same code. The actor of every mutating call is the client's OS user
as declared in metadata (trusted on the socket, whose permissions are the boundary) or `token` on TCP.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import queue
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from typing import Any, cast

import grpc

from controlplane import errors, tags
from controlplane.api import control_pb2 as pb
from controlplane.api import control_pb2_grpc as pb_grpc
from controlplane.api.protocol import ACTOR_KEY, ERROR_CLASS_KEY, TOKEN_KEY, read_token, status_for
from controlplane.config import Settings
from controlplane.names import validate_model_name
from controlplane.results import Outcome, Progress, accepted
from controlplane.service import ControlPlane

log = logging.getLogger("tritonctl.api")

SOCKET_MODE = 0o660


def _abort(context: grpc.ServicerContext, exc: errors.TritonctlError) -> None:
    context.set_trailing_metadata(((ERROR_CLASS_KEY, type(exc).__name__),))
    context.abort(status_for(exc), str(exc))


def _actor(context: grpc.ServicerContext) -> str:
    metadata = dict(context.invocation_metadata())
    if metadata.get(TOKEN_KEY):
        return f"token:{metadata.get(ACTOR_KEY, 'unknown')}"[:64]
    return str(metadata.get(ACTOR_KEY) or "unknown")[:64]


def _progress_message(p: Progress) -> pb.Progress:
    return pb.Progress(model=p.model, step=p.step, state=p.state, message=p.message, digest=p.digest)


def _final(outcome: Outcome) -> pb.Progress:
    return pb.Progress(
        model=outcome.model,
        step="done",
        state="ok" if outcome.succeeded or outcome.outcome == "accepted" else "failed",
        message=outcome.message,
        digest=outcome.digest or "",
        final=True,
        outcome=outcome.outcome,
        result_json=json.dumps(outcome.to_json()),
    )


class ControlServicer(pb_grpc.ControlServicer):
    def __init__(self, plane: ControlPlane, executor: futures.Executor) -> None:
        self.plane = plane
        self.executor = executor

    def _stream(self, context: grpc.ServicerContext, run: Callable[[Callable[[Progress], None]], Outcome]
                ) -> Iterator[pb.Progress]:
        """Run an operation in a worker and stream its progress as it happens."""
        events: queue.Queue[pb.Progress | BaseException] = queue.Queue()

        def work() -> None:
            try:
                events.put(_final(run(lambda p: events.put(_progress_message(p)))))
            except BaseException as exc:  # noqa: BLE001 - handed to the RPC thread below
                events.put(exc)

        threading.Thread(target=work, name="api-op", daemon=True).start()
        while True:
            item = events.get()
            if isinstance(item, errors.TritonctlError):
                _abort(context, item)
                return
            if isinstance(item, BaseException):
                log.exception("operation failed unexpectedly", exc_info=item)
                context.abort(grpc.StatusCode.INTERNAL, f"internal error: {item}")
                return
            yield item
            if item.final:
                return

    def Load(self, request: pb.LoadRequest, context: grpc.ServicerContext) -> Iterator[pb.Progress]:
        actor = _actor(context)

        def run(progress: Callable[[Progress], None]) -> Outcome:
            if len(request.models) > 1:  # one change set (controlplane/changeset.py)
                if request.digest or request.host or request.tag:
                    raise errors.UsageError("--digest, --tag and --host take one MODEL, not a change set of several")
                return self.plane.load_set(list(request.models), actor, request.force, progress)
            digest = request.digest
            if request.tag:  # `load MODEL --tag NAME` (controlplane/tags.py)
                digest = tags.tag_digest(tags.tag_registry(self.plane), request.model, request.tag)
            return self.plane.load(request.model, actor, digest, request.force, progress, **_host(request))

        if not request.wait:
            try:
                for name in request.models or [request.model]:
                    validate_model_name(name)
            except errors.TritonctlError as exc:
                _abort(context, exc)
            def run_logged() -> None:
                try:
                    run(lambda p: None)
                except errors.TritonctlError as exc:  # nobody waits for it: the log and audit tell
                    log.error("%s: load (--no-wait) failed: %s", request.model, exc)

            self.executor.submit(run_logged)
            yield _final(accepted(request.model))
            return
        yield from self._stream(context, run)

    def Rollback(self, request: pb.RollbackRequest, context: grpc.ServicerContext) -> Iterator[pb.Progress]:
        actor = _actor(context)

        def run(progress: Callable[[Progress], None]) -> Outcome:
            to = request.to_digest
            if request.to_tag:  # `rollback MODEL --to-tag NAME` (controlplane/tags.py)
                to = tags.tag_digest(tags.tag_registry(self.plane), request.model, request.to_tag)
            return self.plane.rollback(request.model, actor, to, progress, request.force, **_host(request))

        yield from self._stream(context, run)

    def Unload(self, request: pb.UnloadRequest, context: grpc.ServicerContext) -> Iterator[pb.Progress]:
        actor = _actor(context)
        yield from self._stream(context, lambda progress: self.plane.unload(request.model, actor,
                                                                             request.dependents, progress,
                                                                             request.force, **_host(request)))

    def Tag(self, request: pb.TagRequest, context: grpc.ServicerContext) -> Iterator[pb.Progress]:
        actor = _actor(context)

        def run(progress: Callable[[Progress], None]) -> Outcome:
            result = tags.move(self.plane, request.model, request.name, request.digest, actor, progress,
                               delete=request.delete)
            return cast(Outcome, result)  # a TagResult: succeeded, model, outcome, message, digest, to_json

        yield from self._stream(context, run)

    def _reply(self, context: grpc.ServicerContext, fn: Callable[[], Any]) -> pb.JsonReply:
        try:
            result = fn()  # a controlplane.results dataclass (Ping: a plain dict)
            return pb.JsonReply(json=json.dumps(result.to_json() if hasattr(result, "to_json") else result))
        except errors.TritonctlError as exc:
            _abort(context, exc)
            raise AssertionError("unreachable") from exc

    def Status(self, request: pb.StatusRequest, context: grpc.ServicerContext) -> pb.JsonReply:
        return self._reply(context, lambda: self.plane.status(list(request.models) or None))

    def SetPolicy(self, request: pb.PolicyRequest, context: grpc.ServicerContext) -> pb.JsonReply:
        return self._reply(context, lambda: self.plane.set_policy(request.model, request.policy, _actor(context),
                                                                        **_host(request)))

    def SetPin(self, request: pb.PinRequest, context: grpc.ServicerContext) -> pb.JsonReply:
        return self._reply(context, lambda: self.plane.set_pin(request.model, request.pinned, _actor(context),
                                                                     **_host(request)))

    def Gc(self, request: pb.GcRequest, context: grpc.ServicerContext) -> pb.JsonReply:
        return self._reply(context, lambda: self.plane.gc(request.keep, _actor(context)))

    def Ping(self, request: pb.PingRequest, context: grpc.ServicerContext) -> pb.JsonReply:
        return self._reply(context, lambda: {"pid": os.getpid(), "triton_url": self.plane.triton.url})


def _host(request: Any) -> dict[str, str]:
    """`host=` for the plane only when the caller named one (fleet: act on that host alone)."""
    return {"host": request.host} if request.host else {}


class TokenInterceptor(grpc.ServerInterceptor):
    """Rejects every call on the TCP listener that lacks `authorization: Bearer <token>`."""

    def __init__(self, token: str) -> None:
        self._expected = f"Bearer {token}".encode()

        def deny(request: Any, context: grpc.ServicerContext) -> Any:
            context.set_trailing_metadata(((ERROR_CLASS_KEY, "PermissionDeniedError"),))
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong token")

        self._deny_unary = grpc.unary_unary_rpc_method_handler(deny)
        self._deny_stream = grpc.unary_stream_rpc_method_handler(deny)

    def intercept_service(self, continuation: Any, handler_call_details: Any) -> Any:
        metadata = dict(handler_call_details.invocation_metadata or ())
        given = str(metadata.get(TOKEN_KEY, "")).encode()
        if hmac.compare_digest(given, self._expected):
            return continuation(handler_call_details)
        streaming = handler_call_details.method.rsplit("/", 1)[-1] in ("Load", "Rollback", "Unload", "Tag")
        return self._deny_stream if streaming else self._deny_unary


class ApiServer:
    """The Unix-socket server and, with --listen, the token-protected TCP server."""

    def __init__(self, plane: ControlPlane, executor: futures.Executor, settings: Settings) -> None:
        self.plane = plane
        self.executor = executor
        self.settings = settings
        self.servers: list[grpc.Server] = []

    def _server(self, interceptors: tuple[grpc.ServerInterceptor, ...] = ()) -> grpc.Server:
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=16, thread_name_prefix="api"),
                             interceptors=interceptors)
        pb_grpc.add_ControlServicer_to_server(ControlServicer(self.plane, self.executor), server)
        return server

    def start(self) -> None:
        path = self.settings.socket_path
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() or path.is_symlink():
            path.unlink()
        old_umask = os.umask(0o117)  # the socket is born 0660: no window with wider permissions
        try:
            unix = self._server()
            unix.add_insecure_port(f"unix:{path}")
            unix.start()
        finally:
            os.umask(old_umask)
        os.chmod(path, SOCKET_MODE)
        self.servers.append(unix)
        if self.settings.listen:
            assert self.settings.token_file is not None
            token = read_token(self.settings.token_file)
            tcp = self._server((TokenInterceptor(token),))
            if tcp.add_insecure_port(self.settings.listen) == 0:
                raise errors.ConfigError(f"listen: cannot bind {self.settings.listen}")
            tcp.start()
            self.servers.append(tcp)

    def stop(self, grace_s: float = 1.0) -> None:
        for server in self.servers:
            server.stop(grace_s).wait(grace_s + 1)
        self.servers.clear()
        try:
            self.settings.socket_path.unlink()
        except FileNotFoundError:
            pass
