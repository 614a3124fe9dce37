"""The webhook deliveries' routes: /v1/webhooks/deliveries (`tritonctl webhooks`) and
/v1/webhooks/deliveries/{id}/redeliver (`tritonctl webhooks redeliver ID`).

The daemon's delivery worker (controlplane/outcomes/webhooks.py) owns the deliveries; these routes only ask it
and answer its documents (docs/schemas/webhooks.schema.json, webhooks-redeliver.schema.json).
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Path
from fastapi.responses import JSONResponse

from controlplane import errors
from controlplane.api.access import needs
from controlplane.api.params import LimitQuery
from controlplane.api.protocol import API_PREFIX
from controlplane.control_plane import ControlPlane
from controlplane.outcomes.webhooks import Webhooks
from controlplane.vocab import Role


def _worker(plane: ControlPlane) -> Webhooks:
    worker = getattr(plane, "webhooks", None)
    if worker is None:
        raise errors.NotFoundError("this daemon runs no webhook delivery worker")
    return worker


def webhook_routes(plane: ControlPlane) -> APIRouter:
    router = APIRouter(prefix=f"{API_PREFIX}/webhooks", tags=["webhooks"])

    @router.get("/deliveries", summary="webhooks: deliveries, newest first (pending, delivered, failed)",
                **needs(Role.ADMIN))
    def deliveries(state: Literal["pending", "delivered", "failed"] | None = None,
                   limit: LimitQuery = 100) -> JSONResponse:
        return JSONResponse(_worker(plane).deliveries(state, limit).to_json())

    @router.post("/deliveries/{delivery_id}/redeliver",
                 summary="webhooks redeliver: send a delivery again (same id; a unique prefix will do)",
                 **needs(Role.ADMIN))
    def redeliver(delivery_id: Annotated[str, Path(pattern="^[0-9a-fA-F]+$", max_length=64,
                                                   description="a delivery id or a unique prefix")]) -> JSONResponse:
        return JSONResponse(_worker(plane).redeliver(delivery_id).to_json())

    return router
