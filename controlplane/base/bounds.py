"""The bounds of every duration and count tritonctl takes from outside, declared once.

Why: a number nobody bounded travels. A `bake_s` of 10^15 seconds was accepted by the control API, kept in
`bakes.json`, and every later read that turned its end into a date (`GET /v1/models`, `/v1/ready`, `promote`,
`tritonctl status`) answered 500 `year 31690765 is out of range`, across restarts (issues 57 and 58). So every
source of a duration or a count checks it against the bounds declared here, and nowhere else:

- the daemon's settings, from the config file, TRITONCTL_* variables and flags (settings/config.py `PARSERS`);
- the control API's parameters and bodies (api/params.py: each bound is also the OpenAPI document's
  `minimum`/`maximum`, so a client sees it before it asks);
- the CLI's own flags (`load --bake`, `lease --for`, `--interval`, `--limit`, `gc --keep`);
- a model's own `tritonctl.*` parameters in its config.pbtxt (offline validation refuses one out of range,
  naming its field: validation/fields.py);
- the records the daemon reads back (`bakes.json`, `loads.json`): one out of range is dropped with one warning
  line, never served (bake/figures.py, bake/warn.py).

A bound is wide enough for any real use and narrow enough that whatever is derived from it (a moment, a
sleep, a JSON integer, a row) stays representable. Standard library only: the CLI's client path imports it.
"""

from __future__ import annotations

import math

# Every duration, in seconds: a bake, a lease, an interval, a timeout, a retry's wait. A week: a bake or a
# lease longer than that is a mistake, and a week past any moment is a date every reader can print.
MAX_DURATION_S = 7 * 24 * 3600.0
MAX_DURATION_TEXT = "7d"
# A moment read back from a record (seconds since the epoch): from 1970 to the year 3000.
MAX_EPOCH_S = 32_503_680_000.0
# Counts of things an operator names: hosts in a wave, requests a bake needs, snapshots `gc` keeps.
MAX_COUNT = 1_000_000
# Threads (startup_parallelism, triton_load_threads): each is a thread of the daemon or of Triton.
MAX_THREADS = 1024
# Rows one listing answers (audit, rollouts, webhook deliveries).
MAX_LIMIT = 100_000
# A counter read back from a record (a bake's requests): JSON's largest exact integer.
MAX_COUNTER = 2**53 - 1
# Sizes: a model's files together (max_model_bytes), and memory in MB (budgets, a declared footprint).
MAX_BYTES = 2**50  # 1 PiB
MAX_MEGABYTES = float(2**30)  # 1 PiB in MB
# A ratio of latencies or load times (bake_max_latency_ratio, bake_warn_load_ratio): any real one is far below.
MAX_RATIO = 1e6


def problem(value: object, minimum: float, maximum: float) -> str | None:
    """What is wrong with `value` as a number from `minimum` to `maximum` (None: nothing): not a number, not
    finite, or out of range. The message says the range; the caller names the field."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return "expected a number"
    if isinstance(value, float) and not math.isfinite(value):
        return "expected a finite number"
    if value < minimum or value > maximum:
        return f"expected {_g(minimum)} to {_g(maximum)}"
    return None


def check(value: object, minimum: float, maximum: float) -> float:
    """`value` as a float when it is a finite number from `minimum` to `maximum`; else ValueError (the range)."""
    found = problem(value, minimum, maximum)
    if found:
        raise ValueError(found)
    return float(value)  # type: ignore[arg-type]


def check_duration(seconds: object, minimum: float = 0.0) -> float:
    """A duration in seconds from `minimum` to MAX_DURATION_S; else ValueError saying the range."""
    found = problem(seconds, minimum, MAX_DURATION_S)
    if found:
        raise ValueError(f"{found} seconds (at most {MAX_DURATION_TEXT})" if "to" in found else found)
    return float(seconds)  # type: ignore[arg-type]


def check_count(value: object, minimum: int = 0, maximum: int = MAX_COUNTER) -> int:
    """A whole number from `minimum` to `maximum` (an int, or a float without a fraction); else ValueError."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError("expected a whole number")
    found = problem(value, minimum, maximum)
    if found:
        raise ValueError(found)
    return value


def check_moment(epoch: object) -> float:
    """A moment (seconds since the epoch) a record may hold: 1970 to the year 3000; else ValueError."""
    return check(epoch, 0.0, MAX_EPOCH_S)


def _g(number: float) -> str:
    return f"{number:.0f}" if float(number).is_integer() else f"{number:g}"
