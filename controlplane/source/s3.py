"""A source repository on S3-compatible object storage, with the same atomic-snapshot guarantee as a
local one (docs/object-storage.md).

Object storage has no inotify and no rename: writers (`aws s3 sync`, CI jobs) put a model object by
object, pause between objects, delete and re-put, and upload big files in parts. `S3Source` stands in
for the local watcher: every `poll_interval_s` it lists the prefix once (keys, sizes, ETags,
last-modified; one LIST per 1000 keys, plus one ListMultipartUploads), groups the objects per model
(`PREFIX/MODEL/...`) and hands a model on when its listing held still for the settle window, or at once
when its commit marker appeared with nothing newer than it. A `.tritonctl-hold` object or a multipart
upload in progress under the model holds it back.

`capture` lists the model again, refuses what the listing says is not ready (hold, upload in progress,
missing or stale marker, changed within the settle window), downloads every object straight into the
content store (conditional GETs: the ETag and size must be the listing's; an object whose key, size
and ETag were captured before is not downloaded again), lists once more and refuses the snapshot as
"still changing" if anything differs. The snapshot is then an ordinary content-store tree: validation,
the registry and deploys do not know where it came from.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from controlplane.errors import (
    ConfigError,
    ObjectStoreError,
    SnapshotAwaitingMarkerError,
    SnapshotChangingError,
    SnapshotError,
    SnapshotOnHoldError,
    SnapshotSourceGoneError,
    SnapshotStoreWriteError,
    SnapshotTooLargeError,
    SnapshotUnsupportedError,
)
from controlplane.remote import objectstore
from controlplane.remote.objectstore import S3Location
from controlplane.snapshot.content import ContentStore
from controlplane.snapshot.debris import is_ignored_name
from controlplane.snapshot.layout import CONFIG_FILE, HOLD_FILE, MAX_CONFIG_BYTES
from controlplane.snapshot.manifest import ManifestEntry, Snapshot
from controlplane.source.protocol import Captured, OnChange, last_read
from controlplane.source.shacache import ShaCache

log = logging.getLogger("tritonctl.s3source")

FILE_MODE, DIR_MODE = 0o644, 0o755  # object storage has no modes: every S3 snapshot gets these
_CACHE_MAX = 50_000
Signature = frozenset[tuple[str, int, str, float]]  # (key below the model, size, ETag, last-modified)


def listing_signature(signature: Signature) -> str:
    """A listing signature as the registry records it: the same in every process."""
    return hashlib.blake2b(repr(sorted(signature)).encode(), digest_size=16).hexdigest()


@dataclass
class _ModelState:
    signature: Signature
    changed_at: float  # monotonic time the listing last changed
    handed: Signature | None = None  # the listing last handed on (None: hand on when due)
    not_before: float = 0.0  # reschedule(): not before this monotonic time


@dataclass
class Listing:
    """What one LIST says about one model."""

    objects: dict[str, dict[str, Any]] = field(default_factory=dict)  # key below the model -> row
    uploading: list[str] = field(default_factory=list)  # keys with a multipart upload in progress

    @property
    def signature(self) -> Signature:
        return frozenset((rel, int(r["Size"]), str(r["ETag"]), r["LastModified"].timestamp())
                         for rel, r in self.objects.items())


class S3Source:
    """Poll `s3://BUCKET/PREFIX` and call `on_settled(model)`; capture a model into a ContentStore.

    A `Source` (controlplane/source/protocol.py): watched by polling its listing, captured object by object.
    `on_settled` may be given here (start then polls) or by `watch`.
    """

    def __init__(self, url: str, on_settled: Callable[[str], None] | None = None, *, settle_s: float = 1.0,
                 poll_interval_s: float = 2.0, commit_marker: str | None = None, client: Any = None) -> None:
        self.location = S3Location.parse(url)
        self._client = client or objectstore.new_client()
        self._on_settled: Callable[[str], None] = on_settled or (lambda _model: None)
        self._settle = float(settle_s)
        self.poll_interval_s = float(poll_interval_s)
        self.commit_marker = commit_marker
        self._models: dict[str, _ModelState] = {}
        self._handing: set[str] = set()  # due and being handed on now (still "settling" to status)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing: str | None = None  # the last poll's error, logged once per outage
        self.lists = self.downloads = self.bytes_downloaded = 0  # counters for tests and docs
        self._captured: dict[str, str] = {}  # model -> the listing signature its last capture was taken at
        self._listed_at: float | None = None  # when a poll last listed the prefix (`status` says)

    # -- listing -----------------------------------------------------------------------------------
    def _list(self, model: str | None = None) -> dict[str, Listing]:
        prefix = self.location.prefix + (f"{model}/" if model else "")
        try:
            rows = objectstore.list_objects(self._client, self.location.bucket, prefix)
            uploads = objectstore.list_uploads(self._client, self.location.bucket, prefix)
        except Exception as exc:
            raise objectstore.describe(exc, f"listing {self.location.url}{model or ''}") from None
        finally:
            self.lists += 2
        listings: dict[str, Listing] = {}
        base = len(self.location.prefix)
        for row in rows:
            name, sep, rel = row["Key"][base:].partition("/")
            if sep and name and not is_ignored_name(name):
                listings.setdefault(name, Listing()).objects[rel] = row
        for key in uploads:
            name, sep, rel = key[base:].partition("/")
            if sep and name and not is_ignored_name(name):
                listings.setdefault(name, Listing()).uploading.append(rel)
        return listings

    def check(self) -> None:
        """One LIST now; a one-line ConfigError when the credentials or the bucket are wrong."""
        try:
            self._list()
        except ObjectStoreError as exc:
            if exc.auth:
                raise ConfigError(str(exc)) from None
            log.warning("%s; serving is unchanged, retrying every %.1f s", exc, self.poll_interval_s)

    # -- the Source protocol (controlplane/source/protocol.py) --------------------------------------------------
    def names(self) -> list[str]:
        return self.initial_scan()

    def has(self, model: str) -> bool:
        return self.exists(model)

    def missing(self, model: str) -> str:
        return f"no objects under {self.location.url}{model}/"

    def entry_problem(self, model: str) -> str | None:
        return None  # a prefix has no entry of its own that could dangle

    def capture_into(self, content: ContentStore, model: str, *, settled: bool = True,
                     complete: bool = False) -> Captured:
        snapshot = self.capture(model, content, settled=settled)
        return Captured(snapshot, self.captured_signature(model), True)  # a listing's ETags name the content

    def capture_job(self, model: str, *, settled: bool = True, complete: bool = False) -> None:
        return None  # its captures are downloads, in the daemon (no capture worker)

    def watch(self, on_change: OnChange) -> None:
        self._on_settled = lambda model: on_change(model, False)
        self.start()

    def start_events(self) -> None:
        return None  # a bucket has no events: the listing poller is the watch

    def watch_info(self) -> Mapping[str, str | None]:
        return {"mode": "poll", "reason": f"object storage {self.location.url}: listed every "
                f"{self.poll_interval_s:g} s, {last_read(self._listed_at)}"}

    def repository_held(self) -> bool:
        return False  # a hold is per model here (`<model>/.tritonctl-hold`), checked by the capture

    def repository_marked(self) -> bool:
        return False

    def repository_wait(self, model: str) -> str | None:
        return None

    # -- watching ------------------------------------------------------------------------------------
    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="tritonctl-s3poll", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(30)
        self._thread = None

    def reschedule(self, model: str, delay_s: float) -> None:
        with self._lock:
            state = self._models.get(model)
            if state is not None:
                state.handed = None
                state.not_before = time.monotonic() + max(0.0, delay_s)

    def backlog(self) -> int:
        with self._lock:
            return sum(1 for s in self._models.values() if s.handed != s.signature)

    def held(self) -> dict[str, str]:
        return {}  # a prefix offers every model it holds

    def settling(self) -> dict[str, float | None]:
        """The models whose listing changed and is not handed on yet (settling, on hold, or looked at
        again after a refused capture), each with the seconds since its listing last changed: what
        `status` reports as `sync: pending` (the local watcher's `settling`)."""
        now = time.monotonic()
        with self._lock:
            return {name: max(0.0, now - s.changed_at) for name, s in self._models.items()
                    if s.handed != s.signature or name in self._handing}

    def set_settle(self, settle_s: float) -> None:
        self._settle = float(settle_s)

    @property
    def settle_s(self) -> float:
        return self._settle

    def initial_scan(self) -> list[str]:
        """Models under the prefix now; each counts as settled since its newest object's last-modified."""
        try:
            listings = self._list()
        except ObjectStoreError as exc:
            log.warning("%s; the start-up scan waits for the next poll", exc)
            return []
        now, wall = time.monotonic(), time.time()
        with self._lock:
            for name, listing in listings.items():
                newest = max((r["LastModified"].timestamp() for r in listing.objects.values()), default=wall)
                self._models[name] = _ModelState(listing.signature, now - max(0.0, wall - newest),
                                                 handed=listing.signature)
        return sorted(listings)

    def signatures(self) -> dict[str, str]:
        """Each model's listing signature (keys, sizes, ETags, last-modified) as the start-up scan
        listed it: a start captures only the models whose signature differs from the recorded one."""
        with self._lock:
            return {name: listing_signature(state.signature) for name, state in self._models.items()}

    def signature(self, model: str) -> str | None:
        """The model's listing signature as the last poll saw it (None: not listed)."""
        with self._lock:
            state = self._models.get(model)
            return None if state is None else listing_signature(state.signature)

    def captured_signature(self, model: str) -> str | None:
        """The listing signature the model's last capture was taken at (once; None: none)."""
        with self._lock:
            return self._captured.pop(model, None)

    def exists(self, model: str) -> bool:
        """Whether the model has objects under the prefix now (a LIST of at most one key)."""
        try:
            answer = self._client.list_objects_v2(Bucket=self.location.bucket,
                                                  Prefix=self.location.key(model, ""), MaxKeys=1)
        except Exception as exc:
            raise objectstore.describe(exc, f"listing {self.location.url}{model}") from None
        return bool(answer.get("KeyCount", len(answer.get("Contents", ()))))

    def read_text(self, model: str, name: str) -> str | None:
        try:
            body = self._client.get_object(Bucket=self.location.bucket, Key=self.location.key(model, name))["Body"]
            return str(body.read(MAX_CONFIG_BYTES).decode(errors="replace"))
        except Exception:  # noqa: BLE001 - absent or unreadable: the caller treats it as absent
            return None

    # -- polling -----------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.wait(self.poll_interval_s):
            try:
                self.poll()
            except Exception:  # noqa: BLE001 - one bad poll must not stop the poller
                log.exception("s3 poll failed")

    def poll(self) -> list[str]:
        """List once, update every model's state, hand on the models that are due; their names."""
        try:
            listings = self._list()
        except ObjectStoreError as exc:
            if str(exc) != self._failing:
                log.warning("%s; serving is unchanged, retrying every %.1f s", exc, self.poll_interval_s)
            self._failing = str(exc)
            return []
        if self._failing:
            log.info("object storage %s answers again", self.location.url)
            self._failing = None
        self._listed_at = time.time()
        now = time.monotonic()
        due: list[str] = []
        with self._lock:
            for name, listing in listings.items():
                signature = listing.signature
                state = self._models.get(name)
                if state is None:
                    state = self._models[name] = _ModelState(signature, now)
                elif state.signature != signature:
                    state.signature, state.changed_at = signature, now
                if state.handed == signature or now < state.not_before or self._held(listing):
                    continue
                # with a commit marker only the marker publishes (a capture without it would be refused)
                if self._marked(listing) if self.commit_marker else now - state.changed_at >= self._settle:
                    state.handed = signature
                    due.append(name)
            for name in [n for n in self._models if n not in listings]:
                del self._models[name]  # removed from the source: the consumer decides what that means
                due.append(name)
            self._handing.update(due)
        for name in due:
            try:
                self._on_settled(name)
            except Exception:  # noqa: BLE001
                log.exception("s3 source: on_settled(%r) failed", name)
            finally:
                with self._lock:
                    self._handing.discard(name)
        return due

    @staticmethod
    def _held(listing: Listing) -> bool:
        return HOLD_FILE in listing.objects or bool(listing.uploading)

    def _marked(self, listing: Listing) -> bool:
        """The commit marker is there and no object is newer than it."""
        marker = listing.objects.get(self.commit_marker) if self.commit_marker else None
        if marker is None:
            return False
        return all(r["LastModified"] <= marker["LastModified"] for r in listing.objects.values())

    def _quiet(self, model: str, signature: Signature) -> bool:
        """The poller saw this very listing hold still for the settle window (True when not polling)."""
        if self._thread is None:
            return True
        with self._lock:
            state = self._models.get(model)
            return (state is not None and state.signature == signature
                    and time.monotonic() - state.changed_at >= self._settle)

    # -- capture -----------------------------------------------------------------------------------
    def capture(self, model: str, content: ContentStore, *, settled: bool = True) -> Snapshot:
        """Snapshot the model's objects if complete and holding still; SnapshotError otherwise."""
        before = self._list(model).get(model)
        if before is None or not before.objects:
            raise SnapshotSourceGoneError(f"{model}: no objects under {self.location.url}{model}/")
        self._check_ready(model, before, settled)
        wanted = self._content(model, before, content)
        shas = self._fetch(model, content, wanted)
        after = self._list(model).get(model) or Listing()
        if after.signature != before.signature or after.uploading:
            raise SnapshotChangingError(f"{model}: still changing ({_first_difference(before, after)})")
        entries: dict[str, ManifestEntry] = {}
        for rel, row in wanted.items():
            parts = rel.split("/")
            for i in range(1, len(parts)):
                path = "/".join(parts[:i])
                entries.setdefault(path, ManifestEntry(path, "dir", 0, DIR_MODE, ""))
            if rel.endswith("/"):  # a folder object (or the folder of debris): a directory
                entries.setdefault(rel[:-1], ManifestEntry(rel[:-1], "dir", 0, DIR_MODE, ""))
                continue
            entries[rel] = ManifestEntry(rel, "file", int(row["Size"]), FILE_MODE, shas[rel])
        snapshot = Snapshot.from_entries(model, list(entries.values()))
        try:
            with content.reading():
                content.add_snapshot(snapshot)  # the store's own tree builder, from stored objects
        except OSError as exc:
            raise SnapshotStoreWriteError(f"{model}: cannot record the snapshot in the content store ({exc})") from exc
        with self._lock:
            self._captured[model] = listing_signature(before.signature)
        return snapshot

    def _check_ready(self, model: str, listing: Listing, settled: bool) -> None:
        if HOLD_FILE in listing.objects:
            raise SnapshotOnHoldError(f"{model}: on hold ({HOLD_FILE} present)")
        if listing.uploading:
            raise SnapshotChangingError(
                f"{model}: still changing (multipart upload of {listing.uploading[0]} in progress)")
        marker_ok = False
        if self.commit_marker:
            marker = listing.objects.get(self.commit_marker)
            if marker is None:
                raise SnapshotAwaitingMarkerError(f"{model}: awaiting commit marker {self.commit_marker}")
            newer = sorted(rel for rel, r in listing.objects.items() if r["LastModified"] > marker["LastModified"])
            if newer:
                raise SnapshotAwaitingMarkerError(
                    f"{model}: awaiting commit marker {self.commit_marker} (older than {newer[0]})")
            marker_ok = True
        if settled and not marker_ok:
            newest = max(r["LastModified"].timestamp() for r in listing.objects.values())
            age_s = time.time() - newest
            if -1.0 <= age_s < self._settle or not self._quiet(model, listing.signature):
                raise SnapshotChangingError(f"{model}: still changing (last change {max(age_s, 0.0):.2f} s ago,"
                                    f" settle window {self._settle:g} s)")

    def _content(self, model: str, listing: Listing, content: ContentStore) -> dict[str, dict[str, Any]]:
        """The objects that make the snapshot: no debris, no marker; keys that are safe paths."""
        wanted: dict[str, dict[str, Any]] = {}
        for rel, row in sorted(listing.objects.items()):
            if rel == self.commit_marker or not rel:
                continue
            size = row.get("Size")
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise SnapshotUnsupportedError(f"{model}: object {rel!r} is listed with size {size!r}, not a number "
                                               "of bytes; refusing to capture it")
            parts = rel.rstrip("/").split("/")
            if any(p in ("", ".", "..") for p in parts) or "\\" in rel or "\0" in rel:
                raise SnapshotUnsupportedError(
                    f"{model}: object key {rel!r} is not a safe path; refusing to capture it")
            if any(is_ignored_name(p) for p in parts):
                # debris is left out, but the folders above it exist, as on a disk: an ensemble's empty
                # version folder is often kept in a bucket by a `1/.gitkeep` or a `1/` folder object
                first = next(i for i, p in enumerate(parts) if is_ignored_name(p))
                if first:
                    wanted.setdefault("/".join(parts[:first]) + "/", {"Size": 0})
                continue
            if rel.endswith("/") and int(row["Size"]):
                raise SnapshotUnsupportedError(f"{model}: object key {rel!r} ends with '/' but has content")
            if rel == CONFIG_FILE and int(row["Size"]) > MAX_CONFIG_BYTES:
                raise SnapshotTooLargeError(
                    f"{model}: {CONFIG_FILE} is {row['Size']} bytes, over the {MAX_CONFIG_BYTES}-byte"
                    " limit; refusing to capture it")
            wanted[rel] = row
        files = {rel for rel in wanted if not rel.endswith("/")}
        content.check_model_size(model, sum(int(wanted[rel]["Size"]) for rel in files))
        clash = next((rel for rel in files if any(f.startswith(rel + "/") for f in files)), None)
        if clash:
            raise SnapshotUnsupportedError(f"{model}: {clash} is both an object and a folder; refusing to capture it")
        return wanted

    def _fetch(self, model: str, content: ContentStore, wanted: dict[str, dict[str, Any]]) -> dict[str, str]:
        """sha256 of every wanted object, each stored as a content-store object (downloaded at most once)."""
        cache = self._load_cache(content)
        shas: dict[str, str] = {}
        todo: list[tuple[str, dict[str, Any]]] = []
        for rel, row in wanted.items():
            if rel.endswith("/"):
                continue
            sha = cache.get(_cache_key(self.location.key(model, rel), row))
            if sha is not None and content.has_object(sha, int(row["Size"])):
                shas[rel] = sha
            else:
                todo.append((rel, row))

        def fetch(item: tuple[str, dict[str, Any]]) -> tuple[str, str]:
            rel, row = item
            key = self.location.key(model, rel)
            try:
                tmp, sha = objectstore.download_verified(
                    self._client, self.location.bucket, key, content.root / "tmp", size=int(row["Size"]),
                    etag=str(row["ETag"]),
                    on_mismatch=lambda why: SnapshotChangingError(f"{model}: still changing ({why})"))
            except SnapshotError:
                raise
            except Exception as exc:
                raise objectstore.describe(exc, f"{model}: downloading {rel}") from None
            content.add_object(tmp, sha, int(row["Size"]))
            self.downloads += 1
            self.bytes_downloaded += int(row["Size"])
            return rel, sha

        if todo:
            with ThreadPoolExecutor(max_workers=min(8, len(todo)), thread_name_prefix="s3get") as pool:
                for rel, sha in pool.map(fetch, todo):
                    shas[rel] = sha
                    cache[_cache_key(self.location.key(model, rel), wanted[rel])] = sha
            self._save_cache(content, cache)
        return shas

    # the (key, size, ETag) -> sha256 cache: S3's stat cache, kept beside the content store
    @staticmethod
    def _cache(content: ContentStore) -> ShaCache:
        return ShaCache(content.root / "s3cache.json", _CACHE_MAX)

    def _load_cache(self, content: ContentStore) -> dict[str, str]:
        return self._cache(content).load()

    def _save_cache(self, content: ContentStore, cache: dict[str, str]) -> None:
        self._cache(content).save(cache)


def _cache_key(key: str, row: dict[str, Any]) -> str:
    return f"{key}\0{int(row['Size'])}\0{row['ETag']}"


def _first_difference(before: Listing, after: Listing) -> str:
    if after.uploading:
        return f"multipart upload of {after.uploading[0]} in progress"
    old = {rel: (r["Size"], r["ETag"]) for rel, r in before.objects.items()}
    new = {rel: (r["Size"], r["ETag"]) for rel, r in after.objects.items()}
    changed = sorted(r for r in old.keys() | new.keys() if old.get(r) != new.get(r))
    if not changed:
        return "re-uploaded during the download"
    rel = changed[0]
    return f"{rel} {'removed' if rel not in new else 'added' if rel not in old else 'modified'} during the download"
