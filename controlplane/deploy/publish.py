"""The serving repository: the only directory tritonserver's `--model-repository` points at.

Triton does not compare content to decide whether a model changed: it takes the newest
max(mtime, ctime) over the model's tree and reloads only if that is strictly newer than at the last
load (shared/TRITON_NOTES.md). Re-pointing a model at a tree that already existed (a rollback to an
old snapshot) therefore loads nothing and the wrong content keeps serving. So every publish, rollbacks
included, builds a fresh tree under `published/<model>/` (new directories; files hard-linked from the
store, which bumps their ctime; config.pbtxt written anew), pre-compiles its Python with hash-based
pycs so the python stub never writes `__pycache__` during a load (a spurious reload), and only then
swaps `serving/<model>`, a symlink, atomically. Old trees go only through `prune`/`unpublish`, never
while a link points at them, so the serving root never holds a dangling link (which would break
Triton's repository index for every model).
"""

from __future__ import annotations

import errno
import os
import py_compile
import secrets
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from controlplane.errors import SnapshotCollectedError, SnapshotError
from controlplane.snapshot.content import ContentStore
from controlplane.snapshot.debris import is_ignored_name
from controlplane.snapshot.fsutil import ensure_dir, force_rmtree, link_or_copy
from controlplane.snapshot.layout import CONFIG_FILE
from controlplane.snapshot.manifest import Snapshot


def check_model_name(model: str) -> None:
    """A model name must be one plain directory name Triton would list."""
    if not model or "/" in model or "\0" in model or model in (".", "..") or is_ignored_name(model):
        raise SnapshotError(f"{model!r}: not a usable model name")


def precompile(tree: Path) -> int:
    """Write hash-checked pycs next to every .py in `tree` (as the importer would name them).

    A CHECKED_HASH pyc stays valid whatever the timestamps of the hard-linked source, so Python never
    writes one at load time. Files that do not compile are left for validation to report; returns
    how many compiled.
    """
    tag = sys.implementation.cache_tag
    compiled = 0
    for dirpath, dirnames, filenames in os.walk(tree):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if not name.endswith(".py"):
                continue
            source = os.path.join(dirpath, name)
            cfile = os.path.join(dirpath, "__pycache__", f"{name[:-3]}.{tag}.pyc")
            try:
                os.makedirs(os.path.dirname(cfile), mode=0o755, exist_ok=True)  # py_compile's would take the umask's
                py_compile.compile(
                    source,
                    cfile=cfile,
                    doraise=True,
                    invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH,
                )
                compiled += 1
            except (py_compile.PyCompileError, SyntaxError, ValueError, UnicodeDecodeError):
                continue
    return compiled


