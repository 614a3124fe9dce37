"""A bake's warnings: a digest whose load took more than `bake_warn_load_ratio` times the previous digest's,
or whose memory footprint grew more than that ratio (docs/bake.md, "Load time and footprint").

Neither fails a bake: the digest gets one warning line in the audit (action `bake`, outcome `warning`,
actor `tritonctl:bake`) and, from that line, a mark in `tritonctl versions` (`bake_warning`).

- Load time: the seconds of Triton's load request of each deploy that ended `ok` (TritonClient's
  `load_seconds`), kept per model and digest in `<state>/loads.json` (a few digests per model, across a
  restart), so the previous digest's is known however long ago it was deployed.
- Footprint: what the memory budget code measured at each load (controlplane/memory/: the registry's
  footprints, host memory and, where measured or declared, GPU memory).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from controlplane.base.bounds import check_duration
from controlplane.snapshot.fsutil import write_atomic
from controlplane.store.records import FootprintRecord
from controlplane.vocab import Result

log = logging.getLogger("tritonctl.bake")

LOADS_FILE = "loads.json"  # in the state directory: the load seconds of each model's last digests
KEEP_PER_MODEL = 8
WARNING = Result.WARNING.value  # the audit outcome of a bake's warning line


class LoadTimes:
    """model → digest → the seconds its last deploy's load request took (the newest KEEP_PER_MODEL digests)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._times: dict[str, dict[str, float]] = {}
        if path is not None and path.exists():
            try:
                data = json.loads(path.read_text())
                self._times, dropped = _read(data)
            except (OSError, ValueError, TypeError, AttributeError) as exc:
                log.warning("bake: %s unreadable, load times start afresh: %s", path, exc)
                return
            if dropped:  # one line; the next note writes the file without them
                log.warning("bake: %s: %d load time(s) out of range dropped (%s)", path, len(dropped),
                            "; ".join(dropped)[:500])

    def note(self, model: str, digest: str, seconds: float | None) -> None:
        if seconds is None:
            return
        with self._lock:
            digests = self._times.setdefault(model, {})
            digests.pop(digest, None)
            digests[digest] = round(seconds, 4)  # the newest last
            for old in list(digests)[:-KEEP_PER_MODEL]:
                del digests[old]
            text = json.dumps(self._times)
        if self.path is not None:
            try:  # through an exclusive temporary file, mode 0640 whatever the umask (issue 58)
                write_atomic(self.path, text.encode(), mode=0o640)
            except OSError as exc:
                log.warning("bake: cannot write %s: %s", self.path, exc)

    def of(self, model: str, digest: str | None) -> float | None:
        with self._lock:
            return self._times.get(model, {}).get(digest or "")


def _read(data: Any) -> tuple[dict[str, dict[str, float]], list[str]]:
    """`loads.json`'s model → digest → seconds, and what was dropped: a load time that is not a number from 0
    to a week (controlplane/base/bounds.py) is never compared."""
    times: dict[str, dict[str, float]] = {}
    dropped = []
    for model, digests in data.items():
        for digest, seconds in digests.items():
            try:
                times.setdefault(str(model), {})[str(digest)] = check_duration(seconds)
            except ValueError as exc:
                dropped.append(f"{model} {str(digest)[:12]}: {exc}")
    return times, dropped


def warning(ratio: float, load_s: float | None, previous_load_s: float | None,
            footprint: FootprintRecord | None, previous_footprint: FootprintRecord | None) -> str | None:
    """The warning line for a digest against the previous digest (None: nothing over `ratio`)."""
    found = []
    if load_s is not None and previous_load_s and load_s > ratio * previous_load_s:
        found.append(f"load {load_s:.2f} s, {load_s / previous_load_s:.1f} x the previous digest's "
                     f"{previous_load_s:.2f} s")
    for what, field in (("memory", "memory_mb"), ("GPU memory", "gpu_memory_mb")):
        new = getattr(footprint, field, None) if footprint is not None else None
        old = getattr(previous_footprint, field, None) if previous_footprint is not None else None
        if new is not None and old and new > ratio * old:
            found.append(f"{what} {new:.0f} MB, {new / old:.1f} x the previous digest's {old:.0f} MB")
    if not found:
        return None
    return "; ".join(found) + f" (bake_warn_load_ratio {ratio:g})"


def warnings_by_digest(entries: list[Any]) -> Mapping[str, str]:
    """digest → its newest warning line, from a model's audit records (newest first)."""
    found: dict[str, str] = {}
    for entry in entries:
        if entry.digest and entry.outcome == WARNING:
            found.setdefault(entry.digest, entry.message)
    return found
