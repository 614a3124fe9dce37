"""/v1/events: the audit log and the models' state changes as server-sent events, as they happen.

Each audit record is one `event: audit` whose `id:` is the audit log's id and whose data is the event
document (controlplane/documents/events.py, the same object a webhook receives); a follower that reconnects with
`Last-Event-ID` (or `?after=ID`) gets every later record once, in id order, even across a daemon restart,
because they are read back from the registry. State changes are `event: state` with data
`{"model", "state", "reason", "time"}`, state one of `settling`, `deploying` (sampled in memory every
SAMPLE_S while someone follows), the registry's state when that ends (`serving`, `failed`, ...), and,
from audit records, `rolled_back`, `quarantined` (the rolled-back content was quarantined) and `drift`
(reconcile found Triton not serving what the registry says and restored it). State events carry no id:
they are not replayed on resume.

Followers are woken by the registry when a transaction that wrote audit events commits
(`Registry.audit_listeners`), not by polling: an event reaches a follower within milliseconds of its
audit record (bench/event_latency.py measures it).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from controlplane.api.access import needs
from controlplane.api.protocol import API_PREFIX
from controlplane.control_plane import ControlPlane
from controlplane.documents.events import event_document
from controlplane.store.records import AuditRecord, iso, utcnow
from controlplane.vocab import Role

SAMPLE_S = 0.05  # how often settling / deploying are sampled while someone follows
KEEPALIVE_S = 15.0  # a comment line this often keeps proxies from closing an idle stream
BATCH = 500


class Follower:
    """One connected stream: its event loop, a wake-up flag and the state changes not sent yet."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.woken = asyncio.Event()
        self.states: deque[dict[str, Any]] = deque(maxlen=10_000)

    def wake(self) -> None:
        try:
            self.loop.call_soon_threadsafe(self.woken.set)
        except RuntimeError:  # its loop is closed: the stream ended
            pass


class EventHub:
    """Wakes followers on audit writes and samples the models' activity while anyone follows."""

    def __init__(self, plane: ControlPlane) -> None:
        self.plane = plane
        self.closed = False
        self._followers: set[Follower] = set()
        self._lock = threading.Lock()
        self._sampler: threading.Thread | None = None
        self._listeners: list[Any] = getattr(getattr(plane, "registry", None), "audit_listeners", [])
        self._listeners.append(self.wake_all)

    def wake_all(self) -> None:
        with self._lock:
            followers = list(self._followers)
        for follower in followers:
            follower.wake()

    def follow(self, loop: asyncio.AbstractEventLoop) -> Follower:
        follower = Follower(loop)
        with self._lock:
            self._followers.add(follower)
            if self._sampler is None or not self._sampler.is_alive():
                self._sampler = threading.Thread(target=self._sample, name="api-events", daemon=True)
                self._sampler.start()
        return follower

    def leave(self, follower: Follower) -> None:
        with self._lock:
            self._followers.discard(follower)

    def close(self) -> None:
        """The daemon stops: every stream ends (its followers reconnect with Last-Event-ID)."""
        self.closed = True
        self.wake_all()
        try:
            self._listeners.remove(self.wake_all)
        except ValueError:
            pass

    def _publish(self, state: dict[str, Any]) -> None:
        with self._lock:
            followers = list(self._followers)
        for follower in followers:
            follower.states.append(state)
            follower.wake()

    def _sample(self) -> None:
        """Settling and deploying as they start and end, while at least one follower is connected."""
        before: dict[str, tuple[str, str]] = {}
        while not self.closed:
            with self._lock:
                if not self._followers:
                    self._sampler = None
                    return
            try:
                now = self.plane.activity()
                for model, (state, reason) in now.items():
                    if before.get(model, ("", ""))[0] != state:
                        self._publish(state_event(model, state, reason))
                for model in before.keys() - now.keys():
                    self._publish(state_event(model, self.plane.model_state(model), ""))
                before = now
            except Exception:  # noqa: BLE001 - a failed sample is retried; the stream goes on
                pass
            time.sleep(SAMPLE_S)


def state_event(model: str, state: str, reason: str) -> dict[str, Any]:
    return {"model": model, "state": state, "reason": reason, "time": iso(utcnow())}


def states_of(plane: ControlPlane, record: AuditRecord) -> list[dict[str, Any]]:
    """The state changes an audit record tells of (rolled back, quarantined, drift restored)."""
    if not record.model:
        return []
    out: list[dict[str, Any]] = []
    if record.outcome == "rolled_back":
        out.append(state_event(record.model, "rolled_back", record.message))
        if record.digest and plane.quarantined(record.model, record.digest):
            out.append(state_event(record.model, "quarantined", f"{record.digest[:12]}: {record.message}"))
    elif record.action == "restore":
        out.append(state_event(record.model, "drift", record.message))
    return out


def _sse(event: str, data: dict[str, Any], event_id: int | None = None) -> str:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, ensure_ascii=False, separators=(',', ':'))}\n\n"


def _catch_up(plane: ControlPlane, after: int) -> list[tuple[AuditRecord, list[dict[str, Any]]]]:
    return [(record, states_of(plane, record)) for record in plane.events_after(after, BATCH)]


def events_routes(plane: ControlPlane, hub: EventHub) -> APIRouter:
    router = APIRouter(prefix=API_PREFIX, tags=["events"])

    @router.get("/events", summary="server-sent events: audit records (id: the audit id; resume with "
                "Last-Event-ID or ?after=) and state changes (event: state)",
                response_class=StreamingResponse,
                responses={200: {"content": {"text/event-stream": {"schema": {"type": "string"}}}}},
                **needs(Role.VIEWER))
    async def events(after: Annotated[int | None, Query(ge=0, le=2**63 - 1)] = None,
                     last_event_id: str | None = Header(default=None)) -> StreamingResponse:
        if last_event_id is not None and last_event_id.strip().isdigit():
            start = int(last_event_id.strip())
        elif after is not None:
            start = after
        else:
            start = await run_in_threadpool(plane.last_event_id)  # from now on
        follower = hub.follow(asyncio.get_running_loop())

        async def stream() -> AsyncIterator[str]:
            last = start
            try:
                yield f"retry: 1000\n: following after id {start}\n\n"
                while not hub.closed:
                    follower.woken.clear()
                    batch = await run_in_threadpool(_catch_up, plane, last)
                    for record, states in batch:
                        yield _sse("audit", event_document(record), record.id)
                        last = record.id
                        for state in states:
                            yield _sse("state", state)
                    while follower.states:
                        yield _sse("state", follower.states.popleft())
                    if len(batch) == BATCH:
                        continue
                    try:
                        await asyncio.wait_for(follower.woken.wait(), KEEPALIVE_S)
                    except asyncio.TimeoutError:
                        yield ": keepalive\n\n"
            finally:
                hub.leave(follower)

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    return router
