"""Manifests: a snapshot is its sorted entries, named by the sha256 of their canonical JSON.

The digest is defined by content alone (paths, kinds, sizes, permission bits, file hashes), so the
same tree captured twice, on any host, gets the same name.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from controlplane.errors import SnapshotCorruptError
from controlplane.snapshot.layout import is_digest


@dataclass(frozen=True)
class ManifestEntry:
    """One file or directory of a snapshot; `path` is posix and relative to the model directory."""

    path: str
    kind: str  # "file" | "dir"
    size: int
    mode: int  # permission bits
    sha256: str  # "" for directories

    def row(self) -> dict[str, object]:
        """The entry as a manifest row (`dataclasses.asdict`'s, without its deep copy: a capture
        writes two per file)."""
        return {"path": self.path, "kind": self.kind, "size": self.size, "mode": self.mode, "sha256": self.sha256}


def entry_problem(entry: ManifestEntry) -> str | None:
    """What makes a manifest entry unsafe to build a tree from (None: nothing): a path that is absolute,
    not relative, climbs out (`..`), or is not plain; a kind other than file or dir; a file's sha256 that
    is not 64 hex digits (it names the object linked); a size or mode that is not a whole number."""
    path = entry.path
    if not isinstance(path, str) or not path or path.startswith("/") or "\0" in path:
        return f"path {path!r} is not a relative path"
    if any(part in ("", ".", "..") for part in path.split("/")):
        return f"path {path!r} is not a plain relative path (empty, '.' or '..' part)"
    if entry.kind not in ("file", "dir"):
        return f"{path}: kind {entry.kind!r} is neither file nor dir"
    if entry.kind == "file" and not (isinstance(entry.sha256, str) and is_digest(entry.sha256)):
        return f"{path}: sha256 {entry.sha256!r} is not 64 hex digits"
    if entry.kind == "dir" and entry.sha256 != "":
        return f"{path}: a directory with a sha256"
    for name in ("size", "mode"):
        value = getattr(entry, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            return f"{path}: {name} {value!r} is not a whole number"
    return None


def _canonical(entries: tuple[ManifestEntry, ...]) -> bytes:
    rows = [e.row() for e in entries]
    return json.dumps(rows, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


@dataclass(frozen=True)
class Snapshot:
    """A model's content at one instant: sorted entries and the digest that names them."""

    model: str
    digest: str
    entries: tuple[ManifestEntry, ...]
    total_bytes: int

    @classmethod
    def from_entries(cls, model: str, entries: list[ManifestEntry] | tuple[ManifestEntry, ...]) -> Snapshot:
        ordered = tuple(sorted(entries, key=lambda e: e.path))
        digest = hashlib.sha256(_canonical(ordered)).hexdigest()
        total = sum(e.size for e in ordered if e.kind == "file")
        return cls(model=model, digest=digest, entries=ordered, total_bytes=total)

    def manifest_json(self) -> str:
        rows = [e.row() for e in self.entries]
        body = {"format": 1, "digest": self.digest, "total_bytes": self.total_bytes, "entries": rows}
        return json.dumps(body, sort_keys=True, indent=1, ensure_ascii=True) + "\n"

    @classmethod
    def from_manifest_json(cls, model: str, text: str) -> Snapshot:
        try:
            body = json.loads(text)
            entries = [ManifestEntry(**row) for row in body["entries"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise SnapshotCorruptError(f"{model}: malformed snapshot manifest ({exc})") from exc
        for entry in entries:  # before any tree is built from it: a shared store's manifest is not trusted
            problem = entry_problem(entry)
            if problem:
                raise SnapshotCorruptError(f"{model}: unsafe snapshot manifest: {problem}")
        snap = cls.from_entries(model, entries)
        if body.get("digest", snap.digest) != snap.digest:
            raise SnapshotCorruptError(f"{model}: manifest digest {body['digest']} does not match its entries")
        return snap

    def file(self, path: str) -> ManifestEntry | None:
        return next((e for e in self.entries if e.path == path), None)
