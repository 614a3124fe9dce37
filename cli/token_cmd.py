"""`tritonctl token create NAME --role ROLE [--expires 90d]`, `token list`, `token revoke NAME`: the personal
tokens of the control API (role admin), each one call through the daemon, which keeps them in its registry
(a fleet's shared one: a token works on every host). docs/operations.md "Identities and roles"."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from cli import render, render_admin
from cli.options import daemon_options, json_option
from controlplane.errors import UsageError
from controlplane.text import duration_s

if TYPE_CHECKING:
    from controlplane.api.client import ControlClient

ROLES = ("viewer", "deployer", "admin")


@click.group()
def token() -> None:
    """Personal tokens of the control API: each caller its own identity (token:NAME) and role.

    \b
    Examples:
      tritonctl token create alice --role deployer --expires 90d
      tritonctl token list
      tritonctl token revoke alice
    """


@token.command()
@click.argument("name")
@click.option("--role", type=click.Choice(ROLES), required=True, help="viewer (reads), deployer (changes what "
              "serves) or admin (policy, gc, webhooks, tokens).")
@click.option("--expires", "expires", metavar="DURATION", help="It expires after this long (90d, 12h); "
              "default: never.")
@json_option
@daemon_options
def create(client: ControlClient, name: str, role: str, expires: str | None, as_json: bool) -> None:
    """Create a personal token NAME and print it, this once: the daemon keeps only a slow hash of it. Its
    holder acts as token:NAME with ROLE, on the TCP listener and the web view (every host of a fleet).

    \b
    Examples:
      tritonctl token create alice --role deployer --expires 90d
      tritonctl token create ci --role deployer --json
    """
    expires_s = None
    if expires is not None:
        expires_s = duration_s(expires)
        if not expires_s:
            raise UsageError(f"--expires: {expires!r} is not a duration like 90d, 12h or 30m")
    render.kv(client.create_token(name, role, expires_s), as_json)


@token.command("list")
@json_option
@daemon_options
def list_tokens(client: ControlClient, as_json: bool) -> None:
    """List every personal token (never a secret): role, state (active, expired, revoked), creator, expiry.

    \b
    Examples:
      tritonctl token list
    """
    render_admin.tokens(client.tokens(), as_json)


@token.command()
@click.argument("name")
@json_option
@daemon_options
def revoke(client: ControlClient, name: str, as_json: bool) -> None:
    """Revoke token NAME: refused from now on (on every host of a fleet within liveness_s).

    \b
    Examples:
      tritonctl token revoke alice
    """
    render.kv(client.revoke_token(name), as_json)


COMMANDS = [token]
