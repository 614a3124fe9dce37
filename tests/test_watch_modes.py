"""A watcher that never misses a change, against the real daemon and tritonserver.

- Symlink publishes: a model entry flipped (atomic replace, `ln -sfn`, or its target's own link
  flipped outside the repository) between complete release directories: every flip served, 0 mixed
  answers, 0 failed requests; a dangling entry is one audit line and changes nothing serving.
- A change inotify never reports (the test hook drops the model's events) is caught by the rescan.
- A repository on a FUSE bind mount (bindfs), written from the directory underneath, where inotify
  sees nothing: the daemon polls it, and in-place chunks, temp + rename and a replaced directory are
  each served with 0 mixed answers.
- How each mode is chosen (mount table), an inotify overflow rescanning at once, running out of
  watches switching to polling with one warning.

The probe answers config generation * 1000 + code generation: a snapshot mixing two edits shows.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient

from controlplane.source.inotify import RepositoryWatcher
from controlplane.source.poller import DirectorySource, SignaturePoller
from controlplane.source.watchmode import choose_mode, filesystem_type
from tests.harness import DaemonProcess, gen_config, request_loop, wait_for

pytestmark = pytest.mark.filterwarnings("ignore:Callback with id:RuntimeWarning")

PAIR_MODEL = """import json
import numpy as np
import triton_python_backend_utils as pb_utils

CODE = {gen}


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.value = float(int(config["parameters"]["gen"]["string_value"]) * 1000 + CODE)

    def execute(self, requests):
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("gen", np.full_like(x, self.value))]))
        return out
