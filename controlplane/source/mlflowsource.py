"""Models from an MLflow model registry: `--repository mlflow+http://HOST:PORT` (docs/mlflow.md).

Teams promote a model in MLflow by moving an alias (`champion`). `MLflowSource` makes that move a
tritonctl deploy, behind the same `Source` protocol as a directory or a bucket:

- every `poll_interval_s` it lists the registered models once (`registered-models/search`: names and
  aliases, one request per 1000 models) and hands on each model whose alias `mlflow_alias` now names
  another version, or no version any more (the consumer then marks it `removed`; what serves keeps
  serving). MLflow unreachable: the next poll waits longer (doubling, at most 16 polls' time and 30 s),
  nothing is handed on, and `status`'s watch reason says so;
- `capture` reads the alias, resolves the version's artifact location, lists it, finds the Triton model
  directory (`config.pbtxt` at the root, or `MLmodel` -> `flavors.triton.data`), downloads each file into
  the content store (a file of the same model, version, path and size captured before is not downloaded
  again), then reads the alias and the listing again: a move in between refuses the snapshot as "still
  changing", as a directory edited during its copy is. Hostile artifact paths (`..`, absolute, a
  backslash, NUL), links and sizes that are no sizes are refused, and nothing is read past a file's
  listed size or its deadline (controlplane/source/mlflowfiles.py);
- write-back (controlplane/source/mlflowwriteback.py): each poll, every version this source captured gets
  the MLflow tags `tritonctl.state` (`serving`, `rolled_back`, `quarantined`, `failed`; removed once a
  version no longer serves after serving) and `tritonctl.digest`, in a fleet also `tritonctl.hosts`,
  from this host's registry or (in a fleet, written by the leader alone) the fleet's shared registry; a
  failed write is retried at the next poll and never blocks a deploy. The served version's MLflow
  aliases become tritonctl tags of its digest.
"""

from __future__ import annotations

import hashlib
import http.client
import logging
import os
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from controlplane.base.periodic import Periodic
from controlplane.errors import (
    ConfigError,
    MLflowError,
    SnapshotChangingError,
    SnapshotError,
    SnapshotSourceGoneError,
    SnapshotStoreWriteError,
)
from controlplane.remote import httpbounds
from controlplane.remote.mlflowrest import MLflowRest, tracking_url
from controlplane.settings.config import Settings
from controlplane.snapshot.content import ContentStore
from controlplane.snapshot.layout import MAX_CONFIG_BYTES
from controlplane.snapshot.manifest import ManifestEntry, Snapshot
from controlplane.source.mlflowfiles import ArtifactFile, ArtifactFiles
from controlplane.source.mlflowwriteback import HostView, RegistryView, ServingView, WriteBack
from controlplane.source.protocol import Captured, OnChange, PerModelOnly, last_read
from controlplane.source.shacache import ShaCache
from controlplane.store.records import AuditEntry
from controlplane.vocab import WATCHER_ACTOR, Result

log = logging.getLogger("tritonctl.mlflow")
HELD = "held: "  # the prefix of a not-served reason that `held` reports (alias names no version)

FILE_MODE, DIR_MODE = 0o644, 0o755
MAX_BACKOFF_S = 30.0
VERSIONS_FILE = "mlflowversions.json"  # beside the content store: (model, version) -> the digest captured


