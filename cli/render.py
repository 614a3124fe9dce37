"""The only place that formats output: text for people, JSON (a stable contract) for scripts.

Commands pass results here: the dataclasses of `controlplane.documents.results` (validate, db upgrade) or the
JSON document the API client received (every verb that asks the daemon, or cli/offline.py's). Text
is plain columns (cli/plain.py), cut to fit a narrow terminal, never folded; rich draws the
fleet matrix, webhook deliveries and `status --watch`'s live table. `--json` prints `to_json()` of the
former and the latter as is, so each shape is defined once, in controlplane/documents/results.py; tables are
drawn from that same document. Colour appears only on a terminal; `--json` output never changes
shape without a note in the README.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

from cli.statustable import (  # noqa: F401 - age, footprint_cell, bake_line, STATUS_WIDTH: render's own too
    STATUS_WIDTH,
    _short,
    _tagged,
    _when,
    age,
    bake_line,
    canary_text,
    completed_cell,
    footprint_cell,
    rollout_text,
    status_lines,
)
from controlplane.base import jsontext
from controlplane.text import clean, clean_document

if TYPE_CHECKING:  # type names only: render imports nothing of the core at run time
    from rich.console import Console  # rich is imported where text is rendered: --json never pays for it

    from controlplane.documents.results import DbUpgradeResult
    from controlplane.documents.validation import ValidationReport

_SEVERITY_STYLE = {"error": "bold red", "warning": "yellow"}


def _console() -> Console:
    from rich.console import Console

    # Resolved at call time so click's CliRunner (which swaps sys.stdout) captures the output.
    # Piped into a file or `less`, tables get a generous width instead of folding at 80 columns.
    console = Console(highlight=False, soft_wrap=True)
    if not console.is_terminal:
        console = Console(highlight=False, soft_wrap=True, width=200)
    return console


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


# --- tritonctl validate ---------------------------------------------------------------------------


def render_validation(results: ValidationReport, as_json: bool = False) -> None:
    """One line per problem (`severity file: field: message`), an `ok` line per clean model, then a
    summary line."""
    if as_json:
        click.echo(json.dumps(results.to_json(), indent=2))
        return
    from cli.plain import styled  # no rich: plain lines, colour from click on a terminal only

    for result in results:
        if result.ok and result.config is not None:
            served = ", ".join(map(str, result.served_versions)) or "none"
            click.echo(styled("ok", "green") + f" {clean(result.model)} (serving version {served})")
        for problem in result.problems:  # a file's name and a config's text are the model author's
            click.echo(styled(problem.severity, _SEVERITY_STYLE.get(problem.severity, ""))
                       + f" {clean(problem.line())}")
    failed = sum(1 for r in results if not r.ok)
    errors = sum(len(r.errors) for r in results)
    warnings = sum(len(r.warnings) for r in results)
    summary = (f"{_plural(len(results), 'model')} checked: {len(results) - failed} ok, {failed} invalid "
               f"({_plural(errors, 'error')}, {_plural(warnings, 'warning')})")
    click.echo(styled(summary, "bold red" if failed else "bold green"))


# --- operations through the daemon -----------------------------------------------------------------

_STATE_STYLE = {"ok": "green", "failed": "bold red", "start": "cyan", "skipped": "yellow"}
_OUTCOME_STYLE = {
    "ok": "green", "noop": "green", "accepted": "cyan", "failed": "bold red", "rolled_back": "bold yellow",
}


def document(result: Any) -> Any:
    """The `--json` document of a result: a `controlplane.documents.results` dataclass's `to_json()` (lists of them
    element by element), or the document the API client received, as is."""
    if hasattr(result, "to_json"):
        return result.to_json()
    if isinstance(result, list):
        return [document(item) for item in result]
    return result


def shown(result: Any) -> Any:
    """The document human output is drawn from: every string cleaned of control characters, escape
    sequences and bidirectional controls (controlplane/text.py). `--json` prints the raw document."""
    return clean_document(document(result))


def _print_json(data: Any) -> None:
    click.echo(jsontext.dumps(document(data), indent=2))  # json.dumps's text, faster (status of 10,000 models)


class _ProgressDisplay:
    """Prints each step of an operation as it happens (nothing with --json)."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json

    def __call__(self, message: Any) -> None:
        if self.as_json or message.state == "start":
            return
        from cli.plain import styled

        click.echo(styled(f"{clean(message.state):>7} ", _STATE_STYLE.get(message.state, ""))
                   + styled(f"{clean(message.step):<8} ", "bold") + f"{clean(message.model)} "
                   + styled(clean(_short(message.digest)), "dim")
                   + (f"  {clean(message.message)}" if message.message else ""))