"""


def pair_files(name: str, gen: int) -> dict[str, str]:
    return {"config.pbtxt": gen_config(name, gen), "1/model.py": PAIR_MODEL.format(gen=gen)}


def write_pair(model_dir: Path, name: str, gen: int) -> Path:
    for rel, text in pair_files(name, gen).items():
        (model_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        (model_dir / rel).write_text(text)
    return model_dir


def answer(client: grpcclient.InferenceServerClient, name: str) -> float | None:
    from tests.harness import infer_gen

    try:
        return infer_gen(client, name)
    except Exception:  # noqa: BLE001 - not loaded yet
        return None


def serves(client: grpcclient.InferenceServerClient, name: str, gen: int, timeout_s: float = 40.0) -> None:
    wait_for(lambda: answer(client, name) == gen * 1001, timeout_s, 0.05, f"{name} serving generation {gen}")


def assert_never_mixed(stats: dict, published: set[int]) -> None:
    assert stats["failed"] == 0, stats["errors"]
    assert stats["ok"] > 0
    for value in stats["gens"]:
        config, code = divmod(int(value), 1000)
        assert config == code, f"a mixed answer: config generation {config}, code generation {code}"
        assert config in published, f"generation {config} was never published ({sorted(published)})"


# -- symlink publishes and the rescan, one inotify daemon ---------------------------------------------


RESCAN_OFF_S = "3600"  # no rescan within the test's life: only inotify and the symlink polls can serve a flip


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """The symlink flips' daemon: the rescan off, so that every flip served is the symlink handling's
    (a 1 s rescan would serve each flip even if symlinked models were not watched at all)."""
    base = tmp_path_factory.mktemp("watch-local")
    (base / "repo").mkdir()
    proc = DaemonProcess(base / "repo", base / "state", settle_s=0.3, env={
        "TRITONCTL_RESCAN_INTERVAL_S": RESCAN_OFF_S, "TRITONCTL_POLL_INTERVAL_S": "0.3",
        "TRITONCTL_ALLOWED_LINK_ROOTS": str(base / "releases"),  # the releases the entries flip between
    }).start()
    # the watches are added behind READY, then one rescan: a flip made before that rescan would be
    # found by it (the test asserts no rescan served a flip), so the flips start once it is done
    wait_for(lambda: "inotify watches in place" in proc.log_tail(1 << 20), 60, 0.1, "the inotify watches")
    yield proc
    assert proc.stop() == 0, proc.log_tail()


@pytest.fixture
def rescanning(tmp_path: Path) -> Iterator[DaemonProcess]:
    """A daemon that rescans every second and never sees an event of models named `deaf*` (test hook)."""
    (tmp_path / "repo").mkdir()
    proc = DaemonProcess(tmp_path / "repo", tmp_path / "state", settle_s=0.3, env={
        "TRITONCTL_RESCAN_INTERVAL_S": "1", "TRITONCTL_TEST_DROP_EVENTS": "deaf",
    }).start()
    yield proc
    assert proc.stop() == 0, proc.log_tail()


def test_symlink_flips_are_each_served_never_mixed(local: DaemonProcess) -> None:
    repo, releases = local.repository, local.state_dir.parent / "releases"
    entry = repo / "flip"

    def release(gen: int) -> Path:
        return write_pair(releases / f"v{gen}" / "flip", "flip", gen)

    def flip(target: Path) -> None:  # the atomic replace deploy tools do
        tmp = repo / ".flip.new"
        tmp.unlink(missing_ok=True)
        os.symlink(target, tmp)
        os.replace(tmp, entry)

    os.symlink(release(1), entry)
    client = grpcclient.InferenceServerClient(local.triton_url())
    try:
        serves(client, "flip", 1)
        published = {1}
        with request_loop(local.triton_url(), "flip") as stats:
            flip(release(2))
            published.add(2)
            serves(client, "flip", 2)
            subprocess.run(["ln", "-sfn", str(release(3)), str(entry)], check=True)
            published.add(3)
            serves(client, "flip", 3)
            # the entry stays, its target is a link flipped outside the repository: no event at all
            current = releases / "current"
            os.symlink(release(4), current)
            flip(current)
            published.add(4)
            serves(client, "flip", 4)
            tmp = releases / ".current.new"
            os.symlink(release(5), tmp)
            os.replace(tmp, current)
            published.add(5)
            serves(client, "flip", 5)
            # dangling: one line, nothing serving changes
            flip(releases / "v6-not-written")
            audit = wait_for(lambda: [a for a in local.audit("--model", "flip") if "dangling" in a["message"]],
                             20, 0.2, "the dangling entry audited")
            time.sleep(1.2)  # several symlink polls pass: still one line, still serving
            assert answer(client, "flip") == 5005
            assert len([a for a in local.audit("--model", "flip") if "dangling" in a["message"]]) == 1
            assert audit[0]["outcome"] == "failed" and "nothing changed" in audit[0]["message"]
            row = local.model_status("flip")
            assert row["state"] == "serving" and row.get("removed_at") in (None, "")
            flip(release(7))
            published.add(7)
            serves(client, "flip", 7)
        assert_never_mixed(stats, published)
        assert {int(g) // 1000 for g in stats["gens"]} >= {2, 3, 4, 5, 7}
        deploys = local.audit("--model", "flip", "--action", "deploy")
        assert [d["outcome"] for d in deploys] == ["ok"] * 6
    finally:
        client.close()
    assert "found changes without an event" not in local.log_path.read_text()  # no rescan served any of it


def test_change_without_an_event_is_caught_by_the_rescan(rescanning: DaemonProcess) -> None:
    client = grpcclient.InferenceServerClient(rescanning.triton_url())
    try:
        write_pair(rescanning.repository / "deaf", "deaf", 1)  # the hook drops every event of "deaf"
        serves(client, "deaf", 1, 30)
        write_pair(rescanning.repository / "deaf", "deaf", 2)
        serves(client, "deaf", 2, 30)
    finally:
        client.close()
    assert "found changes without an event: deaf" in rescanning.log_path.read_text()
    status = rescanning.status()
    assert status["watch"]["mode"] == "inotify" and "local" in status["watch"]["reason"], status["watch"]


# -- a FUSE bind mount written from underneath: polled ------------------------------------------------


@pytest.fixture(scope="module")
def fuse_repo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    if not os.path.exists("/dev/fuse"):  # under `python -m tests.tiers` (CI) this skip is a failure
        pytest.skip("/dev/fuse is absent: this machine cannot mount a FUSE filesystem (a container needs "
                    "--device /dev/fuse; a host, `modprobe fuse`)")
    if shutil.which("bindfs") is None:
        pytest.fail("bindfs is not installed (apt-get install -y bindfs)")
    base = tmp_path_factory.mktemp("watch-fuse")
    under, mount = base / "under", base / "mnt"
    under.mkdir()
    mount.mkdir()
    subprocess.run(["bindfs", str(under), str(mount)], check=True, timeout=30)
    try:
        yield under, mount
    finally:
        for cmd in (["fusermount", "-u", str(mount)], ["umount", str(mount)], ["umount", "-l", str(mount)]):
            if shutil.which(cmd[0]) and subprocess.run(cmd, capture_output=True, timeout=30).returncode == 0:
                break


def write_in_chunks(path: Path, text: str, chunks: int = 4, pause_s: float = 0.1) -> None:
    data = text.encode()
    step = -(-len(data) // chunks)
    with open(path, "r+b" if path.exists() else "wb") as fh:
        fh.truncate(0)
        for i in range(0, len(data), step):
            fh.write(data[i : i + step])
            fh.flush()
            time.sleep(pause_s)


def test_fuse_mount_written_from_underneath_is_polled(fuse_repo: tuple[Path, Path]) -> None:
    under, mount = fuse_repo
    fstype = filesystem_type(mount)
    assert fstype is not None and fstype[0].startswith("fuse"), fstype
    write_pair(under / "nfs", "nfs", 1)
    daemon = DaemonProcess(mount, under.parent / "state", settle_s=0.3,
                           env={"TRITONCTL_POLL_INTERVAL_S": "0.3"}).start()
    client = None
    try:
        watch = daemon.status()["watch"]
        assert watch["mode"] == "poll" and "fuse" in watch["reason"], watch
        assert "watch: poll (" in daemon.run("status").output
        client = grpcclient.InferenceServerClient(daemon.triton_url())
        serves(client, "nfs", 1)
        model = under / "nfs"
        with request_loop(daemon.triton_url(), "nfs") as stats:
            # in place, in chunks with pauses shorter than the settle window
            for rel, text in pair_files("nfs", 2).items():
                write_in_chunks(model / rel, text)
            serves(client, "nfs", 2)
            # editor style: a temp file, then renamed over the real one
            for rel, text in pair_files("nfs", 3).items():
                tmp = model / f"{rel}.tmp"
                tmp.write_text(text)
                os.replace(tmp, model / rel)
                time.sleep(0.1)
            serves(client, "nfs", 3)
            # the whole directory replaced by a complete new one
            staged = write_pair(under / ".nfs.new", "nfs", 4)
            os.rename(model, under / ".nfs.old")
            os.rename(staged, model)
            shutil.rmtree(under / ".nfs.old")
            serves(client, "nfs", 4)
        assert_never_mixed(stats, {1, 2, 3, 4})
        assert {int(g) // 1000 for g in stats["gens"]} >= {2, 3, 4}
    finally:
        if client is not None:
            client.close()
        assert daemon.stop() == 0, daemon.log_tail()


# -- mode choice, overflow, out of watches (watcher alone) -------------------------------------------


def test_mode_follows_the_filesystem_type_of_the_longest_mount_prefix(tmp_path: Path) -> None:
    info = tmp_path / "mountinfo"
    info.write_text(
        "22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw\n"
        "40 22 0:50 / /srv/models rw,relatime - nfs4 fs:/export rw,vers=4.2\n"
        "41 40 0:51 / /srv/models/local rw - tmpfs tmpfs rw\n"
        "42 22 0:52 / /mnt/with\\040space rw - fuse.sshfs host:/x rw\n"
        "43 22 0:53 / /srv/fast rw - nfs fs:/fast rw,vers=3,actimeo=1\n"
    )
    assert choose_mode(Path("/srv/models/x"), "auto", str(info)).mode == "poll"
    assert "nfs4" in choose_mode(Path("/srv/models/x"), "auto", str(info)).reason
    assert choose_mode(Path("/srv/models/local/y"), "auto", str(info)).mode == "inotify"
    assert choose_mode(Path("/srv/modelsX"), "auto", str(info)).mode == "inotify"
    assert choose_mode(Path("/mnt/with space/m"), "auto", str(info)).mode == "poll"
    assert choose_mode(Path("/srv/models/x"), "inotify", str(info)).mode == "inotify"
    assert choose_mode(Path("/home"), "poll", str(info)).mode == "poll"
    # how long stat facts may lag writes made elsewhere: captures wait that much beyond the settle window
    assert choose_mode(Path("/srv/models/x"), "auto", str(info)).cache_s == 3.0
    assert choose_mode(Path("/srv/fast/x"), "auto", str(info)).cache_s == 1.0
    assert choose_mode(Path("/mnt/with space/m"), "auto", str(info)).cache_s == 1.0
    assert choose_mode(Path("/home"), "poll", str(info)).cache_s == 0.0


class Calls:
    def __init__(self) -> None:
        self.models: list[str] = []
        self.cond = threading.Condition()

    def __call__(self, model: str) -> None:
        with self.cond:
            self.models.append(model)
            self.cond.notify_all()

    def wait(self, model: str, timeout_s: float = 10.0) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: model in self.models, timeout_s)


def test_inotify_overflow_rescans_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITONCTL_TEST_DROP_EVENTS", "lost")
    calls = Calls()
    watcher = RepositoryWatcher(tmp_path, calls, 0.1, rescan_interval_s=3600)
    watcher.start()
    try:
        assert watcher.watch_info()["mode"] == "inotify"
        (tmp_path / "lost" / "1").mkdir(parents=True)
        (tmp_path / "lost" / "config.pbtxt").write_text("x")
        assert not calls.wait("lost", 1.0), "the hook must drop the events"
        # what watchdog logs when the kernel reports IN_Q_OVERFLOW
        watchdog_log = logging.getLogger("watchdog.observers.inotify_c")
        watchdog_log.warning("Inotify queue overflowed; filesystem events were lost")
        assert calls.wait("lost", 5.0)
    finally:
        watcher.stop()


def test_out_of_watches_switches_to_polling_with_one_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import errno

    import controlplane.source.inotify as watcher_module

    class Exhausted:
        def schedule(self, *args: object, **kwargs: object) -> None:
            pass

        def start(self) -> None:
            raise OSError(errno.ENOSPC, "inotify watch limit reached")

        def stop(self) -> None:
            pass

    monkeypatch.setattr(watcher_module, "_new_observer", Exhausted)
    calls = Calls()
    watcher = RepositoryWatcher(tmp_path, calls, 0.1, poll_interval_s=0.2)
    with caplog.at_level(logging.WARNING, logger="tritonctl.watcher"):
        watcher.start()
        try:
            (tmp_path / "m" / "1").mkdir(parents=True)
            (tmp_path / "m" / "config.pbtxt").write_text("x")
            assert calls.wait("m", 5.0)
            info = watcher.watch_info()
            assert info["mode"] == "poll" and "fs.inotify.max_user_watches" in info["reason"]
        finally:
            watcher.stop()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "fs.inotify.max_user_watches" in warnings[0].getMessage()


def test_signature_sees_edits_flips_and_dangling_entries(tmp_path: Path) -> None:
    source = DirectorySource(tmp_path)
    a = write_pair(tmp_path / "rel" / "a", "m", 1)
    b = write_pair(tmp_path / "rel" / "b", "m", 1)
    os.symlink(a, tmp_path / "m")
    (tmp_path / "notes.txt").write_text("not a model")
    assert sorted(source.names()) == ["m", "rel"]
    first = source.signature("m")
    assert first is not None
    os.replace(os.symlink(b, tmp_path / ".m.new") or tmp_path / ".m.new", tmp_path / "m")
    flipped = source.signature("m")
    assert flipped is not None and flipped[0] != first[0], "a flip changes the identity"
    (b / "1" / "model.py").write_text("changed")
    edited = source.signature("m")
    assert edited is not None and edited[0] == flipped[0] and edited[1] != flipped[1]
    os.replace(os.symlink(tmp_path / "missing", tmp_path / ".m.new") or tmp_path / ".m.new", tmp_path / "m")
    assert source.signature("m") == (("dangling", str(tmp_path / "missing")), 0)
    assert source.signature("notes.txt") is None and source.signature("gone") is None


def test_running_out_of_watches_later_switches_to_polling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """watchdog skips a new directory it cannot watch without a word: the watcher probes the limit."""
    from controlplane.source import watchmode

    exhausted = threading.Event()
    monkeypatch.setattr(watchmode, "watches_exhausted", lambda path: exhausted.is_set())
    calls = Calls()
    watcher = RepositoryWatcher(tmp_path, calls, 0.1, poll_interval_s=0.2, rescan_interval_s=3600)
    with caplog.at_level(logging.WARNING, logger="tritonctl.watcher"):
        watcher.start()
        try:
            assert watcher.watch_info()["mode"] == "inotify"
            exhausted.set()  # the user's watches are used up by now
            (tmp_path / "late" / "1").mkdir(parents=True)
            wait_for(lambda: watcher.watch_info()["mode"] == "poll", 5, 0.05, "switch to polling")
            assert "fs.inotify.max_user_watches" in watcher.watch_info()["reason"]
            (tmp_path / "late" / "config.pbtxt").write_text("x")
            assert calls.wait("late", 5.0)
        finally:
            watcher.stop()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "fs.inotify.max_user_watches" in warnings[0], warnings


def test_symlinked_model_is_captured_through_its_target_and_may_not_lead_out(tmp_path: Path) -> None:
    from controlplane.errors import SnapshotError
    from controlplane.snapshot import ContentStore

    store = ContentStore(tmp_path / "store", fsync=False)
    release = write_pair(tmp_path / "releases" / "v1" / "m", "m", 1)
    (tmp_path / "repo").mkdir()
    os.symlink(release, tmp_path / "repo" / "m")
    snap = store.capture(tmp_path / "repo" / "m", "m")
    assert {e.path for e in snap.entries} == {"config.pbtxt", "1", "1/model.py"}
    assert snap.digest == store.capture(release, "m").digest  # the content, wherever it is reached from
    (tmp_path / "secret").write_text("not the model's")
    os.symlink(tmp_path / "secret", release / "leak")
    with pytest.raises(SnapshotError, match="points outside the model directory"):
        store.capture(tmp_path / "repo" / "m", "m")


def _thread_names() -> set[str]:
    names = set()
    for task in Path("/proc/self/task").iterdir():
        try:
            names.add((task / "comm").read_text().strip())
        except OSError:  # a thread that ended meanwhile
            continue
    return names


def test_the_poll_thread_is_named_in_the_kernel(tmp_path: Path) -> None:
    """`top -H` and /proc/PID/task/TID/comm tell the poll thread apart: bench/rescan_daemon.py reads the
    rescan's own CPU time there."""
    poller = SignaturePoller(DirectorySource(tmp_path), lambda name, kind: None)
    poller.start(3600.0)
    try:
        wait_for(lambda: "tritonctl-poll" in _thread_names(), 10, 0.05, "the poll thread named in /proc")
    finally:
        poller.stop()
    # join() returns when Python's side of the thread is done; the kernel's task can outlive it briefly
    wait_for(lambda: "tritonctl-poll" not in _thread_names(), 10, 0.05, "the poll thread gone from /proc")
