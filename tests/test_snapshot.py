"""The content-addressed store: scan, quiescence, dedup, stat cache, hold file and commit marker.

Real files on the real filesystem; a change "during" a capture is made from a hook the store calls
between reading files, or from a thread that keeps appending.
"""

from __future__ import annotations

import os
import re
import stat
import threading
import time
from pathlib import Path

import pytest

from controlplane.errors import (
    SnapshotAwaitingMarkerError,
    SnapshotChangingError,
    SnapshotCollectedError,
    SnapshotCorruptError,
    SnapshotDigestError,
    SnapshotError,
    SnapshotOnHoldError,
    SnapshotSourceGoneError,
    SnapshotTooLargeError,
    SnapshotUnreadableError,
    SnapshotUnsupportedError,
)
from controlplane.snapshot import HOLD_FILE, ContentStore, ManifestEntry, Snapshot
from controlplane.snapshot import content as storemod
from controlplane.snapshot.scan import ScanItem

GEN_CONFIG = re.compile(r'key: "gen"\s*value \{ string_value: "(\d+)" \}')
GEN_PY = re.compile(r"^GEN = (\d+)$", re.M)


def config_text(name: str, gen: int) -> str:
    return (
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n'
        f'parameters {{ key: "gen" value {{ string_value: "{gen}" }} }}\n'
    )


def model_text(gen: int, pad: int = 0) -> str:
    filler = "# " + "x" * 70 + "\n"
    return (
        '"""A generated test model."""\n' + filler * pad + "\n\nclass TritonPythonModel:\n"
        "    def execute(self, requests):\n        return []\n\n\n" + f"GEN = {gen}\n"
    )


def make_model(root: Path, name: str, gen: int, pad: int = 0) -> Path:
    d = root / name
    (d / "1").mkdir(parents=True, exist_ok=True)
    (d / "config.pbtxt").write_text(config_text(name, gen))
    (d / "1" / "model.py").write_text(model_text(gen, pad))
    return d


def markers(tree: Path) -> tuple[str | None, str | None]:
    """The generation written in config.pbtxt and in 1/model.py of a tree (None when absent)."""
    cfg = tree / "config.pbtxt"
    py = tree / "1" / "model.py"
    m1 = GEN_CONFIG.search(cfg.read_text()) if cfg.exists() else None
    m2 = GEN_PY.search(py.read_text()) if py.exists() else None
    return (m1.group(1) if m1 else None, m2.group(1) if m2 else None)


@pytest.fixture
def store(tmp_path: Path) -> ContentStore:
    return ContentStore(tmp_path / "state" / "store")


