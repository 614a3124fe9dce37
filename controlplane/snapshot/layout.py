"""Names and limits that fix what a model directory and the content store look like on disk.

Shared by the capture (this package), the watchers (the hold file), modelconfig (the config file and
its size limit), the S3 source, publish (the config file), validation and the deploy steps (the smoke
file), so that each rule is written once.
"""

from __future__ import annotations

HOLD_FILE = ".tritonctl-hold"
CONFIG_FILE = "config.pbtxt"
SMOKE_FILE = "smoke.json"  # a model's smoke test (controlplane/deploy/smoke.py)
MAX_CONFIG_BYTES = 1 << 20  # a real config.pbtxt is a few KiB: refuse before copying gigabytes of one
_HEX = frozenset("0123456789abcdef")


def is_digest(text: str) -> bool:  # 64 lowercase hex digits: a digest or object name, safe in a path
    return len(text) == 64 and set(text) <= _HEX
