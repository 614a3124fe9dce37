"""Readiness and liveness that mean something: /v1/ready, /v1/models/{model}/ready, /v1/live.

Triton's own `/v2/health/ready` says only that the server is up. Ready here means converged: tritonserver
is reachable and every model that the daemon deploys on its own (policy `auto` or `track:TAG`) serves
what it should, in `status` words `synced`, `held`, `invalid` or `removed` (controlplane/views/sync.py); a
model `pending` (settling, on hold, capturing, deploying, retrying) is not there yet, and the 503 names
it and why. A registry that does not answer (a fleet's shared PostgreSQL down, a SQLite registry
that cannot be written) is not ready either: 503 with `"registry_reachable": false` and why, while
tritonserver goes on serving what it serves (docs/fleet.md "When the database is down").

Live means the daemon's main loop turns: the loop stamps a heartbeat where it pings the systemd
watchdog, and a heartbeat older than LIVE_STALE_S answers 503 (the API's own threads would answer even
with the loop hung, so answering at all proves nothing).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from controlplane.api.access import needs
from controlplane.api.params import ModelPath
from controlplane.api.protocol import API_PREFIX
from controlplane.control_plane import ControlPlane
from controlplane.documents.results import StatusRow
from controlplane.errors import StoreError
from controlplane.vocab import Role, SyncState

SETTLED = (SyncState.SYNCED.value, SyncState.HELD.value, SyncState.INVALID.value, SyncState.REMOVED.value)
LIVE_STALE_S = 10.0


def _automatic(row: StatusRow) -> bool:
    """Models the daemon converges without being asked: auto policy, or tracking a tag."""
    return row.policy == "auto" or row.policy.startswith("track:")


def _waiting(row: StatusRow) -> dict[str, Any]:
    return {"model": row.model, "sync": row.sync, "state": row.state, "reason": row.sync_reason}


def readiness(plane: ControlPlane, model: str | None = None) -> tuple[bool, dict[str, Any]]:
    """(ready, the document): the whole daemon, or with `model` that one model (whatever its policy)."""
    try:
        result = plane.status([model] if model else None)
    except StoreError as exc:  # the registry failed under the read itself
        document: dict[str, Any] = {"ready": False, "registry_reachable": False, "reason": str(exc)}
        return False, {**document, "model": model} if model else document
    rows = result.models if model else [r for r in result.models if _automatic(r)]
    waiting = [_waiting(r) for r in rows if r.sync not in SETTLED]
    ready = result.triton_reachable and result.registry_reachable and not waiting
    document = {"ready": ready, "triton_reachable": result.triton_reachable, "triton_url": result.triton_url,
                "registry_reachable": result.registry_reachable, "models": len(rows), "not_ready": waiting}
    if model:
        document["model"] = model
    if not result.registry_reachable:
        document["registry_unreachable_since"] = result.registry_unreachable_since
        document["reason"] = f"{result.registry_reason} (unreachable since {result.registry_unreachable_since})"
    if not result.triton_reachable:
        document["reason"] = f"tritonserver {result.triton_url} is not reachable"
    return ready, document


def health_routes(plane: ControlPlane, loop_age_s: Callable[[], float | None]) -> APIRouter:
    """`loop_age_s`: seconds since the daemon's main loop last turned (None: no loop, e.g. a test server)."""
    router = APIRouter(prefix=API_PREFIX, tags=["health"])

    @router.get("/ready", summary="200 when Triton is reachable and every auto model serves what it should; "
                "else 503 with the models not there yet and why", **needs(Role.VIEWER))
    def ready() -> JSONResponse:
        ok, document = readiness(plane)
        return JSONResponse(document, status_code=200 if ok else 503)

    @router.get("/models/{model}/ready", summary="200 when this model serves what it should; else 503 and why",
                **needs(Role.VIEWER))
    def model_ready(model: ModelPath) -> JSONResponse:
        ok, document = readiness(plane, model)
        return JSONResponse(document, status_code=200 if ok else 503)

    @router.get("/live", summary="200 while the daemon's main loop turns; 503 when it has not for 10 s",
                **needs(Role.VIEWER))
    def live() -> JSONResponse:
        age = loop_age_s()
        alive = age is None or age < LIVE_STALE_S
        return JSONResponse({"live": alive, "loop_age_s": None if age is None else round(age, 3),
                             "pid": os.getpid()}, status_code=200 if alive else 503)

    return router
