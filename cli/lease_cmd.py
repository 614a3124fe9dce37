"""`tritonctl ensure MODEL [--for 10m]` and `tritonctl lease renew|release MODEL LEASE`: on-demand models.

`ensure` returns once MODEL is READY (loaded now, or found loaded) and prints the serving digest and the
lease that holds it (on a fleet also the host it is placed on and that host's inference URLs); the
lease expires unless renewed (controlplane/memory/ondemand.py, controlplane/memory/leases.py, and on a
fleet controlplane/fleet/ondemand.py).
Exit codes as every command (docs/cli.md "Exit codes"): 0 READY, 1 the load failed (a memory budget with no
room among the causes), 2 bad input or an unknown model or lease, 3 the daemon unreachable, 4 tritonserver
unreachable.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from cli import render
from cli.options import daemon_options, json_option
from controlplane.memory.leases import DEFAULT_LEASE, parse_duration

if TYPE_CHECKING:
    from controlplane.api.client import ControlClient


def _show(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        render.kv(result, True)
        return
    result = render.shown(result)
    what = "released" if result.get("released") else ("loaded" if result.get("loaded") else "ready")
    where = (f"  on {result['host']} (gRPC {result.get('grpc_url') or '-'}, HTTP {result.get('http_url') or '-'})"
             if result.get("host") else "")
    click.echo(f"{result['model']} {what}: {str(result.get('digest') or '-')[:12]}  lease {result['lease']}"
               + ("" if result.get("released") else f" until {result['until']}") + where)


@click.command()
@click.argument("model")
@click.option("--for", "for_", default=DEFAULT_LEASE, show_default=True, metavar="DURATION",
              help="How long the lease holds MODEL loaded: 90s, 10m, 2h (renew with `lease renew`).")
@json_option
@daemon_options
def ensure(client: ControlClient, model: str, for_: str, as_json: bool) -> None:
    """Load MODEL (or find it loaded) and hold it with a lease; return once it is READY.

    \b
    Examples:
      tritonctl ensure linear
      tritonctl ensure linear --for 1h --json
    """
    _show(client.ensure(model, parse_duration(for_)), as_json)


@click.group()
def lease() -> None:
    """Renew or release a lease that `ensure` returned.

    \b
    Examples:
      tritonctl lease renew linear 3f2a9c1b2c3d4e5f --for 30m
      tritonctl lease release linear 3f2a9c1b2c3d4e5f
    """


@lease.command()
@click.argument("model")
@click.argument("lease_id", metavar="LEASE")
@click.option("--for", "for_", default=DEFAULT_LEASE, show_default=True, metavar="DURATION",
              help="The lease holds MODEL this long from now.")
@json_option
@daemon_options
def renew(client: ControlClient, model: str, lease_id: str, for_: str, as_json: bool) -> None:
    """Hold MODEL for another DURATION from now under LEASE.

    \b
    Example:
      tritonctl lease renew linear 3f2a9c1b2c3d4e5f --for 30m
    """
    _show(client.renew_lease(model, lease_id, parse_duration(for_)), as_json)


@lease.command()
@click.argument("model")
@click.argument("lease_id", metavar="LEASE")
@json_option
@daemon_options
def release(client: ControlClient, model: str, lease_id: str, as_json: bool) -> None:
    """Give LEASE up: MODEL may be unloaded once idle (policy ondemand) or evicted (a memory budget).

    \b
    Example:
      tritonctl lease release linear 3f2a9c1b2c3d4e5f
    """
    _show(client.release_lease(model, lease_id), as_json)


COMMANDS = [ensure, lease]
