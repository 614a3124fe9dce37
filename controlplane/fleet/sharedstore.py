"""Snapshot content for every host: a shared directory, or a bucket prefix on S3-compatible object
storage, with the content store's layout (`objects/ab/cdef…`, `manifests/<digest>.json`).

The leader exports a snapshot (its objects and manifest) into the shared directory; every host imports
it into its own local `ContentStore`, hashing each object as it copies and refusing the snapshot if
any sha256 differs from the manifest (a torn copy, a corrupted disk or a tampered file never reaches
a tritonserver). In a directory both sides write to a temporary name and rename, so a reader never
sees half a file; on S3 an object appears whole or not at all, and the manifest is put last.
`open_shared_store` picks the implementation from the `--shared-store` value.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Protocol

from controlplane import objectstore
from controlplane.errors import SnapshotError
from controlplane.objectstore import S3Location
from controlplane.snapshot import ContentStore, Snapshot, write_atomic

_CHUNK = 1 << 20


class SharedContent(Protocol):
    """What the fleet needs of a shared store: the leader exports, every host imports (verified)."""

    def has(self, digest: str) -> bool: ...

    def export(self, local: ContentStore, model: str, digest: str) -> Snapshot: ...

    def import_into(self, local: ContentStore, model: str, digest: str) -> Snapshot: ...


def open_shared_store(location: Path | str) -> SharedContent:
    """A directory path, or `s3://BUCKET/PREFIX` (docs/object-storage.md)."""
    if objectstore.is_s3_url(location):
        return S3SharedStore(str(location))
    return DirectorySharedStore(Path(location))


def _install_verified(local: ContentStore, model: str, sha256: str, tmp: Path, actual: str, where: str) -> None:
    """Move a fetched object into the local store if its sha256 is the manifest's; refuse it otherwise."""
    if actual != sha256:
        raise SnapshotError(f"{model}: object {sha256[:12]} in the shared store is corrupt "
                            f"(sha256 {actual[:12]}); not imported from {where}")
    dest = local.object_path(sha256)
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(tmp, 0o444)
    os.replace(tmp, dest)


def _load_shared_manifest(model: str, digest: str, text: str) -> Snapshot:
    snap = Snapshot.from_manifest_json(model, text)
    if snap.digest != digest:
        raise SnapshotError(f"{model}: shared manifest {digest[:12]} holds snapshot {snap.digest[:12]}")
    return snap


class DirectorySharedStore:
    """`<root>/objects/ab/cdef…` and `<root>/manifests/<digest>.json` on a filesystem every host mounts."""

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
        snap = _load_shared_manifest(model, digest, text)
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


SharedStore = DirectorySharedStore  # the name callers used before object storage


class S3SharedStore:
    """`PREFIX/objects/ab/cdef…` and `PREFIX/manifests/<digest>.json` in a bucket every host can read.

    The leader puts each object the bucket does not have yet (boto3 uploads big ones in parts; a
    multipart object is invisible until complete), then the manifest: a manifest is only ever there
    once all its objects are. Hosts GET the manifest, then each missing object, hashing it as it
    streams to disk, and refuse the snapshot on any sha256 that differs from the manifest's.
    """

    def __init__(self, url: str, client: Any = None) -> None:
        self.location = S3Location.parse(url)
        self._client = client or objectstore.new_client()

    def object_key(self, sha256: str) -> str:
        return self.location.key("objects", sha256[:2], sha256[2:])

    def manifest_key(self, digest: str) -> str:
        return self.location.key("manifests", f"{digest}.json")

    def _exists(self, key: str) -> bool:
        try:
            self._client.head_object(Bucket=self.location.bucket, Key=key)
            return True
        except Exception as exc:
            code = str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))
            if code in ("404", "NoSuchKey", "NotFound"):
                return False
            raise objectstore.describe(exc, f"shared store {self.location.url}") from None

    def has(self, digest: str) -> bool:
        return self._exists(self.manifest_key(digest))

    def export(self, local: ContentStore, model: str, digest: str) -> Snapshot:
        snap = local.load(model, digest)
        if self.has(digest):
            return snap
        for sha in sorted({e.sha256 for e in snap.entries if e.kind == "file"}):
            key = self.object_key(sha)
            if self._exists(key):
                continue
            try:
                self._client.upload_file(str(local.object_path(sha)), self.location.bucket, key)
            except Exception as exc:
                raise objectstore.describe(exc, f"{model}: exporting object {sha[:12]}") from None
        try:
            self._client.put_object(Bucket=self.location.bucket, Key=self.manifest_key(digest),
                                    Body=snap.manifest_json().encode(), ContentType="application/json")
        except Exception as exc:
            raise objectstore.describe(exc, f"{model}: exporting manifest {digest[:12]}") from None
        return snap

    def import_into(self, local: ContentStore, model: str, digest: str) -> Snapshot:
        try:
            return local.load(model, digest)
        except SnapshotError:
            pass
        try:
            answer = self._client.get_object(Bucket=self.location.bucket, Key=self.manifest_key(digest))
            text = answer["Body"].read().decode()
        except Exception as exc:
            code = str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))
            if code in ("404", "NoSuchKey"):
                raise SnapshotError(f"{model}: snapshot {digest[:12]} is not in the shared store "
                                    f"{self.location.url}") from None
            raise objectstore.describe(exc, f"{model}: reading manifest {digest[:12]}") from None
        snap = _load_shared_manifest(model, digest, text)
        for sha in sorted({e.sha256 for e in snap.entries if e.kind == "file"}):
            if local.object_path(sha).exists():
                continue

            def missing(why: str, sha: str = sha) -> SnapshotError:
                return SnapshotError(f"{model}: object {sha[:12]} is missing from the shared store ({why})")

            try:
                tmp, actual = objectstore.download_verified(self._client, self.location.bucket,
                                                            self.object_key(sha), local.root / "tmp",
                                                            on_mismatch=missing)
            except SnapshotError:
                raise
            except Exception as exc:
                code = str(getattr(exc, "response", {}).get("Error", {}).get("Code", ""))
                if code in ("404", "NoSuchKey"):
                    raise missing("not found") from None
                raise objectstore.describe(exc, f"{model}: importing object {sha[:12]}") from None
            try:
                with open(tmp, "rb") as fh:
                    os.fsync(fh.fileno())
                _install_verified(local, model, sha, tmp, actual, self.location.url)
            finally:
                tmp.unlink(missing_ok=True)
        local._materialize(snap)  # noqa: SLF001 - the store's own tree builder, from verified objects
        return local.load(model, digest)
