"""An MLflow model version's artifacts: listed as safe paths with real sizes, the Triton model directory
found among them, and each file read within its bounds (controlplane/source/mlflowsource.py captures them).

Why its own module: what a tracking server lists and sends is checked here, and only here. A listed path
must be a plain relative path (no `..`, absolute path, backslash or NUL), a listed size a number of bytes
(issue 58: a negative or garbage size was taken); a small file (config.pbtxt, MLmodel) is read to its limit,
an artifact to its listed size plus one byte at most, each within its deadline
(controlplane/remote/mlflowrest.py `download_budget_s`), whatever the server sends.
"""

from __future__ import annotations

import http.client
import time
from dataclasses import dataclass
from typing import Any

from controlplane.errors import SnapshotTooLargeError, SnapshotUnsupportedError
from controlplane.remote import httpbounds
from controlplane.remote.mlflowrest import ANSWER_S, MLflowRest, download_budget_s, ended_early
from controlplane.snapshot.debris import is_ignored_name
from controlplane.snapshot.layout import CONFIG_FILE, MAX_CONFIG_BYTES

MLMODEL = "MLmodel"
ARTIFACTS_SCHEME = "mlflow-artifacts:"


def unsafe_path(rel: str) -> bool:
    """An artifact path that is not a plain relative path below the model (`..`, absolute, `\\`, NUL)."""
    parts = rel.split("/")
    return (not rel or rel.startswith("/") or "\\" in rel or "\0" in rel or ":" in parts[0]
            or any(p in ("", ".", "..") for p in parts))


@dataclass(frozen=True)
class ArtifactFile:
    path: str  # below the version's artifact root
    size: int


def listed_size(model: str, path: str, value: Any) -> int:
    """An artifact's size as a listing gives it: absent (protobuf's JSON leaves out a 0), a whole number
    of bytes or the decimal string of one (int64 in protobuf's JSON); anything else is refused."""
    if value is None:
        return 0
    if isinstance(value, str) and value.isascii() and value.isdigit():
        return int(value)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise SnapshotUnsupportedError(f"{model}: artifact {path!r} is listed with size {value!r}, not a number of "
                                   "bytes; refusing to capture it")


