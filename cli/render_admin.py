"""What the admin verbs print: webhook deliveries and their redelivery, personal tokens (never a secret).

Apart from cli/render.py, whose helpers it uses, to keep each module under its size; the same rules hold:
`--json` prints the document as it is, plain output cleans text from outside before a terminal sees it.
"""

from __future__ import annotations

from typing import Any

import click

from cli.render import _console, _draw, _plural, _print_json, _when, clean_document, document

_DELIVERY_STYLE = {"delivered": "green", "pending": "yellow", "failed": "bold red"}


def _answer(row: dict[str, Any]) -> str:
    """The receiver's last answer: its status and the start of its body, or why there was none."""
    parts = [str(row["status_code"])] if row.get("status_code") is not None else []
    if row.get("answer"):
        parts.append(row["answer"])
    if row["state"] == "pending" and row.get("next_attempt_at"):
        parts.append(f"(next try {_when(row['next_attempt_at'])})")
    return " ".join(parts) or "-"


def webhook_deliveries(rows: Any, as_json: bool) -> None:
    """`tritonctl webhooks`: newest first, one delivery (one event to one webhook) a row."""
    rows = document(rows)
    if as_json:
        _print_json(rows)
        return
    rows = clean_document(rows)
    if not rows:
        click.echo("no webhook deliveries")
        return
    from rich.table import Table
    from rich.text import Text

    table = Table(title=_plural(len(rows), "delivery").replace("deliverys", "deliveries"), title_justify="left")
    for column in ("Delivery", "State", "Event", "Action", "Model", "Tries", "Last answer", "URL"):
        table.add_column(column, overflow="fold")
    for row in rows:
        # Text, never markup: the receiver's answer is its own text (`[/x]` would stop rich's parser)
        table.add_row(Text(row["id"][:12]), Text(row["state"], _DELIVERY_STYLE.get(row["state"], "")),
                      *(Text(cell) for cell in (str(row["event_id"]), row["action"], row.get("model") or "",
                                                str(row["attempts"]), _answer(row), row["url"])))
    _console().print(table)


def redelivery(row: Any, as_json: bool) -> None:
    """`tritonctl webhooks redeliver ID`: the delivery, pending again."""
    row = document(row)
    if as_json:
        _print_json(row)
        return
    row = clean_document(row)
    click.echo(f"delivery {row['id'][:12]} (event {row['event_id']} {row['action']} {row.get('model') or '-'}) "
               f"to {row['url']}: sent again with the same id")


def tokens(rows: Any, as_json: bool) -> None:
    """`tritonctl token list`: by name, never a secret."""
    rows = document(rows)
    if as_json:
        _print_json(rows)
        return
    rows = clean_document(rows)
    cells = [[(row["name"], ""), (row["role"], ""), (row["state"], ""), (row["creator"], ""),
              (_when(row["created_at"]), ""), (_when(row["expires_at"]) if row["expires_at"] else "never", "")]
             for row in rows]
    _draw(_plural(len(rows), "token"), ("Name", "Role", "State", "Creator", "Created", "Expires"), cells)