class MLflowSource(PerModelOnly):
    """A `Source` (controlplane/source/protocol.py) over an MLflow tracking server's model registry."""

    def __init__(self, url: str, *, alias: str = "champion", poll_interval_s: float = 2.0,
                 registry: RegistryView | None = None, rest: MLflowRest | None = None,
                 env: Mapping[str, str] | None = None, view: ServingView | None = None) -> None:
        self.url = url
        self.rest = rest or MLflowRest(tracking_url(url), env)
        self.alias = alias
        self.poll_interval_s = float(poll_interval_s)
        self.registry = registry
        self._on_change: OnChange = lambda _model, _complete: None
        self._lock = threading.Lock()
        self._versions: dict[str, str] = {}  # model -> the version its alias named at the last poll
        self._handed: dict[str, str] = {}  # model -> the version last handed on
        self._not_before: dict[str, float] = {}
        self._ignored: dict[str, str] = {}  # model -> why it is not served (logged once per reason)
        self._held_handed: set[str] = set()  # the held models handed on (once each, while held)
        self._aliases: dict[str, dict[str, list[str]]] = {}  # model -> version -> its aliases
        self._captured: dict[str, str] = {}  # model -> the signature its last capture was taken at
        # the write-back: from this host's registry, or the view given (a fleet's: fleet/mlflowview.py)
        view = view or (HostView(registry) if registry is not None else None)
        self.writeback = WriteBack(self.rest, view) if view is not None else None
        self.files = ArtifactFiles(self.rest)  # each version's artifacts, listed and read within bounds
        self._poller = Periodic("tritonctl-mlflowpoll", self.poll_interval_s, self._round, log)
        self._failing: str | None = None
        self._failures = 0
        self.downloads = self.bytes_downloaded = 0  # counters for tests and docs
        self._root: Path | None = None  # the content store's folder (what was captured is kept there)
        self._read_at: float | None = None  # when a poll last listed the registry (`status` says)

    # -- listing -----------------------------------------------------------------------------------
    def _list(self) -> dict[str, str]:
        """Each registered model whose alias names a version: model -> version (one request per 1000)."""
        served: dict[str, str] = {}
        aliases: dict[str, dict[str, list[str]]] = {}
        for row in self.rest.registered_models():
            name = str(row.get("name", ""))
            by_version: dict[str, list[str]] = {}
            for pair in row.get("aliases", ()) or ():
                by_version.setdefault(str(pair.get("version")), []).append(str(pair.get("alias")))
            aliases[name] = by_version
            version = next((v for v, names in by_version.items() if self.alias in names), None)
            if version is None:
                self._ignore(name, f"{HELD}alias {self.alias} names no version")
                continue
            if self._ignored.get(name, "").startswith(HELD):
                del self._ignored[name]  # its alias names a version now
            served[name] = version
        with self._lock:
            self._aliases = aliases
        return served

    def _ignore(self, name: str, reason: str) -> None:
        if self._ignored.get(name) != reason:
            self._ignored[name] = reason
            log.info("MLflow model %s: not served: %s", name, reason)

    def check(self) -> None:
        """One listing now; a one-line ConfigError when the server refuses the credentials."""
        try:
            self._list()
        except MLflowError as exc:
            if exc.auth:
                raise ConfigError(str(exc)) from None
            log.warning("%s; serving is unchanged, retrying", exc)
            self._failing = str(exc)

    # -- the Source protocol -------------------------------------------------------------------------
    def names(self) -> list[str]:
        try:
            listed = self._list()
        except MLflowError as exc:
            log.warning("%s; the start-up scan waits for the next poll", exc)
            self._failing = str(exc)
            return []
        with self._lock:
            self._versions = dict(listed)
            self._handed = dict(listed)
        return sorted(listed)

    def has(self, model: str) -> bool:
        return self.rest.version_by_alias(model, self.alias) is not None

    def missing(self, model: str) -> str:
        return f"MLflow at {self.rest.base}: alias {self.alias} of registered model {model} names no version"

    def read_text(self, model: str, name: str) -> str | None:
        try:
            version = self.rest.version_by_alias(model, self.alias)
            if version is None:
                return None
            root, files = self.files.layout(model, version)
            if not any(f.path == root + name for f in files):
                return None
            return self.files.read(root + name, self.files.base(version), MAX_CONFIG_BYTES).decode(errors="replace")
        except (SnapshotError, OSError, http.client.HTTPException, httpbounds.TooLarge):
            return None

    def entry_problem(self, model: str) -> str | None:
        return None

    def capture_into(self, content: ContentStore, model: str, *, settled: bool = True,
                     complete: bool = False) -> Captured:
        snapshot = self.capture(model, content)
        with self._lock:
            signature = self._captured.pop(model, None)
        return Captured(snapshot, signature, True)  # a version number names the content

    def capture_job(self, model: str, *, settled: bool = True, complete: bool = False) -> None:
        return None  # its captures are downloads, in the daemon (no capture worker)

    def signature(self, model: str) -> str | None:
        with self._lock:
            version = self._versions.get(model)
        return None if version is None else _signature(version)

    def signatures(self) -> dict[str, str]:
        with self._lock:
            return {name: _signature(v) for name, v in self._versions.items()}

    def watch(self, on_change: OnChange) -> None:
        self._on_change = on_change
        self._poller.start()

    def start_events(self) -> None:
        return None  # the poller is the watch (MLflow 3.3+ alias webhooks are not taken: docs/mlflow.md)

    def stop(self) -> None:
        self._poller.stop()

    def reschedule(self, model: str, delay_s: float) -> None:
        with self._lock:
            self._handed.pop(model, None)
            self._not_before[model] = time.monotonic() + max(0.0, delay_s)

    def set_settle(self, settle_s: float) -> None:
        return None  # a registered version does not change: there is nothing to settle

    def watch_info(self) -> Mapping[str, str | None]:
        reason = (f"MLflow registry {self.rest.base}: alias {self.alias} read every {self.poll_interval_s:g} s, "
                  f"{last_read(self._read_at)}")
        if self._failing:
            reason += f"; unreachable, retrying with backoff: {self._failing}"
        return {"mode": "poll", "reason": reason}

    def settling(self) -> dict[str, float | None]:
        with self._lock:
            return {m: None for m, v in self._versions.items() if self._handed.get(m) != v}

    def backlog(self) -> int:
        return len(self.settling())

    def held(self) -> dict[str, str]:
        """The registered models whose alias names no version, as of the last listing."""
        ignored = dict(self._ignored)  # written by the listing alone (one thread)
        return {name: why.removeprefix(HELD) for name, why in ignored.items() if why.startswith(HELD)}

    # -- polling -----------------------------------------------------------------------------------
    def _round(self) -> None:
        """One poll, then the write-back (each failure logged; the next round tries again). MLflow
        unreachable: no write-back either (the poll's one line says why)."""
        try:
            self.poll()
        except Exception:  # noqa: BLE001 - one bad poll must not stop the poller
            log.exception("MLflow poll failed")
        finally:
            self._poller.interval_s = self._next_wait()
        if self._failing is None:
            self.write_back()

    def _next_wait(self) -> float:
        if not self._failures:
            return self.poll_interval_s
        # doubling from poll_interval_s, at most 16 times it and at most MAX_BACKOFF_S
        return float(min(MAX_BACKOFF_S, self.poll_interval_s * 2 ** min(self._failures, 4)))

    def poll(self) -> list[str]:
        """List once; hand on the models whose alias names another version (or none any more)."""
        try:
            listed = self._list()
        except MLflowError as exc:
            self._failures += 1
            if str(exc) != self._failing:
                log.warning("%s; serving is unchanged, retrying with backoff", exc)
            self._failing = str(exc)
            return []
        if self._failing:
            log.info("MLflow at %s answers again", self.rest.base)
        self._failing, self._failures = None, 0
        self._read_at = time.time()
        now = time.monotonic()
        due: list[str] = []
        with self._lock:
            for name, version in listed.items():
                self._versions[name] = version
                if self._handed.get(name) != version and now >= self._not_before.get(name, 0.0):
                    self._handed[name] = version
                    due.append(name)
            for name in [n for n in self._versions if n not in listed]:
                del self._versions[name]  # the alias or the model was deleted: the consumer marks it removed
                self._handed.pop(name, None)
                due.append(name)

        held = set(self.held())
        due.extend(sorted(held - self._held_handed - set(due)))  # newly held: handed on once, `status` shows them
        self._held_handed = held
        for name in due:
            try:
                self._on_change(name, True)
            except Exception:  # noqa: BLE001
                log.exception("MLflow source: handing on %r failed", name)
        return due

    # -- capture -----------------------------------------------------------------------------------
    def capture(self, model: str, content: ContentStore) -> Snapshot:
        """Snapshot the version the alias names (see the module docstring); SnapshotError otherwise."""
        self._root = content.root
        before = self.rest.version_by_alias(model, self.alias)
        if before is None:
            raise SnapshotSourceGoneError(self.missing(model))
        base = self.files.base(before)
        root, files = self.files.layout(model, before, base)
        wanted = [f for f in files if f.path.startswith(root)]
        content.check_model_size(model, sum(f.size for f in wanted))
        shas, fetched = self._fetch(model, before, base, wanted, content)
        after = self.rest.version_by_alias(model, self.alias)
        if after is None or after.get("version") != before.get("version"):
            moved = "deleted" if after is None else f"moved to version {after.get('version')}"
            raise SnapshotChangingError(f"{model}: still changing (alias {self.alias} {moved} during the download)")
        if self.files.listing(model, base) != files:
            raise SnapshotChangingError(f"{model}: still changing (version {before.get('version')}'s artifacts "
                                        "changed during the download)")
        entries: dict[str, ManifestEntry] = {}
        for f in wanted:
            rel = f.path[len(root):]
            parts = rel.split("/")
            for i in range(1, len(parts)):
                path = "/".join(parts[:i])
                entries.setdefault(path, ManifestEntry(path, "dir", 0, DIR_MODE, ""))
            entries[rel] = ManifestEntry(rel, "file", f.size, FILE_MODE, shas[f.path])
        snapshot = Snapshot.from_entries(model, list(entries.values()))
        try:
            with content.reading():
                content.add_snapshot(snapshot)
        except OSError as exc:
            raise SnapshotStoreWriteError(f"{model}: cannot record the snapshot in the store ({exc})") from exc
        version, run = str(before.get("version")), str(before.get("run_id") or "-")
        with self._lock:
            self._captured[model] = _signature(version)
        if self.writeback is not None:
            self.writeback.forget(model, version)  # write its tags (again) at the next poll
        self._remember(content, model, version, snapshot.digest)
        if self.registry is not None:
            self.registry.audit(AuditEntry(WATCHER_ACTOR, "mlflow", model, snapshot.digest, Result.OK,
                                           f"captured MLflow {model} version {version} (run {run}, alias "
                                           f"{self.alias}): {fetched} of {len(wanted)} files downloaded"))
        return snapshot

    def _fetch(self, model: str, version: dict[str, Any], base: str, wanted: list[ArtifactFile],
               content: ContentStore) -> tuple[dict[str, str], int]:
        """sha256 of every wanted file, each a content-store object; how many were downloaded."""
        cache = ShaCache(content.root / "mlflowcache.json")
        known = cache.load()
        prefix = f"{model}\0{version.get('version')}\0{version.get('run_id')}\0"
        shas: dict[str, str] = {}
        added: dict[str, str] = {}
        fetched = 0
        for f in wanted:
            key = f"{prefix}{f.path}\0{f.size}"
            sha = known.get(key)
            if sha is not None and content.has_object(sha, f.size):
                shas[f.path] = sha
                continue
            fd, tmp = tempfile.mkstemp(dir=content.root / "tmp", prefix="mlflow-")
            try:
                hasher = hashlib.sha256()
                with os.fdopen(fd, "wb") as writer:
                    copied = self.files.download(f, base, writer.write, hasher.update)
                if copied > f.size:
                    raise SnapshotChangingError(f"{model}: still changing ({f.path}: more than the {f.size} bytes the "
                                                "listing said; stopped reading there)")
                if copied != f.size:
                    raise SnapshotChangingError(f"{model}: still changing ({f.path} is {copied} bytes, the "
                                                f"listing said {f.size})")
                sha = hasher.hexdigest()
                content.add_object(Path(tmp), sha, f.size)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
            fetched += 1
            self.downloads += 1
            self.bytes_downloaded += f.size
            shas[f.path] = added[key] = sha
        if added:
            cache.save(added)
        return shas, fetched

    # -- the versions captured, and the write-back -----------------------------------------------------
    def _remember(self, content: ContentStore, model: str, version: str, digest: str) -> None:
        ShaCache(content.root / VERSIONS_FILE).save({f"{model}\0{version}": digest})

    def captured_versions(self) -> dict[tuple[str, str], str]:
        """(model, version) -> the digest captured from it (kept beside the content store)."""
        if self._root is None:
            return {}
        found: dict[tuple[str, str], str] = {}
        for key, digest in ShaCache(self._root / VERSIONS_FILE).load().items():
            model, _, version = key.partition("\0")
            found[(model, version)] = digest
        return found

    def attach(self, store_root: Path) -> None:
        """The content store's folder the daemon captures into (the write-back reads what was captured)."""
        self._root = store_root

    def write_back(self) -> int:
        """Bring each captured version's `tritonctl.*` tags up to date (controlplane/source/mlflowwriteback.py);
        how many versions were tagged. A failure is logged and retried at the next poll."""
        if self.writeback is None:
            return 0
        with self._lock:
            aliases = dict(self._aliases)
        return self.writeback.run(self.captured_versions(), aliases)


def _signature(version: str) -> str:
    return f"mlflow-version:{version}"


def open_source(settings: Settings, registry: RegistryView | None, store_root: Path,
                view: ServingView | None = None) -> MLflowSource:
    """The daemon's MLflow source (load_settings checked the `mlflow` extra). Refused credentials or an
    unreachable server are one logged line, as for s3://: what serves keeps serving, the poller keeps
    trying (the credentials may be fixed) and `status`'s watch reason says why. `view`: what the
    write-back reads (a fleet's; None: this host's registry)."""
    assert settings.repository_url is not None
    source = MLflowSource(settings.repository_url, alias=settings.mlflow_alias,
                          poll_interval_s=settings.poll_interval_s, registry=registry, view=view)
    source.attach(store_root)
    try:
        source.check()
    except ConfigError as exc:
        log.error("%s; serving is unchanged", exc)
        source._failing = str(exc)
    return source
