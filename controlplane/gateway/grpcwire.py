"""gRPC over HTTP/2 as the relay sees it: method kinds, status codes, and header blocks built once.

The client-facing side (grpcfront.py) decodes each request's header block once per distinct block
(h2.HeaderDecoder's cache) into a `RequestHead`: which method, what it costs (hot infer path, a decoded
metadata method, a local answer, a refusal, plain pass-through), the block to send tritonserver, the
`x-tritonctl-route` pin and the metadata a sticky route hashes. The Triton-facing side decodes answers
into a `ResponseHead` carrying the block to send the client. Neither block uses an HPACK dynamic table.
"""

from __future__ import annotations

from urllib.parse import quote, unquote_to_bytes

from controlplane.gateway import frames as f

SERVICE = b"/inference.GRPCInferenceService/"

# what the relay does with each method
PASS, INFER, STREAM, META, READY, CONFIG, STATS, INDEX, REFUSE, TRACE = range(10)
KINDS = {
    b"ModelInfer": INFER, b"ModelStreamInfer": STREAM, b"ModelMetadata": META, b"ModelReady": READY,
    b"ModelConfig": CONFIG, b"ModelStatistics": STATS, b"RepositoryIndex": INDEX,
    b"RepositoryModelLoad": REFUSE, b"RepositoryModelUnload": REFUSE, b"TraceSetting": TRACE,
}
# methods whose request names a model in field 1 (TraceSetting's model_name is field 2: decoded)
NAMED = frozenset({INFER, STREAM, META, READY, CONFIG, STATS})

OK, CANCELLED, UNKNOWN, INVALID_ARGUMENT, DEADLINE_EXCEEDED, NOT_FOUND = 0, 1, 2, 3, 4, 5
PERMISSION_DENIED, RESOURCE_EXHAUSTED, UNIMPLEMENTED, INTERNAL, UNAVAILABLE = 7, 8, 12, 13, 14

ROUTE_HEADER = b"x-tritonctl-route"
# hop-by-hop headers never forwarded; grpc-accept-encoding is dropped so tritonserver never compresses
# an answer the gateway must rewrite
_DROPPED = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade",
                      b"grpc-accept-encoding", b"host"})

RESPONSE_HEADERS = f.encode_headers([(b":status", b"200"), (b"content-type", b"application/grpc")])


def failure_class(status: int) -> str | None:
    """Which failure a gRPC status counts as (docs/gateway.md "Figures"); None for success."""
    if status == OK:
        return None
    if status in (UNAVAILABLE, RESOURCE_EXHAUSTED):
        return "unavailable"
    if status in (INTERNAL, UNKNOWN, DEADLINE_EXCEEDED):
        return "model"
    return "client"


class RequestHead:
    """What a client's request header block means to the relay (one per distinct block)."""

    __slots__ = ("path", "kind", "up_block", "pin", "headers", "error")

    def __init__(self, headers: list[tuple[bytes, bytes]], authority: bytes) -> None:
        self.headers: dict[bytes, bytes] = {}
        self.error: str | None = None
        self.pin: bytes | None = None
        path = method = b""
        scheme = b"http"
        forwarded: list[tuple[bytes, bytes]] = []
        for name, value in headers:
            if name[:1] == b":":
                if name == b":path":
                    path = value
                elif name == b":method":
                    method = value
                elif name == b":scheme":
                    scheme = value
                elif name != b":authority":
                    self.error = f"unknown pseudo-header {name.decode('latin-1')}"
                continue
            if name in _DROPPED:
                continue
            if name == ROUTE_HEADER:
                self.pin = value.strip().lower()
            self.headers[name] = value
            forwarded.append((name, value))
        self.path = path
        if method != b"POST":
            self.error = self.error or f"method {method.decode('latin-1')!r}: gRPC uses POST"
        if not path.startswith(b"/"):
            self.error = self.error or "no :path"
        self.kind = KINDS.get(path[len(SERVICE):], PASS) if path.startswith(SERVICE) else PASS
        block = [(b":method", b"POST"), (b":scheme", scheme), (b":path", path), (b":authority", authority)]
        self.up_block = f.encode_headers(block + forwarded)


class ResponseHead:
    """Triton's answer headers or trailers: status, message and the block for the client."""

    __slots__ = ("status", "message", "http_status", "block", "trailer_pairs")

    def __init__(self, headers: list[tuple[bytes, bytes]]) -> None:
        self.status: int | None = None
        self.message = b""
        self.http_status = b""
        pairs: list[tuple[bytes, bytes]] = []
        for name, value in headers:
            if name == b":status":
                self.http_status = value
                continue
            if name[:1] == b":" or name in _DROPPED:
                continue
            if name == b"grpc-status":
                try:
                    self.status = int(value)
                except ValueError:
                    self.status = UNKNOWN
            elif name == b"grpc-message":
                self.message = unquote_to_bytes(value)
                continue  # re-encoded by `trailers` after its private names are made public
            pairs.append((name, value))
        self.trailer_pairs = pairs
        if self.message:
            self.block = b""  # built per call: its message is rewritten first
        elif self.http_status:
            self.block = f.encode_headers([(b":status", self.http_status), *pairs])
        else:
            self.block = f.encode_headers(pairs)


def percent(message: bytes) -> bytes:
    """grpc-message's encoding: percent-encoded UTF-8, printable ASCII kept."""
    return quote(message, safe=" !\"#$&'()*+,-./:;<=>?@[\\]^_`{|}~").encode("ascii")


def trailers(status: int, message: bytes = b"", extra: list[tuple[bytes, bytes]] | None = None,
             only: bool = False) -> bytes:
    """A trailer block (`only`: trailers-only, with :status and content-type)."""
    pairs = [(b":status", b"200"), (b"content-type", b"application/grpc")] if only else []
    pairs += list(extra or ())
    pairs.append((b"grpc-status", str(status).encode()))
    if message:
        pairs.append((b"grpc-message", percent(message)))
    return f.encode_headers(pairs)


TRAILERS_OK = trailers(OK)


def unknown_model(name: bytes) -> bytes:
    """Triton's own wording for a model it does not serve."""
    return b"Request for unknown model: '" + name + b"' is not found"
