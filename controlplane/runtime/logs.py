"""Log lines for people, journald and shippers: `TIME LEVEL logger: message` on stderr, TIME in ISO 8601
UTC to the millisecond (`2026-12-03T06:59:01.123Z`), or one JSON object per line with `--log-format json`.

Levels (docs/operations.md "Logs"): INFO says what finished (one line per deploy: model, digest, outcome,
duration) and what the daemon is doing; WARNING what needs a look (invalid content, a failed smoke test,
a rollback, a quarantine); the step-by-step lines of each deploy are DEBUG (`--log-level debug`).

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


def _utc(created: float, timespec: str = "auto") -> str:
    return datetime.fromtimestamp(created, timezone.utc).isoformat(timespec=timespec).replace("+00:00", "Z")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data = {
            "time": _utc(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": clean(record.getMessage()),
        }
        if record.exc_info:
            data["exc"] = clean(self.formatException(record.exc_info))
        return json.dumps(data, ensure_ascii=False)


class PlainFormatter(logging.Formatter):
    """`2026-12-03T06:59:01.123Z INFO tritonctl.daemon: ready: ...`, the message on one line; a traceback
    below it, cleaned but multi-line."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802 - logging's name
        return _utc(record.created, "milliseconds")

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
