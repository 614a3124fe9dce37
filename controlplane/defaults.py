"""Defaults that the CLI's client path needs without importing the settings machinery.

`controlplane.config` declares every daemon setting (a large dataclass, TOML parsing, webhook tables);
a `tritonctl status` process needs only where the state directory and its socket are by default, so
those two facts live here and config.py uses them too.
"""

from __future__ import annotations

from pathlib import Path

DEFAULT_STATE_DIR = Path("/var/lib/tritonctl")
SOCKET_NAME = "tritonctl.sock"  # the control API's Unix socket, in the state directory
