"""Defaults that the CLI's client path needs without importing the settings machinery.

`controlplane.settings.config` declares every daemon setting (a large dataclass, TOML parsing, webhook tables);
a `tritonctl status` process needs only where the state directory and its socket are by default, so
those two facts live here and settings/config.py uses them too; so does the list of audit outcomes (`audit
--outcome`'s choices), which store/records.py would otherwise cost the CLI (its dataclasses).
"""

from __future__ import annotations

from pathlib import Path

DEFAULT_STATE_DIR = Path("/var/lib/tritonctl")
SOCKET_NAME = "tritonctl.sock"  # the control API's Unix socket, in the state directory

# Every outcome an audit event can have (the CLI's --outcome choices; store/records.py re-exports it).
OUTCOMES = ("ok", "failed", "rolled_back", "noop", "invalid", "inconclusive", "warning")
