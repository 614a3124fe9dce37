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
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import click

from controlplane.base import jsontext
from controlplane.text import clean, clean_document

if TYPE_CHECKING:  # type names only: render imports nothing of the core at run time
    from rich.console import Console  # rich is imported where text is rendered: --json never pays for it

    from controlplane.documents.results import DbUpgradeResult, ValidationReport

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
    """The one time format of tables: ISO 8601 UTC to the second with a Z (JSON keeps the fraction)."""
    if not value:
        return "-"
    return str(value).split(".")[0].rstrip("Z") + "Z"


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


def _short(digest: Any) -> str:
    return str(digest)[:12] if digest else "-"


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
    data = document(data)
    if as_json:
        _print_json(data)
        return
    data = clean_document(data)
    for key, value in data.items():
        click.echo(f"{key}: {value}")


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


_MODEL_STATE_STYLE = {"serving": "green", "degraded": "yellow", "failed": "bold red", "unloaded": "dim"}
_SYNC_STYLE = {"synced": "green", "pending": "cyan", "held": "yellow", "invalid": "bold red", "removed": "dim"}
_STATUS_COLUMNS = ["MODEL", "STATE", "SYNC", "DIGEST", "VERSIONS", "AGE"]
_WIDE_COLUMNS = ["SINCE", "POLICY", "PINNED", "DRIFT", "SOURCE", "MEMORY", "SYNC REASON", "LAST ERROR", "CONFIG"]
STATUS_WIDTH = 100  # the default table fits here (README "Using it"); `-o wide` shows the rest


def age(value: Any, now: datetime | None = None) -> str:
    """kubectl-style age of an ISO 8601 'Z' time: 45s, 12m, 3h5m, 4d, 2y; '-' when unknown."""
    if not value:
        return "-"
    try:
        moment = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return "-"
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    seconds = int(((now or datetime.now(timezone.utc)) - moment).total_seconds())
    if seconds < 0:
        return "0s"
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 60:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    days = hours // 24
    return f"{days}d" if days < 730 else f"{days // 365}y"


def _tagged(row: dict[str, Any], digest: Any) -> str:
    """A short digest followed by the tags on it (controlplane/intake/tags.py), e.g. '3f2a9c1b2c3d stable,canary'."""
    names = row.get("tags") or []
    return _short(digest) + (f" {','.join(names)}" if names else "")


def footprint_cell(footprint: Any) -> str:
    """'97 MB' (host memory), '97 MB + 512 MB GPU', 'declared 100 MB'; '-' when unknown."""
    if not isinstance(footprint, dict) or footprint.get("memory_mb") is None and footprint.get("gpu_memory_mb") is None:
        return "-"
    parts = [f"{footprint['memory_mb']:.0f} MB"] if footprint.get("memory_mb") is not None else []
    if footprint.get("gpu_memory_mb") is not None:
        parts.append(f"{footprint['gpu_memory_mb']:.0f} MB GPU")
    text = " + ".join(parts)
    return f"declared {text}" if footprint.get("source") == "declared" else text


def completed_cell(completed: Any) -> str:
    """The config Triton completed for a model whose auto_complete_config completes it: 'completed by Triton:
    x FP32[3] -> y FP32[3]; max_batch_size 8'; '' when none is recorded."""
    config = completed.get("config") if isinstance(completed, dict) else None
    if not isinstance(config, dict):
        return ""
    io = [", ".join(f"{t.get('name')} {str(t.get('data_type', '')).removeprefix('TYPE_')}"
                    f"[{','.join(map(str, t.get('dims') or []))}]" for t in config.get(kind) or []) or "none"
          for kind in ("input", "output")]
    return (f"completed by Triton: {io[0]} -> {io[1]}; max_batch_size {config.get('max_batch_size', 0)}"
            + ("; dynamic batching" if "dynamic_batching" in config else ""))


def _ondemand_cell(row: dict[str, Any]) -> str:
    """Policy ondemand: 'standby', 'loading' or 'loaded (leases: N, until HH:MM:SS)' in the STATE column."""
    standing = row.get("ondemand")
    if not isinstance(standing, dict):
        return ""
    if standing.get("state") != "loaded":
        return str(standing.get("state", ""))
    until = str(standing.get("until") or "")
    return f"loaded (leases: {standing.get('leases', 0)}" + (f", until {until[11:19]})" if until else ")")


