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

from controlplane.errors import SnapshotCorruptError, SnapshotError
from controlplane.remote import objectstore
from controlplane.remote.objectstore import S3Location
from controlplane.snapshot import ContentStore, Snapshot, is_digest, write_atomic

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


def _file_objects(snap: Snapshot) -> list[str]:
    return sorted({entry.sha256 for entry in snap.entries if entry.kind == "file"})


class _SharedStore:
    """The export and import both kinds run; each kind says how one object or manifest goes in and out."""

    def has(self, digest: str) -> bool:
        raise NotImplementedError

    def _has_object(self, sha256: str) -> bool:
        raise NotImplementedError

    def _put_object(self, local: ContentStore, model: str, sha256: str) -> None:
        raise NotImplementedError

    def _put_manifest(self, model: str, digest: str, manifest: bytes) -> None:
        raise NotImplementedError

    def _read_manifest(self, model: str, digest: str) -> str:
        """The manifest's text; SnapshotError "not in the shared store" when there is none."""
        raise NotImplementedError

    def _fetch_object(self, local: ContentStore, model: str, sha256: str) -> None:
        """Copy one object into `local`, hashing it on the way (`_install_verified`)."""
        raise NotImplementedError

    def export(self, local: ContentStore, model: str, digest: str) -> Snapshot:
        """Copy a locally stored snapshot's objects, then its manifest (last: it marks it complete)."""
        snap = local.load(model, digest)
        if self.has(digest):
            return snap
        for sha in _file_objects(snap):
            if not self._has_object(sha):
                self._put_object(local, model, sha)
        self._put_manifest(model, digest, snap.manifest_json().encode())
        return snap

    def import_into(self, local: ContentStore, model: str, digest: str) -> Snapshot:
        """Make `digest` available in `local`, verifying every object's sha256 on the way in."""
        if not is_digest(digest):  # it names the manifest's file or key
            raise SnapshotCorruptError(f"{model}: {digest!r} is not a snapshot digest (64 hex digits)")
        try:
            return local.load(model, digest)
        except SnapshotError:
            pass
        # validated (relative paths without '..', 64-hex hashes) before any object is fetched or linked
        snap = Snapshot.from_manifest_json(model, self._read_manifest(model, digest))
        if snap.digest != digest:
            raise SnapshotError(f"{model}: shared manifest {digest[:12]} holds snapshot {snap.digest[:12]}")
        for sha in _file_objects(snap):
            if not local.object_path(sha).exists():
                self._fetch_object(local, model, sha)
        local.add_snapshot(snap)  # the store's own tree builder, from verified objects
        return local.load(model, digest)


class DirectorySharedStore(_SharedStore):
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

    def _has_object(self, sha256: str) -> bool:
        return self.object_path(sha256).exists()

    def _put_object(self, local: ContentStore, model: str, sha256: str) -> None:
        dest = self.object_path(sha256)
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.root / "tmp")
        os.close(fd)
        try:
            shutil.copyfile(local.object_path(sha256), tmp)
            os.chmod(tmp, 0o444)
            os.replace(tmp, dest)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def _put_manifest(self, model: str, digest: str, manifest: bytes) -> None:
        write_atomic(self.manifest_path(digest), manifest, mode=0o444)

    def _read_manifest(self, model: str, digest: str) -> str:
        try:
            return self.manifest_path(digest).read_text()
        except FileNotFoundError:
            raise SnapshotError(f"{model}: snapshot {digest[:12]} is not in the shared store {self.root}") from None

    def _fetch_object(self, local: ContentStore, model: str, sha256: str) -> None:
        fd, name = tempfile.mkstemp(dir=local.root / "tmp")
        tmp = Path(name)
        try:
            hasher = hashlib.sha256()
            try:
                with open(self.object_path(sha256), "rb") as reader, os.fdopen(fd, "wb") as writer:
                    while chunk := reader.read(_CHUNK):
                        hasher.update(chunk)
                        writer.write(chunk)
                    writer.flush()
                    os.fsync(writer.fileno())
            except FileNotFoundError:
                raise SnapshotError(f"{model}: object {sha256[:12]} is missing from the shared store") from None
            _install_verified(local, model, sha256, tmp, hasher.hexdigest(), str(self.root))
        finally:
            tmp.unlink(missing_ok=True)


SharedStore = DirectorySharedStore  # the name callers used before object storage


class S3SharedStore(_SharedStore):
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
            if objectstore.error_code(exc) in ("404", "NoSuchKey", "NotFound"):
                return False
            raise objectstore.describe(exc, f"shared store {self.location.url}") from None

    def has(self, digest: str) -> bool:
        return self._exists(self.manifest_key(digest))

    def _has_object(self, sha256: str) -> bool:
        return self._exists(self.object_key(sha256))

    def _put_object(self, local: ContentStore, model: str, sha256: str) -> None:
        try:
            self._client.upload_file(str(local.object_path(sha256)), self.location.bucket, self.object_key(sha256))
        except Exception as exc:
            raise objectstore.describe(exc, f"{model}: exporting object {sha256[:12]}") from None

    def _put_manifest(self, model: str, digest: str, manifest: bytes) -> None:
        try:
            self._client.put_object(Bucket=self.location.bucket, Key=self.manifest_key(digest), Body=manifest,
                                    ContentType="application/json")
        except Exception as exc:
            raise objectstore.describe(exc, f"{model}: exporting manifest {digest[:12]}") from None

    def _read_manifest(self, model: str, digest: str) -> str:
        try:
            answer = self._client.get_object(Bucket=self.location.bucket, Key=self.manifest_key(digest))
            return str(answer["Body"].read().decode())
        except Exception as exc:
            if objectstore.error_code(exc) in ("404", "NoSuchKey"):
                raise SnapshotError(f"{model}: snapshot {digest[:12]} is not in the shared store "
                                    f"{self.location.url}") from None
            raise objectstore.describe(exc, f"{model}: reading manifest {digest[:12]}") from None

    def _fetch_object(self, local: ContentStore, model: str, sha256: str) -> None:
        def missing(why: str) -> SnapshotError:
            return SnapshotError(f"{model}: object {sha256[:12]} is missing from the shared store ({why})")

        try:
            tmp, actual = objectstore.download_verified(self._client, self.location.bucket, self.object_key(sha256),
                                                        local.root / "tmp", on_mismatch=missing)
        except SnapshotError:
            raise
        except Exception as exc:
            if objectstore.error_code(exc) in ("404", "NoSuchKey"):
                raise missing("not found") from None
            raise objectstore.describe(exc, f"{model}: importing object {sha256[:12]}") from None
        try:
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
            _install_verified(local, model, sha256, tmp, actual, self.location.url)
        finally:
            tmp.unlink(missing_ok=True)
