"""The daemon's C allocator: glibc's malloc arenas capped (`cap_arenas`), before its threads start.

Why: glibc gives each thread that allocates while another holds an arena one of its own, up to 8 per
core, and a freed block goes back to its own arena only. The daemon's threads (the start-up pool,
gRPC's, the API's, the metrics endpoint's) each allocated through their own arena: in a first start
under auto policy at 10,000 models the staged deploys' end added 67 MB to the daemon's peak RSS,
memory freed in one arena and asked for again in another, never reused (measured: 356 MB peak; with
two arenas 269 MB, the end of the deploys adding nothing; issue 39). Python's own small objects come
from its arenas (pymalloc) and are not concerned; what glibc serves (objects over 512 bytes, SQLite's,
gRPC's, protobuf's) is. The daemon holds the GIL for most of its work, so two arenas cost it nothing
measurable.

`MALLOC_ARENA_MAX` in the environment (glibc read it at the process's start) stands instead; a C
library without `mallopt` (musl, macOS) is left as it is. Child processes (tritonserver, the capture
workers once they exec) start with their own defaults.
"""

from __future__ import annotations

import ctypes
import os

M_ARENA_MAX = -8  # glibc's malloc.h
ARENAS = 2


def cap_arenas(arenas: int = ARENAS) -> bool:
    """Cap this process's malloc arenas at `arenas`; whether it was done (False: the environment's
    MALLOC_ARENA_MAX stands, or the C library has no such setting)."""
    if "MALLOC_ARENA_MAX" in os.environ:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the process's own C library
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_ARENA_MAX, arenas))
