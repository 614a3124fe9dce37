"""Sources behind one interface (controlplane/source/protocol.py): every kind implements the whole `Source`
protocol with the same parameters, no module outside the source modules and the daemon's choice of
one asks which kind it has, and a directory's repository-level rules (hold file, root commit marker,
dangling symlink) are said by `LocalSource`. The watching itself is covered end to end by
tests/test_watcher.py, tests/test_watch_modes.py, tests/test_s3_source.py and tests/test_s3_e2e.py."""

from __future__ import annotations

import inspect
import os
import re
import time
from pathlib import Path

from controlplane.snapshot import HOLD_FILE, ContentStore
from controlplane.source.local import LocalSource
from controlplane.source.mlflowsource import MLflowSource
from controlplane.source.protocol import NoSource, Source
from controlplane.source.s3 import S3Source
from tests.harness import write_gen_model

ROOT = Path(__file__).resolve().parents[2]
KINDS = (LocalSource, S3Source, MLflowSource, NoSource)


def _protocol_methods() -> dict[str, inspect.Signature]:
    return {name: inspect.signature(fn) for name, fn in vars(Source).items()
            if callable(fn) and not name.startswith("_")}


def test_every_source_kind_implements_the_whole_protocol() -> None:
    methods = _protocol_methods()
    assert {"names", "has", "read_text", "capture_into", "watch", "watch_info", "settling"} <= set(methods)
    for kind in KINDS:
        for name, wanted in methods.items():
            assert callable(getattr(kind, name, None)), f"{kind.__name__} lacks {name}"
            got = inspect.signature(getattr(kind, name))
            assert list(got.parameters) == list(wanted.parameters), f"{kind.__name__}.{name}{got} != {wanted}"


def test_no_module_branches_on_the_kind_of_source() -> None:
    """Only controlplane/startup/sources.py picks a kind from the settings; everything else asks the
    `Source`."""
    kind_checks = re.compile(r"\.source is (not )?None|settings\.repository(_url)?\b|\bS3Source\b|\bLocalSource\b"
                             r"|isinstance\([^)]*Source\)|WatchHooks")
    allowed = {"controlplane/source/protocol.py", "controlplane/source/local.py", "controlplane/source/s3.py",
               "controlplane/source/mlflowsource.py", "controlplane/settings/config.py",
               "controlplane/startup/sources.py"}
    offenders = []
    for path in sorted([*(ROOT / "controlplane").rglob("*.py"), *(ROOT / "cli").rglob("*.py")]):
        rel = str(path.relative_to(ROOT))
        if rel in allowed:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if kind_checks.search(line):
                offenders.append(f"{rel}:{number}: {line.strip()}")
    assert offenders == [], offenders


def test_a_directory_says_what_holds_the_whole_repository_back(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_gen_model(repo, "m", 1)
    source = LocalSource(repo, settle_s=0.5, commit_marker="DONE")
    assert source.names() == ["m"] and source.has("m") and not source.has("nope")
    assert 'name: "m"' in (source.read_text("m", "config.pbtxt") or "")
    assert source.repository_wait("m") is None and not source.repository_marked()
    (repo / HOLD_FILE).touch()
    assert source.repository_held() and "on hold" in (source.repository_wait("m") or "")
    (repo / HOLD_FILE).unlink()
    marker = repo / "DONE"
    marker.touch()
    old = time.time() - 60
    os.utime(marker, (old, old))  # older than the model's files: the model waits for it
    assert source.repository_marked()
    assert "awaiting commit marker DONE at the repository root" in (source.repository_wait("m") or "")
    marker.touch()
    assert source.repository_wait("m") is None
    captured = source.capture_into(ContentStore(tmp_path / "store", fsync=False), "m", settled=False)
    assert captured.snapshot.model == "m" and captured.signature == source.signature("m")


def test_a_dangling_symlink_entry_is_a_problem_not_a_removal(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "gone").symlink_to(tmp_path / "nowhere")
    source = LocalSource(repo)
    assert "gone" in source.names() and not source.has("gone")
    assert "a dangling symlink" in (source.entry_problem("gone") or "")
    assert source.entry_problem("other") is None


def test_without_a_source_nothing_is_listed_and_load_says_why() -> None:
    source = NoSource()
    assert source.names() == [] and not source.has("m")
    assert "no source repository" in source.missing("m")
    assert source.watch_info() == {"mode": None, "reason": "no source repository"}
