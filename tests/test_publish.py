"""The serving repository: a fresh tree per publish, atomic link swap, never a dangling link.

Triton reloads only when the newest max(mtime, ctime) in a model's tree is strictly newer than at its
last load, so the tests check that property directly on every published tree.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from controlplane.deploy.publish import ServingRepository, precompile
from controlplane.deploy.steps import stamp_digest
from controlplane.errors import SnapshotError
from controlplane.snapshot import ContentStore, Snapshot
from controlplane.triton.client import DIGEST_PARAMETER
from controlplane.validation.modelconfig import stamp_parameter
from tests.test_snapshot import config_text, make_model, markers


def newest_change_ns(tree: Path) -> int:
    """What Triton compares: the newest max(mtime, ctime) of every file and dir, links followed."""
    newest = 0
    for dirpath, dirnames, filenames in os.walk(tree, followlinks=True):
        for name in [".", *dirnames, *filenames]:
            st = os.stat(os.path.join(dirpath, name))
            newest = max(newest, st.st_mtime_ns, st.st_ctime_ns)
    return newest


def stamp(digest: str) -> Callable[[str], str]:
    def transform(text: str) -> str:
        return text + f'parameters {{ key: "tritonctl_digest" value {{ string_value: "{digest}" }} }}\n'

    return transform


@pytest.fixture
def state(tmp_path: Path) -> tuple[ContentStore, ServingRepository, Path]:
    store = ContentStore(tmp_path / "state" / "store")
    serving = ServingRepository(tmp_path / "state" / "serving", tmp_path / "state" / "published")
    src = tmp_path / "src"
    src.mkdir()
    return store, serving, src


def capture(store: ContentStore, src: Path, name: str, gen: int) -> Snapshot:
    return store.capture(make_model(src, name, gen), name)


def test_publish_links_objects_and_rewrites_config(
    state: tuple[ContentStore, ServingRepository, Path],
) -> None:
    store, serving, src = state
    snap = capture(store, src, "m", 1)
    tree = serving.publish(snap, store, stamp(snap.digest))
    link = serving.serving_root / "m"
    assert link.is_symlink() and serving.current("m") == tree.resolve()
    assert tree.parent == serving.published_root / "m" and tree.name.startswith(snap.digest[:12] + "-")
    assert markers(link) == ("1", "1") and (link / "1").is_dir()
    entry = snap.file("1/model.py")
    assert entry is not None
    assert (tree / "1" / "model.py").stat().st_ino == store.object_path(entry.sha256).stat().st_ino
    cfg = (tree / "config.pbtxt").read_text()
    assert cfg.startswith(config_text("m", 1)) and snap.digest in cfg
    cfg_entry = snap.file("config.pbtxt")
    assert cfg_entry is not None
    assert (tree / "config.pbtxt").stat().st_ino != store.object_path(cfg_entry.sha256).stat().st_ino
    assert snap.digest not in store.object_path(cfg_entry.sha256).read_text()  # store untouched
    assert serving.models() == ["m"]


@pytest.mark.parametrize("text", ["", 'name: "m"', config_text("m", 1), "# a comment, no newline at the end",
                                  config_text("m", 1) + 'parameters { key: "tritonctl.digest" value { string_value: '
                                                        '"old" } }\n'])
def test_the_digest_stamp_is_stamp_parameters_without_parsing_an_unstamped_config(text: str) -> None:
    """A publish appends the digest to a config not stamped yet without parsing it (its pure-Python parse
    was most of a publish's CPU): the text is the one `stamp_parameter` makes, a stamp replaced as before."""
    digest = "d" * 64
    assert stamp_digest(digest)(text) == stamp_parameter(text, DIGEST_PARAMETER, digest)


def test_python_is_precompiled_with_hash_checked_pycs(
    state: tuple[ContentStore, ServingRepository, Path],
) -> None:
    store, serving, src = state
    d = make_model(src, "m", 1)
    (d / "1" / "broken.py").write_text("def (:\n")  # left for validation to report
    snap = store.capture(d, "m")
    tree = serving.publish(snap, store)
    tag = sys.implementation.cache_tag
    pyc = tree / "1" / "__pycache__" / f"model.{tag}.pyc"
    assert pyc.is_file() and not (tree / "1" / "__pycache__" / f"broken.{tag}.pyc").exists()
    flags = int.from_bytes(pyc.read_bytes()[4:8], "little")
    assert flags == 0b11  # hash-based, checked
    # importing the served model (what the python stub does) writes nothing into the tree
    before = newest_change_ns(tree)
    listing = sorted(p.relative_to(tree) for p in tree.rglob("*"))
    time.sleep(0.01)
    code = (
        "import importlib.util, sys; s = importlib.util.spec_from_file_location('model', sys.argv[1]); "
        "m = importlib.util.module_from_spec(s); s.loader.exec_module(m); assert m.GEN == 1"
    )
    subprocess.run([sys.executable, "-c", code, str(serving.serving_root / "m" / "1" / "model.py")], check=True)
    assert newest_change_ns(tree) == before
    assert sorted(p.relative_to(tree) for p in tree.rglob("*")) == listing
    spec = importlib.util.spec_from_file_location("model", tree / "1" / "model.py")
    assert spec is not None and spec.cached == str(pyc)


def test_every_publish_is_a_fresh_tree_even_for_the_same_digest(
    state: tuple[ContentStore, ServingRepository, Path],
) -> None:
    store, serving, src = state
    a = capture(store, src, "m", 1)
    first = serving.publish(a, store)
    first_newest = newest_change_ns(first)
    time.sleep(0.01)
    again = serving.publish(a, store)
    assert again != first and again.name.startswith(a.digest[:12])
    assert os.stat(again).st_ino != os.stat(first).st_ino
    assert newest_change_ns(serving.serving_root / "m") > first_newest  # Triton will reload it


def test_rollback_publishes_a_fresh_tree_of_the_old_snapshot(
    state: tuple[ContentStore, ServingRepository, Path],
) -> None:
    store, serving, src = state
    a = capture(store, src, "m", 1)
    b = capture(store, src, "m", 2)
    tree_a = serving.publish(a, store)
    tree_b = serving.publish(b, store)
    served_b = newest_change_ns(serving.serving_root / "m")
    time.sleep(0.01)
    rollback = serving.publish(store.load("m", a.digest), store)
    assert rollback not in (tree_a, tree_b) and markers(serving.serving_root / "m") == ("1", "1")
    assert newest_change_ns(serving.serving_root / "m") > served_b
    assert serving.prune("m") == 2
    assert [p.name for p in (serving.published_root / "m").iterdir()] == [rollback.name]


def test_link_swap_is_atomic(state: tuple[ContentStore, ServingRepository, Path]) -> None:
    store, serving, src = state
    snaps = [capture(store, src, "m", 1), capture(store, src, "m", 2)]
    serving.publish(snaps[0], store)
    seen: set[tuple[str | None, str | None]] = set()
    failures: list[BaseException] = []
    done = threading.Event()

    def reader() -> None:
        link = serving.serving_root / "m"
        while not done.is_set():
            try:  # a missing or dangling link, or a half-built tree, shows up here
                seen.add(markers(serving.serving_root / os.readlink(link)))
            except BaseException as exc:
                failures.append(exc)
                return

    t = threading.Thread(target=reader)
    t.start()
    for i in range(40):
        serving.publish(snaps[i % 2], store)
    done.set()
    t.join()
    assert not failures and seen == {("1", "1"), ("2", "2")}
    assert serving.prune("m") == 40
    assert not [p for p in serving.serving_root.iterdir() if p.name != "m"]  # no temp links left


def test_a_start_sweeps_the_temporary_links_a_stop_left_mid_swap(
    state: tuple[ContentStore, ServingRepository, Path],
) -> None:
    """A daemon that died between making a swap's temporary link and renaming it into place leaves
    `.link-<model>-*` behind (in the published root; in the serving root where a rename across file
    systems failed first): the next start removes them, and a deploy never lists the roots for them."""
    store, serving, src = state
    tree = serving.publish(capture(store, src, "m", 1), store)
    target = os.path.relpath(tree, serving.serving_root)
    os.symlink(target, serving.published_root / ".link-m-dead1")
    os.symlink(target, serving.serving_root / ".link-m-dead2")
    serving.publish(capture(store, src, "m", 2), store)
    assert serving.prune("m") == 1
    assert (serving.published_root / ".link-m-dead1").is_symlink()  # a deploy leaves them to the start
    assert serving.sweep_temp_links() == 2
    assert sorted(p.name for p in serving.published_root.iterdir()) == ["m"]
    assert sorted(p.name for p in serving.serving_root.iterdir()) == ["m"]
    assert markers(serving.serving_root / "m") == ("2", "2")
    assert serving.sweep_temp_links() == 0


def test_no_dangling_links_and_unpublish(state: tuple[ContentStore, ServingRepository, Path]) -> None:
    store, serving, src = state
    for name in ("m1", "m2"):
        serving.publish(capture(store, src, name, 1), store)
        serving.publish(capture(store, src, name, 2), store)
        serving.prune(name)
    assert serving.models() == ["m1", "m2"]
    assert all(p.exists() for p in serving.serving_root.iterdir())  # exists() follows the link
    serving.unpublish("m1")
    assert serving.models() == ["m2"] and serving.current("m1") is None
    assert not (serving.published_root / "m1").exists()
    serving.unpublish("m1")  # idempotent


def test_failed_publish_leaves_serving_untouched(state: tuple[ContentStore, ServingRepository, Path]) -> None:
    store, serving, src = state
    good = capture(store, src, "m", 1)
    tree = serving.publish(good, store)
    bad = capture(store, src, "m", 2)
    entry = bad.file("1/model.py")
    assert entry is not None
    store.gc({good.digest})  # the new model.py object is gone
    with pytest.raises(SnapshotError, match="1/model.py .* missing from the store"):
        serving.publish(bad, store)

    def explode(text: str) -> str:
        raise ValueError("transform failed")

    with pytest.raises(ValueError):
        serving.publish(good, store, explode)
    assert serving.current("m") == tree.resolve() and markers(serving.serving_root / "m") == ("1", "1")
    assert [p.name for p in (serving.published_root / "m").iterdir()] == [tree.name]


def test_refuses_bad_names_and_unmanaged_dirs(state: tuple[ContentStore, ServingRepository, Path]) -> None:
    store, serving, src = state
    snap = capture(store, src, "m", 1)
    (serving.serving_root / "m").mkdir()
    with pytest.raises(SnapshotError, match="real directory"):
        serving.publish(snap, store)
    bad = Snapshot("../evil", snap.digest, snap.entries, snap.total_bytes)
    with pytest.raises(SnapshotError, match="not a usable model name"):
        serving.publish(bad, store)


def test_precompile_counts(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("X = 1\n")
    (tmp_path / "b.py").write_text("def (\n")
    assert precompile(tmp_path) == 1


PROBE_CONFIG = """name: "publish_probe"
backend: "python"
max_batch_size: 4
input [ { name: "x" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""
PROBE_MODEL = """import numpy as np
import triton_python_backend_utils as pb_utils

GEN = {gen}


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            n = pb_utils.get_input_tensor_by_name(r, "x").as_numpy().shape[0]
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", np.full((n, 1), GEN, np.float32))]))
        return out
"""


def test_triton_serves_every_publish_including_rollbacks(triton: Any, tmp_path: Path) -> None:
    """Against the real server: a new snapshot, a rollback and a same-digest republish all reload
    (within the same second), and a load with nothing published since reloads nothing."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    name = "publish_probe"
    store = ContentStore(tmp_path / "store")
    serving = ServingRepository(triton.model_repository, tmp_path / "published")
    src = tmp_path / "src" / name
    (src / "1").mkdir(parents=True)
    client = grpcclient.InferenceServerClient(triton.grpc_url)

    def capture_gen(gen: int) -> Snapshot:
        (src / "config.pbtxt").write_text(PROBE_CONFIG)
        (src / "1" / "model.py").write_text(PROBE_MODEL.format(gen=gen))
        return store.capture(src, name)

    def load_and_serve() -> tuple[float, int, str]:
        t0 = time.monotonic()
        client.load_model(name, client_timeout=60)
        took = time.monotonic() - t0
        x = grpcclient.InferInput("x", [1, 3], "FP32")
        x.set_data_from_numpy(np.zeros((1, 3), np.float32))
        y = int(client.infer(name, [x], client_timeout=30).as_numpy("y")[0][0])
        params = client.get_model_config(name, as_json=True)["config"]["parameters"]
        return took, y, params["tritonctl_digest"]["string_value"]

    try:
        one, two = capture_gen(1), capture_gen(2)
        tree = serving.publish(one, store, stamp(one.digest))
        assert load_and_serve()[1:] == (1, one.digest)
        listing = sorted(tree.rglob("*"))
        took, _, _ = load_and_serve()
        assert took < 0.5 and sorted(tree.rglob("*")) == listing  # no reload, stub wrote nothing
        serving.publish(two, store, stamp(two.digest))
        assert load_and_serve()[1:] == (2, two.digest)
        serving.publish(store.load(name, one.digest), store, stamp(one.digest))  # rollback
        assert load_and_serve()[1:] == (1, one.digest)
        serving.publish(two, store, stamp(two.digest))
        serving.publish(two, store, stamp(two.digest))  # same digest again: still a fresh tree
        assert load_and_serve()[1:] == (2, two.digest)
        assert serving.prune(name) == 4
    finally:
        with contextlib.suppress(Exception):
            client.unload_model(name)
        client.close()
        serving.unpublish(name)
