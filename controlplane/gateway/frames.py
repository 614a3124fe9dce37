"""HTTP/2 on the wire (RFC 9113) and the gateway's own HPACK encoding (RFC 7541), as plain functions.

The gateway speaks HTTP/2 itself, toward clients and toward tritonserver, because a general-purpose
library (grpcio, h2) costs more CPU per request than the whole relay may spend (docs/gateway.md). This
module holds what both sides share and that needs no state: frame types, flags, settings and error
codes, the 9-byte frame header, and an HPACK *encoder* that never touches a dynamic table — static-table
indices and literals without indexing only — so a block the gateway sends means the same to every peer
whatever that peer's table holds, and a block built once (a response's `:status 200`, a `grpc-status: 0`
trailer) is reused as bytes. Decoding, which does depend on the peer's table, is `h2.HeaderDecoder`.
"""

from __future__ import annotations

import struct

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)

FLAG_END_STREAM = 0x1
FLAG_ACK = 0x1
FLAG_END_HEADERS = 0x4
FLAG_PADDED = 0x8
FLAG_PRIORITY = 0x20

S_HEADER_TABLE_SIZE = 1
S_ENABLE_PUSH = 2
S_MAX_CONCURRENT_STREAMS = 3
S_INITIAL_WINDOW_SIZE = 4
S_MAX_FRAME_SIZE = 5
S_MAX_HEADER_LIST_SIZE = 6

NO_ERROR = 0x0
PROTOCOL_ERROR = 0x1
INTERNAL_ERROR = 0x2
FLOW_CONTROL_ERROR = 0x3
STREAM_CLOSED = 0x5
FRAME_SIZE_ERROR = 0x6
REFUSED_STREAM = 0x7
CANCEL = 0x8
COMPRESSION_ERROR = 0x9
ENHANCE_YOUR_CALM = 0xB

DEFAULT_WINDOW = 65_535
DEFAULT_MAX_FRAME = 16_384
MAX_WINDOW = 2**31 - 1

FRAME_HEADER = struct.Struct(">HBBBL")  # length (24 bits as 16 + 8), type, flags, stream id (31 bits)
_U32 = struct.Struct(">L")
_U32X2 = struct.Struct(">LL")
_SETTING = struct.Struct(">HL")


class ProtocolError(Exception):
    """A peer broke HTTP/2: the connection answers GOAWAY with `code` and closes (RFC 9113 §5.4.1)."""

    def __init__(self, message: str, code: int = PROTOCOL_ERROR) -> None:
        super().__init__(message)
        self.code = code


def frame_header(length: int, ftype: int, flags: int, sid: int) -> bytes:
    return FRAME_HEADER.pack(length >> 8, length & 0xFF, ftype, flags, sid)


