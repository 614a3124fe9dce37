"""The control API's routes: HTTP/JSON under /v1, one resource per noun, each a call of the service.

Translates requests into `ControlPlane` calls and results into the `--json` documents of
controlplane/documents/results.py; decides nothing. Core errors become the one error document of
controlplane/api/protocol.py with an HTTP status per class. Operations that take time (load,
rollback, unload, tag moves) answer NDJSON: each step as it happens, then the result. Who acts is
`scope["tritonctl.actor"]`, set by the listener (the socket peer's OS user, or `token:NAME` on TCP;
controlplane/api/server.py). Readiness and the event stream are controlplane/api/health.py and
controlplane/api/stream.py.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
from collections.abc import Callable, Iterator, Mapping
from concurrent import futures
from typing import Annotated, Any, Literal

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException

from controlplane import errors
from controlplane.api.access import ROLE_KEY, actor_of, check_roles, needs
from controlplane.api.leases import lease_routes
from controlplane.api.params import (
    STRICT,
    TRACK_TAKES_NO_HOST,
    BakeSeconds,
    DigestField,
    KeepField,
    LimitQuery,
    ModelField,
    ModelPath,
    ModelQuery,
    ModelsQuery,
    OutcomeQuery,
    PolicyField,
    RefField,
    RefQuery,
    ShadowSeconds,
    TagField,
    TagPath,
    TimeQuery,
)
from controlplane.api.protocol import API_PREFIX, NDJSON, error_document, status_for
from controlplane.base import jsontext
from controlplane.control_plane import ControlPlane
from controlplane.documents.results import Outcome, Progress, accepted
from controlplane.names import validate_digest, validate_model_name
from controlplane.views import queries
from controlplane.vocab import Role

log = logging.getLogger("tritonctl.api")

OPENAPI_PATH = f"{API_PREFIX}/openapi.json"
ERROR_SCHEMA = {
    "type": "object", "required": ["error"],
    "properties": {"error": {"type": "object", "required": ["class", "message", "exit_code"], "properties": {
        "class": {"type": "string", "description": "the core error class (controlplane/errors.py)"},
        "message": {"type": "string", "description": "one line naming the model, file or field"},
        "exit_code": {"type": "integer", "description": "what the CLI exits with (README \"Exit codes\")"}}}},
}
# Each route's result: the JSON Schema published for the CLI's --json document (docs/schemas/NAME.schema.json,
# relative to docs/openapi.json), and whether it comes as one JSON document or as the last line of NDJSON.
_P = API_PREFIX
RESULT_SCHEMAS: dict[tuple[str, str], tuple[str, str]] = {
    (f"{_P}/models", "get"): ("status|status-fleet", "application/json"),
    (f"{_P}/models/{{model}}", "get"): ("status", "application/json"),
    (f"{_P}/models/{{model}}/load", "post"): ("load", NDJSON),
    (f"{_P}/changesets", "post"): ("load", NDJSON),
    (f"{_P}/models/{{model}}/rollback", "post"): ("load", NDJSON),
    (f"{_P}/models/{{model}}/unload", "post"): ("load", NDJSON),
    (f"{_P}/models/{{model}}/policy", "put"): ("policy", "application/json"),
    (f"{_P}/models/{{model}}/pin", "put"): ("pin", "application/json"),
    (f"{_P}/models/{{model}}/pin", "delete"): ("pin", "application/json"),
    (f"{_P}/gc", "post"): ("gc", "application/json"),
    (f"{_P}/models/{{model}}/versions", "get"): ("versions", "application/json"),
    (f"{_P}/models/{{model}}/diff", "get"): ("diff", "application/json"),
    (f"{_P}/audit", "get"): ("audit|audit-at", "application/json"),
    (f"{_P}/tags", "get"): ("tags", "application/json"),
    (f"{_P}/models/{{model}}/tags/{{name}}", "put"): ("tag", NDJSON),
    (f"{_P}/models/{{model}}/tags/{{name}}", "delete"): ("tag", NDJSON),
    (f"{_P}/hosts", "get"): ("hosts", "application/json"),
    (f"{_P}/rollouts", "get"): ("rollouts", "application/json"),
    (f"{_P}/webhooks/deliveries", "get"): ("webhooks", "application/json"),
    (f"{_P}/models/{{model}}/lease", "post"): ("lease", "application/json"),
    (f"{_P}/models/{{model}}/lease/{{lease}}", "put"): ("lease", "application/json"),
    (f"{_P}/models/{{model}}/lease/{{lease}}", "delete"): ("lease", "application/json"),
    (f"{_P}/webhooks/deliveries/{{delivery_id}}/redeliver", "post"): ("webhooks-redeliver", "application/json"),
    (f"{_P}/tokens", "post"): ("token-create", "application/json"),
    (f"{_P}/tokens", "get"): ("token-list", "application/json"),
    (f"{_P}/tokens/{{name}}", "delete"): ("token-revoke", "application/json"),
}
# Who may call what (controlplane/api/access.py): on TCP a bearer, on the socket the peer's uid and groups.
SECURITY_SCHEMES = {"bearer": {
    "type": "http", "scheme": "bearer",
    "description": "On TCP (--listen): a personal token (tritonctl token create), the shared token of token_file "
                   "or an OIDC JWT. On the Unix socket none: the peer's uid and groups (SO_PEERCRED) are the "
                   "identity. Each operation's x-tritonctl-role is the role it needs (viewer < deployer < admin)."}}
UNAUTHENTICATED = "No token, or a wrong, expired or revoked one (TCP)"
FORBIDDEN = "The caller's role may not do this: it needs role {role} (the CLI exits 5)"
CHOSEN_BY = {"status|status-fleet": "?fleet=true", "audit|audit-at": "?at="}  # the query that picks the second
DESCRIPTION = (
    "The daemon's control API: what every `tritonctl` verb calls. Errors: "
    '`{"error": {"class", "message", "exit_code"}}` (the core error class and the CLI\'s exit code). '
    "Long operations answer `application/x-ndjson`: `{\"progress\": ...}` lines, then `{\"result\": ...}` "
    "or `{\"error\": ...}`."
)


CanarySteps = Annotated[
    list[Annotated[int, Field(ge=1, le=100)] | Literal["pause"]] | None,
    Field(min_length=1, max_length=100, description="Percents of the requests, rising to 100; `pause` waits for "
          "`tritonctl promote`, e.g. [10, 100] or [5, \"pause\", 25, 100]")]


class LoadBody(BaseModel):
    model_config = STRICT

    digest: DigestField = ""  # empty: snapshot the source now
    tag: TagField = ""  # deploy what this tag points to
    force: bool = False  # retry a quarantined digest / reload the active one
    wait: bool = True  # false: answer once accepted
    host: str = ""  # fleet: this host only (it is then held)
    bake_s: BakeSeconds = None  # this deploy's bake in seconds (0: none); unset: the daemon's bake_s
    # this deploy's canary steps (percents rising to 100, "pause"); unset: the model's or the daemon's canary_steps.
    # That they rise to 100 is a rule JSON Schema cannot say: a 400 names it (controlplane/settings/canarysteps.py)
    steps: CanarySteps = None
    # this deploy's shadow in seconds before its first canary step (0: none); unset: the daemon's shadow_s
    shadow_s: ShadowSeconds = None


class ChangeSetBody(BaseModel):
    model_config = STRICT

    models: Annotated[list[ModelField], Field(min_length=1)]
    force: bool = False
    wait: bool = True


class RollbackBody(BaseModel):
    model_config = STRICT

    to: DigestField = ""  # empty: the previous good digest
    to_tag: TagField = ""
    force: bool = False  # roll back a pinned model anyway
    host: str = ""


class UnloadBody(BaseModel):
    model_config = STRICT

    dependents: bool = False
    force: bool = False  # unload a member a serving ensemble needs
    host: str = ""


class PolicyBody(BaseModel):
    model_config = ConfigDict(strict=True, json_schema_extra=TRACK_TAKES_NO_HOST)

    policy: PolicyField  # auto | manual | ondemand | inherit | track:TAG
    host: str = ""


class PinBody(BaseModel):
    model_config = STRICT

    host: str = ""


class GcBody(BaseModel):
    model_config = STRICT

    keep: KeepField = 10


class TagBody(BaseModel):
    model_config = STRICT

    digest: RefField = ""  # a digest (prefix) or another tag; empty: what serves now


class _JSONResponse(JSONResponse):
    """Starlette's JSONResponse, its text written by controlplane/base/jsontext.py (the same bytes, faster:
    `status` of 10,000 models)."""

    def render(self, content: Any) -> bytes:
        return jsontext.dumps(content, compact=True).encode("utf-8")


def _json(result: Any, status_code: int = 200) -> JSONResponse:
    return _JSONResponse(result.to_json() if hasattr(result, "to_json") else result, status_code=status_code)


def _line(kind: str, body: Any) -> bytes:
    return (json.dumps({kind: body}, ensure_ascii=False) + "\n").encode()


def _progress_json(p: Progress) -> dict[str, str]:
    return {"model": p.model, "step": p.step, "state": p.state, "message": p.message, "digest": p.digest}


def stream_operation(run: Callable[[Callable[[Progress], None]], Outcome]) -> Response:
    """Run an operation in a thread of its own and answer its steps as NDJSON as they happen.

    A refusal before the first step (an unknown model, a bad digest) answers as a plain error with its
    HTTP status; once steps flowed, an error is the stream's last line."""
    items: queue.Queue[Progress | Outcome | BaseException] = queue.Queue()

    def work() -> None:
        try:
            items.put(run(items.put))
        except BaseException as exc:  # noqa: BLE001 - handed to the response below
            items.put(exc)

    threading.Thread(target=work, name="api-op", daemon=True).start()
    first = items.get()
    if isinstance(first, errors.TritonctlError):
        return JSONResponse(error_document(first), status_code=status_for(first))
    if isinstance(first, BaseException):
        raise first

    def lines() -> Iterator[bytes]:
        item: Progress | Outcome | BaseException = first
        while True:
            if isinstance(item, Progress):
                yield _line("progress", _progress_json(item))
            elif isinstance(item, errors.TritonctlError):
                yield _line("error", error_document(item)["error"])
                return
            elif isinstance(item, BaseException):
                log.error("operation failed unexpectedly", exc_info=item)
                yield _line("error", error_document(errors.TritonctlError(f"internal error: {item}"))["error"])
                return
            else:
                yield _line("result", item.to_json())
                return
            item = items.get()

    return StreamingResponse(lines(), media_type=NDJSON)


