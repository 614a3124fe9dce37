"""The state one HTTP/2 connection keeps besides its socket: limits, streams, the peer's HPACK table.

h2.py (receiving) and h2send.py (sending) share these; `DIRTY` is the list of connections with frames
queued since the last `flush_dirty()`, which every data_received ends with, so each event writes each
touched connection once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import hpack
from hpack.exceptions import HPACKError

from controlplane.gateway import frames as f

DIRTY: list[Any] = []  # connections with frames queued since the last flush_dirty()


def flush_dirty() -> None:
    while DIRTY:
        conn = DIRTY.pop()
        conn.flush()


class Limits:
    """What one connection grants and tolerates (docs/gateway.md "Limits")."""

    def __init__(self, *, stream_window: int = 8 << 20, conn_window: int = 16 << 20, max_frame: int = 1 << 20,
                 max_header_block: int = 64 << 10, max_header_list: int = 64 << 10, max_streams: int = 1000,
                 header_table: int = 4096) -> None:
        self.stream_window = stream_window
        self.conn_window = conn_window
        self.max_frame = max_frame
        self.max_header_block = max_header_block
        self.max_header_list = max_header_list
        self.max_streams = max_streams
        self.header_table = header_table


class Stream:
    """One stream's flow-control state and the relay object (`call`) it belongs to."""

    __slots__ = ("sid", "send_window", "recv_window", "unacked", "pending", "pending_end", "pending_trailers",
                 "remote_closed", "local_closed", "call")

    def __init__(self, sid: int, send_window: int, recv_window: int, call: Any = None) -> None:
        self.sid = sid
        self.send_window = send_window
        self.recv_window = recv_window
        self.unacked = 0
        self.pending: list[Any] = []  # DATA payload pieces waiting for window
        self.pending_end = False
        self.pending_trailers: list[bytes] | None = None
        self.remote_closed = False
        self.local_closed = False
        self.call = call


class HeaderDecoder:
    """The peer's HPACK state, with a cache of decoded blocks keyed by their bytes.

    A repeated request's header block is byte-identical once the peer's encoder has indexed its fields;
    decoding such a block changes nothing in the table, so while the table stays as it was, the same
    bytes mean the same headers and `make` (what the side derives from them) is reused. Any block that
    changes the table empties the cache.
    """

    CACHE_MAX = 256

    def __init__(self, limits: Limits, make: Callable[[list[tuple[bytes, bytes]]], Any]) -> None:
        self._decoder = hpack.Decoder(max_header_list_size=limits.max_header_list)
        self._decoder.max_allowed_table_size = limits.header_table
        self._table = self._decoder.header_table
        self._make = make
        self.cache: dict[bytes, Any] = {}

    def decode(self, block: bytes) -> Any:
        hit = self.cache.get(block)
        if hit is not None:
            return hit
        table = self._table
        before = (tuple(table.dynamic_entries), table.maxsize)
        try:
            headers = self._decoder.decode(block, raw=True)
        except HPACKError as exc:
            raise f.ProtocolError(f"header block: {type(exc).__name__}: {exc}", f.COMPRESSION_ERROR) from None
        except (ValueError, IndexError, UnicodeError) as exc:  # malformed input the library did not wrap
            raise f.ProtocolError(f"header block: {exc}", f.COMPRESSION_ERROR) from None
        made = self._make(list(headers))  # type: ignore[arg-type]  # raw=True: (bytes, bytes) pairs
        if (tuple(table.dynamic_entries), table.maxsize) == before:
            if len(self.cache) >= self.CACHE_MAX:
                self.cache.clear()
            self.cache[block] = made
        else:
            self.cache.clear()
        return made
