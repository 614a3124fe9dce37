"""Following the daemon's event stream (/v1/events): `audit --follow` and what wakes `status --watch`.

Both read server-sent events through the API client (controlplane/api/client.py); a daemon that restarts
is waited for and followed again from the last audit id seen, so no event is lost or printed twice.
"""

from __future__ import annotations

import json
import threading
from typing import TYPE_CHECKING, Any

import click

from controlplane.text import clean_document

if TYPE_CHECKING:
    from controlplane.api.client import ControlClient


def audit_line(event: dict[str, Any]) -> str:
    digest = (event.get("digest") or "-")[:12]
    return (f"{event.get('time')}  {event.get('actor', ''):<14} {event.get('action', ''):<10} "
            f"{event.get('model') or '-':<20} {digest:<12} {event.get('outcome', ''):<11} {event.get('message', '')}")


def follow_audit(client: ControlClient, filters: dict[str, str | None], as_json: bool) -> None:
    """Print each new audit event that matches `filters` as it is written (Ctrl-C to stop)."""
    try:
        for event in client.events():
            if event.kind != "audit":
                continue
            if any(value is not None and event.data.get(key) != value for key, value in filters.items()):
                continue
            click.echo(json.dumps(event.data, ensure_ascii=False) if as_json
                       else audit_line(clean_document(event.data)))
    except KeyboardInterrupt:
        pass


def change_signal(client: ControlClient) -> threading.Event:
    """An Event set whenever the daemon reports an audit record or a state change (`status --watch`
    redraws then instead of polling)."""
    changed = threading.Event()

    def follow() -> None:
        try:
            for _ in client.events():
                changed.set()
        except Exception:  # noqa: BLE001 - without a stream the watch falls back to its interval
            return

    threading.Thread(target=follow, name="events", daemon=True).start()
    return changed
