"""Triton's real reason for a failed load, from the place Triton wrote it.

For an invalid config.pbtxt, a name that does not match its directory, bad sequence-batching
controls and more, Triton's gRPC answer is only `failed to load 'm', failed to poll from model
repository`; the reason is in the server's log, as an E-line written during the load, e.g.
`E1201 00:51:17.762426 11150 model_repository_manager.cc:1460] "Poll failed for model directory
'seq': sequence batching control 'fp32_false_true' must have exactly 2 entries ..."` (measured,
shared/TRITON_NOTES.md). `LoadExplainer` remembers where the log ended before a load, reads what
the load added, and appends the E-lines that name the model to the error; without a log (an
external server with no `triton_log_path`) it uses the repository index's `reason` for the model.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

# glog: <severity><MMDD> <HH:MM:SS.micro> <thread> <file:line>] <message>, Triton quotes the message.
_GLOG = re.compile(r'^([IWEF])\d{4} \d{2}:\d{2}:\d{2}\.\d+\s+\d+ [^\]]+\] ?(.*)$')
MAX_READ_BYTES = 1 << 20  # never read more than this much log for one load
MAX_REASON_CHARS = 600
LOG_FLUSH_WAIT_S = 0.2  # Triton answers the load and writes its log line from different threads


@dataclass(frozen=True)
class LogLine:
    severity: str
    message: str


def parse_lines(text: str) -> list[LogLine]:
    """glog lines of a tritonserver log (tables, banners and stub output are skipped)."""
    lines = []
    for raw in text.splitlines():
        match = _GLOG.match(raw.strip())
        if match:
            message = match.group(2).strip()
            if len(message) >= 2 and message[0] == message[-1] == '"':
                message = message[1:-1]
            lines.append(LogLine(match.group(1), message.strip()))
    return lines


def reasons_for(model: str, lines: Sequence[LogLine]) -> list[str]:
    """The error messages that name `model` (quoted as Triton quotes names, or as a word), in order."""
    quoted = f"'{model}'"
    word = re.compile(rf"(?<![\w.-]){re.escape(model)}(?![\w.-])")
    errors = [line.message for line in lines if line.severity in ("E", "F")]
    named = [m for m in errors if quoted in m] or [m for m in errors if word.search(m)]
    return list(dict.fromkeys(named))


def is_bare(message: str) -> bool:
    """Whether Triton's answer says only that the load failed, not why."""
    text = " ".join(message.split()).rstrip(" ;.")
    if "failed to poll from model repository" in text:
        return True
    return re.search(r"load failed(?: for model '[^']*')?$", text) is not None


def summarise(reasons: Sequence[str]) -> str:
    text = "; ".join(reasons)
    return text if len(text) <= MAX_REASON_CHARS else text[: MAX_REASON_CHARS - 1] + "…"


class LogCursor:
    """A position in a log file: `read_new()` returns what was appended since it was made."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.offset = path.stat().st_size
        except OSError:
            self.offset = 0

    def read_new(self) -> str:
        try:
            with open(self.path, "rb") as handle:
                size = handle.seek(0, 2)
                if size < self.offset:  # rotated or truncated: read it from the start
                    self.offset = 0
                start = max(self.offset, size - MAX_READ_BYTES)
                handle.seek(start)
                return handle.read(size - start).decode("utf-8", "replace")
        except OSError:
            return ""


IndexReason = Callable[[str], str]  # model -> the repository index's reason for it ("" if none)


@dataclass
class LoadExplainer:
    """Finds why a load of `model` failed: the server log when there is one, else the index."""

    log_path: Path | None = None
    index_reason: IndexReason | None = None

    def start(self) -> LogCursor | None:
        """Call before the load: marks where the log ends now."""
        return LogCursor(self.log_path) if self.log_path is not None else None

    def reason(self, model: str, cursor: LogCursor | None) -> str:
        """Triton's reason for the failed load of `model` ("" when none is found)."""
        if cursor is not None:
            found = reasons_for(model, parse_lines(cursor.read_new()))
            if not found:
                time.sleep(LOG_FLUSH_WAIT_S)
                found = reasons_for(model, parse_lines(cursor.read_new()))
            if found:
                return summarise(found)
        if self.index_reason is not None:
            try:
                reason = self.index_reason(model)
            except Exception:  # noqa: BLE001 - an explanation must never hide the load's own error
                reason = ""
            if reason and reason != "unloaded":
                return summarise([reason])
        return ""

    def explain(self, model: str, message: str, cursor: LogCursor | None) -> str:
        """`message` with Triton's reason appended when the message itself does not give one."""
        if not is_bare(message):
            return message
        reason = self.reason(model, cursor)
        if not reason or reason in message:
            return message
        source = "tritonserver log" if cursor is not None and self.log_path is not None else "repository index"
        return f"{message} ({source}: {reason})"