class progress_display:  # noqa: N801 - used as `with render.progress_display(...) as show`
    def __init__(self, as_json: bool) -> None:
        self.display = _ProgressDisplay(as_json)

    def __enter__(self) -> _ProgressDisplay:
        return self.display

    def __exit__(self, *exc: object) -> None:
        return None


def outcome(result: Any, as_json: bool) -> None:
    result = document(result)
    if as_json:
        _print_json(result)
        return
    result = clean_document(result)
    from cli.plain import styled

    state = str(result.get("outcome", ""))
    click.echo(styled(state, _OUTCOME_STYLE.get(state, "")) + f"  {result.get('model', '')} "
               + styled(_short(result.get("digest")), "dim") + f"  {result.get('message', '')}")


def kv(data: Any, as_json: bool) -> None:
    """`key: value` lines; a true or false as JSON writes it (never Python's `True`), None as `-`."""
    data = document(data)
    if as_json:
        _print_json(data)
        return
    data = clean_document(data)
    for key, value in data.items():
        shown = ("true" if value else "false") if isinstance(value, bool) else "-" if value is None else value
        click.echo(f"{key}: {shown}")


def policy(data: Any, as_json: bool) -> None:
    """`policy`: one line, `linear: policy manual`, `linear: policy auto (inherited: the daemon's default)`,
    `linear: policy track:stable (tag stable names 0123456789ab)`, `... on host H (held there)`, `... fleet-wide`."""
    data = document(data)
    if as_json:
        _print_json(data)
        return
    data = clean_document(data)
    line = f"{data['model']}: policy {data['policy']}"
    if data.get("inherited"):
        line += " (inherited: the daemon's default)"
    if data.get("tag"):
        line += f" (tag {data['tag']} names {_short(data.get('digest')) or 'nothing'})"
    if data.get("host"):
        line += f" on host {data['host']} (held there)"
    elif data.get("fleet"):
        line += " fleet-wide"
    click.echo(line)


def pin(data: Any, as_json: bool) -> None:
    """`pin` / `unpin`: one line, `linear pinned at 0123456789ab`, `linear unpinned` (`held on host H`
    with --host)."""
    data = document(data)
    if as_json:
        _print_json(data)
        return
    held = data["held"] if "host" in data else data["pinned"]
    if "host" in data:
        word = f"held on host {data['host']}" if held else f"released on host {data['host']}"
    else:
        word = "pinned" if held else "unpinned"
    at = f" at {_short(data['digest'])}" if held and data.get("digest") else ""
    click.echo(f"{data['model']} {word}{at}")


def db_upgrade(result: DbUpgradeResult, as_json: bool) -> None:
    """`db upgrade`: from and to, then each migration run (--dry-run: that would run), then the copy taken."""
    if as_json:
        _print_json(document(result))
        return
    click.echo(f"from: {result.before}")
    click.echo(f"to: {result.after}")
    verb = "would run" if result.dry_run else "ran"
    if not result.migrations:
        click.echo("migrations: none, the schema is current" if result.before else "migrations: none")
    for migration in result.migrations:
        click.echo(f"{verb}: {migration.revision} {migration.title}")
    if result.backup:
        click.echo(f"backup: {result.backup}")


def status(data: Any, as_json: bool, wide: bool = False) -> None:
    data = document(data)
    if as_json:
        _print_json(data)
        return
    data = clean_document(data)
    outage = registry_outage_line(data)
    if outage:
        click.echo(outage)
    click.echo("\n".join(status_lines(data, wide)))
    watch = data.get("watch") or {}
    if watch.get("mode"):
        click.echo(f"watch: {watch['mode']} ({watch.get('reason', '')})")


def registry_outage_line(data: dict[str, Any]) -> str:
    """`status`'s first line while the registry does not answer: the table is what this host knows."""
    if data.get("registry_reachable", True):
        return ""
    since = data.get("registry_unreachable_since") or "?"
    return (f"registry unreachable since {since} ({data.get('registry_reason') or 'no answer'}); showing what "
            "this host knows: what its tritonserver serves and the last registry state it read")


def _status_console() -> Console:
    from rich.console import Console

    return Console(highlight=False)


def status_line_json(data: dict[str, Any]) -> None:
    """`status --watch --json` off a terminal: one JSON document per line per interval."""
    click.echo(json.dumps(data, ensure_ascii=False))


