"""The registries a daemon opens at start: this host's own (journaled while it cannot be written:
controlplane/store/journaled.py), upgraded to the head schema, with what a stop during an outage left in
its journal written; and, with --fleet, the fleet's shared one (`--db-url`).
"""

from __future__ import annotations

import logging

from controlplane.settings.config import Settings
from controlplane.store import migrate
from controlplane.store.journaled import JOURNAL_NAME, JournaledRegistry
from controlplane.store.registry import Registry

log = logging.getLogger("tritonctl.daemon")


def open_registries(settings: Settings, fleet: bool) -> tuple[JournaledRegistry, Registry | None]:
    """(this host's registry, the fleet's shared one or None)."""
    # In a fleet the host's own deploy state stays in its local registry; --db-url is the fleet's, and
    # the webhooks send the shared registry's events (the leader does): a host's own keeps no outbox.
    local_url = f"sqlite:///{settings.state_dir / 'registry.db'}" if fleet else settings.registry_url
    registry = JournaledRegistry(local_url, settings.state_dir / JOURNAL_NAME, host=settings.host,
                                 busy_timeout_s=settings.db_busy_timeout_s, outbox=not fleet)
    # a registry at the head revision needs no Alembic (importing it costs about half a second of
    # every restart): one query of alembic_version says so
    if migrate.current_revision(registry) != migrate.HEAD_REVISION:
        # a fresh state directory: the head schema at once, not every migration in turn
        before, after = (None, migrate.HEAD_REVISION) if migrate.create_fresh(registry) else migrate.upgrade(registry)
        if before != after:
            log.info("registry schema upgraded %s -> %s", before or "empty", after)
    if written := registry.replay_journal():  # what a stop during an outage left unwritten
        log.info("wrote %d registry journal entr%s left from an outage", written, "y" if written == 1 else "ies")
    shared = None
    if fleet:
        shared = Registry(settings.registry_url, host=settings.host)
        migrate.upgrade_shared(shared)
    return registry, shared
