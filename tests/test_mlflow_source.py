"""The MLflow source's rules that a real tracking server cannot be made to show (tests/test_mlflow_e2e.py
runs the rest against a real `mlflow server`): hostile artifact listings, an alias moved during the
download, a listing that changes under the capture; its settings (the URL, `mlflow_alias`, the
extra); and the write-back's rules in a fleet over a stand-in view (only the leader writes, from the tags
MLflow holds; a refused write is retried). The stand-in below answers what MLflow's REST API answers
(listing names relative to the folder listed, `mlflow-artifacts:` URIs); a real server refuses to store
`..` or absolute paths, so only a stand-in (or a compromised or buggy server) can list them.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from controlplane.errors import ConfigError, MLflowError, SnapshotChangingError, SnapshotUnsupportedError
from controlplane.remote import mlflowrest
from controlplane.settings.config import load_settings
from controlplane.snapshot.content import ContentStore
from controlplane.source.mlflowfiles import unsafe_path
from controlplane.source.mlflowsource import MLflowSource
from controlplane.source.mlflowwriteback import DIGEST_TAG, HOSTS_TAG, STATE_TAG, Standing, WriteBack

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

    def open_artifact(self, path: str, deadline: float = 0.0) -> Any:
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


class TagStandIn:
    """MLflow's model-version tags (set, delete, search by tag); `fail` refusals of the next set-tag calls
    (a write that fails), `search_refused`: a server that cannot search versions by tag."""

    def __init__(self, tags: dict[tuple[str, str], dict[str, str]] | None = None) -> None:
        self.tags = tags or {}
        self.fail = 0
        self.calls = 0
        self.search_refused = False

    def tagged_versions(self, key: str) -> Any:
        if self.search_refused:
            error = MLflowError("listing versions tagged: MLflow refused: HTTP 400 bad filter")
            error.answered = True
            raise error
        return iter([{"name": n, "version": v, "tags": [{"key": k, "value": x} for k, x in t.items()]}
                     for (n, v), t in self.tags.items() if key in t])

    def set_version_tag(self, name: str, version: str, key: str, value: str) -> None:
        self.calls += 1
        if self.fail:
            self.fail -= 1
            raise MLflowError(f"tagging {name} version {version}: MLflow refused: HTTP 503")
        self.tags.setdefault((name, version), {})[key] = value

    def delete_version_tag(self, name: str, version: str, key: str) -> None:
        self.calls += 1
        self.tags.get((name, version), {}).pop(key, None)


class FleetStandIn:
    """A fleet's view (controlplane/fleet/mlflowview.py reads it from the shared registry): who leads,
    which hosts serve which digest. Not a database: the rules of the write-back over any such view."""

    fleet = True

    def __init__(self) -> None:
        self.leading = False
        self.serving: dict[tuple[str, str], tuple[str, ...]] = {}
        self.tags = None

    def writes(self) -> bool:
        return self.leading

    def look(self) -> object:
        return repr(sorted(self.serving.items()))

    def standings(self, pairs: set[tuple[str, str]]) -> dict[tuple[str, str], Standing]:
        return {p: Standing("serving" if self.serving.get(p) else None, self.serving.get(p, ()), False)
                for p in pairs}


def test_in_a_fleet_only_the_leader_writes_and_it_starts_from_the_tags_mlflow_holds() -> None:
    # v1 was tagged by a former leader; this daemon captured v2 itself
    rest = TagStandIn({("m", "1"): {STATE_TAG: "serving", DIGEST_TAG: "d1", HOSTS_TAG: "h1,h2"}})
    view = FleetStandIn()
    wb = WriteBack(rest, view)  # type: ignore[arg-type]
    view.serving = {("m", "d1"): ("h2",), ("m", "d2"): ("h1",)}  # mid-rollout: h1 took v2, h2 still on v1
    assert wb.run({("m", "2"): "d2"}, {}) == 0 and rest.calls == 0  # a follower writes nothing
    view.leading = True
    assert wb.run({("m", "2"): "d2"}, {}) == 2
    assert rest.tags[("m", "1")] == {STATE_TAG: "serving", DIGEST_TAG: "d1", HOSTS_TAG: "h2"}
    assert rest.tags[("m", "2")] == {STATE_TAG: "serving", DIGEST_TAG: "d2", HOSTS_TAG: "h1"}
    calls = rest.calls
    assert wb.run({("m", "2"): "d2"}, {}) == 0 and rest.calls == calls  # nothing changed: nothing written
    view.serving = {("m", "d2"): ("h2", "h1")}  # h2 took v2 too; a write fails once, then is retried
    rest.fail = 1
    assert wb.run({("m", "2"): "d2"}, {}) == 1  # v1's write refused, v2's written
    assert rest.tags[("m", "2")] == {STATE_TAG: "serving", DIGEST_TAG: "d2", HOSTS_TAG: "h1,h2"}
    assert wb.run({("m", "2"): "d2"}, {}) == 1  # v1's, retried at the next round
    assert rest.tags[("m", "1")] == {DIGEST_TAG: "d1"}  # served by no host: no state, no hosts


def test_a_server_that_cannot_search_by_tag_still_gets_the_write_back() -> None:
    rest, view = TagStandIn(), FleetStandIn()
    rest.search_refused, view.leading = True, True
    view.serving = {("m", "d1"): ("h1",)}
    wb = WriteBack(rest, view)  # type: ignore[arg-type]
    assert wb.run({("m", "1"): "d1"}, {}) == 1
    assert rest.tags[("m", "1")] == {STATE_TAG: "serving", DIGEST_TAG: "d1", HOSTS_TAG: "h1"}
