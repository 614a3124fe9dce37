"""Reconcile's view of Triton at scale: one repository-index call per round; a served digest is read
only where it can have changed (newly READY, not what the registry wants) plus a rotating slice, so
every model is still checked within a bounded number of rounds (issue 15, item 2)."""

from __future__ import annotations

from controlplane.servedview import ServedView
from controlplane.triton.client import IndexEntry


class StandIn:
    """Triton's index and served configs, counting the calls."""

    def __init__(self, served: dict[str, str]) -> None:
        self.served = served
        self.ready = set(served)
        self.index_calls = 0
        self.digest_calls: list[str] = []

    def index(self) -> list[IndexEntry]:
        self.index_calls += 1
        return [IndexEntry(n, "1", "READY" if n in self.ready else "UNAVAILABLE", "") for n in sorted(self.served)]

    def served_digest(self, model: str) -> str | None:
        self.digest_calls.append(model)
        return self.served[model]


def test_steady_state_costs_one_index_call_and_a_bounded_slice() -> None:
    names = [f"m{i:04d}" for i in range(1000)]
    triton = StandIn({n: "d1" for n in names})
    wanted = {n: "d1" for n in names}
    view = ServedView(recheck_per_round=50)
    _, served = view.view(triton, wanted)
    assert served == wanted and len(triton.digest_calls) == 1000  # first round: nothing known yet
    triton.digest_calls.clear()
    for _ in range(20):
        _, served = view.view(triton, wanted)
        assert served == wanted
    assert triton.index_calls == 21
    assert len(triton.digest_calls) == 20 * 50
    assert set(triton.digest_calls) == set(names)  # every model re-read within 1000/50 rounds


def test_a_change_is_read_fresh_where_it_can_have_happened() -> None:
    triton = StandIn({"a": "d1", "b": "d1", "c": "d1"})
    view = ServedView(recheck_per_round=0)
    view.view(triton, {"a": "d1", "b": "d1", "c": "d1"})
    triton.digest_calls.clear()
    # a deployed between rounds (registry wants d2, Triton serves d2): read, not reported as drift
    triton.served["a"] = "d2"
    # b reloaded by someone else behind our back while staying READY, registry unchanged: not seen...
    triton.served["b"] = "d9"
    # c went away and came back (a Triton restart): read fresh
    triton.ready.discard("c")
    _, served = view.view(triton, {"a": "d2", "b": "d1", "c": "d1"})
    assert "c" not in served
    triton.ready.add("c")
    triton.served["c"] = "d7"
    _, served = view.view(triton, {"a": "d2", "b": "d1", "c": "d1"})
    assert served["a"] == "d2" and served["c"] == "d7"
    assert served["b"] == "d1"  # ...until the rotating slice reaches it (recheck_per_round=0 here: never)
    assert sorted(triton.digest_calls) == ["a", "c"]
    view.recheck_per_round = 3  # the slice now covers every model: b's reload is found and is drift
    _, served = view.view(triton, {"a": "d2", "b": "d1", "c": "d1"})
    assert served["b"] == "d9"


def test_without_the_registry_view_every_digest_is_read() -> None:
    triton = StandIn({"a": "d1", "b": "d1"})
    view = ServedView()
    view.view(triton, {"a": "d1", "b": "d1"})
    triton.digest_calls.clear()
    view.view(triton, None)
    assert sorted(triton.digest_calls) == ["a", "b"]