def _host(host: str) -> dict[str, str]:
    """`host=` for the plane only when the caller named one (fleet: act on that host alone)."""
    return {"host": host} if host else {}


def models_routes(plane: ControlPlane, executor: futures.Executor) -> APIRouter:
    """/v1/models, /v1/changesets, /v1/gc: status and the operations on models."""
    router = APIRouter(prefix=API_PREFIX)

    @router.get("/models", tags=["models"], summary="status: every model (or those named by ?model=); ?fleet=true: "
                "the fleet's model x host matrix (status --fleet)", **needs(Role.VIEWER))
    def list_models(model: ModelsQuery = [], fleet: bool = False) -> JSONResponse:  # noqa: B006
        if fleet:
            return _json(fleet_matrix(plane, model))
        return _json(plane.status(model or None))

    @router.get("/models/{model}", tags=["models"], summary="status of one model", **needs(Role.VIEWER))
    def get_model(model: ModelPath) -> JSONResponse:
        return _json(plane.status([model]))

    def submit(names: list[str], run: Callable[[Callable[[Progress], None]], Outcome]) -> Response:
        """`load --no-wait`: validated now, run by the daemon's executor, answered `accepted` at once."""
        for name in names:
            validate_model_name(name)

        def run_logged() -> None:
            try:
                run(lambda p: None)
            except errors.TritonctlError as exc:  # nobody waits for it: the log and the audit tell
                log.error("%s: load (--no-wait) failed: %s", names[0], exc)

        executor.submit(run_logged)
        return StreamingResponse(iter([_line("result", accepted(names[0]).to_json())]), media_type=NDJSON)

    @router.post("/models/{model}/load", tags=["models"], summary="load: deploy (NDJSON steps, then the outcome)",
                 **needs(Role.DEPLOYER))
    def load(model: ModelPath, request: Request, body: LoadBody | None = None) -> Response:
        body, actor = body or LoadBody(), actor_of(request)

        def run(progress: Callable[[Progress], None]) -> Outcome:
            digest = plane.tag_digest(model, body.tag) if body.tag else body.digest
            return plane.load(model, actor, digest, body.force, progress, **_host(body.host), bake_s=body.bake_s,
                              steps=body.steps, shadow_s=body.shadow_s)

        return stream_operation(run) if body.wait else submit([model], run)

    @router.post("/changesets", tags=["models"], summary="load of several models as one change set (NDJSON)",
                 **needs(Role.DEPLOYER))
    def load_set(body: ChangeSetBody, request: Request) -> Response:
        actor = actor_of(request)

        def run(progress: Callable[[Progress], None]) -> Outcome:
            return plane.load_set(body.models, actor, body.force, progress)

        if not body.models:
            raise errors.UsageError("models: name at least one model")
        return stream_operation(run) if body.wait else submit(body.models, run)

    @router.post("/models/{model}/rollback", tags=["models"], summary="rollback (NDJSON steps, then the outcome)",
                 **needs(Role.DEPLOYER))
    def rollback(model: ModelPath, request: Request, body: RollbackBody | None = None) -> Response:
        body, actor = body or RollbackBody(), actor_of(request)

        def run(progress: Callable[[Progress], None]) -> Outcome:
            to = plane.tag_digest(model, body.to_tag) if body.to_tag else body.to
            return plane.rollback(model, actor, to, progress, body.force, **_host(body.host))

        return stream_operation(run)

    @router.post("/models/{model}/promote", tags=["models"],
                 summary="promote: end the model's bake in progress as passed (docs/bake.md); answers the bake",
                                                                               **needs(Role.DEPLOYER))
    def promote(model: ModelPath, request: Request) -> JSONResponse:
        return JSONResponse(plane.promote(model, actor_of(request)))

    @router.post("/models/{model}/abort", tags=["models"],
                 summary="abort: end the model's canary (or bake) in progress as a crossed limit does: every request "
                         "back on the previous digest, the deploy rolled back (docs/bake.md); answers the bake",
                 **needs(Role.DEPLOYER))
    def abort(model: ModelPath, request: Request) -> JSONResponse:
        return JSONResponse(plane.abort(model, actor_of(request)))

    @router.post("/models/{model}/unload", tags=["models"], summary="unload (NDJSON steps, then the outcome)",
                 **needs(Role.DEPLOYER))
    def unload(model: ModelPath, request: Request, body: UnloadBody | None = None) -> Response:
        body, actor = body or UnloadBody(), actor_of(request)
        return stream_operation(lambda progress: plane.unload(model, actor, body.dependents, progress, body.force,
                                                              **_host(body.host)))

    @router.put("/models/{model}/policy", tags=["models"], summary="policy: auto, manual, inherit or track:TAG",
                **needs(Role.ADMIN))
    def set_policy(model: ModelPath, body: PolicyBody, request: Request) -> JSONResponse:
        return _json(plane.set_policy(model, body.policy, actor_of(request), **_host(body.host)))

    @router.put("/models/{model}/pin", tags=["models"], summary="pin: hold the model at its active snapshot",
                **needs(Role.DEPLOYER))
    def pin(model: ModelPath, request: Request, body: PinBody | None = None) -> JSONResponse:
        return _json(plane.set_pin(model, True, actor_of(request), **_host((body or PinBody()).host)))

    @router.delete("/models/{model}/pin", tags=["models"], summary="unpin", **needs(Role.DEPLOYER))
    def unpin(model: ModelPath, request: Request, host: str = "") -> JSONResponse:
        return _json(plane.set_pin(model, False, actor_of(request), **_host(host)))

    @router.post("/gc", tags=["models"], summary="gc: drop the stored content of old snapshots", **needs(Role.ADMIN))
    def gc(request: Request, body: GcBody | None = None) -> JSONResponse:
        return _json(plane.gc((body or GcBody()).keep, actor_of(request)))

    return router


