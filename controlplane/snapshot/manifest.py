"""Manifests: a snapshot is its sorted entries, named by the sha256 of their canonical JSON.

The digest is defined by content alone (paths, kinds, sizes, permission bits, file hashes), so the
same tree captured twice, on any host, gets the same name.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

from controlplane.errors import SnapshotCorruptError


@dataclass(frozen=True)
class ManifestEntry:
    """One file or directory of a snapshot; `path` is posix and relative to the model directory."""

    path: str
    kind: str  # "file" | "dir"
    size: int
    mode: int  # permission bits
    sha256: str  # "" for directories


def _canonical(entries: tuple[ManifestEntry, ...]) -> bytes:
    rows = [asdict(e) for e in entries]
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
        rows = [asdict(e) for e in self.entries]
        body = {"format": 1, "digest": self.digest, "total_bytes": self.total_bytes, "entries": rows}
        return json.dumps(body, sort_keys=True, indent=1, ensure_ascii=True) + "\n"

    @classmethod
    def from_manifest_json(cls, model: str, text: str) -> Snapshot:
        try:
            body = json.loads(text)
            entries = [ManifestEntry(**row) for row in body["entries"]]
        except (ValueError, KeyError, TypeError) as exc:
            raise SnapshotCorruptError(f"{model}: malformed snapshot manifest ({exc})") from exc
        snap = cls.from_entries(model, entries)
        if body.get("digest", snap.digest) != snap.digest:
            raise SnapshotCorruptError(f"{model}: manifest digest {body['digest']} does not match its entries")
        return snap

    def file(self, path: str) -> ManifestEntry | None:
        return next((e for e in self.entries if e.path == path), None)
