"""The registry's SQLAlchemy engine for any URL: SQLite with WAL, a busy timeout and foreign keys; any
other URL as SQLAlchemy opens it (a missing driver is one line naming the extra to install)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url

from controlplane.errors import ConfigError

BUSY_TIMEOUT_S = 10.0


def redact(url: str) -> str:
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - a URL we cannot parse is shown as given
        return url


def make_engine(url: str, busy_timeout_s: float = BUSY_TIMEOUT_S) -> Engine:
    """An engine for any SQLAlchemy URL; SQLite gets WAL, a busy timeout and foreign keys."""
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        engine = create_engine(url, connect_args={"timeout": busy_timeout_s, "check_same_thread": False})

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
            cursor = dbapi_conn.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
            cursor.close()

        return engine
    try:
        return create_engine(url, pool_pre_ping=True)
    except ModuleNotFoundError as exc:  # the URL's driver is an optional dependency
        extra = "postgres" if parsed.get_backend_name() == "postgresql" else None
        fix = f"pip install 'tritonctl[{extra}]'" if extra else f"install the Python package {exc.name}"
        raise ConfigError(f"{redact(url)} needs the {exc.name} driver, which is not installed; {fix}") from None
