"""Acceptance: however a writer edits the source repository, no snapshot mixes old and new content.

The watcher and the store are wired as the daemon wires them (settled → capture; "still changing",
"on hold" or "awaiting commit marker" → reschedule; "gone" → removed). Every test model carries its
generation twice, in config.pbtxt (`parameters gen`) and in 1/model.py (`GEN = n`, the file's last
line, so a partly written model.py has none): a snapshot of a half-finished edit shows two different
markers. Each writer pattern must end with the new generation captured, and no captured snapshot may
ever disagree with itself.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from controlplane.errors import SnapshotError, SnapshotSourceGoneError
from controlplane.snapshot import HOLD_FILE, ContentStore
from controlplane.source.inotify import RepositoryWatcher
from tests.test_snapshot import config_text, make_model, markers, model_text

SETTLE = 0.5
# watchdog warns (from its thread) when a new directory's watch races its own scan; harmless
pytestmark = pytest.mark.filterwarnings("ignore:Callback with id:RuntimeWarning")
PAUSE = 0.2  # writers pause less than the settle window
BIG = 200 << 20


@dataclass(frozen=True)
class Record:
    model: str
    digest: str  # "removed" when the model directory was gone
    markers: tuple[str | None, str | None]
    sizes: tuple[tuple[str, int], ...]


class Harness:
    """on_settled → capture → record, as the daemon does it (without registry or Triton)."""

    def __init__(self, repo: Path, state: Path, commit_marker: str | None = None) -> None:
        self.repo = repo
        self.commit_marker = commit_marker
        self.store = ContentStore(state / "store")
        self.watcher = RepositoryWatcher(repo, self.on_settled, SETTLE, commit_marker=commit_marker)
        self.records: list[Record] = []
        self.refusals: list[str] = []
        self.busy = 0
        self.cond = threading.Condition()

    def start(self) -> None:
        self.watcher.start()
        for model in self.watcher.initial_scan():
            self.on_settled(model)

    def on_settled(self, model: str) -> None:
        with self.cond:
            self.busy += 1
        try:
            self._capture(model)
        finally:
            with self.cond:
                self.busy -= 1
                self.cond.notify_all()

    def _capture(self, model: str) -> None:
        try:
            snap = self.store.capture(self.repo / model, model, commit_marker=self.commit_marker)
        except SnapshotError as exc:
            reason = str(exc)
            if isinstance(exc, SnapshotSourceGoneError):
                record = Record(model, "removed", (None, None), ())
            elif exc.retryable:
                self.refusals.append(reason)
                self.watcher.reschedule(model, SETTLE)
                return
            else:
                raise
        else:
            tree = self.store.tree_path(snap.digest)
            sizes = tuple((e.path, e.size) for e in snap.entries if e.kind == "file")
            record = Record(model, snap.digest, markers(tree), sizes)
        with self.cond:
            self.records.append(record)

    def of(self, model: str) -> list[Record]:
        with self.cond:
            return [r for r in self.records if r.model == model]

    def wait_for(self, model: str, gen: int, timeout: float = 20.0) -> list[Record]:
        """Wait until `model`'s latest capture is generation `gen` and nothing is pending."""
        want = (str(gen), str(gen))
        deadline = time.monotonic() + timeout
        with self.cond:
            while time.monotonic() < deadline:
                mine = [r for r in self.records if r.model == model]
                if mine and mine[-1].markers == want and not self.busy and not self.watcher.backlog():
                    break
                self.cond.wait(0.05)
        time.sleep(SETTLE + 0.2)  # nothing else may turn up afterwards
        mine = self.of(model)
        assert mine and mine[-1].markers == want, f"{model}: captures {[r.markers for r in mine]}"
        return mine


def assert_never_mixed(records: list[Record]) -> None:
    for r in records:
        if r.digest != "removed":
            assert r.markers[0] is not None and r.markers[0] == r.markers[1], f"mixed snapshot: {r}"


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    return root


@pytest.fixture
def harness(repo: Path, tmp_path: Path) -> Iterator[Harness]:
    h = Harness(repo, tmp_path / "state")
    yield h
    h.watcher.stop()


