"""The source the settings name: an s3:// prefix (docs/object-storage.md), a directory
(docs/watching.md), or none (controlplane/source/protocol.py)."""

from __future__ import annotations

import logging

from controlplane.config import Settings
from controlplane.errors import ConfigError
from controlplane.source.protocol import NoSource, Source

log = logging.getLogger("tritonctl.source")


def configured_source(s: Settings) -> Source:
    """Built, not watched yet. Wrong s3 credentials or bucket are one logged line: what serves keeps
    serving, and the poller keeps trying (the credentials may be fixed)."""
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