class live_status:  # noqa: N801 - a context manager named for how it reads at the call site
    """`status --watch` on a terminal: refresh the table in place."""

    def __init__(self, wide: bool = False) -> None:
        self.wide = wide

    def __enter__(self) -> Any:
        from rich.live import Live
        from rich.text import Text

        console = _status_console()
        self.live = Live(console=console, auto_refresh=False)
        self.live.__enter__()
        return lambda data: self.live.update(
            Text.from_ansi("\n".join(status_lines(shown(data), self.wide, console.width))), refresh=True)

    def __exit__(self, *exc: object) -> None:
        self.live.__exit__(None, None, None)


def status_is_live() -> bool:
    """Whether `status --watch` can redraw in place (stdout is a terminal)."""
    from rich.console import Console

    return Console().is_terminal


# --- history: versions, diff, audit ---------------------------------------------------------------


def _draw(title: str, headers: tuple[str, ...], rows: list[list[tuple[str, str]]], title_style: str = "") -> None:
    """A listing: plain columns (cli/plain.py, no rich import) whose last column may run on, as kubectl's;
    when the columns before the last do not fit the width either, the lines run on: no cell wraps."""
    from cli.plain import UNLIMITED, table, width

    lines = table(title, headers, rows, width(False, 200), title_style=title_style, last_runs_on=True)
    if lines is None:  # even the columns before the last do not fit: every line runs on, no cell wraps
        lines = table(title, headers, rows, UNLIMITED, title_style=title_style)
    assert lines is not None
    click.echo("\n".join(lines))


def versions(model: str, rows: Any, as_json: bool) -> None:
    rows = document(rows)
    if as_json:
        _print_json(rows)
        return
    rows = clean_document(rows)
    cells = []
    for row in rows:
        note = row.get("first_error") or ""
        if row.get("quarantined"):
            note = f"quarantined: {row.get('quarantine_reason')}"
        if row.get("collected"):
            note = (note + "; " if note else "") + "content removed by gc"
        if row.get("bake_warning"):  # its bake's warning: a load or footprint over bake_warn_load_ratio
            note = (note + "; " if note else "") + f"! {row['bake_warning']}"
        if row.get("canary"):  # its last rollout through canary steps: the weights it reached, how it ended
            note = (note + "; " if note else "") + rollout_text(row["canary"])
        cells.append([("*" if row.get("active") else "", "bold"), (_tagged(row, row["digest"]), ""),
                      (_when(row["first_seen"]), ""), (_when(row["last_seen"]), ""),
                      (", ".join(str(v) for v in row.get("versions", [])), ""),
                      ("yes" if row["valid"] else "no", "" if row["valid"] else "bold red"),
                      (footprint_cell(row.get("footprint")), ""), (note, "")])
    _draw(f"{model}: {_plural(len(rows), 'version')}",
          ("", "Digest", "First seen", "Last seen", "Triton versions", "Valid", "Memory", "Note"), cells)
    for row in rows:  # what serves for a model that completes its config at load: not its config.pbtxt
        if completed_cell(row.get("completed_config")):
            click.echo(f"{_short(row['digest'])} config {completed_cell(row['completed_config'])}")


def diff(data: Any, as_json: bool) -> None:
    data = document(data)
    if as_json:
        _print_json(data)
        return
    data = clean_document(data)
    click.echo(f"{data['model']}: {_short(data['a'])} -> {_short(data['b'])}")
    for item in data["added"]:
        click.echo(f"  added    {item['path']} ({item['size']} bytes)")
    for item in data["removed"]:
        click.echo(f"  removed  {item['path']} ({item['size']} bytes)")
    for item in data["changed"]:
        click.echo(f"  changed  {item['path']} ({item['size_a']} -> {item['size_b']} bytes)")
    for item in data["changed"]:
        if item.get("diff"):
            click.echo(item["diff"].rstrip("\n"))
    completed = data.get("completed_config_diff")
    if completed is not None:  # what serves for a model that completes its config at load
        click.echo("  config completed by Triton: " + (f"changed\n{completed.rstrip()}" if completed else "the same"))
    if not (data["added"] or data["removed"] or data["changed"] or completed):
        click.echo("  no differences")


def audit(rows: Any, as_json: bool) -> None:
    rows = document(rows)
    if as_json:
        _print_json(rows)
        return
    rows = clean_document(rows)
    cells = [[(_when(row["time"]), ""), (row["actor"] + (f" (claimed {row['claimed']})" if row.get("claimed") else ""),
                                         ""), (row["action"], ""), (row.get("model") or "", ""),
              (_short(row.get("digest")), ""), (row["outcome"], _OUTCOME_STYLE.get(row["outcome"], "")),
              (f"{row['duration_ms']} ms" if row.get("duration_ms") is not None else "", ""),
              (row.get("message", ""), "")] for row in rows]
    _draw(_plural(len(rows), "event"),
          ("Time", "Actor", "Action", "Model", "Digest", "Outcome", "Duration", "Message"), cells)


