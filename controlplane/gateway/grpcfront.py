"""The gateway's gRPC listener: an HTTP/2 server connection per client, a `GrpcCall` per stream.

Clients speak Triton's `inference.GRPCInferenceService` to this port as they would to tritonserver's.
Each new stream's header block becomes a `RequestHead` (decoded once per distinct block, see
h2.HeaderDecoder) and a `GrpcCall` that relays it (grpccall.py). Limits against hostile peers: the
stream count per connection (SETTINGS_MAX_CONCURRENT_STREAMS, refused above it), the header block and
list sizes, the message size (`max_message`), and every protocol error ends that client's connection
with GOAWAY, never another client's.
"""

from __future__ import annotations

import asyncio
from typing import Any

from controlplane.gateway import frames as f
from controlplane.gateway.grpccall import GrpcCall
from controlplane.gateway.grpcwire import RequestHead
from controlplane.gateway.h2 import H2Connection
from controlplane.gateway.h2state import Stream
from controlplane.gateway.upstream import nodelay


class FrontConnection(H2Connection):
    """One client's HTTP/2 connection to the gateway's gRPC port."""

    def __init__(self, gw: Any) -> None:
        super().__init__(gw.front_limits)
        self.gw = gw

    def make_head(self, headers: list[tuple[bytes, bytes]]) -> Any:
        return RequestHead(headers, self.gw.authority)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        nodelay(transport)
        super().connection_made(transport)
        self.gw.connections.add(self)
        if self.gw.draining:
            self.send_goaway()
            self.flush()

    def on_headers(self, sid: int, head: Any, end_stream: bool) -> None:
        st = self.streams.get(sid)
        if st is not None:  # trailers from the client: gRPC sends none, but HTTP/2 allows them
            if not end_stream:
                raise f.ProtocolError("a second header block without END_STREAM")
            st.remote_closed = True
            st.call.client_data(b"", True)
            return
        if sid % 2 == 0 or sid <= self.last_peer_sid:
            raise f.ProtocolError(f"HEADERS opening stream {sid} (closed, or not a client's id)", f.STREAM_CLOSED)
        self.last_peer_sid = sid
        if self.goaway_sent or len(self.streams) >= self.limits.max_streams:
            self.queue(f.rst_stream(sid, f.REFUSED_STREAM))
            return
        st = self.open_stream(sid, None)
        st.remote_closed = end_stream
        call = GrpcCall(self.gw, self, st, head)
        st.call = call
        self.gw.calls += 1
        call.start(end_stream)

    def on_data(self, st: Stream, payload: Any, end_stream: bool) -> None:
        st.call.client_data(payload, end_stream)
        if end_stream:
            self._maybe_close(st)

    def on_reset(self, st: Stream, code: int) -> None:
        st.call.client_reset(code)

    def on_window(self, st: Stream) -> None:
        call = st.call
        if call is not None:
            call.client_window()

    def on_goaway(self, last_sid: int, code: int) -> None:
        """The client opens no more streams: with none open, the connection is done."""
        if not self.streams and self.transport is not None:
            self.flush()
            self.transport.close()

    def on_lost(self) -> None:
        self.gw.connections.discard(self)
        for st in list(self.streams.values()):
            st.call.client_reset(f.CANCEL)