def history_routes(plane: ControlPlane) -> APIRouter:
    """/v1/models/{model}/versions, /diff, /tags; /v1/audit; /v1/tags: the registry's history."""
    router = APIRouter(prefix=API_PREFIX)

    @router.get("/models/{model}/versions", tags=["versions"], summary="versions: every content the model had",
                **needs(Role.VIEWER))
    def versions(model: ModelPath) -> JSONResponse:
        return _json(plane.versions(model))

    @router.get("/models/{model}/diff", tags=["versions"], summary="diff between two digests or tags",
                **needs(Role.VIEWER))
    def diff(model: ModelPath, a: RefQuery, b: RefQuery) -> JSONResponse:
        return _json(plane.diff(model, a, b))

    @router.get("/audit", tags=["audit"], summary="audit: the audit log, newest first (or ?at=: what served)",
                **needs(Role.VIEWER))
    def audit(model: ModelQuery = None, action: str | None = None, outcome: OutcomeQuery = None,
              actor: str | None = None, since: TimeQuery = None, until: TimeQuery = None,
              limit: LimitQuery = 100, at: TimeQuery = None) -> JSONResponse:
        if at:  # the other filters do not apply, but a malformed one is still refused
            queries.audit_query(model=model, outcome=outcome, since=since, until=until, limit=limit)
            return _json(plane.serving_at(at, model))
        return _json(plane.audit(model=model, action=action, outcome=outcome, actor=actor, since=since,
                                 until=until, limit=limit))

    @router.get("/tags", tags=["tags"], summary="tags: where each tag points (or pointed ?at=)", **needs(Role.VIEWER))
    def list_tags(model: ModelQuery = None, at: TimeQuery = None) -> JSONResponse:
        return _json(plane.tag_listing(model, at))

    @router.put("/models/{model}/tags/{name}", tags=["tags"], summary="tag: point NAME at a digest (NDJSON)",
                **needs(Role.DEPLOYER))
    def move_tag(model: ModelPath, name: TagPath, request: Request, body: TagBody | None = None) -> Response:
        actor, ref = actor_of(request), (body or TagBody()).digest
        return stream_operation(lambda progress: plane.move_tag(model, name, ref, actor, progress))  # type: ignore

    @router.delete("/models/{model}/tags/{name}", tags=["tags"], summary="tag --delete (NDJSON)",
                   **needs(Role.DEPLOYER))
    def delete_tag(model: ModelPath, name: TagPath, request: Request) -> Response:
        actor = actor_of(request)
        return stream_operation(lambda progress: plane.move_tag(model, name, "", actor, progress,  # type: ignore
                                                                delete=True))

    return router


