"""Capture a model directory only once it is complete, into an immutable content-addressed store.

A package by concern: `layout` (on-disk names and limits), `debris` (which names are never content),
`fsutil` (atomic replace, link-or-copy, forced removal), `scan` (reading a directory that may be
changing), `manifest` (snapshots and their content-defined digest) and `content` (the content store:
capture, lookup, gc and the stat-cache journal). Refusals are typed SnapshotError subclasses in
controlplane.errors, each with `retryable`.

`from controlplane.snapshot import X` keeps working for every name the single module exported.
"""

from typing import TYPE_CHECKING

from controlplane.snapshot.debris import is_ignored_name
from controlplane.snapshot.fsutil import ensure_dir, force_rmtree, link_or_copy, open_private, write_atomic
from controlplane.snapshot.layout import CONFIG_FILE, HOLD_FILE, MAX_CONFIG_BYTES, SMOKE_FILE, is_digest
from controlplane.snapshot.scan import last_change_ns, scan

if TYPE_CHECKING:
    from controlplane.snapshot.content import FICLONE, ContentStore
    from controlplane.snapshot.manifest import ManifestEntry, Snapshot

# The content store and the manifest are imported when first used (PEP 562): `validate` reads only
# `layout` and `fsutil`, and need not load them (and hashlib) on every start.
_LATER = {"FICLONE": "content", "ContentStore": "content", "ManifestEntry": "manifest", "Snapshot": "manifest"}


def __getattr__(name: str) -> object:
    home = _LATER.get(name)
    if home is None:
        raise AttributeError(f"module 'controlplane.snapshot' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"controlplane.snapshot.{home}"), name)
    globals()[name] = value
    return value


__all__ = [
    "CONFIG_FILE",
    "FICLONE",
    "HOLD_FILE",
    "MAX_CONFIG_BYTES",
    "SMOKE_FILE",
    "ContentStore",
    "ManifestEntry",
    "Snapshot",
    "ensure_dir",
    "force_rmtree",
    "is_digest",
    "is_ignored_name",
    "last_change_ns",
    "link_or_copy",
    "open_private",
    "scan",
    "write_atomic",
]
