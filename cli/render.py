"""The only place that formats output: rich text for people, JSON (a stable contract) for scripts.

Commands pass results (plain dataclasses from `controlplane`) here. Colour appears only on a
terminal; `--json` output never changes shape without a note in the README.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:  # importing modelconfig loads tritonclient: only `validate` should pay for that
    from rich.console import Console  # rich is imported where text is rendered: --json never pays for it

    from controlplane.modelconfig import Problem, ValidationResult

_SEVERITY_STYLE = {"error": "bold red", "warning": "yellow"}


def _console() -> Console:
    from rich.console import Console

    # Resolved at call time so click's CliRunner (which swaps sys.stdout) captures the output.
    # Piped into a file or `less`, tables get a generous width instead of folding at 80 columns.
    console = Console(highlight=False, soft_wrap=True)
    if not console.is_terminal:
        console = Console(highlight=False, soft_wrap=True, width=200)
    return console


def _when(value: Any) -> str:
    """ISO 8601 'Z' times shown as 'YYYY-MM-DD HH:MM:SS' (UTC) in tables; JSON keeps ISO."""
    if not value:
        return "-"
    return str(value).replace("T", " ").split(".")[0].rstrip("Z")


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


# --- tritonctl validate ---------------------------------------------------------------------------


def validation_json(results: Sequence[ValidationResult]) -> list[dict[str, Any]]:
    """The `validate --json` contract: one object per model, keys in this order."""
    return [
        {
            "model": r.model,
            "path": str(r.path),
            "ok": r.ok,
            "versions": list(r.versions),
            "served_versions": list(r.served_versions),
            "problems": [_problem_json(p) for p in r.problems],
        }
        for r in results
    ]


def _problem_json(problem: Problem) -> dict[str, str]:
    return {
        "file": problem.file,
        "field": problem.field,
        "message": problem.message,
        "severity": problem.severity,
    }


def render_validation(results: Sequence[ValidationResult], as_json: bool = False) -> None:
    """One line per problem (`severity file: field: message`), an `ok` line per clean model, then a
    summary line."""
    if as_json:
        click.echo(json.dumps(validation_json(results), indent=2))
        return
    from rich.text import Text

    console = _console()
    for result in results:
        if result.ok and result.config is not None:
            served = ", ".join(map(str, result.served_versions)) or "none"
            console.print(Text.assemble(("ok", "green"), f" {result.model} (serving version {served})"))
        for problem in result.problems:
            console.print(Text.assemble((problem.severity, _SEVERITY_STYLE.get(problem.severity, "")),
                                        f" {problem.line()}"))
    failed = sum(1 for r in results if not r.ok)
    errors = sum(len(r.errors) for r in results)
    warnings = sum(len(r.warnings) for r in results)
    summary = (f"{_plural(len(results), 'model')} checked: {len(results) - failed} ok, {failed} invalid "
               f"({_plural(errors, 'error')}, {_plural(warnings, 'warning')})")
    console.print(Text(summary, style="bold red" if failed else "bold green"))


# --- operations through the daemon -----------------------------------------------------------------

_STATE_STYLE = {"ok": "green", "failed": "bold red", "start": "cyan", "skipped": "yellow"}
_OUTCOME_STYLE = {
    "ok": "green", "noop": "green", "accepted": "cyan", "failed": "bold red", "rolled_back": "bold yellow",
}


def _short(digest: Any) -> str:
    return str(digest)[:12] if digest else "-"


def _print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, ensure_ascii=False))


class _ProgressDisplay:
    """Prints each step of an operation as it happens (nothing with --json)."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.console = _console()

    def __call__(self, message: Any) -> None:
        if self.as_json or message.state == "start":
            return
        from rich.text import Text

        style = _STATE_STYLE.get(message.state, "")
        text = Text.assemble(
            (f"{message.state:>7} ", style), (f"{message.step:<8} ", "bold"), f"{message.model} ",
            (_short(message.digest), "dim"), f"  {message.message}" if message.message else "",
        )
        self.console.print(text)


class progress_display:  # noqa: N801 - used as `with render.progress_display(...) as show`
    def __init__(self, as_json: bool) -> None:
        self.display = _ProgressDisplay(as_json)

    def __enter__(self) -> _ProgressDisplay:
        return self.display

    def __exit__(self, *exc: object) -> None:
        return None


