"""The registry adapter: SQLAlchemy schema and repository functions returning plain dataclasses.

Nothing outside this package sees an ORM object or a SQLAlchemy exception: reads return the
dataclasses of `controlplane.store.records`, failures become `controlplane.errors.StoreError`.
"""

from controlplane.store.records import (
    AuditRecord,
    DeploymentRecord,
    ModelRecord,
    ServingRecord,
    SnapshotRecord,
)
from controlplane.store.registry import AuditQuery, Registry

__all__ = [
    "AuditQuery",
    "AuditRecord",
    "DeploymentRecord",
    "ModelRecord",
    "Registry",
    "ServingRecord",
    "SnapshotRecord",
]
