"""The gateway's metrics listener: its own figures as Prometheus text, and Triton's, named publicly.

`GET /metrics` answers the gateway's `tritonctl_gateway_*` families (figures.py) followed by
tritonserver's own `/metrics`, scraped at that moment, with every `model="<private name>"` label
rewritten to the public name plus `digest="<12 hex>"`: a dashboard on `nv_inference_*` keeps its
`model` label, and `sum by (model)` adds up the digests that served (docs/gateway.md). When Triton's
metrics cannot be read, the answer still carries the gateway's own and says so in a comment.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any

import httptools

from controlplane.gateway.figures import BUCKETS, CLASSES, Fig
from controlplane.gateway.wire import PRIVATE_IN_TEXT

log = logging.getLogger("tritonctl.gateway")
SCRAPE_TIMEOUT_S = 5.0
_MODEL_LABEL = re.compile(rb'model="([^"\\]*)"')


def _labels(**labels: str) -> str:
    return ",".join(f'{k}="{v}"' for k, v in labels.items())


def gateway_text(gw: Any) -> str:
    """The gateway's own families, one sample per (model, digest, protocol) it ever routed to."""
    figures, parking = gw.figures, gw.parking
    requests, failures, hist, inflight = [], [], [], []
    for slot in figures.slots.values():
        digest = slot.digest[:12]
        inflight.append(f"tritonctl_gateway_in_flight{{{_labels(model=slot.model, digest=digest)}}} {slot.inflight}")
        for protocol in ("grpc", "http"):
            fig: Fig = getattr(slot, protocol)
            base = _labels(model=slot.model, digest=digest, protocol=protocol)
            requests.append(f"tritonctl_gateway_requests_total{{{base}}} {fig.requests}")
            for cls in CLASSES:
                failures.append(f'tritonctl_gateway_failures_total{{{base},class="{cls}"}} {getattr(fig, cls)}')
            running = 0
            for bound, count in zip(BUCKETS, fig.counts[:-1], strict=True):
                running += count
                hist.append(f'tritonctl_gateway_request_seconds_bucket{{{base},le="{bound:g}"}} {running}')
            total = running + fig.counts[-1]
            hist.append(f'tritonctl_gateway_request_seconds_bucket{{{base},le="+Inf"}} {total}')
            hist.append(f"tritonctl_gateway_request_seconds_sum{{{base}}} {fig.sum:.6f}")
            hist.append(f"tritonctl_gateway_request_seconds_count{{{base}}} {total}")
    lines = [
        "# HELP tritonctl_gateway_requests_total Requests the gateway routed, by public model, digest and protocol.",
        "# TYPE tritonctl_gateway_requests_total counter", *requests,
        "# HELP tritonctl_gateway_failures_total Failed requests by class: model (its own error, error responses "
        "included), unavailable (tritonserver unreachable or refusing), client (the request's fault).",
        "# TYPE tritonctl_gateway_failures_total counter", *failures,
        "# HELP tritonctl_gateway_request_seconds Time from a request's start to its answer's end, at the gateway.",
        "# TYPE tritonctl_gateway_request_seconds histogram", *hist,
        "# HELP tritonctl_gateway_in_flight Requests in flight, by public model and digest.",
        "# TYPE tritonctl_gateway_in_flight gauge", *inflight,
        "# HELP tritonctl_gateway_waiting_requests Requests waiting for their model's load, by public model.",
        "# TYPE tritonctl_gateway_waiting_requests gauge",
        *(f"tritonctl_gateway_waiting_requests{{{_labels(model=m)}}} {len(q)}"
          for m, q in sorted(parking.waiting.items())),
        "# HELP tritonctl_gateway_parked_requests_total Requests that waited for their model's load.",
        "# TYPE tritonctl_gateway_parked_requests_total counter",
        f"tritonctl_gateway_parked_requests_total {parking.parked}",
    ]
    return "\n".join(lines) + "\n"


def relabel_triton(text: bytes, digests: dict[str, str]) -> bytes:
    """Triton's exposition with each private `model` label made public and a `digest` label added."""

    def swap(match: re.Match[bytes]) -> bytes:
        name = match.group(1)
        private = PRIVATE_IN_TEXT.fullmatch(name)
        if private is None:
            return match.group(0)
        digest = digests.get(name.decode(), name[-8:].decode())
        return b'model="' + private.group(1) + b'",digest="' + digest[:12].encode() + b'"'

    return _MODEL_LABEL.sub(swap, text)


async def scrape(host: str, port: int) -> bytes:
    """tritonserver's /metrics body (HTTP/1.1, Connection: close)."""
    reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), SCRAPE_TIMEOUT_S)
    try:
        writer.write(f"GET /metrics HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode())
        raw = await asyncio.wait_for(reader.read(), SCRAPE_TIMEOUT_S)
    finally:
        writer.close()
    body: list[bytes] = []

    class Sink:
        def on_body(self, data: bytes) -> None:
            body.append(data)

    parser = httptools.HttpResponseParser(Sink())
    parser.feed_data(raw)
    if parser.get_status_code() != 200:
        raise OSError(f"tritonserver's /metrics answered {parser.get_status_code()}")
    return b"".join(body)


class MetricsServer:
    def __init__(self, gw: Any) -> None:
        self.gw = gw
        self.server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> None:
        self.server = await asyncio.start_server(self._client, host, port, reuse_address=True)

    def port(self) -> int | None:
        if self.server is None or not self.server.sockets:
            return None
        return int(self.server.sockets[0].getsockname()[1])

    def close(self) -> None:
        if self.server is not None:
            self.server.close()

    async def body(self) -> bytes:
        own = gateway_text(self.gw).encode()
        address = self.gw.options.triton_metrics
        if address is None:
            return own
        digests = {slot.name: slot.digest for slot in self.gw.figures.slots.values()}
        for route in self.gw.routes.routes.values():
            digests.update({t.name: t.digest for t in route.targets})
        try:
            triton = relabel_triton(await scrape(*address), digests)
        except (OSError, asyncio.TimeoutError, httptools.HttpParserError) as exc:
            return own + f"# tritonserver's metrics at {address[0]}:{address[1]} could not be read: {exc}\n".encode()
        return own + triton

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10.0)
            path = request.split(b" ", 2)[1] if request.count(b" ") >= 2 else b""
            if request.startswith(b"GET ") and path.split(b"?")[0] == b"/metrics":
                payload = await self.body()
                head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
            else:
                payload = b"only GET /metrics here\n"
                head = b"HTTP/1.1 404 Not Found\r\nContent-Type: text/plain\r\n"
            writer.write(head + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(payload) + payload)
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, ConnectionError, OSError):
            pass
        finally:
            writer.close()
