"""A shadow: copies of live requests go to a version no client is served by, and each pair of answers is compared.

A route's `shadow` (routes.py) names a target of weight 0. An inference request the route serves (gRPC
ModelInfer, HTTP `/infer`; not a stream, not a pinned request) is copied when `ShadowState.pair` admits it:
`fraction` of the requests, at most COPY_RATE a second (a token bucket of COPY_BURST) and COPY_IN_FLIGHT
copies at once per shadow. The copied request is relayed to the serving version as any other; its bytes
are also kept (at most COPY_MAX_BYTES: a larger request is not copied) and, once the client's request is
whole, sent to the shadow's private name (shadowcopy.py) beside it. The serving answer goes to the client
as it comes; the gateway keeps a copy of it (at most ANSWER_MAX_BYTES) and the shadow's answer never
leaves the gateway. When both answers are in (the client got its own already), the pair is decoded and
compared (compare.py): on the event loop when its two answers together are under INLINE_BYTES (a hand-over
to a thread and back costs more than that comparison: docs/gateway.md), else in one comparing thread (at
most COMPARE_QUEUE waiting), whose verdict comes back to the event loop.

What a copy costs a request that is not copied: nothing but the route's `shadow` attribute being there
(a route with a shadow is never a single-target route, table.py). A copied request costs the gateway a
copy of its bytes and of its answer, one more stream or HTTP exchange to tritonserver, and the decoding
and comparison in the comparing thread. The figures (`to_json`, in the control channel's `figures` under
`shadows`, keyed by the shadow's `id`) count every pair: agreed, disagreed (an error on one side is a
disagreement too, counted in `errors` by the side that failed), the requests not copied and why
(`skipped`), the latency of both sides where both answered, and the first KEEP disagreements (with the
request's inputs only where the shadow says `keep_inputs`; otherwise no input is kept once the copy left).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import random
import time
from typing import Any

from controlplane.gateway import compare as c
from controlplane.gateway import shadowcopy
from controlplane.gateway.figures import Fig
from controlplane.gateway.routes import Shadow
from controlplane.gateway.wire import WireError, fields, grpc_prefix, string_field

log = logging.getLogger("tritonctl.gateway")

COPY_RATE = 100.0  # copies a second per shadow, at most
COPY_BURST = 20.0
COPY_IN_FLIGHT = 16  # copies whose pair is not yet compared, per shadow
COPY_MAX_BYTES = 1 << 20  # a larger request is not copied
ANSWER_MAX_BYTES = shadowcopy.ANSWER_LIMIT  # a larger answer (either side) is not compared
COMPARE_QUEUE = 64  # pairs waiting for the comparing thread; more are not compared
INLINE_BYTES = 128 << 10  # a pair whose two answers together are smaller is compared on the loop (docs/gateway.md)
KEEP = 5  # disagreements kept per shadow
KEPT_STATES = 32  # shadows whose figures are kept (the oldest go first)
SKIPS = ("rate", "busy", "size", "abandoned", "unavailable", "unreadable")
_perf = time.perf_counter


def state_for(figures: Any, model: str, shadow: Shadow) -> ShadowState:
    """The figures and limits of `shadow`, kept across route updates (a new `id` starts from 0)."""
    states: dict[str, ShadowState] = figures.shadows
    found = states.get(shadow.id)
    if found is None or found.model != model or found.digest != shadow.digest:
        found = states[shadow.id] = ShadowState(model, shadow)
        while len(states) > KEPT_STATES:
            del states[next(iter(states))]
    found.spec = shadow
    return found


class Comparer:
    """One thread that decodes and compares pairs, off the event loop (created on the first pair)."""

    def __init__(self) -> None:
        self.pool: concurrent.futures.ThreadPoolExecutor | None = None
        self.waiting = 0

    def submit(self, job: Any) -> bool:
        if self.waiting >= COMPARE_QUEUE:
            return False
        if self.pool is None:
            self.pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="shadow")
        self.waiting += 1
        self.pool.submit(job)
        return True

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)


class ShadowState:
    """One shadow's limits and figures (see the module docstring)."""

    def __init__(self, model: str, shadow: Shadow) -> None:
        self.model, self.digest, self.name, self.id = model, shadow.digest, shadow.name, shadow.id
        self.spec = shadow
        self.field = string_field(1, shadow.name.encode())
        self.started = time.time()
        self.tokens, self.stamp = COPY_BURST, time.monotonic()
        self.in_flight = 0
        self.copied = self.pairs = self.agreed = self.disagreed = 0
        self.errors = {"shadow": 0, "serving": 0}
        self.skipped = dict.fromkeys(SKIPS, 0)
        self.serving_latency, self.shadow_latency = Fig(), Fig()
        self.disagreements: list[dict[str, Any]] = []

    def pair(self, gw: Any, protocol: str, block: bytes = b"") -> Pair | None:
        """A pair for this request when it is copied (None: not this one)."""
        spec = self.spec
        if spec.fraction < 1.0 and random.random() >= spec.fraction:
            return None
        now = time.monotonic()
        self.tokens = min(COPY_BURST, self.tokens + (now - self.stamp) * COPY_RATE)
        self.stamp = now
        if self.tokens < 1.0:
            self.skipped["rate"] += 1
            return None
        if self.in_flight >= COPY_IN_FLIGHT:
            self.skipped["busy"] += 1
            return None
        self.tokens -= 1.0
        self.in_flight += 1
        return Pair(gw, self, protocol, block)

    def record(self, outcome: str, disagreement: dict[str, Any] | None, serving_s: float, shadow_s: float,
               inputs: list[dict[str, Any]] | None, protocol: str) -> None:
        """A pair's verdict (on the event loop)."""
        if outcome in SKIPS:
            self.skipped[outcome] += 1
            return
        self.pairs += 1
        if outcome == "agreed":
            self.agreed += 1
        else:
            self.disagreed += 1
            if outcome == "shadow_error":
                self.errors["shadow"] += 1
            elif outcome == "serving_error":
                self.errors["serving"] += 1
        if serving_s >= 0 and shadow_s >= 0:
            self.serving_latency.observe(serving_s)
            self.shadow_latency.observe(shadow_s)
        if disagreement is not None and len(self.disagreements) < KEEP:
            entry = {**disagreement, "time": round(time.time(), 3), "protocol": protocol}
            if self.spec.keep_inputs and inputs is not None:
                entry["inputs"] = inputs
            self.disagreements.append(entry)

    def to_json(self) -> dict[str, Any]:
        return {"model": self.model, "digest": self.digest, "name": self.name, "id": self.id,
                "started": self.started, "copied": self.copied, "pairs": self.pairs, "agreed": self.agreed,
                "disagreed": self.disagreed, "errors": dict(self.errors), "skipped": dict(self.skipped),
                "in_flight": self.in_flight,
                "latency": {"serving": self.serving_latency.to_json()["latency"],
                            "shadow": self.shadow_latency.to_json()["latency"]},
                "disagreements": [dict(d) for d in self.disagreements]}