class ServingRepository:
    """`serving/<model>` symlinks, each to a tree under `published/<model>/` that was made for it."""

    def __init__(self, serving_root: Path, published_root: Path) -> None:
        self.serving_root = Path(serving_root)
        self.published_root = Path(published_root)
        for root in (self.serving_root, self.published_root):  # Triton's group reads them; nobody writes
            root.parent.mkdir(mode=0o750, parents=True, exist_ok=True)
            ensure_dir(root, 0o750)
        # resolved once: a publish's trees are made under them (a realpath per publish was a tenth of it)
        self._serving_real = self.serving_root.resolve()
        self._published_real = self.published_root.resolve()
        self._lock = threading.RLock()

    def link_path(self, model: str) -> Path:
        return self.serving_root / model

    def publish(
        self,
        snapshot: Snapshot,
        content: ContentStore,
        config_transform: Callable[[str], str] | None = None,
        name: str | None = None,
        sync: bool = True,
    ) -> Path:
        """Build a fresh tree for `snapshot` and make `serving/<model>` point at it; returns the tree.

        `config_transform` rewrites the root config.pbtxt (e.g. stamps the digest into `parameters`); a
        snapshot without one (a python model whose auto_complete_config completes it) gets the transform of
        an empty text: Triton completes a config that holds only the stamp as it completes none at all
        (measured on 2.51), and serves the stamp back for verification. On any failure the link is left unchanged.
        `name` publishes it under another model name (a change set's private step name,
        controlplane/intake/changeset.py; the transform then renames the config to match). `sync` False: the link
        swap is made durable by the caller's one `sync()` after many publishes (a first start's, before
        the launching tritonserver reads them: an fsync of the serving root each was a third of them).
        """
        model = name or snapshot.model
        check_model_name(model)
        base = self._published_real / model
        base.mkdir(mode=0o750, exist_ok=True)
        tree = base / f"{snapshot.digest[:12]}-{time.time_ns():x}-{secrets.token_hex(4)}"
        tree.mkdir(mode=0o750)  # exclusive: a tree is never reused
        try:
            with content.reading():
                self._fill(tree, snapshot, content, config_transform)
            if any(entry.path.endswith(".py") for entry in snapshot.entries):
                precompile(tree)
            with self._lock:
                self._swap(model, tree, sync)
        except BaseException:
            if self.current(model) != tree:
                force_rmtree(tree)
            raise
        return tree  # made under the resolved published root: resolved

    def _fill(
        self,
        tree: Path,
        snapshot: Snapshot,
        content: ContentStore,
        config_transform: Callable[[str], str] | None,
    ) -> None:
        model = snapshot.model
        for entry in snapshot.entries:
            dest = tree / entry.path
            if entry.kind == "dir":
                dest.mkdir(mode=0o755)
                continue
            obj = content.object_path(entry.sha256)
            if not obj.exists():
                raise SnapshotCollectedError(f"{model}: {entry.path} ({entry.sha256[:12]}) is missing from the store")
            if entry.path == CONFIG_FILE:
                text = obj.read_bytes().decode("utf-8", errors="surrogateescape")
                if config_transform is not None:
                    text = config_transform(text)
                fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o444)
                with os.fdopen(fd, "wb") as handle:
                    handle.write(text.encode("utf-8", errors="surrogateescape"))
            else:
                try:
                    link_or_copy(obj, dest)
                except OSError as exc:
                    raise SnapshotError(f"{model}: cannot publish {entry.path} ({exc.strerror})") from exc
        if config_transform is not None and not any(entry.path == CONFIG_FILE for entry in snapshot.entries):
            dest = tree / CONFIG_FILE
            dest.write_bytes(config_transform("").encode("utf-8", errors="surrogateescape"))
            dest.chmod(0o444)

    def _swap(self, model: str, tree: Path, sync: bool = True) -> None:
        link = self.link_path(model)
        if link.exists() and not link.is_symlink():
            raise SnapshotError(f"{model}: {link} is a real directory, not a link tritonctl manages")
        target = os.path.relpath(tree, self._serving_real)
        unique = f"{time.time_ns():x}-{secrets.token_hex(4)}"
        # the temp link is made outside the serving root: Triton never lists it
        tmp = self.published_root / f".link-{model}-{unique}"
        os.symlink(target, tmp)
        try:
            os.replace(tmp, link)
        except OSError as exc:
            os.unlink(tmp)
            if exc.errno != errno.EXDEV:
                raise
            tmp = self.serving_root / f".link-{model}-{unique}"
            os.symlink(target, tmp)
            os.replace(tmp, link)
        if sync:
            self.sync()

    def sync(self) -> None:
        """Make the link swaps made so far durable (`publish(..., sync=False)`)."""
        self._sync_dir(self.serving_root)

    @staticmethod
    def _sync_dir(path: Path) -> None:
        """Make a link swap durable; best effort, never fails the publish it follows."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            return
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)

    def current(self, model: str) -> Path | None:
        """The tree `serving/<model>` points at, or None when the model is not published."""
        link = self.link_path(model)
        if not link.is_symlink():
            return None
        target = link.resolve()
        return target if target.is_dir() else None

    def unpublish(self, model: str) -> None:
        """Remove the link first (Triton then sees no model), then every tree of the model."""
        check_model_name(model)
        with self._lock:
            link = self.link_path(model)
            if link.is_symlink():
                link.unlink()
                self._sync_dir(self.serving_root)
            base = self.published_root / model
            if base.exists():
                force_rmtree(base)

    def prune(self, model: str) -> int:
        """Remove the model's published trees except the one serving; returns how many went."""
        check_model_name(model)
        removed = 0
        with self._lock:
            keep = self.current(model)
            base = self.published_root / model
            if not base.is_dir():
                return 0
            for tree in base.iterdir():
                if keep is not None and tree.resolve() == keep:
                    continue
                force_rmtree(tree)
                removed += 1
        return removed

    def sweep_temp_links(self) -> int:
        """Remove the temporary links a swap (`_swap`) left when the daemon died between making one and
        renaming it into place; returns how many went. Called once by the daemon's start, under its
        state directory lock: a deploy's own temporary link lives only inside its swap, and listing
        the published root (one entry per model) on every deploy cost O(N) per deploy (issue 26)."""
        removed = 0
        with self._lock:
            for root in (self.published_root, self.serving_root):
                if not root.is_dir():
                    continue
                for stale in root.glob(".link-*"):
                    if stale.is_symlink():
                        stale.unlink(missing_ok=True)
                        removed += 1
        return removed

    def models(self) -> list[str]:
        """Models with a link in the serving root."""
        return sorted(p.name for p in self.serving_root.iterdir() if p.is_symlink() and not p.name.startswith("."))
