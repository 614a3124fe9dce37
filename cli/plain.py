"""Plain-text rendering for the outputs an operator waits for most: a step, an outcome, the status table,
the history and fleet listings (versions, audit, audit --at, hosts), validate's lines.

Why not rich: importing it costs more than the rest of a `tritonctl status` process (about 135 ms measured,
bench/cli_latency.py), and these outputs need no more than aligned columns and a colour per word. Colour
comes from click.style (click is imported anyway) on a terminal only, unless NO_COLOR is set. A table that
would not fit the width without folding returns None, and cli/render.py draws it with rich as before.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Sequence

import click

# rich style names used by cli/render.py -> click.style arguments
_STYLES: dict[str, dict[str, object]] = {
    "green": {"fg": "green"}, "yellow": {"fg": "yellow"}, "cyan": {"fg": "cyan"}, "dim": {"dim": True},
    "bold": {"bold": True}, "bold red": {"fg": "red", "bold": True}, "bold yellow": {"fg": "yellow", "bold": True},
    "bold green": {"fg": "green", "bold": True}, "italic": {"italic": True},
}


def colour() -> bool:
    """Whether stdout takes colour: a terminal, and no NO_COLOR (https://no-color.org)."""
    return sys.stdout.isatty() and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"


def styled(text: str, style: str, use_colour: bool | None = None) -> str:
    if not style or not text or not (colour() if use_colour is None else use_colour):
        return text
    return click.style(text, **_STYLES.get(style, {}))  # type: ignore[arg-type]


def width(wide: bool, default: int) -> int:
    """The width a table may take: the terminal's, or off a terminal `default` (200 for wide tables)."""
    if sys.stdout.isatty():
        return shutil.get_terminal_size((default, 24)).columns
    return 200 if wide else default


def table(title: str, headers: Sequence[str], rows: Sequence[Sequence[tuple[str, str]]], max_width: int,
          title_style: str = "", last_runs_on: bool = False) -> list[str] | None:
    """Columns two spaces apart, each as wide as its widest cell (rich's `box=None, pad_edge=False`
    layout); each cell is (text, style). None when the table needs more than `max_width` columns.
    `last_runs_on`: the last column (a message, a note) may run past `max_width` (as kubectl's do): only
    the columns before it must fit, plus ten characters of it."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, (text, _) in enumerate(row):
            widths[i] = max(widths[i], len(text))
    needed = sum(widths[:-1]) + min(widths[-1], 10) if last_runs_on else sum(widths)
    if needed + 2 * (len(widths) - 1) > max_width or len(title) > max_width:
        return None
    use_colour = colour()
    lines = [styled(title, title_style, use_colour)] if title else []
    heads = [styled(h.ljust(w), "bold", use_colour) for h, w in zip(headers, widths, strict=True)]
    lines.append("  ".join(heads).rstrip())
    for row in rows:
        cells = [styled(text, style, use_colour) + " " * (w - len(text))
                 for (text, style), w in zip(row, widths, strict=True)]
        lines.append("  ".join(cells).rstrip())
    return lines
