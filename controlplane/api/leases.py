"""The lease routes of the control API: ensure (`POST /v1/models/{model}/lease`), renew and release.

Why a module of its own: on-demand loads (controlplane/memory/ondemand.py) are one resource, a model's lease,
with three verbs; each route is one call of the ControlPlane, as in app.py. `POST` answers once the
model is READY, with the serving digest and the lease (docs/schemas/lease.schema.json); a load that
fails answers the error document (409, exit 1 in the CLI), a budget with no room among them.
"""

from __future__ import annotations

from collections.abc import Callable

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from controlplane.api.access import needs
from controlplane.api.params import STRICT, LeaseSeconds, ModelPath
from controlplane.api.protocol import API_PREFIX
from controlplane.control_plane import ControlPlane
from controlplane.vocab import Role

DEFAULT_LEASE_S = 600.0


class LeaseBody(BaseModel):
    model_config = STRICT

    for_s: LeaseSeconds = DEFAULT_LEASE_S  # how long the lease holds the model loaded, in seconds


def lease_routes(plane: ControlPlane, actor_of: Callable[[Request], str]) -> APIRouter:
    """The routes; `actor_of`: the audit actor of a request (app.py's, from the peer or the token)."""
    router = APIRouter(prefix=API_PREFIX, tags=["leases"])

    @router.post("/models/{model}/lease", summary="ensure: load the model (or find it loaded) and lease it",
                 **needs(Role.DEPLOYER))
    def ensure(model: ModelPath, request: Request, body: LeaseBody | None = None) -> JSONResponse:
        result = plane.ensure(model, (body or LeaseBody()).for_s, actor_of(request))
        return JSONResponse(result.to_json())

    @router.put("/models/{model}/lease/{lease}", summary="renew a lease for for_s seconds from now",
                **needs(Role.DEPLOYER))
    def renew(model: ModelPath, lease: str, body: LeaseBody | None = None) -> JSONResponse:
        return JSONResponse(plane.renew_lease(model, lease, (body or LeaseBody()).for_s).to_json())

    @router.delete("/models/{model}/lease/{lease}", summary="release a lease", **needs(Role.DEPLOYER))
    def release(model: ModelPath, lease: str) -> JSONResponse:
        return JSONResponse(plane.release_lease(model, lease).to_json())

    return router
