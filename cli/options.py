"""Options shared by several commands, and how they become a client or a registry."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from controlplane.defaults import DEFAULT_STATE_DIR, SOCKET_NAME

F = TypeVar("F", bound=Callable[..., Any])


LOCAL_STATE_DIR = Path(".state")  # where README's "Using it" starts a daemon


def default_state_dir() -> Path:
    """./.state when a daemon (or its registry) lives there, as README's "Using it" starts one; else the
    system default. --state-dir and TRITONCTL_STATE_DIR always win."""
    if (LOCAL_STATE_DIR / SOCKET_NAME).exists() or (LOCAL_STATE_DIR / "registry.db").exists():
        return LOCAL_STATE_DIR
    return DEFAULT_STATE_DIR


def state_option(fn: F) -> F:
    return click.option(
        "--state-dir",
        type=click.Path(path_type=Path, file_okay=False),
        default=default_state_dir,
        show_default=f"./.state if it holds a daemon, else {DEFAULT_STATE_DIR}",
        envvar="TRITONCTL_STATE_DIR",
        help="The daemon's state directory (registry, store, socket). Env: TRITONCTL_STATE_DIR.",
    )(fn)


def json_option(fn: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON (a stable contract, see README).")(fn)


def daemon_options(fn: F) -> F:
    """--state-dir, --socket, --address, --token-file: how to reach the daemon."""

    @click.option("--socket", type=click.Path(path_type=Path), envvar="TRITONCTL_SOCKET",
                  help="Control socket (default <state-dir>/tritonctl.sock). Env: TRITONCTL_SOCKET.")
    @click.option("--address", envvar="TRITONCTL_ADDRESS",
                  help="HOST:PORT of a daemon's TCP listener (https://HOST:PORT: TLS). Env: TRITONCTL_ADDRESS.")
    @click.option("--token-file", type=click.Path(path_type=Path, dir_okay=False), envvar="TRITONCTL_TOKEN_FILE",
                  help="Token for --address.")
    @click.option("--ca-file", type=click.Path(path_type=Path, dir_okay=False), envvar="TRITONCTL_CA_FILE",
                  help="CA certificate that signed an https:// --address's certificate. Env: TRITONCTL_CA_FILE.")
    @state_option
    @functools.wraps(fn)
    def wrapper(*args: Any, socket: Path | None, address: str | None, token_file: Path | None,
                ca_file: Path | None, state_dir: Path, **kwargs: Any) -> Any:
        from controlplane.api.client import ControlClient
        from controlplane.api.protocol import read_token

        token = read_token(token_file) if token_file else None
        client = ControlClient(socket=socket or state_dir / SOCKET_NAME, address=address, token=token,
                               ca_file=ca_file)
        try:
            return fn(*args, client=client, **kwargs)
        finally:
            client.close()

    return wrapper  # type: ignore[return-value]


def registry_options(fn: F | None = None, *, store: bool = False, state: bool = False) -> Any:
    """--state-dir and --db-url: read the registry directly (works while the daemon is down).

    With `state=True` the command also gets `state_dir` (`audit --follow` finds the daemon's socket there).
    With `store=True` the command also gets the content store (`diff` reads file contents). The others
    never open it: opening creates its directories, which a read-only query must not need (a user with
    read access only, or --db-url on a machine without the state directory).
    """

    def decorate(fn: F) -> F:
        @click.option("--db-url", envvar="TRITONCTL_DB_URL",
                      help="SQLAlchemy URL of the registry (default sqlite:///<state-dir>/registry.db).")
        @state_option
        @functools.wraps(fn)
        def wrapper(*args: Any, db_url: str | None, state_dir: Path, **kwargs: Any) -> Any:
            from controlplane.config import Settings
            from controlplane.store.migrate import open_reader

            settings = Settings(state_dir=state_dir, db_url=db_url)
            if state:
                kwargs["state_dir"] = state_dir
            registry = open_reader(settings.registry_url)
            try:
                if store:
                    from controlplane.snapshot import ContentStore

                    kwargs["store"] = ContentStore(state_dir / "store")
                return fn(*args, registry=registry, **kwargs)
            finally:
                registry.close()

        return wrapper  # type: ignore[return-value]

    return decorate(fn) if fn is not None else decorate