def _versions_cell(row: dict[str, Any]) -> str:
    """'1,2' when every version is READY, else each one with its state ('1:READY 2:UNAVAILABLE')."""
    versions = row.get("versions") or []
    if not versions:
        return "-"
    if all(v.get("state") == "READY" for v in versions):
        return ",".join(str(v.get("version", "")) for v in versions)
    return " ".join(f"{v.get('version', '')}:{v.get('state', '')}" for v in versions)


def _status_title(data: dict[str, Any]) -> str:
    reachable = data.get("triton_reachable")
    urls = " ".join(f"{k.split('_')[1]} {data[k]}" for k in ("triton_grpc_url", "triton_http_url") if data.get(k))
    exposed = " (KEY EXPOSED: other users can read its command line)" if data.get("triton_key_exposed") else ""
    return f"triton {urls or data.get('triton_url', '')}" + ("" if reachable else " (UNREACHABLE)") + exposed


def canary_text(canary: dict[str, Any], shadow: dict[str, Any] | None = None) -> str:
    """A canary in progress (`canary 10% 42s left`, `canary 10% paused: tritonctl promote`, its shadow first:
    `shadow 42s left, 120 pairs, agreement 1.00`); "" once it ended."""
    left, state = canary.get("seconds_left"), canary.get("state")
    if state == "shadow":
        text = f"shadow {left}s left" if left is not None else "shadow"
        if shadow and shadow.get("pairs"):
            text += f", {shadow['pairs']} pairs, agreement {shadow.get('agreement') or 0:.2f}"
        return text
    if state not in ("running", "paused"):
        return ""
    return f"canary {canary.get('weight')}%" + (" paused: tritonctl promote" if state == "paused" else
                                                 f" {left}s left" if left is not None else "")


def rollout_text(history: dict[str, Any]) -> str:
    """A rollout's history (`versions`): `canary 10% → 100% done`, `canary 10% rolled back`."""
    steps = " → ".join(f"{w}%" for w in history.get("weights") or []) or "-"
    return f"canary {steps} {str(history.get('state') or '').replace('_', ' ')}"


def _status_cells(row: dict[str, Any], wide: bool) -> list[tuple[str, str]]:
    """One row of the status table: (text, style) per column (a canary in progress: in SYNC, always shown)."""
    state, sync = _ondemand_cell(row) or str(row.get("state", "")), str(row.get("sync") or "-")
    canary = canary_text(row["canary"], row.get("shadow")) if row.get("canary") else ""
    cells = [(str(row["model"]), ""), (state, _MODEL_STATE_STYLE.get(state, "")),
             (f"{sync} {canary}" if canary else sync, _SYNC_STYLE.get(sync, "")),
             (_tagged(row, row.get("digest")), ""), (_versions_cell(row), ""), (age(row.get("since")), "")]
    if wide:
        cells += [(str(text), "") for text in (
            _when(row.get("since")), row.get("policy", ""), "yes" if row.get("pinned") else "no",
            row.get("drift") or "-", _short(row.get("source_digest")), footprint_cell(row.get("footprint")),
            row.get("sync_reason") or "",
            row.get("last_error") or "", completed_cell(row.get("completed_config")) or "-")]
    return cells


# Least important first: what a narrow terminal cuts (to whole words and an ellipsis), then leaves out.
# MODEL, STATE and SYNC are always shown.
_STATUS_CUT = ("DIGEST", "VERSIONS", "STATE")
_STATUS_DROP = ("AGE", "VERSIONS", "DIGEST")


def status_lines(data: dict[str, Any], wide: bool, max_width: int | None = None) -> list[str]:
    """The status table (cli/plain.py). It fits the terminal (STATUS_WIDTH off one) by cutting and then
    leaving out the least important columns; `-o wide` keeps every column whole and lets the lines run
    on, as kubectl does."""
    from cli.plain import UNLIMITED, fit, table, width

    headers = _STATUS_COLUMNS + (_WIDE_COLUMNS if wide else [])
    rows = [_status_cells(row, wide) for row in data.get("models", [])]
    if not wide:
        headers, rows = fit(headers, rows, width(False, STATUS_WIDTH) if max_width is None else max_width,
                            cut_first=_STATUS_CUT, drop_first=_STATUS_DROP)
    lines = table(_status_title(data), headers, rows, UNLIMITED, title_style="italic")
    assert lines is not None  # an unlimited width always fits
    return lines


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
