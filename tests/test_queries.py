"""Read-only queries: time parsing for --since/--until/--at, snapshot diffs, audit argument checks.

Diffs run on real snapshots captured into a real content store and recorded in a migrated SQLite
registry, as the daemon records them.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from controlplane.errors import NotFoundError, UsageError
from controlplane.snapshot import ContentStore, Snapshot
from controlplane.store.registry import Registry
from controlplane.views import queries

REF = datetime(2026, 11, 29, 12, 0, 0)

# --- parse_time -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-29T03:00:00Z", datetime(2026, 11, 29, 3, 0, 0)),
        ("2026-11-29T03:00:00.250000Z", datetime(2026, 11, 29, 3, 0, 0, 250000)),
        ("2026-11-29T05:30:00+02:30", datetime(2026, 11, 29, 3, 0, 0)),
        ("2026-11-28T22:00:00-05:00", datetime(2026, 11, 29, 3, 0, 0)),
        ("2026-11-29T03:00:00", datetime(2026, 11, 29, 3, 0, 0)),  # naive means UTC
        ("2026-11-29 03:00", datetime(2026, 11, 29, 3, 0, 0)),
        ("2026-11-29", datetime(2026, 11, 29)),
        ("  2026-11-29T03:00:00Z  ", datetime(2026, 11, 29, 3, 0, 0)),
    ],
)
def test_parse_time_iso(text: str, expected: datetime) -> None:
    parsed = queries.parse_time(text, reference=REF)
    assert parsed == expected
    assert parsed.tzinfo is None  # naive UTC, comparable with the registry's columns


@pytest.mark.parametrize(
    ("text", "ago"),
    [
        ("45s", timedelta(seconds=45)),
        ("30m", timedelta(minutes=30)),
        ("2h", timedelta(hours=2)),
        ("7d", timedelta(days=7)),
        ("1w", timedelta(weeks=1)),
        ("1.5h", timedelta(minutes=90)),
        ("0m", timedelta(0)),
        ("2 h", timedelta(hours=2)),
    ],
)
def test_parse_time_relative(text: str, ago: timedelta) -> None:
    assert queries.parse_time(text, reference=REF) == REF - ago


def test_parse_time_relative_defaults_to_now(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("controlplane.base.clock.utcnow", lambda: REF)
    assert queries.parse_time("2h") == REF - timedelta(hours=2)


@pytest.mark.parametrize("text", ["", "yesterday", "2h ago", "-5m", "5y", "5 minutes", "2026-13-01", "12:00Z:00",
                                  "2026-11-29T25:00:00"])
def test_parse_time_rejects_with_the_field_name(text: str) -> None:
    with pytest.raises(UsageError, match=r"^--since: .* is neither ISO 8601 nor a relative time"):
        queries.parse_time(text, "--since", reference=REF)


def test_parse_time_out_of_range_is_a_usage_error() -> None:
    with pytest.raises(UsageError):
        queries.parse_time("999999w", "--since", reference=REF)


# --- audit argument checks --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"model": "../x"}, "path separator"),
        ({"model": ".hidden"}, "starts with"),
        ({"outcome": "great"}, "--outcome: 'great' is not one of"),
        ({"limit": 0}, "--limit"),
        ({"since": "soon"}, "--since"),
        ({"until": "later"}, "--until"),
    ],
)
def test_audit_rejects_bad_arguments(registry: Registry, kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        queries.audit(registry, **kwargs)  # type: ignore[arg-type]


def test_serving_at_checks_time_and_names(registry: Registry) -> None:
    with pytest.raises(UsageError, match="--at"):
        queries.serving_at(registry, "when it broke")
    with pytest.raises(UsageError):
        queries.serving_at(registry, "2h", ["a/b"])
    at = queries.serving_at(registry, "2026-11-29T03:00:00Z")
    assert at.to_json() == {"at": "2026-11-29T03:00:00Z", "models": []}


def test_versions_of_an_unknown_model(registry: Registry) -> None:
    with pytest.raises(NotFoundError, match="unknown"):
        queries.versions(registry, "nobody")


# --- diff -------------------------------------------------------------------------------------------

CONFIG_V1 = 'name: "linear"\nbackend: "python"\nmax_batch_size: 8\n'
CONFIG_V2 = 'name: "linear"\nbackend: "python"\nmax_batch_size: 16\n'


@pytest.fixture
def two_versions(tmp_path: Path, registry: Registry) -> tuple[Registry, ContentStore, Snapshot, Snapshot]:
    """linear, then: config.pbtxt edited, notes.txt removed, version 2 added, weights.bin replaced,
    run.sh made executable, model.py untouched."""
    store = ContentStore(tmp_path / "store", fsync=False)
    src = tmp_path / "src" / "linear"
    (src / "1").mkdir(parents=True)
    (src / "config.pbtxt").write_text(CONFIG_V1)
    (src / "1" / "model.py").write_text("GEN = 1\n")
    (src / "1" / "notes.txt").write_text("first cut\n")
    (src / "1" / "weights.bin").write_bytes(bytes(range(256)))
    (src / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(src / "run.sh", 0o644)
    first = store.capture(src, "linear")
    (src / "config.pbtxt").write_text(CONFIG_V2)
    (src / "1" / "notes.txt").unlink()
    (src / "2").mkdir()
    (src / "2" / "model.py").write_text("GEN = 2\n")
    (src / "1" / "weights.bin").write_bytes(bytes(range(255, -1, -1)) + b"\x00")
    os.chmod(src / "run.sh", 0o755)
    second = store.capture(src, "linear")
    for snap in (first, second):
        registry.record_snapshot("linear", snap.digest, snap.manifest_json(), config=None, versions=[1],
                                 served_versions=[1], valid=True, problems=[], total_bytes=snap.total_bytes)
    return registry, store, first, second


def test_diff_lists_added_removed_and_changed_files(two_versions: tuple) -> None:
    registry, store, first, second = two_versions
    result = queries.diff(registry, store, "linear", first.digest[:8], second.digest[:10]).to_json()
    assert (result["model"], result["a"], result["b"]) == ("linear", first.digest, second.digest)
    assert result["added"] == [{"path": "2/model.py", "size": 8}]
    assert result["removed"] == [{"path": "1/notes.txt", "size": 10}]
    changed = {c["path"]: c for c in result["changed"]}
    assert sorted(changed) == ["1/weights.bin", "config.pbtxt", "run.sh"]
    assert (changed["1/weights.bin"]["size_a"], changed["1/weights.bin"]["size_b"]) == (256, 257)
    assert changed["1/weights.bin"]["diff"] is None  # binary: sizes only
    assert changed["config.pbtxt"]["diff"] == (
        f"--- {first.digest[:12]}/config.pbtxt\n+++ {second.digest[:12]}/config.pbtxt\n"
        "@@ -1,3 +1,3 @@\n"
        ' name: "linear"\n backend: "python"\n-max_batch_size: 8\n+max_batch_size: 16\n'
    )
    assert (changed["run.sh"]["size_a"], changed["run.sh"]["size_b"]) == (10, 10)  # mode only: still listed


def test_diff_is_directional(two_versions: tuple) -> None:
    registry, store, first, second = two_versions
    back = queries.diff(registry, store, "linear", second.digest, first.digest).to_json()
    assert back["added"] == [{"path": "1/notes.txt", "size": 10}]
    assert back["removed"] == [{"path": "2/model.py", "size": 8}]
    assert "-max_batch_size: 16\n+max_batch_size: 8" in {c["path"]: c for c in back["changed"]}["config.pbtxt"]["diff"]


def test_diff_of_a_snapshot_with_itself_is_empty(two_versions: tuple) -> None:
    registry, store, first, _ = two_versions
    result = queries.diff(registry, store, "linear", first.digest, first.digest).to_json()
    assert (result["added"], result["removed"], result["changed"]) == ([], [], [])


def test_diff_refuses_collected_and_unknown_snapshots(two_versions: tuple) -> None:
    registry, store, first, second = two_versions
    with pytest.raises(NotFoundError, match="no snapshot with digest"):
        queries.diff(registry, store, "linear", "deadbeef", second.digest)
    registry.mark_collected("linear", [first.digest])
    with pytest.raises(NotFoundError, match="removed by gc"):
        queries.diff(registry, store, "linear", first.digest, second.digest)
    with pytest.raises(UsageError):
        queries.diff(registry, store, "../linear", first.digest, second.digest)


def test_diff_of_text_too_large_or_undecodable_shows_sizes_only(two_versions: tuple, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    registry, store, first, second = two_versions
    monkeypatch.setattr(queries, "MAX_TEXT_DIFF_BYTES", 10)
    result = queries.diff(registry, store, "linear", first.digest, second.digest).to_json()
    changed = {c["path"]: c for c in result["changed"]}
    assert changed["config.pbtxt"]["diff"] is None


def test_diff_refuses_digests_that_are_not_hex(two_versions: tuple) -> None:
    registry, store, first, second = two_versions
    with pytest.raises(UsageError, match="hexadecimal"):
        queries.diff(registry, store, "linear", first.digest[:6] + "%", second.digest)
