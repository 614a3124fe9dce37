"""The web view's pages: server-rendered HTML of what the control API answers, read-only.

Each page calls the same `ControlPlane` methods the API routes call (status, versions, audit, diff,
serving_at; the Fleet page reads the shared registry as `hosts`, `status --fleet` and `rollouts` do:
controlplane/api/web/fleetview.py) and renders their `--json` documents with the Jinja2 templates
shipped beside this module, so the view can never say something the CLI would not. Filters are query
parameters (a link can be shared). `?fragment=1` answers only the page's live part, which the page's
script fetches when the event stream (/v1/events, served here as /ui/v1/events) tells of a change, and
when `/ui/stamp` changes (asked every 5 s for the page's own rows: what makes no event, such as Triton's
reachability; see static/web.js). The overview is one page of `status` cut in SQL
(ControlPlane.status_page): at 10,000 models a page looks at its 100 (bench/web_overview.py).
Who may look is controlplane/api/web/gate.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from datetime import datetime, timezone
from math import ceil
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from markupsafe import Markup, escape

from controlplane import errors
from controlplane.api.access import Authenticator
from controlplane.api.tokens import Identity
from controlplane.api.web import fleetview, gate
from controlplane.api.web.timeline import MARK_KINDS, build_timeline, config_field_changes, parse_iso
from controlplane.base.clock import utcnow
from controlplane.control_plane import ControlPlane
from controlplane.names import validate_model_name
from controlplane.vocab import Role

HERE = Path(__file__).resolve().parent
PAGE_SIZE = 100
SYNC_VALUES = ("synced", "pending", "held", "invalid", "removed")
AUDIT_FILTERS = ("model", "actor", "action", "outcome", "since", "until")
EVENTS_PREFIX = "/ui"  # the event stream on the web listener: /ui/v1/events (the session cookie's path)
# What a model's page offers, by the role it needs: the view itself changes nothing (it is read-only), so
# these are the CLI's commands, shown only to a caller whose role may run them.
ACTIONS = ((Role.DEPLOYER, "tritonctl load {m}", "deploy the source's content now"),
           (Role.DEPLOYER, "tritonctl rollback {m}", "back to the previous good digest"),
           (Role.DEPLOYER, "tritonctl pin {m}", "hold it at what serves (unpin: release)"),
           (Role.DEPLOYER, "tritonctl tag {m} NAME", "name what serves"),
           (Role.DEPLOYER, "tritonctl unload {m}", "take it out of Triton"),
           (Role.ADMIN, "tritonctl policy {m} manual", "auto, manual, ondemand, inherit or track:TAG"),
           (Role.ADMIN, "tritonctl gc --keep 10", "drop the content of old snapshots"))


def actions_for(identity: Identity | None, model: str) -> list[tuple[str, str]]:
    """The commands this caller's role may run on `model` (none without a proven identity)."""
    if identity is None:
        return []
    return [(command.format(m=model), why) for role, command, why in ACTIONS if identity.may(role)]


def time_html(iso: str | None) -> Markup:
    """A <time> the script shows in the browser's zone; the UTC text stays in the title (and without script)."""
    if not iso:
        return Markup("&ndash;")
    return Markup('<time datetime="{0}" title="{0} (UTC)" data-local>{0}</time>').format(iso)


