"""Log lines for journald and for shippers: `LEVEL logger: message` on stderr (journald adds the time),
or one JSON object per line with `--log-format json`.

Every message passes controlplane/text.py's `clean` here, the log's one boundary: a reason carrying a
model's exception text, a file name or a client's actor shows its control characters escaped (`\x1b`),
and a plain line its newlines too (`\x0a`: a message cannot forge a second log line)."""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime, timezone
from typing import Any

from controlplane.text import clean


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat().replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": clean(record.getMessage()),
        }
        if record.exc_info:
            data["exc"] = clean(self.formatException(record.exc_info))
        return json.dumps(data, ensure_ascii=False)


class PlainFormatter(logging.Formatter):
    """`LEVEL logger: message`, the message on one line; a traceback below it, cleaned but multi-line."""

    def __init__(self) -> None:
        super().__init__("%(levelname)s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        record.message = clean(record.message, one_line=True)
        return super().formatMessage(record)

    def formatException(self, ei: Any) -> str:  # noqa: N802 - logging's name
        return clean(super().formatException(ei))


def configure(level: str = "info", fmt: str = "plain") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(PlainFormatter())
    root = logging.getLogger("tritonctl")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
