"""The repository watcher with real inotify events: settle, coalesce, debris, moves, deletes, threads."""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from controlplane.errors import ConfigError
from controlplane.snapshot import HOLD_FILE, ContentStore
from controlplane.source.inotify import RepositoryWatcher
from tests.test_snapshot import make_model

SETTLE = 0.3
# watchdog warns (from its thread) when a new directory's watch races its own scan; harmless
pytestmark = pytest.mark.filterwarnings("ignore:Callback with id:RuntimeWarning")


class Recorder:
    """on_settled calls: (model, monotonic time, thread ident)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float, int]] = []
        self.cond = threading.Condition()

    def __call__(self, model: str) -> None:
        with self.cond:
            self.calls.append((model, time.monotonic(), threading.get_ident()))
            self.cond.notify_all()

    def models(self) -> list[str]:
        with self.cond:
            return [c[0] for c in self.calls]

    def wait_for(self, n: int, timeout: float = 5.0) -> list[str]:
        with self.cond:
            self.cond.wait_for(lambda: len(self.calls) >= n, timeout)
            return [c[0] for c in self.calls]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    return root


@pytest.fixture
def watch(repo: Path) -> Iterator[Callable[..., tuple[RepositoryWatcher, Recorder]]]:
    started: list[RepositoryWatcher] = []

    def start(settle: float = SETTLE, **kwargs: object) -> tuple[RepositoryWatcher, Recorder]:
        rec = Recorder()
        w = RepositoryWatcher(repo, rec, settle, **kwargs)  # type: ignore[arg-type]
        w.start()
        started.append(w)
        time.sleep(0.05)
        return w, rec

    yield start
    for w in started:
        w.stop()


def test_events_coalesce_until_the_model_settles(repo: Path, watch: Callable[..., tuple]) -> None:
    make_model(repo, "m", 1)
    w, rec = watch()
    f = repo / "m" / "1" / "model.py"
    for i in range(10):
        with open(f, "a") as fh:
            fh.write(f"# {i}\n")
        last_write = time.monotonic()
        time.sleep(0.05)
    assert rec.wait_for(1) == ["m"]
    assert rec.calls[0][1] - last_write >= SETTLE - 0.02
    time.sleep(SETTLE + 0.2)
    assert rec.models() == ["m"] and w.backlog() == 0


def test_models_settle_independently(repo: Path, watch: Callable[..., tuple]) -> None:
    w, rec = watch()
    make_model(repo, "a", 1)
    make_model(repo, "b", 1)
    assert sorted(rec.wait_for(2)) == ["a", "b"]
    time.sleep(SETTLE + 0.2)
    assert len(rec.models()) == 2


def test_debris_never_starts_a_check(repo: Path, watch: Callable[..., tuple]) -> None:
    make_model(repo, "m", 1)
    w, rec = watch()
    junks = ["m/.model.py.swp", "m/1/model.py~", "m/.git/index", "m/x.tmp", "m/.#config.pbtxt"]
    junks += ["m/1/__pycache__/model.cpython-311.pyc", ".staging/m/config.pbtxt", "README.md"]
    for junk in junks:
        (repo / junk).parent.mkdir(parents=True, exist_ok=True)
        (repo / junk).write_text("junk")
    time.sleep(SETTLE * 3)
    assert rec.models() == [] and w.backlog() == 0


def test_debris_writes_keep_a_pending_check_waiting(repo: Path, watch: Callable[..., tuple]) -> None:
    make_model(repo, "m", 1)
    w, rec = watch()
    (repo / "m" / "config.pbtxt").write_text("changed")
    t0 = time.monotonic()
    with open(repo / "m" / "1" / ".weights.bin.Xy12ab", "wb") as fh:  # rsync's temp file
        while time.monotonic() - t0 < 1.0:
            fh.write(b"\0" * 4096)
            fh.flush()
            time.sleep(0.05)
    assert rec.wait_for(1) == ["m"] and rec.calls[0][1] - t0 >= 1.0 + SETTLE - 0.05


@pytest.mark.parametrize("marker", [HOLD_FILE, ".committed"])
def test_hold_file_and_commit_marker_start_a_check(repo: Path, watch: Callable[..., tuple], marker: str) -> None:
    make_model(repo, "m", 1)
    w, rec = watch(commit_marker=".committed")
    (repo / "m" / marker).touch()
    assert rec.wait_for(1) == ["m"]
    (repo / "m" / marker).unlink()
    assert rec.wait_for(2) == ["m", "m"]


def test_directory_moved_in_is_handed_on_at_once(repo: Path, tmp_path: Path, watch: Callable[..., tuple]) -> None:
    w, rec = watch(settle=2.0)
    outside = make_model(tmp_path / "staging", "m1", 1)
    t0 = time.monotonic()
    os.rename(outside, repo / "m1")  # from outside the repository
    assert rec.wait_for(1, timeout=1.5) == ["m1"] and rec.calls[0][1] - t0 < 1.0
    inside = make_model(repo, ".incoming", 1)  # staged under a dot name, then renamed
    time.sleep(0.1)
    t1 = time.monotonic()
    os.rename(inside, repo / "m2")
    assert rec.wait_for(2, timeout=1.5) == ["m1", "m2"] and rec.calls[1][1] - t1 < 1.0


def test_declared_complete_goes_to_on_complete_at_once(repo: Path, tmp_path: Path) -> None:
    """A directory renamed in and a commit marker created are handed to `on_complete` (captured
    without a quiet window) well inside a 5 s settle window; an in-place write waits the window
    and goes to `on_settled`."""
    settled, complete = Recorder(), Recorder()
    w = RepositoryWatcher(repo, settled, 5.0, commit_marker="DONE", on_complete=complete)
    w.start()
    try:
        time.sleep(0.05)
        staged = make_model(tmp_path / "staging", "moved", 1)
        t0 = time.monotonic()
        os.rename(staged, repo / "moved")
        assert complete.wait_for(1, timeout=2.5) == ["moved"] and complete.calls[0][1] - t0 < 2.0
        make_model(repo, "marked", 1)  # written in place: would wait the 5 s window
        time.sleep(0.1)
        t1 = time.monotonic()
        (repo / "marked" / "DONE").touch()
        assert complete.wait_for(2, timeout=2.5)[1] == "marked" and complete.calls[1][1] - t1 < 2.0
        assert settled.models() == []
        (repo / "marked" / "config.pbtxt").write_text("# changed in place\n")
        assert settled.wait_for(1, timeout=8) == ["marked"] and settled.calls[0][1] - t1 >= 5.0
    finally:
        w.stop()


def test_deletion_is_handed_on_at_once(repo: Path, watch: Callable[..., tuple]) -> None:
    make_model(repo, "m", 1)
    w, rec = watch(settle=2.0)
    t0 = time.monotonic()
    shutil.rmtree(repo / "m")
    assert rec.wait_for(1, timeout=1.5) == ["m"] and rec.calls[0][1] - t0 < 1.0


def test_deleted_then_recreated_waits_for_the_new_content(repo: Path, watch: Callable[..., tuple]) -> None:
    make_model(repo, "m", 1)
    w, rec = watch()
    shutil.rmtree(repo / "m")
    make_model(repo, "m", 2)
    t0 = time.monotonic()
    time.sleep(SETTLE * 2 + 0.2)
    # a removal handed on before the mkdir is fine; once recreated, the new content settles first
    assert rec.models() in (["m"], ["m", "m"])
    assert rec.calls[-1][1] - t0 >= SETTLE - 0.05


def test_reschedule_backlog_and_settle(repo: Path, watch: Callable[..., tuple]) -> None:
    w, rec = watch()
    w.reschedule("m", 0.2)
    w.reschedule("n", 5.0)
    assert w.backlog() == 2
    assert rec.wait_for(1) == ["m"] and w.backlog() == 1
    with pytest.raises(ConfigError, match="at least 0.05"):
        w.set_settle(0.01)
    w.set_settle(0.05)
    assert w.settle_s == 0.05
    make_model(repo, "fast", 1)
    assert rec.wait_for(2, timeout=1.0) == ["m", "fast"]


def test_initial_scan(repo: Path) -> None:
    make_model(repo, "b", 1)
    make_model(repo, "a", 1)
    (repo / ".git").mkdir()
    (repo / "README.md").write_text("hi")
    assert RepositoryWatcher(repo, print).initial_scan() == ["a", "b"]


def test_callbacks_run_on_the_debounce_thread_and_survive_errors(repo: Path, watch: Callable[..., tuple]) -> None:
    failing = {"boom"}
    seen: list[tuple[str, str]] = []

    def on_settled(model: str) -> None:
        seen.append((model, threading.current_thread().name))
        if model in failing:
            raise RuntimeError("consumer bug")

    w = RepositoryWatcher(repo, on_settled, SETTLE)
    w.start()
    try:
        make_model(repo, "boom", 1)
        time.sleep(SETTLE + 0.3)
        make_model(repo, "ok", 1)
        deadline = time.monotonic() + 3
        while len(seen) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        w.stop()
    assert seen == [("boom", "tritonctl-debounce"), ("ok", "tritonctl-debounce")]


def test_our_own_reads_do_not_trigger(repo: Path, tmp_path: Path, watch: Callable[..., tuple]) -> None:
    d = make_model(repo, "m", 1)
    w, rec = watch()
    store = ContentStore(tmp_path / "store")
    store.capture(d, "m")
    time.sleep(SETTLE * 2)
    assert rec.models() == []


def test_stop_joins_its_threads(repo: Path) -> None:
    before = set(threading.enumerate())
    w = RepositoryWatcher(repo, print, SETTLE)
    w.start()
    assert len(set(threading.enumerate()) - before) >= 2
    w.stop()
    assert {t for t in set(threading.enumerate()) - before if t.is_alive()} == set()


def test_missing_root_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a directory"):
        RepositoryWatcher(tmp_path / "nope", print).start()
    with pytest.raises(ConfigError):
        RepositoryWatcher(tmp_path, print, settle_s=0)


def test_settling_lists_a_model_from_its_first_change_until_handed_on(repo: Path) -> None:
    """What `status` shows as `sync: pending` (settling): the seconds since the last change, the
    model still listed while it is being handed on, None for a look the consumer asked for again."""
    make_model(repo, "m", 1)
    during: list[dict[str, float | None]] = []
    handed = threading.Event()

    def on_settled(_model: str) -> None:
        during.append(w.settling())
        handed.set()

    w = RepositoryWatcher(repo, on_settled, SETTLE)
    w.start()
    try:
        time.sleep(0.05)
        assert w.settling() == {}
        (repo / "m" / "1" / "model.py").write_text("# changed\n")
        deadline = time.monotonic() + 5
        while "m" not in (now := w.settling()) and time.monotonic() < deadline:
            time.sleep(0.01)
        since = now.get("m")
        assert since is not None and 0 <= since < SETTLE, now
        assert handed.wait(5) and "m" in during[0], during
        while w.settling() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert w.settling() == {}
        w.reschedule("m", 30)  # the consumer's "on hold": no change seen since
        assert w.settling() == {"m": None}
    finally:
        w.stop()


def test_watches_added_later_miss_nothing_changed_before_them(repo: Path) -> None:
    """The daemon adds its inotify watches behind READY (`start(events=False)`, then `start_events`):
    a change made after the baseline but before its directory is watched raised no event, and the
    rescan that follows the watches hands it on; a change after that comes by its event."""
    make_model(repo, "early", 1)
    make_model(repo, "late", 1)
    rec = Recorder()
    w = RepositoryWatcher(repo, rec, SETTLE, rescan_interval_s=3600.0)  # no periodic rescan in this test
    w.start(events=False)
    try:
        (repo / "early" / "1" / "model.py").write_text("# changed before the watches\n")
        time.sleep(SETTLE * 2)
        assert rec.models() == []  # nothing watches yet: no event, no rescan
        w.start_events()
        assert rec.wait_for(1) == ["early"]  # the rescan after the watches
        t0 = time.monotonic()
        (repo / "late" / "1" / "model.py").write_text("# changed once watched\n")
        assert rec.wait_for(2) == ["early", "late"]
        assert rec.calls[1][1] - t0 < SETTLE + 1.5  # its event, not a rescan an hour away
    finally:
        w.stop()
    assert w._events_thread is None and w._observer is None


def test_a_rescan_inside_an_edits_settle_window_does_not_say_the_change_came_without_an_event(
        repo: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 57: with a 0.5 s rescan interval every edit (6 of 6) was logged `rescan ... found changes without an
    event` although its event had come: the rescan fell inside the edit's settle window. Logged only for a
    change no event announced (here `deaf`, whose events the test hook drops)."""
    monkeypatch.setenv("TRITONCTL_TEST_DROP_EVENTS", "deaf")
    make_model(repo, "heard", 1)
    make_model(repo, "deaf", 1)
    rec = Recorder()
    w = RepositoryWatcher(repo, rec, 1.2, rescan_interval_s=0.5)  # each settle window holds two rescans
    with caplog.at_level("INFO", "tritonctl.watcher"):
        w.start()
        try:
            for n in range(6):
                (repo / "heard" / "1" / "model.py").write_text(f"# edit {n}\n")
                assert rec.wait_for(n + 1, 10) == ["heard"] * (n + 1)
            (repo / "deaf" / "1" / "model.py").write_text("# no event for this one\n")
            assert rec.wait_for(7, 10)[-1] == "deaf"
        finally:
            w.stop()
    told = [r.getMessage() for r in caplog.records if "found changes without an event" in r.getMessage()]
    assert told and all(line.rsplit(": ", 1)[-1].startswith("deaf ") for line in told), told  # `deaf changed`
