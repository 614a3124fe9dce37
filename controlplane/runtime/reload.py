"""SIGHUP: the settings that change without a restart, applied to the running parts.

Re-read settings apply from now to the control plane (policy, settle window, bake limits, ...), the
source's settle window, the fleet's settings (canaries, wave size, liveness window, converge period),
the webhooks and the log level; the others are named in one WARNING and wait for a restart
(`Settings.reloaded`). A file that does not parse keeps the running settings (one ERROR line).
"""

from __future__ import annotations

import logging
from dataclasses import fields
from typing import TYPE_CHECKING, Protocol

from controlplane.errors import TritonctlError
from controlplane.settings.config import Settings

if TYPE_CHECKING:
    from controlplane.fleet.member import FleetMember
    from controlplane.outcomes.webhooks import Webhooks
    from controlplane.source.protocol import Source

log = logging.getLogger("tritonctl.daemon")


class Reconfigurable(Protocol):
    """The control plane, as a reload sees it."""

    def reconfigure(self, settings: Settings) -> None: ...


def reloaded(running: Settings, read: Settings, plane: Reconfigurable | None, source: Source,
             fleet: FleetMember | None, webhooks: Webhooks | None) -> Settings:
    """`read` (the settings file and environment now) applied where it may be; returns the settings the
    daemon runs with from now."""
    new = running.reloaded(read)
    pending = [f.name for f in fields(Settings) if getattr(read, f.name) != getattr(new, f.name)]
    if pending:
        log.warning("reload: %s changed but take effect only after a restart", ", ".join(pending))
    if plane is not None:
        plane.reconfigure(new)
    source.set_settle(new.settle_s)
    if fleet is not None:
        from controlplane.fleet.settings import from_settings

        try:  # canaries, wave size, liveness window and converge period apply from the next use
            fleet.reconfigure(from_settings(new))
        except TritonctlError as exc:
            log.error("reload: fleet settings refused, keeping the running ones: %s", exc)
    if webhooks is not None:
        from controlplane.outcomes.webhooks import Backoff

        webhooks.reconfigure(new.webhook, Backoff(max_s=new.webhook_retry_max_s))
    logging.getLogger("tritonctl").setLevel(new.log_level.upper())
    log.info("reloaded: policy=%s settle_s=%s log_level=%s reconcile_interval_s=%s webhooks=%d",
             new.policy, new.settle_s, new.log_level, new.reconcile_interval_s, len(new.webhook))
    return new