def frame(ftype: int, flags: int, sid: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return FRAME_HEADER.pack(n >> 8, n & 0xFF, ftype, flags, sid) + payload


def settings_frame(values: dict[int, int]) -> bytes:
    return frame(SETTINGS, 0, 0, b"".join(_SETTING.pack(k, v) for k, v in values.items()))


SETTINGS_ACK = frame(SETTINGS, FLAG_ACK, 0)


def parse_settings(payload: bytes) -> list[tuple[int, int]]:
    if len(payload) % 6:
        raise ProtocolError("SETTINGS payload not a multiple of 6", FRAME_SIZE_ERROR)
    return [_SETTING.unpack_from(payload, i) for i in range(0, len(payload), 6)]


def window_update(sid: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, sid, _U32.pack(increment))


def rst_stream(sid: int, code: int) -> bytes:
    return frame(RST_STREAM, 0, sid, _U32.pack(code))


def goaway(last_sid: int, code: int, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, _U32X2.pack(last_sid, code) + debug[:256])


def u32(payload: bytes, offset: int = 0) -> int:
    return int(_U32.unpack_from(payload, offset)[0])


# -- HPACK, encoding side: static indices and literals without indexing only -------------------------

STATIC_TABLE: tuple[tuple[bytes, bytes], ...] = (
    (b":authority", b""), (b":method", b"GET"), (b":method", b"POST"), (b":path", b"/"),
    (b":path", b"/index.html"), (b":scheme", b"http"), (b":scheme", b"https"), (b":status", b"200"),
    (b":status", b"204"), (b":status", b"206"), (b":status", b"304"), (b":status", b"400"),
    (b":status", b"404"), (b":status", b"500"), (b"accept-charset", b""), (b"accept-encoding", b"gzip, deflate"),
    (b"accept-language", b""), (b"accept-ranges", b""), (b"accept", b""), (b"access-control-allow-origin", b""),
    (b"age", b""), (b"allow", b""), (b"authorization", b""), (b"cache-control", b""),
    (b"content-disposition", b""), (b"content-encoding", b""), (b"content-language", b""), (b"content-length", b""),
    (b"content-location", b""), (b"content-range", b""), (b"content-type", b""), (b"cookie", b""),
    (b"date", b""), (b"etag", b""), (b"expect", b""), (b"expires", b""), (b"from", b""), (b"host", b""),
    (b"if-match", b""), (b"if-modified-since", b""), (b"if-none-match", b""), (b"if-range", b""),
    (b"if-unmodified-since", b""), (b"last-modified", b""), (b"link", b""), (b"location", b""),
    (b"max-forwards", b""), (b"proxy-authenticate", b""), (b"proxy-authorization", b""), (b"range", b""),
    (b"referer", b""), (b"refresh", b""), (b"retry-after", b""), (b"server", b""), (b"set-cookie", b""),
    (b"strict-transport-security", b""), (b"transfer-encoding", b""), (b"user-agent", b""), (b"vary", b""),
    (b"via", b""), (b"www-authenticate", b""),
)
_FULL_INDEX = {entry: i + 1 for i, entry in enumerate(STATIC_TABLE)}
_NAME_INDEX: dict[bytes, int] = {}
for _i, (_name, _value) in enumerate(STATIC_TABLE):
    _NAME_INDEX.setdefault(_name, _i + 1)


def hpack_int(value: int, prefix_bits: int, first: int) -> bytes:
    """RFC 7541 §5.1: `value` in a `prefix_bits` prefix whose high bits are `first`."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes((first | value,))
    out = bytearray((first | limit,))
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_header(name: bytes, value: bytes) -> bytes:
    """One field: the static table's full entry when there is one, else a literal without indexing
    (its name by static index when the name is there), never Huffman-coded."""
    index = _FULL_INDEX.get((name, value))
    if index is not None:
        return hpack_int(index, 7, 0x80)
    name_index = _NAME_INDEX.get(name)
    head = hpack_int(name_index, 4, 0x00) if name_index else b"\x00" + hpack_int(len(name), 7, 0) + name
    return head + hpack_int(len(value), 7, 0) + value


def encode_headers(headers: list[tuple[bytes, bytes]]) -> bytes:
    return b"".join(encode_header(name, value) for name, value in headers)


TABLE_SIZE_ZERO = b"\x20"  # a dynamic table size update to 0: the block's first byte after a peer's new limit


def header_frames(sid: int, block: bytes, end_stream: bool, max_frame: int) -> list[bytes]:
    """A header block as HEADERS (+ CONTINUATION) frames of at most `max_frame` bytes each."""
    flags = FLAG_END_STREAM if end_stream else 0
    if len(block) <= max_frame:
        return [frame_header(len(block), HEADERS, flags | FLAG_END_HEADERS, sid), block]
    out = [frame_header(max_frame, HEADERS, flags, sid), block[:max_frame]]
    pos = max_frame
    while pos < len(block):
        chunk = block[pos : pos + max_frame]
        pos += len(chunk)
        out += [frame_header(len(chunk), CONTINUATION, FLAG_END_HEADERS if pos >= len(block) else 0, sid), chunk]
    return out