FLEET_ONLY = (f"{API_PREFIX}/hosts", f"{API_PREFIX}/rollouts")
NOT_IN_A_FLEET = "This daemon is not in a fleet (started without --fleet): the fleet's resources are not there"


def shared_registry(plane: ControlPlane) -> Any:
    """The fleet's shared registry (docs/fleet.md), on a daemon started with --fleet; NotFoundError (404, exit 2)
    on another: the resource does not exist there."""
    if getattr(plane, "fleet", None) is None:
        raise errors.NotFoundError("this daemon is not in a fleet (--fleet): no hosts, rollouts or fleet matrix")
    return getattr(plane.fleet, "registry", None)


def fleet_matrix(plane: ControlPlane, models: list[str]) -> Any:
    """`status --fleet`: model x host from the shared registry (of the models named, if any)."""
    from controlplane.fleet import queries as fleet_queries

    for name in models:
        validate_model_name(name)
    result = fleet_queries.matrix(shared_registry(plane))
    if models:
        result.models = [row for row in result.models if row.model in models]
    return result


def fleet_routes(plane: ControlPlane) -> APIRouter:
    """/v1/hosts, /v1/rollouts: the fleet's shared registry (docs/fleet.md), on a daemon started with --fleet."""
    router = APIRouter(prefix=API_PREFIX, tags=["fleet"])

    def shared() -> Any:
        return shared_registry(plane)

    @router.get("/hosts", summary="hosts: the fleet's hosts, last heartbeat, alive, leader", **needs(Role.VIEWER))
    def hosts() -> JSONResponse:
        from controlplane.fleet import queries as fleet_queries

        return JSONResponse([row.to_json() for row in fleet_queries.hosts(shared())])

    @router.get("/rollouts", summary="rollouts: newest first, each host's step (?open=true: in progress only)",
                **needs(Role.VIEWER))
    def rollouts(open: bool = False, limit: LimitQuery = 20) -> JSONResponse:  # noqa: A002
        from controlplane.fleet import queries as fleet_queries

        rows = fleet_queries.rollouts(shared(), not open, limit)
        return JSONResponse([row.to_json() if hasattr(row, "to_json") else row for row in rows])

    return router