def age(iso: str | None, now: datetime | None = None) -> str:
    moment = parse_iso(iso)
    if moment is None:
        return ""
    seconds = int(((now or datetime.now(timezone.utc)) - moment).total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


def short(digest: str | None) -> str:
    return (digest or "")[:12]


def page_link(request: Request, **changes: Any) -> str:
    params = {**dict(request.query_params), **{k: str(v) for k, v in changes.items()}}
    params.pop("fragment", None)
    return f"{request.url.path}?{urlencode({k: v for k, v in params.items() if v})}"


_TICKED = re.compile(r"`([^`\n]+)`")


def prose(text: str | None) -> Markup:
    """Text whose `quoted` parts (a command, a setting: the CLI's and the docs' way) are code, not backticks."""
    parts = _TICKED.split(str(text or ""))
    return Markup("").join(Markup("<code>{}</code>").format(part) if i % 2 else escape(part)
                           for i, part in enumerate(parts))


def a_model(name: str | None) -> bool:
    """Whether `name` is a model's (a page of its own): not a source entry whose name no model can have."""
    try:
        validate_model_name(name or "")
    except errors.UsageError:
        return False
    return True


def make_templates() -> Jinja2Templates:
    templates = Jinja2Templates(directory=str(HERE / "templates"))
    templates.env.filters.update(time=time_html, age=age, short=short, prose=prose)
    templates.env.tests.update(a_model=a_model)
    templates.env.globals.update(page_link=page_link, mark_kinds=MARK_KINDS)
    return templates


def live_stamp(plane: ControlPlane, status: dict[str, Any]) -> str:
    """Changes whenever what a page shows of `status` (its own rows) changes, or a newer audit event is written."""
    rows = [{k: v for k, v in row.items() if k != "next_retry_s"} for row in status["models"]]
    newest = plane.audit(limit=1).to_json()
    body = json.dumps([status["triton_reachable"], status["watch"], rows, newest[:1]], sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()[:16]


def audit_stamp(plane: ControlPlane) -> str:
    """The audit page's stamp: the newest audit event."""
    return hashlib.sha256(json.dumps(plane.audit(limit=1).to_json()[:1]).encode()).hexdigest()[:16]


def newest_audit_id(plane: ControlPlane) -> int:
    """The page's script follows the event stream from here: nothing between the render and the stream is lost."""
    newest = plane.audit(limit=1).to_json()
    return int(newest[0]["id"]) if newest else 0


def stamp_link(request: Request, view: str) -> str:
    """The page's /ui/stamp address: the same filters, so the stamp covers the rows the page shows."""
    params = {k: v for k, v in request.query_params.items() if k != "fragment" and v}
    return "/ui/stamp?" + urlencode({"view": view, **params})


def build_web_app(plane: ControlPlane, login: Authenticator | None, secure: bool,
                  events: APIRouter | None = None) -> FastAPI:
    """The view's own application (its own listener): `login` None means no login (a loopback address),
    else who may log in (personal tokens, the shared token, OIDC); `events`: the control API's /v1/events
    router, served here as /ui/v1/events behind the same gate."""
    app = FastAPI(title="tritonctl web view", docs_url=None, redoc_url=None, openapi_url=None)
    sessions, throttle = gate.Sessions(), gate.LoginThrottle()
    if events is not None:
        app.include_router(events, prefix=EVENTS_PREFIX)
    templates = make_templates()
    app.mount("/ui/static", StaticFiles(directory=str(HERE / "static")), name="static")

    def render(request: Request, name: str, context: dict[str, Any], status_code: int = 200,
               live: str = "") -> HTMLResponse:
        """The page, or with `?fragment=1` only its live part (the template `live`)."""
        if live and request.query_params.get("fragment") == "1":
            name = live
        context = {**context, "login": login is not None, "after": newest_audit_id(plane),
                   "in_fleet": plane.fleet is not None, "live": live,
                   "who": getattr(request.state, "identity", None)}
        return templates.TemplateResponse(request, name, context,
                                          status_code=status_code)

    @app.middleware("http")
    async def only_with_token(request: Request, call_next: Any) -> Response:
        response: Response
        open_path = login is None or request.scope["path"].startswith(gate.OPEN_PREFIXES)
        identity = None if open_path or login is None else await asyncio.to_thread(
            gate.caller, request.scope, login.identify, sessions)
        request.state.identity = identity
        if open_path or identity is not None:
            response = await call_next(request)
            response.headers["cache-control"] = "no-store"
        elif (request.scope["path"].startswith(("/ui/stamp", EVENTS_PREFIX + "/v1/"))
              or request.query_params.get("fragment") == "1"):
            response = JSONResponse({"error": {"class": "PermissionDeniedError", "message": "log in to the web view",
                                               "exit_code": 77}}, status_code=401)
        else:
            response = RedirectResponse("/ui/login?" + urlencode({"next": page_link(request)}), status_code=303)
        for name, value in gate.SECURITY_HEADERS:
            response.headers[name.decode()] = value.decode()
        return response

    @app.exception_handler(errors.TritonctlError)
    async def core_error(request: Request, exc: errors.TritonctlError) -> HTMLResponse:
        code = 404 if isinstance(exc, errors.NotFoundError) else 400
        return render(request, "error.html", {"message": str(exc)}, status_code=code)

    @app.get("/")
    def root() -> RedirectResponse:
        return RedirectResponse("/ui/", status_code=307)

    @app.get("/ui/login")
    def login_form(request: Request, next: str = "/ui/") -> HTMLResponse:
        return render(request, "login.html", {"next": _safe_next(next), "wrong": False})

    @app.post("/ui/login")
    async def log_in(request: Request) -> Response:
        client = request.client.host if request.client else ""
        wait_s = throttle.wait_s(client)
        if wait_s > 0:  # before the body is read: a client guessing tokens waits, whatever it sends
            waiting = render(request, "login.html", {"next": "/ui/", "wrong": True, "wait_s": ceil(wait_s)},
                             status_code=429)
            waiting.headers["retry-after"] = str(ceil(wait_s))
            return waiting
        body = await _small_body(request, gate.LOGIN_BODY_LIMIT)
        if body is None:
            return PlainTextResponse(f"413 the login form takes at most {gate.LOGIN_BODY_LIMIT} bytes\n",
                                     status_code=413, headers={"connection": "close"})
        form = parse_qs(body.decode("utf-8", "replace"))
        given, target = form.get("token", [""])[0].strip(), _safe_next(form.get("next", ["/ui/"])[0])
        if login is None:
            return RedirectResponse(target, status_code=303)
        try:
            identity: Identity | None = await asyncio.to_thread(login.identify, given)
        except errors.PermissionDeniedError:
            identity = None
        if identity is not None and identity.role is not None:
            throttle.succeeded(client)
            response = RedirectResponse(target, status_code=303)
            left = (identity.expires_at - utcnow()).total_seconds() if identity.expires_at else None
            response.headers["set-cookie"] = gate.cookie_header(sessions.open(given, left), secure)
            return response
        for key in (client, *login.failure_keys(given)):
            throttle.failed(key)
        return render(request, "login.html", {"next": target, "wrong": True}, status_code=401)

    @app.post("/ui/logout")
    def logout(request: Request) -> RedirectResponse:
        sessions.end(gate.session_of(request.scope))  # the cookie opens nothing from now on, kept or not
        response = RedirectResponse("/ui/login", status_code=303)
        response.headers["set-cookie"] = gate.logout_header(secure)
        return response

    @app.get("/ui/stamp")
    def stamp(view: str = "", model: str = "", state: str = "", sync: str = "", q: str = "",
              page: int = 1) -> JSONResponse:
        """What the page's script compares every 5 s: each page's own rows (a 10,000-model registry's
        overview page costs its 100 models, not every model's status)."""
        if view == "fleet" and plane.fleet is not None:
            return JSONResponse({"stamp": fleetview.read(plane.fleet.registry).stamp()})
        if view == "audit":
            return JSONResponse({"stamp": audit_stamp(plane)})
        if view == "model" and model:
            validate_model_name(model)
            return JSONResponse({"stamp": live_stamp(plane, plane.status([model]).to_json())})
        shown = plane.status_page(state=state, sync=sync, name=q.strip(), page=page, size=PAGE_SIZE)
        return JSONResponse({"stamp": live_stamp(plane, shown.status.to_json())})

    @app.get("/ui/")
    def overview(request: Request, state: str = "", sync: str = "", q: str = "", page: int = 1) -> HTMLResponse:
        shown = plane.status_page(state=state, sync=sync, name=q.strip(), page=page, size=PAGE_SIZE)
        status = shown.status.to_json()
        return render(request, "overview.html", {
            "status": status, "rows": status["models"], "total": shown.total, "page": shown.page,
            "pages": shown.pages, "state": state, "sync": sync, "q": q, "sync_values": SYNC_VALUES,
            "states": shown.states, "stamp": live_stamp(plane, status),
            "stamp_url": stamp_link(request, "overview")}, live="_overview_live.html")

    @app.get("/ui/models/{model}")
    def model_page(request: Request, model: str) -> HTMLResponse:
        validate_model_name(model)
        status = plane.status([model]).to_json()
        versions = plane.versions(model).to_json()
        events = plane.audit(model=model, limit=500).to_json()
        now = datetime.now(timezone.utc)
        return render(request, "model.html", {
            "row": status["models"][0], "versions": versions, "events": events[:100],
            "actions": actions_for(request.state.identity, model),
            "timeline": build_timeline(versions, events, now), "now": now.isoformat(timespec="seconds"),
            "stamp": live_stamp(plane, status),
            "stamp_url": "/ui/stamp?" + urlencode({"view": "model", "model": model})}, live="_model_live.html")

    @app.get("/ui/models/{model}/diff")
    def diff_page(request: Request, model: str, a: str = "", b: str = "") -> HTMLResponse:
        validate_model_name(model)
        versions = plane.versions(model).to_json()
        result = plane.diff(model, a, b).to_json() if a and b else None
        fields = []
        if result:
            config = [c for c in result["changed"] if c["path"] == "config.pbtxt"]
            fields = config_field_changes(config[0]["diff"]) if config else []
        return render(request, "diff.html", {"model": model, "versions": versions, "a": a, "b": b,
                                             "result": result, "fields": fields})

    @app.get("/ui/fleet")
    def fleet_page(request: Request) -> HTMLResponse:
        if plane.fleet is None:
            return render(request, "error.html", {"message": "this daemon is not in a fleet (--fleet): "
                                                             "no hosts or rollouts"}, status_code=404)
        view = fleetview.read(plane.fleet.registry)
        return render(request, "fleet.html", {"view": view, "stamp": view.stamp(),
                                              "stamp_url": "/ui/stamp?view=fleet"}, live="_fleet_live.html")

    @app.get("/ui/audit")
    def audit_page(request: Request, at: str = "", limit: int = 200) -> HTMLResponse:
        filters = {k: request.query_params.get(k) or None for k in AUDIT_FILTERS}
        events = plane.audit(**filters, limit=max(1, min(limit, 1000))).to_json()
        serving = plane.serving_at(at, filters["model"]).to_json() if at else None
        return render(request, "audit.html", {"events": events, "filters": filters, "at": at, "serving": serving,
                                              "limit": limit, "stamp": audit_stamp(plane),
                                              "stamp_url": "/ui/stamp?view=audit"},
                      live="_audit_live.html")

    return app


async def _small_body(request: Request, limit: int) -> bytes | None:
    """The request's body, or None as soon as it is known to exceed `limit` bytes (a Content-Length
    above it: nothing is read; else reading stops at the first chunk past it)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        return None
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            return None
    return bytes(body)


def _safe_next(target: str) -> str:
    """Only a path of this view (no open redirect to another site)."""
    return target if target.startswith("/ui/") and not target.startswith("//") else "/ui/"

