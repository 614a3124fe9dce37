"""`tritonctl tag` (a tracked tag's move deploys) and `tritonctl tags` (like `versions`: one HTTP call to the
daemon, or the registry named by --db-url). The rules live in controlplane/intake/tags.py."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from cli import render
from cli.options import daemon_options, json_option, reader_options

if TYPE_CHECKING:
    from controlplane.api.client import ControlClient


@click.command()
@click.argument("model")
@click.argument("name")
@click.argument("digest", required=False, default="")
@click.option("--delete", is_flag=True, help="Delete the tag (its history stays).")
@json_option
@daemon_options
def tag(client: ControlClient, model: str, name: str, digest: str, delete: bool, as_json: bool) -> None:
    """Point MODEL's tag NAME at DIGEST (default: the digest serving now), or delete it.

    NAME: lowercase letters, digits, '-', '_', '.', at most 63 characters, not a hex digest prefix. DIGEST is
    a digest (unique prefix) or another tag. A model that tracks NAME (`policy MODEL track:NAME`) deploys
    the new digest; if that deploy rolls back the move fails (exit 1) and NAME stays on what serves.

    \b
    Examples:
      tritonctl tag linear stable            # what serves now
      tritonctl tag linear canary 3f2a9c1b
      tritonctl tag linear stable canary     # promote: stable := canary
      tritonctl tag linear canary --delete
    """
    from cli.operations import _finish

    with render.progress_display(as_json) as show:
        result = client.tag(model, name, digest, delete, on_progress=show)
    _finish(result, as_json)


@click.command()
@click.argument("model", required=False)
@click.option("--at", "at", help="Where each tag pointed at this time (ISO 8601 or relative: 30m, 2h, 7d).")
@json_option
@reader_options
def tags(reader: Any, model: str | None, at: str | None, as_json: bool) -> None:
    """List tags (of MODEL): the digest each names, who moved it there and when.

    \b
    Examples:
      tritonctl tags
      tritonctl tags linear --json
      tritonctl tags linear --at 2026-11-29T03:00:00Z
    """
    data = reader.tags(model, at)
    if as_json:
        render.kv(data, True)
        return
    rows = render.shown(data["tags"])  # moved_by is an actor: as a client declared it
    if not rows:
        click.echo("no tags" + (f" at {data['at']}" if data["at"] else ""))
        return
    width = max(len(r["model"]) for r in rows)
    click.echo(f"{'MODEL':<{width}}  {'TAG':<16} {'DIGEST':<12}  {'MOVED BY':<16} MOVED AT")
    for r in rows:
        click.echo(f"{r['model']:<{width}}  {r['name']:<16} {r['digest'][:12]:<12}  {r['moved_by']:<16} "
                   f"{r['moved_at']}")


COMMANDS = [tag, tags]