@pytest.fixture(scope="module")
def big_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A model with a 200 MB weights file, staged outside the repository."""
    staging = tmp_path_factory.mktemp("staging")
    d = make_model(staging, "big", 5)
    block = os.urandom(1 << 20)
    with open(d / "1" / "weights.bin", "wb") as fh:
        for _ in range(BIG >> 20):
            fh.write(block)
    return d


def write_in_chunks(path: Path, text: str, chunks: int, pause: float = PAUSE) -> None:
    step = -(-len(text) // chunks)
    with open(path, "w") as fh:
        for i in range(0, len(text), step):
            fh.write(text[i : i + step])
            fh.flush()
            time.sleep(pause)


def test_file_written_in_chunks_with_pauses(repo: Path, harness: Harness) -> None:
    make_model(repo, "m", 1, pad=100)
    harness.start()
    (repo / "m" / "config.pbtxt").write_text(config_text("m", 2))
    t0 = time.monotonic()
    write_in_chunks(repo / "m" / "1" / "model.py", model_text(2, pad=200), chunks=12)
    assert time.monotonic() - t0 >= 2.0
    records = harness.wait_for("m", 2)
    assert_never_mixed(records)
    assert [r.markers for r in records] == [("1", "1"), ("2", "2")]  # no capture in between


def test_editor_save_temp_and_rename(repo: Path, harness: Harness) -> None:
    make_model(repo, "m", 1)
    harness.start()
    cfg, py = repo / "m" / "config.pbtxt", repo / "m" / "1" / "model.py"
    (repo / "m" / ".config.pbtxt.swp").write_text("vim swap")  # vim: swap, backup, write, unlink
    os.rename(cfg, repo / "m" / "config.pbtxt~")
    cfg.write_text(config_text("m", 3))
    (repo / "m" / "config.pbtxt~").unlink()
    time.sleep(PAUSE)
    tmp = repo / "m" / "1" / "model.py.tmp"  # atomic-save editors: temp file renamed over
    tmp.write_text(model_text(3))
    os.replace(tmp, py)
    (repo / "m" / ".config.pbtxt.swp").unlink()
    records = harness.wait_for("m", 3)
    assert_never_mixed(records)
    assert len(records) == 2


@pytest.mark.parametrize("tool", ["cp", "rsync"])
def test_copy_of_a_model_with_a_big_file(repo: Path, harness: Harness, big_model: Path, tool: str) -> None:
    harness.start()
    if tool == "cp":
        subprocess.run(["cp", "-r", str(big_model), str(repo / "m")], check=True)
    else:
        if shutil.which("rsync") is None:
            pytest.fail("rsync is not installed (apt-get install -y rsync)")
        subprocess.run(["rsync", "-a", f"{big_model}/", str(repo / "m")], check=True)
    records = harness.wait_for("m", 5, timeout=40)
    assert_never_mixed(records)
    for r in records:  # never a snapshot without the whole weights file
        assert ("1/weights.bin", BIG) in r.sizes, r


def test_delete_and_recreate(repo: Path, harness: Harness) -> None:
    make_model(repo, "m", 1)
    harness.start()
    shutil.rmtree(repo / "m")
    time.sleep(0.05)
    (repo / "m").mkdir()
    time.sleep(PAUSE / 2)
    (repo / "m" / "config.pbtxt").write_text(config_text("m", 6))
    time.sleep(PAUSE)
    (repo / "m" / "1").mkdir()
    write_in_chunks(repo / "m" / "1" / "model.py", model_text(6, pad=50), chunks=3)
    records = harness.wait_for("m", 6)
    assert_never_mixed(records)
    assert records[0].markers == ("1", "1")


def test_delete_is_recorded_as_removed(repo: Path, harness: Harness) -> None:
    make_model(repo, "m", 1)
    harness.start()
    shutil.rmtree(repo / "m")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and harness.of("m")[-1].digest != "removed":
        time.sleep(0.05)
    assert [r.digest == "removed" for r in harness.of("m")] == [False, True]


def test_two_models_edited_at_once(repo: Path, harness: Harness) -> None:
    for name in ("a", "b"):
        make_model(repo, name, 1, pad=50)
    harness.start()

    def edit(name: str, gen: int) -> None:
        (repo / name / "config.pbtxt").write_text(config_text(name, gen))
        time.sleep(PAUSE / 2)
        write_in_chunks(repo / name / "1" / "model.py", model_text(gen, pad=150), chunks=8)

    threads = [threading.Thread(target=edit, args=(n, g)) for n, g in (("a", 7), ("b", 8))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for name, gen in (("a", 7), ("b", 8)):
        records = harness.wait_for(name, gen)
        assert_never_mixed(records)
        assert len(records) == 2


@pytest.mark.parametrize("config_first", [True, False], ids=["config-then-code", "code-then-config"])
def test_config_and_code_changed_in_either_order(repo: Path, harness: Harness, config_first: bool) -> None:
    make_model(repo, "m", 1)
    harness.start()
    writes = [
        lambda: (repo / "m" / "config.pbtxt").write_text(config_text("m", 9)),
        lambda: (repo / "m" / "1" / "model.py").write_text(model_text(9)),
    ]
    for write in writes if config_first else writes[::-1]:
        write()
        time.sleep(PAUSE)
    records = harness.wait_for("m", 9)
    assert_never_mixed(records)
    assert len(records) == 2


def test_long_pause_under_a_hold_file(repo: Path, harness: Harness) -> None:
    make_model(repo, "m", 1)
    harness.start()
    (repo / "m" / HOLD_FILE).touch()
    (repo / "m" / "config.pbtxt").write_text(config_text("m", 10))
    time.sleep(SETTLE * 3)  # far longer than the settle window
    (repo / "m" / "1" / "model.py").write_text(model_text(10))
    time.sleep(PAUSE)
    (repo / "m" / HOLD_FILE).unlink()
    records = harness.wait_for("m", 10)
    assert_never_mixed(records)
    assert len(records) == 2 and any("on hold" in r for r in harness.refusals)


def test_long_pause_before_a_commit_marker(repo: Path, tmp_path: Path) -> None:
    make_model(repo, "m", 1)
    (repo / "m" / "COMMIT").touch()
    h = Harness(repo, tmp_path / "state", commit_marker="COMMIT")
    h.start()
    try:
        (repo / "m" / "config.pbtxt").write_text(config_text("m", 11))
        time.sleep(SETTLE * 3)
        (repo / "m" / "1" / "model.py").write_text(model_text(11))
        time.sleep(0.05)
        (repo / "m" / "COMMIT").touch()
        records = h.wait_for("m", 11)
    finally:
        h.watcher.stop()
    assert_never_mixed(records)
    assert len(records) == 2 and any("awaiting commit marker" in r for r in h.refusals)