def allowed_methods(app: FastAPI, scope: Any) -> list[str]:
    """The methods of every route whose path matches the request's (the `Allow` of a 405)."""
    from starlette.routing import Match

    methods: set[str] = set()
    for route in _flat_routes(app.routes):
        match, _ = route.matches({**scope, "method": "GET"})
        if match is not Match.NONE and getattr(route, "methods", None):
            methods.update(route.methods)
    return sorted(methods)


def _flat_routes(routes: list[Any]) -> Iterator[Any]:
    for route in routes:
        if hasattr(route, "original_router"):  # FastAPI >= 0.120 keeps an included router as one node
            yield from _flat_routes(route.original_router.routes)
        else:
            yield route


# A parameter the document's pattern refused is refused for the reason the core gives the CLI and every
# other path ("model name '../x' contains a path separator"), not the pattern's text.
CORE_CHECKS: dict[str, Callable[[str], object]] = {"model": validate_model_name, "models": validate_model_name,
                                                   "digest": validate_digest}


def _core_reason(error: Mapping[str, Any]) -> str | None:
    """The core's one-line reason for a value a parameter's pattern refused, when the core checks that
    parameter and refuses the value too; else None (the validator's own message is shown)."""
    loc = error.get("loc", ())
    check = CORE_CHECKS.get(str(loc[-1])) if loc else None
    value = error.get("input")
    if check is None or not isinstance(value, str):
        return None
    try:
        check(value)
    except errors.TritonctlError as exc:
        return str(exc)
    return None