@pytest.fixture
def src(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    root.mkdir()
    return root


def objects(store: ContentStore) -> list[Path]:
    return [p for p in (store.root / "objects").rglob("*") if p.is_file()]


def leftovers(store: ContentStore) -> list[Path]:
    tmp = list((store.root / "tmp").iterdir())
    return tmp + [p for p in (store.root / "trees").iterdir() if p.name.startswith(".")]


def test_capture_records_files_dirs_and_manifest(store: ContentStore, src: Path) -> None:
    d = make_model(src, "m", 1)
    (d / "2").mkdir()  # an empty version dir (ensembles have them) must survive
    snap = store.capture(d, "m")
    assert [(e.path, e.kind) for e in snap.entries] == [
        ("1", "dir"), ("1/model.py", "file"), ("2", "dir"), ("config.pbtxt", "file"),
    ]  # fmt: skip
    assert snap.total_bytes == sum(e.size for e in snap.entries)
    cfg = snap.file("config.pbtxt")
    assert cfg is not None and cfg.sha256 and cfg.mode == stat.S_IMODE((d / "config.pbtxt").stat().st_mode)
    tree = store.tree_path(snap.digest)
    assert (tree / "2").is_dir() and markers(tree) == ("1", "1")
    assert store.load("m", snap.digest) == snap
    assert Snapshot.from_manifest_json("m", snap.manifest_json()) == snap
    assert not leftovers(store)


def test_digest_is_content_defined(store: ContentStore, src: Path, tmp_path: Path) -> None:
    a = store.capture(make_model(src, "a", 1), "a")
    b_dir = make_model(src, "b", 1)
    (b_dir / "config.pbtxt").write_text(config_text("a", 1))  # same bytes as a's
    os.utime(b_dir / "config.pbtxt", ns=(1, 1))  # other times, other inodes, same content
    b = store.capture(b_dir, "b")
    assert a.digest == b.digest and a.entries == b.entries and a.model == "a" and b.model == "b"
    assert store.capture(src / "a", "a").digest == a.digest  # stable
    (b_dir / "1" / "model.py").chmod(0o755)
    assert store.capture(b_dir, "b").digest != a.digest  # mode is content
    (src / "a" / "config.pbtxt").write_text(config_text("a", 2))
    assert store.capture(src / "a", "a").digest != a.digest


def test_objects_deduplicated_across_models_and_versions(store: ContentStore, src: Path) -> None:
    big = os.urandom(100_000)
    for name in ("m1", "m2"):
        d = make_model(src, name, 1)
        for v in ("1", "2", "3"):
            (d / v).mkdir(exist_ok=True)
            (d / v / "weights.bin").write_bytes(big)
        store.capture(d, name)
    sizes = sorted(p.stat().st_size for p in objects(store))
    # weights once, model.py once, one config per model (names differ)
    assert sizes.count(len(big)) == 1 and len(sizes) == 4


def test_objects_and_trees_are_read_only_copies(store: ContentStore, src: Path) -> None:
    d = make_model(src, "m", 1)
    snap = store.capture(d, "m")
    for obj in objects(store):
        assert stat.S_IMODE(obj.stat().st_mode) == 0o444
    tree = store.tree_path(snap.digest)
    assert stat.S_IMODE(tree.stat().st_mode) == 0o555 and stat.S_IMODE((tree / "1").stat().st_mode) == 0o555
    entry = snap.file("1/model.py")
    assert entry is not None
    stored = store.object_path(entry.sha256)
    assert (tree / "1" / "model.py").stat().st_ino == stored.stat().st_ino
    # never a link to the source: an in-place edit of the source leaves the store alone
    assert stored.stat().st_ino != (d / "1" / "model.py").stat().st_ino
    with open(d / "1" / "model.py", "r+") as fh:
        fh.write("#garbage")
    assert markers(tree) == ("1", "1") and "#garbage" not in stored.read_text()


def test_ignored_debris_is_not_captured(store: ContentStore, src: Path) -> None:
    d = make_model(src, "m", 1)
    clean = store.capture(d, "m").digest
    for junk in (
        ".git/HEAD",
        ".model.py.swp",
        "1/model.py~",
        ".#config.pbtxt",
        "x.tmp",
        "1/__pycache__/a.pyc",
    ):
        (d / junk).parent.mkdir(parents=True, exist_ok=True)
        (d / junk).write_text("junk")
    assert store.capture(d, "m").digest == clean


def test_change_during_capture_is_refused_and_leaves_nothing(
    store: ContentStore, src: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = make_model(src, "m", 1)
    (d / "1" / "weights.bin").write_bytes(b"w" * 5000)
    real_copy = ContentStore._copy_in

    def copy_then_edit(self: ContentStore, fd: int, item: ScanItem, model: str) -> str:
        sha = real_copy(self, fd, item, model)
        if item.rel == "1/model.py":  # the writer strikes between two files
            (d / "config.pbtxt").write_text(config_text("m", 2))
        return sha

    monkeypatch.setattr(ContentStore, "_copy_in", copy_then_edit)
    with pytest.raises(SnapshotChangingError, match=r"m: still changing \(config.pbtxt"):
        store.capture(d, "m")
    assert not leftovers(store) and not store.digests()


def test_append_during_read_is_refused(store: ContentStore, src: Path) -> None:
    d = make_model(src, "m", 1)
    big = d / "1" / "weights.bin"
    big.write_bytes(os.urandom(1 << 20) * 48)
    stop = threading.Event()

    def appender() -> None:
        with open(big, "ab") as fh:
            while not stop.is_set():
                fh.write(b"more")
                fh.flush()
                time.sleep(0.001)

    t = threading.Thread(target=appender)
    t.start()
    try:
        with pytest.raises(SnapshotChangingError, match="still changing"):
            store.capture(d, "m")
    finally:
        stop.set()
        t.join()
    assert not leftovers(store) and not store.digests()
    assert all(p.stat().st_size != big.stat().st_size for p in objects(store))


def test_stat_cache_spares_big_files_and_persists(store: ContentStore, src: Path) -> None:
    d = make_model(src, "m", 1)
    with open(d / "1" / "weights.bin", "wb") as fh:  # 64 MiB, sparse: cheap to make, real to read
        fh.truncate(64 << 20)
    first = store.capture(d, "m")
    assert store.files_read == 3 and store.bytes_read >= 64 << 20
    (d / "config.pbtxt").write_text(config_text("m", 2))  # config-only edit
    second = store.capture(d, "m")
    assert second.digest != first.digest and store.files_read == 4
    again = ContentStore(store.root)  # a restarted daemon keeps the cache
    assert again.capture(d, "m").digest == second.digest and again.files_read == 0
    os.utime(d / "1" / "weights.bin")  # new mtime: read it again
    again.capture(d, "m")
    assert again.files_read == 1 and again.bytes_read == 64 << 20


def test_stat_cache_is_not_trusted_without_the_object(store: ContentStore, src: Path) -> None:
    d = make_model(src, "m", 1)
    snap = store.capture(d, "m")
    assert store.gc(set()) > 0 and not objects(store)
    assert store.capture(d, "m").digest == snap.digest and store.files_read == 4
    assert len(objects(store)) == 2


def test_only_a_writer_not_done_yet_is_retryable() -> None:
    """The daemon reschedules a retryable refusal and audits any other as a failed snapshot."""
    waits = {SnapshotChangingError, SnapshotOnHoldError, SnapshotAwaitingMarkerError}
    kinds = {SnapshotCollectedError, SnapshotCorruptError, SnapshotDigestError, SnapshotSourceGoneError,
             SnapshotTooLargeError, SnapshotUnreadableError, SnapshotUnsupportedError} | waits
    assert all(issubclass(k, SnapshotError) for k in kinds)
    assert {k for k in kinds if k.retryable} == waits
    assert SnapshotError("m: x").retryable is False


def test_hold_file(store: ContentStore, src: Path) -> None:
    d = make_model(src, "m", 1)
    (d / HOLD_FILE).touch()
    with pytest.raises(SnapshotOnHoldError, match=r"^m: on hold"):
        store.capture(d, "m")
    (d / HOLD_FILE).unlink()
    store.capture(d, "m")


def test_commit_marker(store: ContentStore, src: Path) -> None:
    d = make_model(src, "m", 1)
    with pytest.raises(SnapshotAwaitingMarkerError, match="awaiting commit marker COMMIT$"):
        store.capture(d, "m", commit_marker="COMMIT")
    (d / "COMMIT").touch()
    snap = store.capture(d, "m", commit_marker="COMMIT")
    assert "COMMIT" not in {e.path for e in snap.entries}
    later = time.time_ns() + 5_000_000_000
    os.utime(d / "1" / "model.py", ns=(later, later))
    with pytest.raises(SnapshotAwaitingMarkerError, match=r"awaiting commit marker COMMIT \(older than 1/model.py\)"):
        store.capture(d, "m", commit_marker="COMMIT")


def test_symlinks(store: ContentStore, src: Path, tmp_path: Path) -> None:
    d = make_model(src, "m", 1)
    (d / "1" / "alias.py").symlink_to("model.py")
    snap = store.capture(d, "m")
    alias, real = snap.file("1/alias.py"), snap.file("1/model.py")
    assert alias is not None and real is not None
    assert alias.kind == "file" and alias.sha256 == real.sha256
    assert not (store.tree_path(snap.digest) / "1" / "alias.py").is_symlink()
    secret = tmp_path / "secret.txt"
    secret.write_text("not yours")
    (d / "1" / "leak.txt").symlink_to(secret)
    with pytest.raises(SnapshotUnsupportedError, match="symlink 1/leak.txt points outside the model directory"):
        store.capture(d, "m")
    (d / "1" / "leak.txt").unlink()
    (d / "1" / "up").symlink_to("../..")
    with pytest.raises(SnapshotUnsupportedError, match="outside the model directory"):
        store.capture(d, "m")
    (d / "1" / "up").unlink()
    (d / "1" / "dangling").symlink_to("nowhere")
    with pytest.raises(SnapshotUnsupportedError, match="dangling"):
        store.capture(d, "m")


def test_fifo_refused(store: ContentStore, src: Path) -> None:
    d = make_model(src, "m", 1)
    os.mkfifo(d / "1" / "pipe")
    with pytest.raises(SnapshotUnsupportedError, match="m: 1/pipe is a fifo"):
        store.capture(d, "m")


def test_unreadable_file_is_named(store: ContentStore, src: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = make_model(src, "m", 1)
    real_open = storemod._open_source

    def deny(path: str) -> int:
        if path.endswith("model.py"):
            raise PermissionError(13, "Permission denied", path)
        return real_open(path)

    monkeypatch.setattr(storemod, "_open_source", deny)
    with pytest.raises(SnapshotUnreadableError, match=r"m: cannot read 1/model.py \(Permission denied\)"):
        store.capture(d, "m")
    assert not leftovers(store)


def test_gone_and_not_a_directory(store: ContentStore, src: Path) -> None:
    with pytest.raises(SnapshotSourceGoneError, match="m: model directory .* is gone"):
        store.capture(src / "m", "m")
    (src / "f").write_text("x")
    with pytest.raises(SnapshotSourceGoneError, match="not a directory"):
        store.capture(src / "f", "f")


def test_load_unknown_or_malformed(store: ContentStore) -> None:
    with pytest.raises(SnapshotCollectedError, match="unknown snapshot"):
        store.load("m", "0" * 64)
    with pytest.raises(SnapshotDigestError, match="not a snapshot digest"):
        store.load("m", "../../etc/passwd")
    with pytest.raises(SnapshotCorruptError, match="malformed"):
        Snapshot.from_manifest_json("m", "{}")


def test_reflink_is_used_where_supported(store: ContentStore, src: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_clone(src_fd: int, dst_fd: int) -> bool:
        size = os.fstat(src_fd).st_size
        os.copy_file_range(src_fd, dst_fd, size, 0, 0)
        return True

    monkeypatch.setattr(storemod, "_reflink", fake_clone)
    d = make_model(src, "m", 1)
    snap = store.capture(d, "m")
    assert store.reflinks == 2 and markers(store.tree_path(snap.digest)) == ("1", "1")
    assert snap == ContentStore(store.root.parent / "other").capture(d, "m")


def test_gc_keeps_what_is_kept(store: ContentStore, src: Path) -> None:
    d = make_model(src, "m", 1)
    (d / "1" / "weights.bin").write_bytes(b"w" * 10_000)
    old = store.capture(d, "m")
    (d / "1" / "weights.bin").write_bytes(b"v" * 20_000)
    new = store.capture(d, "m")
    assert len(objects(store)) == 4
    assert store.gc({new.digest}) == 10_000
    assert store.digests() == {new.digest} and not store.tree_path(old.digest).exists()
    assert len(objects(store)) == 3 and store.load("m", new.digest) == new
    assert store.gc({new.digest}) == 0
    assert store.gc(set()) == sum(e.size for e in new.entries) and not objects(store)


def test_manifest_entry_is_plain_data() -> None:
    e = ManifestEntry("1/model.py", "file", 3, 0o644, "a" * 64)
    snap = Snapshot.from_entries("m", [e, ManifestEntry("1", "dir", 0, 0o755, "")])
    assert snap.entries[0].path == "1" and snap.total_bytes == 3 and len(snap.digest) == 64


def test_gc_waits_for_captures_and_publishes_in_progress(store: ContentStore, src: Path) -> None:
    d = make_model(src, "m", 1)
    snap = store.capture(d, "m")
    (store.root / "tmp" / "obj-leftover").write_text("from a crash")
    other = ContentStore(store.root)  # e.g. `tritonctl gc` in another process
    done = threading.Event()

    def collect() -> None:
        other.gc(set())
        done.set()

    with store.reading():  # what capture and publish hold while objects are unreferenced
        t = threading.Thread(target=collect)
        t.start()
        time.sleep(0.3)
        assert not done.is_set() and store.load("m", snap.digest) == snap
    t.join(5)
    assert done.is_set() and not store.digests() and not list((store.root / "tmp").iterdir())


def test_objects_a_power_loss_emptied_before_their_deferred_sync_are_written_again(
        store: ContentStore, src: Path) -> None:
    """The start-up scan writes objects without an fsync each and syncs the store once per batch before
    recording any (controlplane/startup/record.py). A power loss in between can leave an object's name with
    no data (the rename survived, the data did not): simulated here by emptying the object. The next
    capture of that content must not trust it: the object and the tree linked to it are written again
    whole, so what is recorded and published holds the model's files."""
    d = make_model(src, "m", 1)
    with store.deferred_sync():
        snap = store.capture(d, "m")
    store.sync()
    entry = next(e for e in snap.entries if e.path == "1/model.py")
    obj = store.object_path(entry.sha256)
    obj.chmod(0o644)
    obj.write_bytes(b"")  # what a power loss before the sync can leave
    again = store.capture(d, "m")
    assert again.digest == snap.digest
    assert obj.stat().st_size == entry.size
    assert markers(store.tree_path(snap.digest)) == ("1", "1")
    assert (store.tree_path(snap.digest) / "1" / "model.py").read_text() == model_text(1)
