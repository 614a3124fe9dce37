"""The source the settings name: an MLflow registry (docs/mlflow.md), an s3:// prefix
(docs/object-storage.md), a directory (docs/watching.md), or none (controlplane/source/protocol.py)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from controlplane.errors import ConfigError
from controlplane.settings.config import Settings
from controlplane.source.protocol import NoSource, Source

if TYPE_CHECKING:
    from controlplane.source.mlflowsource import RegistryView
    from controlplane.store.registry import Registry

log = logging.getLogger("tritonctl.source")


def configured_source(s: Settings, registry: RegistryView | None = None, *, shared: Registry | None = None,
                      leads: Callable[[], bool] = lambda: False) -> Source:
    """Built, not watched yet. Wrong s3 credentials or bucket are one logged line: what serves keeps
    serving, and the poller keeps trying (the credentials may be fixed). `registry`: where an MLflow
    source writes its audit and tags, and reads what serves for its write-back; in a fleet (`shared`:
    the fleet's registry) it writes back the fleet's view, while this daemon `leads()`."""
    if s.repository_url and s.repository_url.startswith("mlflow+"):
        from controlplane.source import mlflowsource

        view = None
        if shared is not None:
            from controlplane.fleet.mlflowview import FleetView

            view = FleetView(shared, leads, s.liveness_s)
        return mlflowsource.open_source(s, registry, s.state_dir / "store", view)
    if s.repository_url:
        from controlplane.source.s3 import S3Source

        source = S3Source(s.repository_url, settle_s=s.settle_s, poll_interval_s=s.poll_interval_s,
                          commit_marker=s.commit_marker)
        try:
            source.check()
        except ConfigError as exc:
            log.error("%s; serving is unchanged", exc)
        return source
    if s.repository is not None:
        from controlplane.source.local import LocalSource

        return LocalSource(s.repository, settle_s=s.settle_s, commit_marker=s.commit_marker, watch=s.watch,
                           poll_interval_s=s.poll_interval_s, rescan_interval_s=s.rescan_interval_s,
                           events_later=True,  # the inotify watches after READY (Daemon.start)
                           allowed_link_roots=s.allowed_link_roots)
    return NoSource()
