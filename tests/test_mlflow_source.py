"""The MLflow source's rules that a real tracking server cannot be made to show (tests/test_mlflow_e2e.py
runs the rest against a real `mlflow server`): hostile artifact listings, an alias moved during the
download, a listing that changes under the capture; and its settings (the URL, `mlflow_alias`, the
extra). The stand-in below answers what MLflow's REST API answers (listing names relative to the folder
listed, `mlflow-artifacts:` URIs); a real server refuses to store `..` or absolute paths, so only a
stand-in (or a compromised or buggy server) can list them.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from controlplane.config import load_settings
from controlplane.errors import ConfigError, SnapshotChangingError, SnapshotUnsupportedError
from controlplane.snapshot.content import ContentStore
from controlplane.source import mlflowrest
from controlplane.source.mlflowsource import MLflowSource, unsafe_path

CONFIG = b'name: "m"\nbackend: "python"\n'


class StandIn:
    """MLflow's REST answers for one model `m` whose alias names `version`, with artifact `files`."""

    base = "http://stand-in"

    def __init__(self, files: dict[str, bytes], version: str = "1") -> None:
        self.files = dict(files)
        self.version = version
        self.downloads = 0
        self.on_download: Any = None
        self.listing_override: dict[str, list[dict[str, Any]]] = {}

    def registered_models(self) -> Any:
        return iter([{"name": "m", "aliases": [{"alias": "champion", "version": self.version}]}])

    def version_by_alias(self, name: str, alias: str) -> dict[str, Any] | None:
        if self.version is None:
            return None
        return {"name": name, "version": self.version, "run_id": "r1", "source": "runs:/r1/model"}

    def artifact_uri(self, version: dict[str, Any]) -> str:
        return "mlflow-artifacts:/0/r1/artifacts/model"

    def list_artifacts(self, path: str) -> list[dict[str, Any]]:
        rel = path.removeprefix("0/r1/artifacts/model").strip("/")
        if rel in self.listing_override:
            return self.listing_override[rel]
        prefix = rel + "/" if rel else ""
        seen: dict[str, dict[str, Any]] = {}
        for name, data in self.files.items():
            if not name.startswith(prefix):
                continue
            head, sep, _ = name[len(prefix):].partition("/")
            seen[head] = {"path": head, "is_dir": True} if sep else {"path": head, "is_dir": False,
                                                                    "file_size": len(data)}
        return list(seen.values())

    def open_artifact(self, path: str) -> Any:
        self.downloads += 1
        if self.on_download is not None:
            self.on_download()
        return io.BytesIO(self.files[path.removeprefix("0/r1/artifacts/model/")])


def source(rest: StandIn) -> MLflowSource:
    return MLflowSource("mlflow+http://stand-in:5000", rest=rest)  # type: ignore[arg-type]


@pytest.fixture()
def store(tmp_path: Path) -> ContentStore:
    return ContentStore(tmp_path / "store", fsync=False)


@pytest.mark.parametrize("bad", ["../escape", "/etc/passwd", "a\\b", "a/../b", "", "c:/x", "a//b"])
def test_unsafe_paths(bad: str) -> None:
    assert unsafe_path(bad)


def test_safe_paths() -> None:
    assert not any(unsafe_path(p) for p in ("config.pbtxt", "1/model.py", "mymodel/1/model.savedmodel/x.pb"))


@pytest.mark.parametrize("name", ["..", "/abs", "a\\b", "x/../../y"])
def test_a_hostile_artifact_listing_is_refused_before_any_download(store: ContentStore, name: str) -> None:
    rest = StandIn({"config.pbtxt": CONFIG})
    rest.listing_override[""] = [{"path": "config.pbtxt", "is_dir": False, "file_size": len(CONFIG)},
                                 {"path": name, "is_dir": False, "file_size": 3}]
    with pytest.raises(SnapshotUnsupportedError, match="not a safe path"):
        source(rest).capture("m", store)
    assert rest.downloads == 0


def test_a_hostile_flavor_directory_is_refused(store: ContentStore) -> None:
    rest = StandIn({"MLmodel": b"flavors:\n  triton:\n    data: ../../etc\n", "x/config.pbtxt": CONFIG})
    with pytest.raises(SnapshotUnsupportedError, match="flavors.triton.data '../../etc' is not a safe path"):
        source(rest).capture("m", store)


def test_not_a_triton_model_is_refused_with_its_reason(store: ContentStore) -> None:
    rest = StandIn({"model.pkl": b"\x80\x04", "MLmodel": b"flavors:\n  sklearn: {}\n"})
    with pytest.raises(SnapshotUnsupportedError, match="no flavors.triton.data: not a Triton model"):
        source(rest).capture("m", store)
    with pytest.raises(SnapshotUnsupportedError, match="not a Triton model"):
        source(StandIn({"model.pkl": b"x"})).capture("m", store)


