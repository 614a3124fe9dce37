"""Options shared by several commands, and how they become a client of the daemon (or, for the read verbs
given --db-url, a reader of that registry: cli/offline.py)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from controlplane.base.defaults import DEFAULT_STATE_DIR, SOCKET_NAME

if TYPE_CHECKING:
    from controlplane.api.client import ControlClient

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


def host_option(fn: F) -> F:
    """--host H: a fleet verb acts on one host only (its daemon's address)."""
    return click.option("--host", "host", default="", metavar="H",
                        help="Fleet: act on host H only (its daemon's address); the fleet then holds H, "
                             "not converging it back.")(fn)


def _connection_options(fn: F) -> F:
    """--socket, --address, --token-file, --ca-file and --state-dir."""
    for option in (
        click.option("--socket", type=click.Path(path_type=Path), envvar="TRITONCTL_SOCKET",
                     help="Control socket (default <state-dir>/tritonctl.sock). Env: TRITONCTL_SOCKET."),
        click.option("--address", envvar="TRITONCTL_ADDRESS",
                     help="HOST:PORT of a daemon's TCP listener (https://HOST:PORT: TLS). Env: TRITONCTL_ADDRESS."),
        click.option("--token-file", type=click.Path(path_type=Path, dir_okay=False), envvar="TRITONCTL_TOKEN_FILE",
                     help="Token for --address."),
        click.option("--ca-file", type=click.Path(path_type=Path, dir_okay=False), envvar="TRITONCTL_CA_FILE",
                     help="CA certificate that signed an https:// --address's certificate. Env: TRITONCTL_CA_FILE."),
    ):
        fn = option(fn)
    return state_option(fn)


def _client(socket: Path | None, address: str | None, token_file: Path | None, ca_file: Path | None,
            state_dir: Path) -> ControlClient:
    from controlplane.api.client import ControlClient
    from controlplane.api.protocol import read_token

    token = read_token(token_file) if token_file else None
    return ControlClient(socket=socket or state_dir / SOCKET_NAME, address=address, token=token, ca_file=ca_file)


def daemon_options(fn: F) -> F:
    """--state-dir, --socket, --address, --token-file: how to reach the daemon."""

    @_connection_options
    @functools.wraps(fn)
    def wrapper(*args: Any, socket: Path | None, address: str | None, token_file: Path | None,
                ca_file: Path | None, state_dir: Path, **kwargs: Any) -> Any:
        client = _client(socket, address, token_file, ca_file, state_dir)
        try:
            return fn(*args, client=client, **kwargs)
        finally:
            client.close()

    return wrapper  # type: ignore[return-value]


def reader_options(fn: F | None = None, *, with_client: bool = False) -> Any:
    """How a read verb gets its answer (`reader`): one HTTP call to the daemon (the daemon options above),
    or, given --db-url (TRITONCTL_DB_URL), that registry read directly without a daemon (cli/offline.py).
    A daemon that does not answer is exit 3, its message naming --db-url: no silent fallback, so what
    answered is always what the command line says. `with_client`: the command also gets `client`, the
    daemon's, for what only the daemon answers (`status` without --fleet, `audit --follow`)."""

    def decorate(fn: F) -> F:
        @click.option("--db-url", envvar="TRITONCTL_DB_URL",
                      help="Read this registry directly instead of asking the daemon (no daemon needed; e.g. "
                           "sqlite:///<state-dir>/registry.db, or a fleet's PostgreSQL URL). Env: TRITONCTL_DB_URL.")
        @_connection_options
        @functools.wraps(fn)
        def wrapper(*args: Any, db_url: str | None, socket: Path | None, address: str | None,
                    token_file: Path | None, ca_file: Path | None, state_dir: Path, **kwargs: Any) -> Any:
            client = _client(socket, address, token_file, ca_file, state_dir) if with_client or not db_url else None
            if db_url:
                from cli.offline import RegistryReader

                reader: Any = RegistryReader(db_url, state_dir)
            else:
                reader = _NamingDbUrl(client, state_dir)
            if with_client:
                kwargs["client"] = client
            try:
                return fn(*args, reader=reader, **kwargs)
            finally:
                reader.close()
                if client is not None:
                    client.close()

        return wrapper  # type: ignore[return-value]

    return decorate(fn) if fn is not None else decorate


class _NamingDbUrl:
    """The daemon's client for a read verb: a daemon that does not answer is exit 3 as always, its message
    adding that --db-url reads the registry without one."""

    def __init__(self, client: Any, state_dir: Path) -> None:
        self._client = client
        registry = state_dir.absolute() / "registry.db"
        self._hint = f"(or read the registry without a daemon: --db-url sqlite:///{registry})"

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._client, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            from controlplane.errors import DaemonUnavailableError

            try:
                return method(*args, **kwargs)
            except DaemonUnavailableError as exc:
                raise DaemonUnavailableError(f"{exc} {self._hint}") from None

        return call