class Pair:
    """One copied request: the client's bytes, the serving answer, the shadow's (see the module docstring)."""

    __slots__ = ("gw", "state", "protocol", "block", "request", "size", "head", "json_in", "answer_parts",
                 "answer_size", "json_out", "serving", "serving_text", "shadow", "kept", "ended")

    def __init__(self, gw: Any, state: ShadowState, protocol: str, block: bytes) -> None:
        self.gw, self.state, self.protocol, self.block = gw, state, protocol, block
        self.request: list[bytes] | None = []
        self.size = 0
        self.head: tuple[bytes, bytes, list[tuple[bytes, bytes]]] | None = None  # HTTP: method, path, headers
        self.json_in: int | None = None  # HTTP: the request's Inference-Header-Content-Length
        self.answer_parts: list[bytes] | None = []
        self.answer_size = 0
        self.json_out: int | None = None
        self.serving: tuple[int, float] | None = None  # (status, seconds)
        self.serving_text = b""
        self.shadow: tuple[int, str, float, bytes | None, int | None] | None = None
        self.kept = b""  # the request, for its inputs (keep_inputs only)
        self.ended = False

    # -- from the serving side (grpccall.py, grpcanswer.py, httpexchange.py) --------------------------

    def http_head(self, method: bytes, path: bytes, headers: list[tuple[bytes, bytes]]) -> None:
        """The copy's request line and headers: the client's, with the shadow's private name in `path`."""
        self.head = (method, path, headers)
        for name, value in headers:
            if name == b"inference-header-content-length" and value.isdigit():
                self.json_in = int(value)

    def request_piece(self, data: Any) -> None:
        if self.request is None:
            return
        self.size += len(data)
        if self.size > COPY_MAX_BYTES:
            self._drop("size")
            return
        self.request.append(bytes(data))

    def request_end(self) -> None:
        """The client's request is whole: the copy leaves now, beside the serving request."""
        request, self.request = self.request, None
        if request is None or self.ended:
            return
        data = b"".join(request)
        if self.state.spec.keep_inputs:
            self.kept = data
        try:
            if self.protocol == "grpc":
                shadowcopy.grpc_copy(self, self.renamed(data))
            else:
                assert self.head is not None
                shadowcopy.http_copy(self, self.head, data)
        except (WireError, c.Unreadable):
            self._drop("unreadable")
            return
        self.state.copied += 1

    def renamed(self, framed: bytes) -> bytes:
        """The client's gRPC request message with the shadow's private name as its model_name (field 1)."""
        body = c._message(framed)
        parts = [self.state.field if tag == 0x0A else body[start:end] for tag, start, _, end in fields(body)]
        message = b"".join(parts)
        return grpc_prefix(len(message)) + message

    def answer(self, data: Any) -> None:
        if self.answer_parts is None:
            return
        self.answer_size += len(data)
        if self.answer_size > ANSWER_MAX_BYTES:
            self.answer_parts = None
        else:
            self.answer_parts.append(bytes(data))

    def serving_head(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        for name, value in headers:
            if name == b"inference-header-content-length" and value.isdigit():
                self.json_out = int(value)

    def serving_done(self, status: int, seconds: float) -> None:
        """The serving side ended (a gRPC status, or an HTTP one; 499: the client went away)."""
        if self.serving is not None:
            return
        self.serving = (status, seconds)
        if self.request is not None:  # the request never became whole: nothing was copied
            self._drop("abandoned")
            return
        self._settle()

    # -- from the shadow's side (shadowcopy.py) ---------------------------------------------------

    def shadow_done(self, status: int, text: str, seconds: float, body: bytes | None, json_len: int | None) -> None:
        self.shadow = (status, text, seconds, body, json_len)
        self._settle()

    # -- the verdict ----------------------------------------------------------------------------

    def _drop(self, why: str) -> None:
        self.request = None
        if not self.ended:
            self.ended = True
            self.state.in_flight -= 1
            self.state.skipped[why] += 1

    def _settle(self) -> None:
        if self.ended or self.serving is None or self.shadow is None:
            return
        self.ended = True
        self.state.in_flight -= 1
        status, seconds = self.serving
        abandoned = status == 499 if self.protocol == "http" else status == 1  # CANCELLED: the client left
        if abandoned or self.shadow[0] == shadowcopy.UNREACHED or self.answer_parts is None or self.shadow[3] is None:
            why = "abandoned" if abandoned else "unavailable" if self.shadow[0] == shadowcopy.UNREACHED else "size"
            self.state.skipped[why] += 1
            self.answer_parts = None
            return
        serving_body, self.answer_parts = b"".join(self.answer_parts), None
        state, loop = self.state, asyncio.get_running_loop()
        job = _Job(state, self.protocol, status, self.serving_text.decode("utf-8", "replace"), seconds, serving_body,
                   self.json_out, self.shadow, self.kept, self.json_in, loop, self.gw.comparer)
        self.kept = b""
        if len(serving_body) + len(self.shadow[3]) <= INLINE_BYTES and not job.kept:
            job.record(*job.compute())  # small: cheaper here than a hand-over to the thread and back
        elif not self.gw.comparer.submit(job.run):
            state.skipped["busy"] += 1


class _Job:
    """One pair decoded and compared in the comparing thread; its verdict handed back to the event loop."""

    def __init__(self, state: ShadowState, protocol: str, status: int, text: str, seconds: float, body: bytes,
                 json_out: int | None, shadow: tuple[int, str, float, bytes | None, int | None], kept: bytes,
                 json_in: int | None, loop: asyncio.AbstractEventLoop, comparer: Comparer) -> None:
        self.state, self.protocol, self.loop, self.comparer = state, protocol, loop, comparer
        self.serving = (status, text, seconds, body, json_out)
        self.shadow, self.kept, self.json_in = shadow, kept, json_in
        self.rtol, self.atol = state.spec.rtol, state.spec.atol

    def _answer(self, side: tuple[int, str, float, bytes | None, int | None]) -> c.Answer:
        status, text, _, body, json_len = side
        body = body or b""
        if self.protocol == "grpc":
            return c.grpc_answer(status == 0, f"{_GRPC_NAMES.get(status, status)}: {text}", body)
        return c.http_answer(status, body, json_len)

    def run(self) -> None:
        """In the comparing thread: the verdict, handed back to the event loop."""
        found = self.compute()
        try:
            self.loop.call_soon_threadsafe(self._record, *found)
        except RuntimeError:  # the loop closed: the gateway is stopping
            pass

    def compute(self) -> tuple[str, dict[str, Any] | None, tuple[float, float], list[dict[str, Any]] | None]:
        inputs = None
        try:
            serving, shadow = self._answer(self.serving), self._answer(self.shadow)
            outcome, disagreement = c.compare(serving, shadow, self.rtol, self.atol)
            both = serving.ok and shadow.ok
            if disagreement is not None and self.kept:
                inputs = c.grpc_inputs(self.kept) if self.protocol == "grpc" else c.http_inputs(self.kept, self.json_in)
        except c.Unreadable as exc:
            log.info("gateway: shadow %s: a pair not compared: %s", self.state.id, exc)
            outcome, disagreement, both = "unreadable", None, False
        except Exception:  # noqa: BLE001 - a comparison never takes the gateway down
            log.exception("gateway: shadow %s: comparing a pair failed", self.state.id)
            outcome, disagreement, both = "unreadable", None, False
        seconds = (self.serving[2], self.shadow[2]) if both else (-1.0, -1.0)
        return outcome, disagreement, seconds, inputs

    def _record(self, outcome: str, disagreement: dict[str, Any] | None, seconds: tuple[float, float],
                inputs: list[dict[str, Any]] | None) -> None:
        self.comparer.waiting -= 1
        self.record(outcome, disagreement, seconds, inputs)

    def record(self, outcome: str, disagreement: dict[str, Any] | None, seconds: tuple[float, float],
               inputs: list[dict[str, Any]] | None) -> None:
        self.state.record(outcome, disagreement, seconds[0], seconds[1], inputs, self.protocol)


_GRPC_NAMES = {1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED", 5: "NOT_FOUND",
               8: "RESOURCE_EXHAUSTED", 12: "UNIMPLEMENTED", 13: "INTERNAL", 14: "UNAVAILABLE"}
