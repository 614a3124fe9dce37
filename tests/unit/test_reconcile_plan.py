"""Every branch of `reconcile.plan`: what the daemon restores and which drift it reports."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from controlplane.deploy.reconcile import Drift, plan
from controlplane.store.records import ModelRecord
from controlplane.triton.client import IndexEntry

pytestmark = pytest.mark.unit

A, B = "a" * 64, "b" * 64
NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def model(name: str, digest: str | None = A, state: str = "serving") -> ModelRecord:
    return ModelRecord(name, None, False, digest, state, None, NOW, NOW, None)


def ready(name: str, version: str = "1", state: str = "READY") -> IndexEntry:
    return IndexEntry(name, version, state, "")


def test_a_model_serving_its_digest_needs_nothing() -> None:
    result = plan([model("m")], [ready("m")], {"m": A})
    assert result.restore == [] and result.drift == []


def test_a_model_triton_does_not_have_ready_is_restored() -> None:
    result = plan([model("m"), model("d", B, "degraded")], [ready("m", state="UNAVAILABLE")], {})
    assert result.restore == [("d", B), ("m", A)]
    assert [(d.model, d.kind) for d in result.drift] == [("d", "missing"), ("m", "missing")]


def test_a_wrong_or_unstamped_digest_is_restored() -> None:
    result = plan([model("m"), model("n")], [ready("m"), ready("n")], {"m": B, "n": None})
    assert result.restore == [("m", A), ("n", A)]
    assert result.drift == [
        Drift("m", "wrong_digest", f"Triton serves {B[:12]}, should serve {A[:12]}"),
        Drift("n", "wrong_digest", f"Triton serves unstamped, should serve {A[:12]}"),
    ]


def test_models_not_meant_to_serve_are_never_restored_and_show_as_unmanaged_when_ready() -> None:
    records = [model("u", A, "unloaded"), model("f", A, "failed"), model("n", None, "serving"), model("x", A, "new")]
    result = plan(records, [ready("u"), ready("extra")], {"u": A, "extra": None})
    assert result.restore == []
    assert [(d.model, d.kind) for d in result.drift] == [("extra", "unmanaged"), ("u", "unmanaged")]


def test_busy_models_are_left_alone_this_round() -> None:
    result = plan([model("m")], [ready("other")], {}, busy=["m", "other"])
    assert result.restore == [] and result.drift == []
    assert Drift("m", "missing", "x").to_json() == {"model": "m", "kind": "missing", "detail": "x"}
