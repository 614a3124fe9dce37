"""Registry.contents: what a recorded content holds is read from the registry once per digest, then kept
(controlplane/store/contentmemo.py), and only what a full digest names. `registry`: tests/conftest.py."""

from __future__ import annotations

import functools

import pytest

from controlplane.store.contentmemo import ContentMemo
from controlplane.store.records import SnapshotRecord
from controlplane.store.registry import Registry

CONFIG = {"name": "m", "backend": "python", "max_batch_size": 4}


def _record(registry: Registry, digest: str) -> None:
    registry.record_snapshot("m", digest, "{}", config=CONFIG, versions=[1, 2], served_versions=[2], valid=True,
                             problems=[], total_bytes=10)


def test_a_full_digest_is_read_once_and_a_prefix_every_time(registry: Registry,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    digest = "ab" * 32
    _record(registry, digest)
    reads: list[str] = []
    real = registry.get_snapshot

    def counted(model: str, d: str) -> SnapshotRecord:
        reads.append(d)
        return real(model, d)

    monkeypatch.setattr(registry, "get_snapshot", counted)
    for _ in range(3):
        assert registry.snapshot_content("m", digest) == (CONFIG, [2])
    assert reads == [digest]
    for _ in range(2):
        assert registry.snapshot_content("m", digest[:12]) == (CONFIG, [2])
    assert reads == [digest, digest[:12], digest[:12]]  # a prefix may come to name another content


def test_an_unknown_digest_is_an_error_each_time_not_kept(registry: Registry) -> None:
    from controlplane.errors import NotFoundError

    for _ in range(2):
        with pytest.raises(NotFoundError):
            registry.snapshot_content("m", "cd" * 32)
    assert len(registry.contents) == 0


def test_the_memo_is_bounded_oldest_out() -> None:
    memo = ContentMemo(size=2)
    computed: list[str] = []

    def value(tag: str) -> tuple[str, bool]:
        computed.append(tag)
        return tag, True

    for tag in ("a", "b", "c"):
        assert memo.get(("x", "m", tag), functools.partial(value, tag)) == tag
    assert len(memo) == 2
    assert memo.get(("x", "m", "c"), lambda: value("c?")) == "c"  # kept
    assert memo.get(("x", "m", "a"), lambda: value("a")) == "a"  # the oldest went out: computed again
    assert computed == ["a", "b", "c", "a"]
    assert memo.get(("x", "m", "n"), lambda: ("not kept", False)) == "not kept"
    assert memo.get(("x", "m", "n"), lambda: ("again", False)) == "again"
