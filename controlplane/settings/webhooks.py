"""The `[[webhook]]` tables of the config file (controlplane/outcomes/webhooks.py delivers to them), and the
checks every secret file takes (a webhook's secret, the daemon's token file): apart from config.py, which
parses every other setting, to keep each module to one job and under its size."""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# An audit action name a `[[webhook]]` table may subscribe to (`*`: every action).
ACTION_NAME = re.compile(r"^[a-z][a-z_]{0,31}$")
WEBHOOK_KEYS = ("url", "events", "secret_file")


@dataclass(frozen=True)
class WebhookTarget:
    """One `[[webhook]]` table: where events go, which actions, and the secret that signs them (read
    when the config is loaded, so SIGHUP picks up a rotated secret)."""

    url: str
    events: tuple[str, ...]
    secret_file: Path
    secret: str = field(repr=False, compare=False, default="")

    def wants(self, action: str) -> bool:
        return "*" in self.events or action in self.events


def private_file_problem(path: os.PathLike[str] | str, mode: int) -> str | None:
    """What is wrong with a secret file (a webhook's secret, the daemon's token file) of this st_mode: not
    a regular file, or writable by its group or open to others; None when nothing is."""
    if not stat.S_ISREG(mode):
        return f"{path} is not a regular file"
    if mode & 0o027:
        return (f"{path} has mode {stat.S_IMODE(mode):04o}: others (or its group) may read or change it; "
                f"chmod 600 {path}")
    return None


def read_secret(path: Path) -> str:
    """A webhook's secret: a regular file, not writable by its group nor open to others (like a token
    file: whoever reads it can sign events), at least 16 characters."""
    try:
        problem = private_file_problem(path, os.stat(path).st_mode)  # before open: a fifo would block it
        if problem:
            raise ValueError(problem)
        with open(path, encoding="utf-8") as handle:
            secret = handle.read().strip()
    except OSError as exc:
        raise ValueError(f"{path}: cannot read: {exc.strerror}") from None
    if len(secret) < 16:
        raise ValueError(f"{path}: the secret must be at least 16 characters")
    return secret


def _webhook_table(index: int, table: Any) -> WebhookTarget:
    where = f"[[webhook]] #{index + 1}"
    if not isinstance(table, dict):
        raise ValueError(f"{where}: expected a table with url, events and secret_file")
    unknown = sorted(set(table) - set(WEBHOOK_KEYS))
    if unknown:
        raise ValueError(f"{where}: {unknown[0]}: unknown key (expected url, events, secret_file)")
    for key in WEBHOOK_KEYS:
        if key not in table:
            raise ValueError(f"{where}: {key}: missing")
    url = table["url"]
    if not isinstance(url, str) or not re.match(r"^https?://[^/\s]+", url) or any(c.isspace() for c in url):
        raise ValueError(f"{where}: url: expected an http:// or https:// URL, got {url!r}")
    events = table["events"]
    if (not isinstance(events, list) or not events
            or not all(isinstance(e, str) and (e == "*" or ACTION_NAME.match(e)) for e in events)):
        raise ValueError(f"{where}: events: expected a list of audit action names (deploy, rollback, tag, "
                         f"changeset, ...) or [\"*\"], got {events!r}")
    secret_file = table["secret_file"]
    if not isinstance(secret_file, (str, os.PathLike)) or not str(secret_file):
        raise ValueError(f"{where}: secret_file: expected a path")
    secret_file = Path(secret_file).expanduser()
    try:
        secret = read_secret(secret_file)
    except ValueError as exc:
        raise ValueError(f"{where}: secret_file: {exc}") from None
    return WebhookTarget(url, tuple(events), secret_file, secret)


def webhook_tables(value: Any) -> tuple[WebhookTarget, ...]:
    """`[[webhook]]` tables (the config file only: a list of tables has no flag or variable form)."""
    if not isinstance(value, list):
        raise ValueError("expected [[webhook]] tables in the config file")
    targets = tuple(_webhook_table(i, table) for i, table in enumerate(value))
    urls = [t.url for t in targets]
    for url in urls:
        if urls.count(url) > 1:
            raise ValueError(f"url {url} is configured twice (one table per receiver)")
    return targets
