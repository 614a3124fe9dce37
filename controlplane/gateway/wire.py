"""The model name inside gRPC messages, found and replaced without decoding the tensors.

A gRPC message is a 5-byte prefix (compressed flag, big-endian length) and protobuf bytes. In
`ModelInferRequest` and `ModelInferResponse` the model name is field 1 (shared/TRITON_NOTES.md "Wire
facts"). Protobuf does not promise field order, and a parser keeps the *last* value of a repeated
singular field, so a request is walked over all its top-level tags (the length of each length-delimited
field lets the walk jump over tensor bytes): a second field 1 is refused, never passed on. The walk is
incremental (`RequestScan.feed`): a large message streams through the gateway as its DATA frames
arrive, and only the bytes before field 1 are held. Triton's own answers are serialized in field order
by its C++ protobuf, so a response's name is its first field (`response_head`).

Private names (`<model>__<8 hex>`, controlplane/names.py) in error texts become the public model name
(`public_text`): a client never reads a private name.
"""

from __future__ import annotations

import re
import struct
from typing import Any

NAME_MAX = 1024  # bytes of a model name the walk holds; a longer field 1 is refused
# a private name in a text: `<model>__<8 hex>` not followed by a letter or digit (the python backend names an
# instance `<model>_0_0`: `boom__0123abcd_0_0` becomes `boom_0_0`)
PRIVATE_IN_TEXT = re.compile(rb"([A-Za-z0-9_][A-Za-z0-9_.\-]*?)__[0-9a-f]{8}(?![0-9A-Za-z])")


class WireError(Exception):
    """The message is not one the gateway can pass on (INVALID_ARGUMENT to the client)."""


def varint(buf: Any, i: int) -> tuple[int, int]:
    """(value, next index) of the varint at `buf[i]`; next index -1 when the bytes end first."""
    result = 0
    shift = 0
    n = len(buf)
    while i < n:
        b = buf[i]
        result |= (b & 0x7F) << shift
        i += 1
        if b < 0x80:
            return result, i
        shift += 7
        if shift > 63:
            raise WireError("a varint longer than 10 bytes")
    return 0, -1


def encode_varint(value: int) -> bytes:
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_PREFIX = struct.Struct(">BL").pack


def grpc_prefix(length: int) -> bytes:
    """An uncompressed gRPC message's 5-byte prefix."""
    return _PREFIX(0, length)


def string_field(number: int, value: bytes) -> bytes:
    return encode_varint((number << 3) | 2) + encode_varint(len(value)) + value


class RequestScan:
    """Walks one message's top-level fields as its bytes arrive; finds field 1 (a string).

    `feed(chunk, at)` takes the body bytes `[at, at + len(chunk))` in order. After each feed, `name`
    is field 1's value once seen whole (with `start`/`end`: its tag's offset and the offset after its
    value), and a second field 1 or a malformed field raises WireError. `finish(length)` checks that
    the walk ended exactly at the end of the message.
    """

    __slots__ = ("next", "carry", "carry_at", "name", "start", "end")

    def __init__(self) -> None:
        self.next = 0  # body offset of the next tag
        self.carry = b""  # bytes from carry_at on, when a tag or field 1 straddled a chunk end
        self.carry_at = 0
        self.name: bytes | None = None
        self.start = self.end = 0

    def feed(self, chunk: Any, at: int) -> None:
        stop = at + len(chunk)
        if self.next >= stop:
            return
        if self.carry:
            buf: Any = self.carry + bytes(chunk)
            base = self.carry_at
            self.carry = b""
        else:
            buf = chunk
            base = at
        n = len(buf)
        i = self.next - base
        while i < n:
            tag = buf[i]
            j = i + 1
            if tag >= 0x80:
                tag, j = varint(buf, i)
                if j < 0:
                    break
            wire = tag & 7
            if tag < 8:
                raise WireError("a field numbered 0")
            if wire == 2:
                if j >= n:
                    break
                length = buf[j]
                k = j + 1
                if length >= 0x80:
                    length, k = varint(buf, j)
                    if k < 0:
                        break
                if tag == 0x0A:
                    if length > NAME_MAX:
                        raise WireError(f"model_name longer than {NAME_MAX} bytes")
                    if k + length > n:
                        break
                    if self.name is not None:
                        raise WireError("model_name (field 1) given twice")
                    self.name = bytes(buf[k : k + length])
                    self.start, self.end = base + i, base + k + length
                i = k + length
            elif wire == 0:
                while j < n and buf[j] >= 0x80:
                    j += 1
                if j >= n:
                    break
                i = j + 1
            elif wire == 1:
                i = j + 8
            elif wire == 5:
                i = j + 4
            else:
                raise WireError(f"wire type {wire} (groups are not used by this service)")
        if i < n:  # a tag or field 1 cut by the chunk's end: keep its bytes for the next feed
            self.carry = bytes(buf[i:])
            self.carry_at = base + i
        self.next = base + i

    def finish(self, length: int) -> None:
        if self.carry or self.next != length:
            raise WireError("the message ends inside a field")


