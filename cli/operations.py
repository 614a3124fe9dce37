"""Commands that act through the running daemon: load, unload, rollback, status, policy, pin, gc."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import click

from cli import render
from cli.options import daemon_options, json_option
from controlplane.errors import DeployError

if TYPE_CHECKING:
    from controlplane.api.client import ControlClient

OUTCOMES_THAT_FAIL = ("failed", "rolled_back")


def _finish(result: dict[str, Any], as_json: bool) -> None:
    """Print the outcome; exit 1 when the operation failed or was rolled back."""
    render.outcome(result, as_json)
    if result.get("outcome") in OUTCOMES_THAT_FAIL:
        raise DeployError(str(result.get("message", "")), str(result.get("outcome")))


@click.command()
@click.argument("model")
@click.option("--digest", default="", help="Deploy this recorded snapshot (full digest or unique prefix).")
@click.option("--force", is_flag=True, help="Retry a quarantined digest, or reload the active one.")
@click.option("--no-wait", is_flag=True, help="Return once the daemon accepted the request.")
@json_option
@daemon_options
def load(client: ControlClient, model: str, digest: str, force: bool, no_wait: bool, as_json: bool) -> None:
    """Deploy MODEL's current source content (or a recorded snapshot) and show each step.

    \b
    Examples:
      tritonctl load linear
      tritonctl load linear --digest 3f2a9c1b
      tritonctl load linear --force      # retry a quarantined digest
    """
    with render.progress_display(as_json) as show:
        result = client.load(model, digest, force, wait=not no_wait, on_progress=show)
    _finish(result, as_json)


@click.command()
@click.argument("model")
@click.option("--dependents", is_flag=True, help="Also unload models that only this one needs (ensembles).")
@json_option
@daemon_options
def unload(client: ControlClient, model: str, dependents: bool, as_json: bool) -> None:
    """Unload MODEL from Triton; it stays unloaded until `tritonctl load`.

    \b
    Example:
      tritonctl unload sentiment_pipeline --dependents
    """
    with render.progress_display(as_json) as show:
        result = client.unload(model, dependents, on_progress=show)
    _finish(result, as_json)


@click.command()
@click.argument("model")
@click.option("--to", "to_digest", default="", help="Digest to return to (default: the previous good one).")
@json_option
@daemon_options
def rollback(client: ControlClient, model: str, to_digest: str, as_json: bool) -> None:
    """Serve MODEL's previous good version again (or the one given by --to).

    \b
    Examples:
      tritonctl rollback linear
      tritonctl rollback linear --to 3f2a9c1b
    """
    with render.progress_display(as_json) as show:
        result = client.rollback(model, to_digest, on_progress=show)
    _finish(result, as_json)


@click.command()
@click.argument("models", nargs=-1)
@click.option("--watch", is_flag=True, help="Refresh in place every --interval seconds (Ctrl-C to stop).")
@click.option("--interval", type=click.FloatRange(min=0.2), default=2.0, show_default=True)
@json_option
@daemon_options
def status(client: ControlClient, models: tuple[str, ...], watch: bool, interval: float, as_json: bool) -> None:
    """Show each model: Triton versions and state, active digest, since when, policy, pin, drift, last error.

    \b
    Examples:
      tritonctl status
      tritonctl status linear sentiment --json
      tritonctl status --watch
    """
    if not watch:
        render.status(client.status(list(models)), as_json)
        return
    with render.live_status() as update:
        try:
            while True:
                update(client.status(list(models)))
                time.sleep(interval)
        except KeyboardInterrupt:
            pass


@click.command()
@click.argument("model")
@click.argument("policy", type=click.Choice(["auto", "manual", "inherit"]))
@json_option
@daemon_options
def policy(client: ControlClient, model: str, policy: str, as_json: bool) -> None:
    """Set MODEL's deploy policy: auto (every settled valid change deploys), manual, or inherit the global one.

    \b
    Example:
      tritonctl policy linear manual
    """
    render.kv(client.set_policy(model, policy), as_json)


@click.command()
@click.argument("model")
@json_option
@daemon_options
def pin(client: ControlClient, model: str, as_json: bool) -> None:
    """Hold MODEL at its active snapshot: changes are recorded but not deployed until `unpin`.

    \b
    Example:
      tritonctl pin linear
    """
    render.kv(client.set_pin(model, True), as_json)


@click.command()
@click.argument("model")
@json_option
@daemon_options
def unpin(client: ControlClient, model: str, as_json: bool) -> None:
    """Release a pinned MODEL.

    \b
    Example:
      tritonctl unpin linear
    """
    render.kv(client.set_pin(model, False), as_json)


@click.command()
@click.option("--keep", type=click.IntRange(min=0), default=10, show_default=True,
              help="Snapshots to keep per model besides the active one.")
@json_option
@daemon_options
def gc(client: ControlClient, keep: int, as_json: bool) -> None:
    """Remove stored content of old snapshots (their history and audit rows stay).

    \b
    Example:
      tritonctl gc --keep 5
    """
    render.kv(client.gc(keep), as_json)


COMMANDS = [load, unload, rollback, status, policy, pin, unpin, gc]