def build_app(plane: ControlPlane, executor: futures.Executor, *extra: APIRouter) -> FastAPI:
    """The ASGI application both listeners serve (the TCP one behind the token gate)."""
    app = FastAPI(title="tritonctl control API", version="1", openapi_url=OPENAPI_PATH, docs_url=None,
                  redoc_url=None, description=DESCRIPTION)

    @app.exception_handler(errors.TritonctlError)
    async def core_error(request: Request, exc: errors.TritonctlError) -> JSONResponse:
        return JSONResponse(error_document(exc), status_code=status_for(exc))

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = "; ".join(_core_reason(e) or f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}"
                             for e in exc.errors())
        return JSONResponse(error_document(errors.UsageError(problems or "bad request")), status_code=400)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        cls = errors.NotFoundError if exc.status_code == 404 else errors.UsageError
        error = cls(f"{request.method} {request.url.path}: {exc.detail}")
        headers = dict(exc.headers or {})
        if exc.status_code == 405:  # RFC 9110: every method the path answers, not only one route's
            headers["Allow"] = ", ".join(allowed_methods(app, request.scope))
        return JSONResponse(error_document(error), status_code=exc.status_code, headers=headers)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        """The last line of defence: a bug answers the one JSON error document, never text/plain."""
        log.error("%s %s failed unexpectedly", request.method, request.url.path, exc_info=exc)
        error = errors.TritonctlError(f"internal error: {type(exc).__name__}: {exc}")
        return JSONResponse(error_document(error), status_code=500)

    @app.get(f"{API_PREFIX}/ping", tags=["daemon"], summary="the daemon's pid and Triton URL", **needs(Role.VIEWER))
    def ping() -> JSONResponse:
        return JSONResponse({"pid": os.getpid(), "triton_url": plane.triton.url})

    app.include_router(models_routes(plane, executor))
    app.include_router(history_routes(plane))
    app.include_router(fleet_routes(plane))
    app.include_router(lease_routes(plane, actor_of))  # ensure, renew, release (api/leases.py)
    for router in extra:
        app.include_router(router)
    check_roles(app, (OPENAPI_PATH,))  # a route without a role never serves (controlplane/api/access.py)
    app.openapi = lambda: openapi_document(app)  # type: ignore[method-assign]
    return app