class ArtifactFiles:
    """The artifacts of model versions on one tracking server (`rest`)."""

    def __init__(self, rest: MLflowRest) -> None:
        self.rest = rest

    def base(self, version: dict[str, Any]) -> str:
        """Where a version's artifacts are served (`mlflow-artifacts:/...` without the scheme)."""
        uri = self.rest.artifact_uri(version)
        if not uri.startswith(ARTIFACTS_SCHEME):
            raise SnapshotUnsupportedError(
                f"{version.get('name')} version {version.get('version')}: artifacts at {uri} are not served by "
                f"the tracking server (start it with --serve-artifacts); refusing to capture it")
        return uri[len(ARTIFACTS_SCHEME):].lstrip("/")

    def listing(self, model: str, base: str, rel: str = "") -> list[ArtifactFile]:
        """Every file below `base`/`rel`, each a safe path with a size (SnapshotUnsupportedError otherwise)."""
        files: list[ArtifactFile] = []
        for row in self.rest.list_artifacts(base + ("/" + rel if rel else "")):
            name = str(row.get("path", ""))
            path = f"{rel}/{name}" if rel else name
            if unsafe_path(name) or unsafe_path(path):
                raise SnapshotUnsupportedError(f"{model}: artifact path {path!r} is not a safe path; refusing to "
                                               "capture it")
            if row.get("is_dir"):
                files.extend(self.listing(model, base, path))
            elif not is_ignored_name(name):
                files.append(ArtifactFile(path, listed_size(model, path, row.get("file_size"))))
        return sorted(files, key=lambda f: f.path)

    def layout(self, model: str, version: dict[str, Any], base: str | None = None) -> tuple[str, list[ArtifactFile]]:
        """(the Triton model directory's prefix in the artifacts, "" or "DIR/"; every artifact file)."""
        base = self.base(version) if base is None else base
        files = self.listing(model, base)
        paths = {f.path: f for f in files}
        if CONFIG_FILE in paths:
            root = ""
        elif MLMODEL in paths:
            root = self._flavor_dir(model, base, paths[MLMODEL])
        else:
            raise SnapshotUnsupportedError(
                f"{model} version {version.get('version')}: not a Triton model (no {CONFIG_FILE} and no {MLMODEL} "
                "with a triton flavor in its artifacts)")
        config = paths.get(root + CONFIG_FILE)
        if config is None:
            raise SnapshotUnsupportedError(f"{model} version {version.get('version')}: no {root}{CONFIG_FILE}")
        if config.size > MAX_CONFIG_BYTES:
            raise SnapshotTooLargeError(f"{model}: {CONFIG_FILE} is {config.size} bytes, over the "
                                        f"{MAX_CONFIG_BYTES}-byte limit; refusing to capture it")
        return root, files

    def _flavor_dir(self, model: str, base: str, mlmodel: ArtifactFile) -> str:
        try:
            text = self.read(mlmodel.path, base, MAX_CONFIG_BYTES).decode(errors="replace")
        except httpbounds.TooLarge:
            raise SnapshotTooLargeError(f"{model}: {MLMODEL} is over the {MAX_CONFIG_BYTES}-byte limit; refusing "
                                        "to capture it") from None
        data = _triton_flavor_data(text)
        if data is None:
            raise SnapshotUnsupportedError(f"{model}: {MLMODEL} has no flavors.triton.data: not a Triton model")
        if unsafe_path(data):
            raise SnapshotUnsupportedError(f"{model}: {MLMODEL} flavors.triton.data {data!r} is not a safe path")
        return data.rstrip("/") + "/"

    def _open(self, rel: str, base: str, deadline: float) -> Any:
        return self.rest.open_artifact(f"{base}/{rel}", deadline=deadline)

    def read(self, rel: str, base: str, limit: int) -> bytes:
        """A small artifact (config.pbtxt, MLmodel): at most `limit` bytes (TooLarge past it), within ANSWER_S."""
        deadline = time.monotonic() + ANSWER_S
        with self._open(rel, base, deadline) as answer:
            try:
                data = httpbounds.read_at_most(answer, limit)
            except (OSError, http.client.HTTPException) as exc:
                raise self.rest.cut_off(f"downloading artifact {rel}", exc, deadline) from None
            if ended_early(answer, deadline):
                raise self.rest.cut_off(f"downloading artifact {rel}", EOFError("the answer ended early"), deadline)
        return data

    def download(self, f: ArtifactFile, base: str, *sinks: Any) -> int:
        """Stream one artifact into `sinks`: at most its listed size plus one byte (a server that sends
        more is not read further), within `download_budget_s` of its size; the bytes read."""
        what, deadline = f"downloading artifact {f.path}", time.monotonic() + download_budget_s(f.size)
        copied = 0
        with self._open(f.path, base, deadline) as answer:
            while copied <= f.size:
                try:
                    chunk = answer.read1(min(httpbounds.CHUNK, f.size + 1 - copied))
                except (OSError, http.client.HTTPException) as exc:
                    raise self.rest.cut_off(what, exc, deadline) from None
                if not chunk:
                    break
                for sink in sinks:
                    sink(chunk)
                copied += len(chunk)
            if copied <= f.size and ended_early(answer, deadline):
                raise self.rest.cut_off(what, EOFError("the answer ended early"), deadline)
        return copied


def _triton_flavor_data(text: str) -> str | None:
    """`flavors.triton.data` of an MLmodel file (YAML), or None."""
    try:
        import yaml  # mlflow-skinny's dependency (the `mlflow` extra)

        doc = yaml.safe_load(text)
    except Exception:  # noqa: BLE001 - unreadable: not a Triton model
        return None
    flavors = doc.get("flavors") if isinstance(doc, dict) else None
    flavor = flavors.get("triton") if isinstance(flavors, dict) else None
    data = flavor.get("data") if isinstance(flavor, dict) else None
    return data if isinstance(data, str) and data else None