def outcome(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        _print_json(result)
        return
    from rich.text import Text

    state = str(result.get("outcome", ""))
    text = Text.assemble(
        (f"{state}", _OUTCOME_STYLE.get(state, "")), f"  {result.get('model', '')} ",
        (_short(result.get("digest")), "dim"), f"  {result.get('message', '')}",
    )
    _console().print(text)


def kv(data: dict[str, Any], as_json: bool) -> None:
    if as_json:
        _print_json(data)
        return
    for key, value in data.items():
        click.echo(f"{key}: {value}")


def _status_table(data: dict[str, Any]) -> Any:
    from rich.table import Table

    title = f"triton {data.get('triton_url', '')}" + ("" if data.get("triton_reachable") else " (UNREACHABLE)")
    table = Table(title=title, title_justify="left")
    for column in ("Model", "Version", "Status", "Digest", "Since", "Policy", "Pinned", "Drift", "Last error"):
        table.add_column(column, overflow="fold")
    for row in data.get("models", []):
        versions = row.get("versions") or [{"version": "-", "state": row.get("state", ""), "reason": ""}]
        for i, version in enumerate(versions):
            first = i == 0
            status = version.get("state", "")
            if version.get("reason"):
                status = f"{status}: {version['reason']}"
            table.add_row(
                row["model"] if first else "",
                str(version.get("version", "")),
                status if row.get("versions") else row.get("state", ""),
                _short(row.get("digest")) if first else "",
                _when(row.get("since")) if first else "",
                (row.get("policy", "") + ("" if first else "")) if first else "",
                ("yes" if row.get("pinned") else "no") if first else "",
                (row.get("drift") or "-") if first else "",
                (row.get("last_error") or "") if first else "",
            )
    return table


def status(data: dict[str, Any], as_json: bool) -> None:
    if as_json:
        _print_json(data)
        return
    _console().print(_status_table(data))
    watch = data.get("watch") or {}
    if watch.get("mode"):
        click.echo(f"watch: {watch['mode']} ({watch.get('reason', '')})")


class live_status:  # noqa: N801 - a context manager named for how it reads at the call site
    """`status --watch`: refresh the table in place."""

    def __enter__(self) -> Any:
        from rich.live import Live

        self.live = Live(console=_console(), auto_refresh=False)
        self.live.__enter__()
        return lambda data: self.live.update(_status_table(data), refresh=True)

    def __exit__(self, *exc: object) -> None:
        self.live.__exit__(None, None, None)


# --- history: versions, diff, audit ---------------------------------------------------------------


def versions(model: str, rows: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        _print_json(rows)
        return
    from rich.table import Table

    table = Table(title=f"{model}: {_plural(len(rows), 'version')}", title_justify="left")
    for column in ("", "Digest", "First seen", "Last seen", "Triton versions", "Valid", "Note"):
        table.add_column(column, overflow="fold")
    for row in rows:
        note = row.get("first_error") or ""
        if row.get("quarantined"):
            note = f"quarantined: {row.get('quarantine_reason')}"
        if row.get("collected"):
            note = (note + "; " if note else "") + "content removed by gc"
        table.add_row(
            "*" if row.get("active") else "",
            _short(row["digest"]),
            row["first_seen"],
            row["last_seen"],
            ", ".join(str(v) for v in row.get("versions", [])),
            "yes" if row["valid"] else "no",
            note,
        )
    _console().print(table)


def diff(data: dict[str, Any], as_json: bool) -> None:
    if as_json:
        _print_json(data)
        return
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
    if not (data["added"] or data["removed"] or data["changed"]):
        click.echo("  no differences")


def audit(rows: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        _print_json(rows)
        return
    from rich.table import Table
    from rich.text import Text

    table = Table(title=_plural(len(rows), "event"), title_justify="left")
    for column in ("Time", "Actor", "Action", "Model", "Digest", "Outcome", "Duration", "Message"):
        table.add_column(column, overflow="fold")
    for row in rows:
        duration = f"{row['duration_ms']} ms" if row.get("duration_ms") is not None else ""
        table.add_row(
            row["time"], row["actor"], row["action"], row.get("model") or "", _short(row.get("digest")),
            Text(row["outcome"], _OUTCOME_STYLE.get(row["outcome"], "")), duration, row.get("message", ""),
        )
    _console().print(table)


def serving_at(data: dict[str, Any], as_json: bool) -> None:
    if as_json:
        _print_json(data)
        return
    from rich.table import Table

    table = Table(title=f"serving at {data['at']}", title_justify="left")
    hosts = any(row.get("host") for row in data["models"])  # a fleet: one row per model and host
    for column in ("Model", *(("Host",) if hosts else ()), "Digest", "Triton versions", "Since"):
        table.add_column(column)
    for row in data["models"]:
        table.add_row(row["model"], *((row.get("host") or "",) if hosts else ()), _short(row["digest"]),
                      ", ".join(str(v) for v in row["versions"]), row["since"] or "")
    _console().print(table)


# --- fleet: hosts, rollouts, model x host matrix ---------------------------------------------------


def fleet_hosts(rows: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        _print_json(rows)
        return
    from rich.table import Table

    table = Table(title="fleet hosts", title_justify="left")
    for column in ("Host", "Leader", "Alive", "Last heartbeat", "Triton", "Version"):
        table.add_column(column)
    for row in rows:
        table.add_row(row["host"], "yes" if row["leader"] else "", "yes" if row["alive"] else "NO",
                      f"{_when(row['last_heartbeat'])} ({row['age_s']}s ago)", row["triton_url"], row["version"])
    _console().print(table)


def fleet_rollouts(rows: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        _print_json(rows)
        return
    for rollout in rows:
        click.echo(f"rollout {rollout['id']} {rollout['model']} {_short(rollout['digest'])} "
                   f"(from {_short(rollout['previous_digest'])}): {rollout['state']}"
                   + (f" - {rollout['error']}" if rollout.get("error") else ""))
        for step in rollout["steps"]:
            label = "canary" if step["wave"] == 0 and step["action"] == "deploy" else f"wave {step['wave']}"
            click.echo(f"  {label:<8} {step['host']:<16} {step['action']:<8} {_short(step['digest'])} "
                       f"{step['state']:<8} {step['message']}")


def fleet_matrix(data: dict[str, Any], as_json: bool) -> None:
    if as_json:
        _print_json(data)
        return
    from rich.table import Table

    hosts = sorted({h for m in data["models"] for h in m["hosts"]})
    table = Table(title="fleet: model x host (digest state; * = drift from the fleet's target)", title_justify="left")
    for column in ("Model", "Target", *hosts):
        table.add_column(column)
    for model in data["models"]:
        cells = []
        for host in hosts:
            cell = model["hosts"].get(host)
            cells.append("-" if cell is None else
                         f"{_short(cell['digest'])} {cell['state']}{' *' if cell['drift'] else ''}")
        table.add_row(model["model"], _short(model["target"]), *cells)
    _console().print(table)