def _not_null(schema: dict[str, Any]) -> dict[str, Any]:
    """FastAPI's `anyOf: [X, null]` of an optional parameter as X (with the outer description, pattern...)."""
    options = [option for option in schema.get("anyOf", ()) if option != {"type": "null"}]
    if "anyOf" not in schema or len(options) != 1:
        return schema
    outer = {key: value for key, value in schema.items() if key != "anyOf"}
    return {**options[0], **outer}


def openapi_document(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document of the routes, plus the route that serves it (so every route is in it), made
    self-contained (controlplane/api/openapi.py): the published --json schemas bundled under `components`."""
    if app.openapi_schema is None:
        from fastapi.openapi.utils import get_openapi

        from controlplane.api import openapi

        document = get_openapi(title=app.title, version=app.version, description=app.description,
                               routes=app.routes)
        schemas = document.setdefault("components", {}).setdefault("schemas", {})
        for name in ("HTTPValidationError", "ValidationError"):
            schemas.pop(name, None)
        schemas["Error"] = ERROR_SCHEMA
        openapi.add_line_schemas(schemas, ERROR_SCHEMA)
        error = {"description": "An error: the core class, its message, the CLI's exit code",
                 "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
        document["components"]["securitySchemes"] = SECURITY_SCHEMES
        document["security"] = [{"bearer": []}]
        for path, operations in document["paths"].items():
            for operation in operations.values():
                for parameter in operation.get("parameters", ()):
                    parameter["schema"] = _not_null(parameter["schema"])  # a parameter is absent, never null
                operation["responses"].pop("422", None)  # validation errors answer 400 with the one error shape
                operation["responses"]["default"] = error
                operation["responses"]["401"] = {**error, "description": UNAUTHENTICATED}
                operation["responses"]["403"] = {**error, "description": FORBIDDEN.format(
                    role=operation.get(ROLE_KEY, "viewer"))}
                if path in FLEET_ONLY or any(p["name"] == "fleet" for p in operation.get("parameters", ())):
                    operation["responses"]["404"] = {**error, "description": NOT_IN_A_FLEET}
        for (path, method), (name, media) in RESULT_SCHEMAS.items():
            operation = document["paths"].get(path, {}).get(method)
            if operation is not None:  # the published JSON Schema of the --json document (docs/schemas/)
                schema = openapi.result_schema(name, media, CHOSEN_BY.get(name, ""), schemas)
                operation["responses"]["200"]["content"] = {media: {"schema": schema}}
        events = document["paths"].get(f"{API_PREFIX}/events", {}).get("get")
        if events is not None:
            openapi.document_events(events, schemas)
        document["paths"][OPENAPI_PATH] = {"get": {
            "tags": ["daemon"], "summary": "this OpenAPI 3 document", "operationId": "openapi", ROLE_KEY: "viewer",
            "responses": {"200": {"description": "The OpenAPI document",
                                  "content": {"application/json": {"schema": {"type": "object"}}}},
                          "401": {**error, "description": UNAUTHENTICATED}}}}
        app.openapi_schema = document
    return app.openapi_schema
