"""Now, and moments given as text: ISO 8601 (naive = UTC) or relative to now (30s, 30m, 2h, 7d, 1w).

Times are naive UTC, as the registry stores them. At the bottom of the core so that every stage can
read the clock and parse `--since` / `--at` without importing a view (controlplane/views/queries.py
answers the read verbs with these, and re-exports `now` and `parse_time`).
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

from controlplane.errors import UsageError

_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def utcnow() -> datetime:
    """Now as the registry stores times: naive UTC."""
    return datetime.now(timezone.utc).replace(tzinfo=None)


def now() -> datetime:
    return utcnow()


def parse_time(text: str, field: str = "time", reference: datetime | None = None) -> datetime:
    """ISO 8601 (naive = UTC) or relative to now: 30s, 30m, 2h, 7d, 1w. Returns naive UTC."""
    value = text.strip()
    match = _RELATIVE.match(value)
    if match:
        amount, unit = float(match.group(1)), match.group(2)
        try:
            return (reference or now()) - timedelta(seconds=amount * _UNITS[unit])
        except OverflowError:
            raise UsageError(f"{field}: '{text}' reaches before year 1") from None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(f"{field}: '{text}' is neither ISO 8601 nor a relative time like 30m, 2h, 7d") from None
    if parsed.tzinfo is not None:
        try:
            parsed = parsed.astimezone(timezone.utc).replace(tzinfo=None)
        except OverflowError:  # e.g. 0001-01-01T00:00:00+05:00: before anything the registry holds
            return datetime.min
    return parsed
