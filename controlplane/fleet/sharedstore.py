"""Snapshot content for every host: a shared directory with the content store's layout.

The leader exports a snapshot (its objects and manifest) into the shared directory; every host imports
it into its own local `ContentStore`, hashing each object as it copies and refusing the snapshot if
any sha256 differs from the manifest (a torn copy, a corrupted disk or a tampered file never reaches
a tritonserver). Both sides write to a temporary name and rename, so a reader never sees half a file.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from controlplane.errors import SnapshotError
from controlplane.snapshot import ContentStore, Snapshot, write_atomic

_CHUNK = 1 << 20


class SharedStore:
    """`<root>/objects/ab/cdef…` and `<root>/manifests/<digest>.json`."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        try:
            for sub in ("objects", "manifests", "tmp"):
                (self.root / sub).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SnapshotError(f"shared store {self.root}: {exc.strerror}") from exc

    def object_path(self, sha256: str) -> Path:
        return self.root / "objects" / sha256[:2] / sha256[2:]

    def manifest_path(self, digest: str) -> Path:
        return self.root / "manifests" / f"{digest}.json"

    def has(self, digest: str) -> bool:
        return self.manifest_path(digest).exists()

    def export(self, local: ContentStore, model: str, digest: str) -> Snapshot:
        """Copy a locally stored snapshot's objects, then its manifest (last: it marks it complete)."""
        snap = local.load(model, digest)
        if self.has(digest):
            return snap
        for entry in snap.entries:
            if entry.kind != "file":
                continue
            dest = self.object_path(entry.sha256)
            if dest.exists():
                continue
            dest.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.root / "tmp")
            os.close(fd)
            try:
                shutil.copyfile(local.object_path(entry.sha256), tmp)
                os.chmod(tmp, 0o444)
                os.replace(tmp, dest)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        write_atomic(self.manifest_path(digest), snap.manifest_json().encode(), mode=0o444)
        return snap

    def import_into(self, local: ContentStore, model: str, digest: str) -> Snapshot:
        """Make `digest` available in `local`, verifying every object's sha256 on the way in."""
        try:
            return local.load(model, digest)
        except SnapshotError:
            pass
        try:
            text = self.manifest_path(digest).read_text()
        except FileNotFoundError:
            raise SnapshotError(f"{model}: snapshot {digest[:12]} is not in the shared store {self.root}") from None
        snap = Snapshot.from_manifest_json(model, text)
        if snap.digest != digest:
            raise SnapshotError(f"{model}: shared manifest {digest[:12]} holds snapshot {snap.digest[:12]}")
        for entry in snap.entries:
            if entry.kind == "file" and not local.object_path(entry.sha256).exists():
                self._copy_verified(local, model, entry.sha256)
        local._materialize(snap)  # noqa: SLF001 - the store's own tree builder, from verified objects
        return local.load(model, digest)

    def _copy_verified(self, local: ContentStore, model: str, sha256: str) -> None:
        src = self.object_path(sha256)
        dest = local.object_path(sha256)
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=local.root / "tmp")
        try:
            hasher = hashlib.sha256()
            try:
                with open(src, "rb") as reader, os.fdopen(fd, "wb") as writer:
                    while chunk := reader.read(_CHUNK):
                        hasher.update(chunk)
                        writer.write(chunk)
                    writer.flush()
                    os.fsync(writer.fileno())
            except FileNotFoundError:
                raise SnapshotError(f"{model}: object {sha256[:12]} is missing from the shared store") from None
            if hasher.hexdigest() != sha256:
                raise SnapshotError(f"{model}: object {sha256[:12]} in the shared store is corrupt "
                                    f"(sha256 {hasher.hexdigest()[:12]}); not imported")
            os.chmod(tmp, 0o444)
            os.replace(tmp, dest)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
