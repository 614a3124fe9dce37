"""`status --json` and the HTTP API's answers are written by controlplane/base/jsontext.py (fast for 10,000
models, issue 26): the text must be exactly what `json.dumps` wrote before, so nothing a user's script
reads changes, and a document the fast encoder cannot write is still written."""

from __future__ import annotations

import json
import math

import pytest

from controlplane.base import jsontext

pytestmark = pytest.mark.unit

DOCUMENT = {
    "reachable": True,
    "triton_url": "127.0.0.1:8001",
    "watch": {"mode": "inotify", "reason": None},
    "models": [{"model": f"m{i:05d}", "state": "serving", "versions": [{"version": "1", "state": "READY"}],
                "digest": "ab" * 32, "footprint": {"rss_mb": 12.5, "gpu_mb": None}, "tags": [], "sync": {},
                "next_retry_s": 0.1 * i, "note": "é ✓ \u2028 \x00 \"quoted\"", "big": 2**70, "neg": -0.0}
               for i in range(50)],
}


@pytest.mark.parametrize("document", [DOCUMENT, [], {}, [1e-7, 1e22, 5e-324, 1 / 3], "text"])
def test_same_text_as_json_dumps(document: object) -> None:
    """The text user scripts read is what it was."""
    assert jsontext.dumps(document, indent=2) == json.dumps(document, indent=2, ensure_ascii=False)
    assert jsontext.dumps(document, compact=True) == json.dumps(document, ensure_ascii=False, separators=(",", ":"))
    assert jsontext.dumps(document) == json.dumps(document, ensure_ascii=False)


def test_what_the_fast_encoder_cannot_write_is_written_as_before() -> None:
    odd = {"lone": "\ud800", 3: "int key"}
    assert jsontext.dumps(odd, indent=2) == json.dumps(odd, indent=2, ensure_ascii=False)
    odd_floats = [math.nan, math.inf, -math.inf]
    assert jsontext.dumps(odd_floats, indent=2) == json.dumps(odd_floats, indent=2)
    with pytest.raises(ValueError):  # an HTTP answer never carries NaN (Starlette's rule)
        jsontext.dumps({"x": math.nan}, compact=True)


@pytest.mark.parametrize("text", [json.dumps(DOCUMENT), "[1e-7, 1e22, 5e-324, 0.1, 1.7976931348623157e308, NaN, "
                                  "-Infinity, -0.0, 123456789012345678901234567890]", '"\\ud800"', '{"a": 1, "a": 2}'])
def test_loads_reads_what_json_loads_reads(text: str) -> None:
    """What the CLI reads from the daemon: the same values json.loads gives (a lone surrogate, which
    the fast reader refuses, by json itself)."""
    expected, got = json.loads(text), jsontext.loads(text.encode())
    assert repr(got) == repr(expected)