def rest_ok(buf: Any, i: int, n: int) -> bool:
    """Whether `buf[i:n]` is whole top-level fields with no field 1 among them (the fast path's check;
    anything else takes RequestScan, which says what is wrong)."""
    while i < n:
        tag = buf[i]
        if tag >= 0x80:
            tag, i = varint(buf, i)
            if i < 0:
                return False
        else:
            i += 1
        if tag < 16:  # field 0 or field 1 again
            return False
        wire = tag & 7
        if wire == 2:
            if i >= n:
                return False
            length = buf[i]
            if length >= 0x80:
                length, i = varint(buf, i)
                if i < 0:
                    return False
            else:
                i += 1
            i += length
        elif wire == 0:
            while i < n and buf[i] >= 0x80:
                i += 1
            i += 1
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        else:
            return False
    return i == n


def response_head(buf: Any) -> tuple[int, int] | None:
    """(start, end) of a response's model_name field when it is the first field and wholly in `buf`;
    (0, 0) when the first field is not field 1 (no name to rename); None when `buf` is too short."""
    if not buf:
        return None
    if buf[0] != 0x0A:
        return (0, 0)
    if len(buf) < 2:
        return None
    length = buf[1]
    k = 2
    if length >= 0x80:
        length, k = varint(buf, 1)
        if k < 0:
            return None
    if k + length > len(buf):
        return None if length <= NAME_MAX else (0, 0)
    return (0, k + length)


def fields(body: Any) -> list[tuple[int, int, int, int]]:
    """Every top-level field of a whole message: (tag, start, value start, end)."""
    out = []
    i, n = 0, len(body)
    while i < n:
        tag, j = varint(body, i)
        if j < 0:
            raise WireError("the message ends inside a tag")
        wire = tag & 7
        if wire == 2:
            length, k = varint(body, j)
            if k < 0 or k + length > n:
                raise WireError("the message ends inside a field")
            out.append((tag, i, k, k + length))
            i = k + length
            continue
        if wire == 0:
            _, k = varint(body, j)
            if k < 0:
                raise WireError("the message ends inside a varint")
        elif wire == 1:
            k = j + 8
        elif wire == 5:
            k = j + 4
        else:
            raise WireError(f"wire type {wire}")
        if k > n:
            raise WireError("the message ends inside a field")
        out.append((tag, i, j, k))
        i = k
    return out


def rename_infer_response(body: bytes, public: bytes) -> bytes:
    """A whole ModelInferResponse with model_name (field 1) set to `public`."""
    head = response_head(body)
    if head is None or head == (0, 0):
        return body
    return string_field(1, public) + body[head[1] :]


def rename_stream_response(body: bytes) -> bytes:
    """A whole ModelStreamInferResponse with private names made public: error_message (field 1) text
    and infer_response (field 2)'s model_name."""
    parts: list[bytes] = []
    for tag, start, value, end in fields(body):
        if tag == 0x0A:
            parts.append(string_field(1, public_text(bytes(body[value:end]))))
        elif tag == 0x12:
            inner = bytes(body[value:end])
            head = response_head(inner)
            if head is not None and head != (0, 0):
                _, k = varint(inner, 1)
                name = public_name(inner[k : head[1]])
                inner = string_field(1, name) + inner[head[1] :]
            parts.append(string_field(2, inner))
        else:
            parts.append(bytes(body[start:end]))
    return b"".join(parts)


def stream_error(body: Any) -> bytes:
    """A ModelStreamInferResponse's error_message (field 1), b"" when it has none."""
    for tag, _start, value, end in fields(body):
        if tag == 0x0A:
            return bytes(body[value:end])
    return b""


def public_name(name: bytes) -> bytes:
    """`linear__0123abcd` → `linear`; any other name as it is."""
    if len(name) > 10 and name[-10:-8] == b"__":
        match = PRIVATE_IN_TEXT.fullmatch(name)
        if match:
            return match.group(1)
    return name


def public_text(text: bytes) -> bytes:
    """An error text with every private name in it made public."""
    if b"__" not in text:
        return text
    return PRIVATE_IN_TEXT.sub(rb"\1", text)
