"""Canary steps as settings write them (docs/bake.md): percents of the requests a new digest takes in turn,
`pause` waiting for `tritonctl promote`; and the request header a sticky split hashes. Parsed alike from
the config file, a TRITONCTL_* variable, a flag and a model's `tritonctl.canary_steps` config parameter.
"""

from __future__ import annotations

import json
import re
from typing import Any

PAUSE = "pause"  # a canary step that waits for `tritonctl promote`
AT_ONCE: tuple[int | str, ...] = (100,)  # every request on the new digest at once: no canary
# Header names the gateway reads itself or that every request has: never a sticky header
RESERVED_HEADERS = ("x-tritonctl-route", "host", "content-length", "content-type", "te")


STEPS_EXPECTED = "expected percents rising to 100, e.g. [10, 100] or [5, pause, 25, 100]"


def parse_steps(value: Any) -> tuple[int | str, ...]:
    """Canary steps: a list (TOML), or its text (`[5, 25, 100]`, `5,25,100`, `[10, "pause", 100]`) from a
    variable, a flag or a config parameter. Each a percent of the requests from 1 to 100, rising, the last
    one 100; `pause` waits for `tritonctl promote` (first: the new digest takes no request until then)."""
    items: Any = value
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                items = json.loads(re.sub(r"\bpause\b(?!\")", '"pause"', text))
            except ValueError:
                raise ValueError(STEPS_EXPECTED) from None
        else:
            items = [item.strip() for item in text.split(",")]
    if not isinstance(items, (list, tuple)) or not items:
        raise ValueError(STEPS_EXPECTED)
    steps: list[int | str] = []
    last = 0
    for item in items:
        if isinstance(item, str) and item.strip().lower() == PAUSE:
            steps.append(PAUSE)
            continue
        if isinstance(item, bool) or not (isinstance(item, int) or (isinstance(item, str) and item.strip().isdigit())):
            raise ValueError(f"{item!r}: {STEPS_EXPECTED}")
        weight = int(item)
        if not last < weight <= 100:
            raise ValueError(f"{weight}: {STEPS_EXPECTED}")
        steps.append(weight)
        last = weight
    if last != 100:
        raise ValueError(f"the last weight is {last}, not 100: {STEPS_EXPECTED}")
    return tuple(steps)


def steps_text(steps: tuple[int | str, ...]) -> str:
    """Canary steps as the docs and the settings write them: `[10, pause, 100]`."""
    return "[" + ", ".join(str(step) for step in steps) + "]"


def header_name(value: Any) -> str:
    """A request header (HTTP) or metadata key (gRPC) name, lowercase: what the gateway hashes."""
    if not isinstance(value, str):
        raise ValueError("expected a string")
    text = value.strip().lower()
    if not re.fullmatch(r"[a-z0-9][a-z0-9_.-]{0,63}", text) or text in RESERVED_HEADERS or text.startswith(":"):
        raise ValueError("expected a header name such as x-user-id (not one the gateway reads itself)")
    return text
