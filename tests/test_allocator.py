"""The daemon caps glibc's malloc arenas before its threads start (controlplane/runtime/allocator.py: its peak
RSS in a first start at 10,000 models, 361 MB with glibc's default arenas, 271 MB with two); an
operator's own MALLOC_ARENA_MAX stands instead."""

from __future__ import annotations

import platform

import pytest

from controlplane.runtime.allocator import cap_arenas


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_arenas_are_capped_on_glibc(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MALLOC_ARENA_MAX", raising=False)
    assert cap_arenas() is True


def test_the_environments_malloc_arena_max_stands(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MALLOC_ARENA_MAX", "8")
    assert cap_arenas() is False
