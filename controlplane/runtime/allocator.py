"""The daemon's C allocator: glibc's malloc arenas capped (`cap_arenas`), before its threads start.

Why: glibc gives each thread that allocates while another holds an arena one of its own, up to 8 per
core, and a freed block goes back to its own arena only. The daemon's threads (the start-up pool,
gRPC's, the API's, the metrics endpoint's) each allocated through their own arena: in a first start
under auto policy at 10,000 models the staged deploys' end added 67 MB to the daemon's peak RSS,
memory freed in one arena and asked for again in another, never reused (measured by RSS samples then:
356 MB peak; with two arenas 269 MB, the end of the deploys adding nothing; issue 39). Since the deploys
end a chunk at a time, the cap saves less: bench/arena_ab.py measures it side by side (docs/benchmarks.md).
Python's own small objects come from its arenas (pymalloc) and are not concerned; what glibc serves
(objects over 512 bytes, SQLite's, gRPC's, protobuf's) is. The daemon holds the GIL for most of its work,
so two arenas cost it nothing measurable.

`MALLOC_ARENA_MAX` in the environment (glibc read it at the process's start) stands instead; a C
library without `mallopt` (musl, macOS) is left as it is. Child processes (tritonserver, the capture
workers once they exec) start with their own defaults.

`secondary_arenas` reads from outside how many arenas a process made beside its main one (its
/proc/PID/maps): what tests/test_allocator.py checks of a real daemon, and bench/arena_ab.py records.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

M_ARENA_MAX = -8  # glibc's malloc.h
ARENAS = 2
# glibc's heap of a secondary arena: a reservation of HEAP_MAX_SIZE (64 MiB on 64-bit) aligned to it, its
# used part read-write and the rest PROT_NONE, anonymous. The main arena is the brk heap, not one of these.
HEAP_MAX = 64 << 20


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


def secondary_arenas(pid: int) -> int:
    """The malloc arenas process `pid` made beside its main one, read from /proc/PID/maps: each is one
    anonymous HEAP_MAX-aligned reservation of exactly HEAP_MAX (OSError: no such process)."""
    maps = []
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        parts = line.split()
        start, end = (int(x, 16) for x in parts[0].split("-"))
        maps.append((start, end, parts[1], parts[5] if len(parts) > 5 else ""))
    found = 0
    for i, (start, end, perms, path) in enumerate(maps):
        if start % HEAP_MAX or path or not perms.startswith("rw"):
            continue
        j = i + 1
        while j < len(maps) and maps[j][0] == end and not maps[j][3] and end < start + HEAP_MAX:
            end = maps[j][1]
            j += 1
        found += end == start + HEAP_MAX
    return found
