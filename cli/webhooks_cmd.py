"""`tritonctl webhooks` (the deliveries of signed webhooks) and `tritonctl webhooks redeliver ID`, both
through the daemon's control API: the daemon's delivery worker (controlplane/outcomes/webhooks.py) owns them,
and in a fleet they live in the shared registry the leader delivers from."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from cli import render_admin
from cli.options import daemon_options, json_option
from controlplane.base.bounds import MAX_LIMIT

if TYPE_CHECKING:
    from controlplane.api.client import ControlClient

DELIVERY_STATES = ("pending", "delivered", "failed")


@click.group(invoke_without_command=True)
@click.option("--state", "state", type=click.Choice(DELIVERY_STATES), help="Only deliveries in this state.")
@click.option("--limit", type=click.IntRange(min=1, max=MAX_LIMIT), default=100, show_default=True,
              help="At most this many.")
@json_option
@daemon_options
@click.pass_context
def webhooks(ctx: click.Context, client: ControlClient, state: str | None, limit: int, as_json: bool) -> None:
    """List webhook deliveries, newest first: pending (with the next try), delivered, or failed with the
    receiver's last answer. Webhooks are `[[webhook]]` tables of the daemon's config (docs/operations.md).

    \b
    Examples:
      tritonctl webhooks
      tritonctl webhooks --state failed --json
      tritonctl webhooks redeliver 3f2a9c1b
    """
    if ctx.invoked_subcommand is not None:
        return
    render_admin.webhook_deliveries(client.webhook_deliveries(state, limit), as_json)


@webhooks.command()
@click.argument("delivery_id", metavar="ID")
@json_option
@daemon_options
def redeliver(client: ControlClient, delivery_id: str, as_json: bool) -> None:
    """Send delivery ID (or a unique prefix of it, as `tritonctl webhooks` shows) again, with the same
    `X-Tritonctl-Delivery` id; it goes first in its model's order.

    \b
    Examples:
      tritonctl webhooks redeliver 3f2a9c1b
    """
    render_admin.redelivery(client.redeliver(delivery_id), as_json)


COMMANDS = [webhooks]
