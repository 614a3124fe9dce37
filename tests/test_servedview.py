"""Reconcile's view of Triton at scale: one repository-index call per round; a served digest is read
only where it can have changed (newly READY, not what the registry wants) plus a rotating slice, so
every model is still checked within a bounded number of rounds (issue 15, item 2)."""

from __future__ import annotations

from controlplane.deploy.servedview import ServedView
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


def test_a_deploys_own_verification_is_taken_as_read() -> None:
    """A first start that deployed N models: each deploy verified its served digest, and noted it, so
    the next round reads none of them again (it read all N before: seconds for the first `status`)."""
    names = [f"m{i:04d}" for i in range(500)]
    triton = StandIn({})
    view = ServedView(recheck_per_round=5)
    view.view(triton, {})
    for name in names:  # deployed one by one between two rounds, each verified
        triton.served[name] = "d1"
        triton.ready.add(name)
        view.note(name, "d1")
    _, served = view.view(triton, dict.fromkeys(names, "d1"))
    assert served == dict.fromkeys(names, "d1")
    assert len(triton.digest_calls) == 5  # the rotating slice only


def test_a_note_newer_than_the_rounds_index_outlives_the_round() -> None:
    """A deploy that ends while a round runs (after its index call, which did not show the model READY
    yet) keeps its note; a note older than the round's index gives way to what the round read."""
    triton = StandIn({"old": "d1"})
    view = ServedView(recheck_per_round=0)
    view.view(triton, {"old": "d1"})

    class MidRound(StandIn):
        def index(self) -> list[IndexEntry]:
            entries = super().index()
            view.note("new", "d5")  # verified right after this round's index call
            return entries

    mid = MidRound({"old": "d1"})
    mid.served["new"] = "d5"
    mid.ready.discard("new")
    view.view(mid, {"old": "d1", "new": "d5"})
    mid.ready.add("new")
    mid.digest_calls.clear()
    _, served = view.view(mid, {"old": "d1", "new": "d5"})
    assert served["new"] == "d5" and mid.digest_calls == []  # the note held across the round

    view.note("old", "d1")  # then Triton is found serving another digest for it: the reading wins
    mid.served["old"] = "d9"
    view.recheck_per_round = 2
    _, served = view.view(mid, {"old": "d1", "new": "d5"})
    assert served["old"] == "d9"


class SameList(StandIn):
    """As the real client does: an index equal to the last one comes back as the very same list."""

    def __init__(self, served: dict[str, str]) -> None:
        super().__init__(served)
        self._last: list[IndexEntry] | None = None

    def index(self) -> list[IndexEntry]:
        entries = super().index()
        if self._last is not None and self._last == entries:
            return self._last
        self._last = entries
        return entries


def test_an_unchanged_round_reads_only_its_slice_and_returns_what_it_saw() -> None:
    """Issue 39, item 3: with the same index list and registry view and no note, a round re-reads only
    the slice (and what did not match) and returns the same dicts, so the reconcile keeps its plan."""
    names = [f"m{i:03d}" for i in range(100)]
    triton = SameList(dict.fromkeys(names, "d1"))
    triton.served["m007"] = "d9"  # serves another digest than the registry wants: re-read every round
    wanted = dict.fromkeys(names, "d1")
    view = ServedView(recheck_per_round=10)
    first_index, first = view.public(triton, wanted=wanted)
    triton.digest_calls.clear()
    for _ in range(10):
        index, served = view.public(triton, wanted=wanted)
        assert index is first_index and served is first  # the same objects: nothing to plan again
    assert triton.digest_calls.count("m007") == 10 + 1  # every round, and once in the slice
    assert set(triton.digest_calls) == set(names)  # every model re-read within 100/10 rounds
    assert len(triton.digest_calls) == 10 * 11

    triton.served["m050"] = "d8"  # reloaded behind our back, still READY: the slice finds it
    for _ in range(10):
        _, served = view.public(triton, wanted=wanted)
    assert served["m050"] == "d8" and served is not first

    settled = view.public(triton, wanted=wanted)[1]
    view.note("m007", "d1")  # a deploy verified between rounds: the next round is a full one
    triton.served["m007"] = "d1"
    _, served = view.public(triton, wanted=wanted)
    assert served is not settled and served["m007"] == "d1"

    triton.ready.discard("m001")  # the index changed: a full round
    _, served = view.public(triton, wanted=wanted)
    assert "m001" not in served
