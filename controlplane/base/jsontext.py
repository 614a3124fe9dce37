"""JSON text of big documents, fast: `status --json` of 10,000 models is 5 MB.

Why: `json.dumps(indent=2)` takes the pure-Python encoder (the C one has no indent): 2.7 s for
`status --json` at 10,000 models on this machine, most of the command's time (issue 26: target 1 s).
python-rapidjson (already installed with tritonclient; a C++ encoder) writes the same text - byte for
byte, checked by tests/test_jsontext.py - in a tenth of that. A document it cannot write (a lone
surrogate in a string, a non-string key, NaN) is written by the standard library, as before. The CLI
reads the daemon's answers with it too (`loads`: 5 MB in 0.09 s instead of json's 0.14 s), the same
values json.loads gives; a text it refuses is read by the standard library.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any


def iso(value: datetime | None) -> str | None:
    """Naive-UTC datetime → ISO 8601 with a Z, the JSON contract's time format."""
    if value is None:
        return None
    return value.replace(tzinfo=timezone.utc).isoformat().replace("+00:00", "Z")


def dumps(document: Any, *, indent: int | None = None, compact: bool = False) -> str:
    """`json.dumps(document, indent=indent, ensure_ascii=False)`, or with `compact` the separators of an
    HTTP response (",", ":") and no NaN: the same text, faster where it can be."""
    if indent is not None or compact:
        try:
            import rapidjson

            # compact: no NaN (ValueError), as Starlette's allow_nan=False; indented: NaN as json writes it
            mode = rapidjson.NM_NONE if compact and indent is None else rapidjson.NM_NAN
            return str(rapidjson.dumps(document, indent=indent, ensure_ascii=False, number_mode=mode))
        except (ImportError, TypeError, ValueError, OverflowError, UnicodeError):
            pass
    if compact:
        return json.dumps(document, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return json.dumps(document, indent=indent, ensure_ascii=False)


def loads(text: bytes | str) -> Any:
    """`json.loads(text)`: the same values (NaN and Infinity too), faster where it can be."""
    try:
        import rapidjson

        return rapidjson.loads(text, number_mode=rapidjson.NM_NAN)
    except (ImportError, TypeError, ValueError, OverflowError, UnicodeError):
        return json.loads(text)