def serving_at(data: Any, as_json: bool) -> None:
    data = document(data)
    if as_json:
        _print_json(data)
        return
    data = clean_document(data)
    hosts = any(row.get("host") for row in data["models"])  # a fleet: one row per model and host
    cells = [[(row["model"], ""), *(((row.get("host") or "", ""),) if hosts else ()),
              (_tagged(row, row["digest"]), ""), (", ".join(str(v) for v in row["versions"]), ""),
              (_when(row["since"]), "")] for row in data["models"]]
    _draw(f"serving at {data['at']}", ("Model", *(("Host",) if hosts else ()), "Digest", "Triton versions", "Since"),
          cells)


# --- fleet: hosts, rollouts, model x host matrix ---------------------------------------------------


def fleet_hosts(rows: Any, as_json: bool) -> None:
    rows = document(rows)
    if as_json:
        _print_json(rows)
        return
    rows = clean_document(rows)
    cells = [[(row["host"], ""), ("yes" if row["leader"] else "", ""),
              ("yes" if row["alive"] else "NO", "" if row["alive"] else "bold red"),
              (f"{_when(row['last_heartbeat'])} ({row['age_s']}s ago)", ""), (row["triton_url"], ""),
              (row["version"], "")] for row in rows]
    _draw("fleet hosts", ("Host", "Leader", "Alive", "Last heartbeat", "Triton", "Version"), cells)


def fleet_rollouts(rows: Any, as_json: bool) -> None:
    rows = document(rows)
    if as_json:
        _print_json(rows)
        return
    rows = clean_document(rows)
    for rollout in rows:
        click.echo(f"rollout {rollout['id']} {rollout['model']} {_short(rollout['digest'])} "
                   f"(from {_short(rollout['previous_digest'])}): {rollout['state']}"
                   + (f" - {rollout['error']}" if rollout.get("error") else ""))
        bake = rollout.get("bake")
        if bake:
            wave, steps = "canary" if bake["wave"] == 0 else f"wave {bake['wave']}", bake.get("canary") or {}
            click.echo(f"  bake of the {wave} ({', '.join(bake['hosts'])}): {bake['state']}, {bake['requests']} "
                       f"requests, {bake['failures']} failed, until {_when(bake['until'])}"
                       + (f", {steps['weight']}% (step {steps['step'] + 1}/{len(steps['steps'])})" if steps else "")
                       + (f" - {bake['reason']}" if bake.get("reason") else ""))
        for step in rollout["steps"]:
            label = "canary" if step["wave"] == 0 and step["action"] in ("deploy", "bake") else f"wave {step['wave']}"
            figures = step.get("figures")
            counted = f" ({figures['requests']} requests, {figures['failures']} failed)" if figures else ""
            click.echo(f"  {label:<8} {step['host']:<16} {step['action']:<8} {_short(step['digest'])} "
                       f"{step['state']:<8} {step['message']}{counted}")


def fleet_matrix(data: Any, as_json: bool) -> None:
    data = document(data)
    if as_json:
        _print_json(data)
        return
    data = clean_document(data)
    from rich.table import Table
    from rich.text import Text

    hosts = sorted({h for m in data["models"] for h in m["hosts"]})
    placed = any(m.get("placement") for m in data["models"])
    table = Table(title="fleet: model x host (digest state; * = drift from the fleet's target)", title_justify="left")
    for column in ("Model", "Target", *hosts, *(["Placed"] if placed else [])):
        table.add_column(Text(column))
    for model in data["models"]:
        cells = []
        for host in hosts:
            cell = model["hosts"].get(host)
            cells.append("-" if cell is None else
                         f"{_short(cell['digest'])} {cell['state']}{' *' if cell['drift'] else ''}")
        if placed:
            cells.append(_placement(model.get("placement")))
        table.add_row(*(Text(cell) for cell in (model["model"], _tagged(model, model["target"]), *cells)))
    _console().print(table)


def _placement(placement: dict[str, Any] | None) -> str:
    """An on-demand model's placement: `h2 loaded (leases: 1, until 12:30:00)`; `-` when not placed."""
    if not placement:
        return "-"
    until = f", until {str(placement['until'])[11:19]}" if placement.get("until") else ""
    return f"{placement['host']} {placement['state']} (leases: {placement['leases']}{until})"



# --- webhooks: deliveries ----------------------------------------------------------------------------
