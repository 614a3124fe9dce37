"""Plain-text rendering for the outputs an operator waits for most: a step, an outcome, the status table,
the history and fleet listings (versions, audit, audit --at, hosts), validate's lines.

Why not rich: importing it costs more than the rest of a `tritonctl status` process (about 135 ms measured,
bench/cli_latency.py), and these outputs need no more than aligned columns and a colour per word. Colour
comes from click.style (click is imported anyway) on a terminal only, unless NO_COLOR is set.

A cell never wraps (a word split over two lines reads as two words): a table too wide for the terminal
first cuts its least important cells to whole words and an ellipsis, then drops its least important
columns (`fit`); what still does not fit runs on past the edge, as kubectl's tables do.
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


ELLIPSIS = "\u2026"
UNLIMITED = 1 << 30  # a width no table reaches: every column at its natural width, lines run on


def cut(text: str, limit: int) -> str:
    """`text` in at most `limit` characters: whole words, then an ellipsis. The first word is never cut
    (`fit` never gives a column less than it)."""
    if len(text) <= limit:
        return text
    words = text.split(" ")
    kept = words[0]
    for word in words[1:]:
        if len(kept) + 1 + len(word) + len(ELLIPSIS) > limit:
            break
        kept += " " + word
    return kept.rstrip(",;:") + ELLIPSIS


def _least(text: str) -> int:
    """The narrowest a cell can be cut to: its first word, and the ellipsis if more follows."""
    first = text.split(" ")[0]
    return len(first) + (len(ELLIPSIS) if len(first) < len(text) else 0)


def fit(headers: Sequence[str], rows: Sequence[Sequence[tuple[str, str]]], max_width: int,
        cut_first: Sequence[str] = (), drop_first: Sequence[str] = ()
        ) -> tuple[list[str], list[list[tuple[str, str]]]]:
    """The headers and rows that fit `max_width`: the columns named in `cut_first` are cut to whole words
    and an ellipsis (least important first); if that is not enough, the columns in `drop_first` are left
    out one by one (each drop gives the cut columns their room back). Columns in neither list are kept
    whole; what still does not fit runs on."""
    def layout(dropped: Sequence[str]) -> tuple[list[int], dict[int, int], bool]:
        keep = [i for i, h in enumerate(headers) if h not in dropped]
        widths = {i: max([len(headers[i])] + [len(row[i][0]) for row in rows]) for i in keep}

        def total() -> int:
            return sum(widths.values()) + 2 * (len(keep) - 1)

        for name in cut_first:
            if total() <= max_width:
                break
            if name in headers and headers.index(name) in widths:
                i = headers.index(name)
                least = max([len(headers[i])] + [_least(row[i][0]) for row in rows])
                widths[i] = max(least, widths[i] - (total() - max_width))
        return keep, widths, total() <= max_width

    keep, widths, fits = layout(())
    for n in range(1, len(drop_first) + 1):
        if fits:
            break
        keep, widths, fits = layout(drop_first[:n])
    return ([headers[i] for i in keep],
            [[(cut(row[i][0], widths[i]), row[i][1]) for i in keep] for row in rows])


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