def test_both_layouts_give_the_same_snapshot(store: ContentStore) -> None:
    plain = source(StandIn({"config.pbtxt": CONFIG, "1/model.py": b"pass\n"})).capture("m", store)
    flavored = source(StandIn({"MLmodel": b"flavors:\n  triton:\n    data: m\n", "m/config.pbtxt": CONFIG,
                               "m/1/model.py": b"pass\n", "registered_model_meta": b"x"})).capture("m", store)
    assert plain.digest == flavored.digest
    assert [e.path for e in plain.entries] == ["1", "1/model.py", "config.pbtxt"]


def test_an_alias_moved_during_the_download_is_not_recorded(store: ContentStore) -> None:
    rest = StandIn({"config.pbtxt": CONFIG, "1/model.py": b"pass\n"})
    rest.on_download = lambda: setattr(rest, "version", "2")
    with pytest.raises(SnapshotChangingError, match="alias champion moved to version 2 during the download"):
        source(rest).capture("m", store)


def test_artifacts_changed_during_the_download_are_not_recorded(store: ContentStore) -> None:
    rest = StandIn({"config.pbtxt": CONFIG, "1/model.py": b"pass\n"})
    rest.on_download = lambda: rest.files.__setitem__("1/extra.py", b"x")
    with pytest.raises(SnapshotChangingError, match="artifacts changed during the download"):
        source(rest).capture("m", store)


def test_a_version_captured_before_is_not_downloaded_again(store: ContentStore) -> None:
    rest = StandIn({"config.pbtxt": CONFIG, "1/model.py": b"pass\n"})
    first = source(rest).capture("m", store)
    assert rest.downloads == 2
    assert source(rest).capture("m", store).digest == first.digest  # a new source: the cache is on disk
    assert rest.downloads == 2


def test_the_poller_hands_on_an_alias_move_and_a_deleted_alias() -> None:
    rest = StandIn({"config.pbtxt": CONFIG})
    src = source(rest)
    handed: list[tuple[str, bool]] = []
    src._on_change = lambda model, complete: handed.append((model, complete))
    assert src.names() == ["m"] and src.signatures() == {"m": "mlflow-version:1"}
    assert src.poll() == []  # unchanged since the start-up scan
    rest.version = "2"
    assert src.poll() == ["m"] and src.signature("m") == "mlflow-version:2"
    assert src.poll() == []
    rest.version = None  # type: ignore[assignment]
    rest.registered_models = lambda: iter([{"name": "m", "aliases": []}])  # type: ignore[method-assign]
    assert src.poll() == ["m"] and not src.has("m")
    assert handed == [("m", True), ("m", True)]


def test_repository_setting_takes_an_mlflow_url() -> None:
    s = load_settings({"repository": "mlflow+http://127.0.0.1:5000/"}, env={})
    assert (s.repository, s.repository_url, s.mlflow_alias) == (None, "mlflow+http://127.0.0.1:5000", "champion")
    assert load_settings({}, env={"TRITONCTL_REPOSITORY": "mlflow+https://mlflow.example",
                                  "TRITONCTL_MLFLOW_ALIAS": "challenger"}).mlflow_alias == "challenger"
    with pytest.raises(ConfigError, match=r"repository: invalid value 'mlflow\+ftp://x'"):
        load_settings({"repository": "mlflow+ftp://x"}, env={})
    with pytest.raises(ConfigError, match="expected mlflow"):
        load_settings({"repository": "mlflow+http://user:secret@host:5000"}, env={})
    with pytest.raises(ConfigError, match="mlflow_alias: invalid value 'no spaces'"):
        load_settings({"mlflow_alias": "no spaces"}, env={})


def test_without_the_extra_one_line_names_it() -> None:
    with pytest.raises(ConfigError, match=r"pip install 'tritonctl\[mlflow\]'") as caught:
        mlflowrest.require_extra(lambda _name: None)
    assert "\n" not in str(caught.value)
    mlflowrest.require_extra()  # the test environment has it


def test_credentials_come_from_mlflows_own_variables() -> None:
    token = mlflowrest.MLflowRest("http://h:1", env={"MLFLOW_TRACKING_TOKEN": "t0k"})
    assert token._headers["Authorization"] == "Bearer t0k"
    basic = mlflowrest.MLflowRest("http://h:1", env={"MLFLOW_TRACKING_USERNAME": "u",
                                                     "MLFLOW_TRACKING_PASSWORD": "p"})
    assert basic._headers["Authorization"] == "Basic dTpw"
