"""controlplane/fleet/placement.py: which host of a fleet an on-demand model is placed on, from each live
host's budget and holdings (a pure function; the one-at-a-time recording under PostgreSQL's lock and the
end-to-end path through two real daemons are tests/test_fleet_placement_e2e.py)."""

from __future__ import annotations

import pytest

from controlplane.errors import BudgetError
from controlplane.fleet.placement import Holding, HostRoom, place

pytestmark = pytest.mark.unit

NEED = {"memory_mb": 150.0, "gpu_memory_mb": 0.0}


def test_a_host_that_has_it_serves_it_whatever_its_room() -> None:
    rooms = [HostRoom("h1", 100.0, holdings=(Holding("x", 100.0),)), HostRoom("h2", 1000.0)]
    choice = place("m", NEED, rooms, has_it=["h1"])
    assert (choice.host, choice.reason) == ("h1", "has it")


def test_a_dead_host_that_had_it_does_not_count() -> None:
    choice = place("m", NEED, [HostRoom("h2", 1000.0)], has_it=["h1"])
    assert (choice.host, choice.reason) == ("h2", "placed")


def test_the_host_with_the_most_room_left_wins_then_the_name() -> None:
    rooms = [HostRoom("h1", 300.0, holdings=(Holding("a", 140.0),)), HostRoom("h2", 300.0), HostRoom("h3", 300.0)]
    assert place("m", NEED, rooms).host == "h2"  # h2 and h3 tie on room: by name
    assert "placed on h2" in place("m", NEED, rooms).message


def test_a_host_without_a_budget_has_unlimited_room() -> None:
    rooms = [HostRoom("h1", 10_000.0), HostRoom("h2", None, holdings=(Holding("a", 5000.0),))]
    assert place("m", NEED, rooms).host == "h2"


def test_the_gpu_budget_counts_too() -> None:
    need = {"memory_mb": 10.0, "gpu_memory_mb": 400.0}
    rooms = [HostRoom("h1", 10_000.0, 500.0, (Holding("a", 10.0, 300.0),)), HostRoom("h2", 100.0, 1000.0)]
    assert place("m", need, rooms).host == "h2"  # h1 has memory, not GPU memory


def test_without_free_room_a_host_that_can_evict_idle_models_is_chosen() -> None:
    rooms = [HostRoom("h1", 200.0, holdings=(Holding("a", 150.0, evictable=False),)),
             HostRoom("h2", 200.0, holdings=(Holding("b", 100.0, evictable=True), Holding("c", 50.0, evictable=False)))]
    choice = place("m", NEED, rooms)
    assert (choice.host, choice.reason) == ("h2", "evicts")


def test_no_room_anywhere_names_every_budget_and_what_holds_it() -> None:
    rooms = [HostRoom("h1", 200.0, holdings=(Holding("a", 150.0),)), HostRoom("h2", 100.0)]
    with pytest.raises(BudgetError) as caught:
        place("big", {"memory_mb": 5000.0}, rooms)
    message = str(caught.value)
    assert "big needs 5000 MB" in message
    assert "h1: memory_budget_mb = 200 MB, 150 MB held by a 150 MB" in message
    assert "h2: memory_budget_mb = 100 MB, 0 MB held by nothing" in message


def test_no_live_host_is_an_error() -> None:
    with pytest.raises(BudgetError, match="no live host"):
        place("m", NEED, [])


def test_a_request_places_on_the_host_it_arrived_at_when_that_host_has_or_can_make_room() -> None:
    """A request at h1's gateway (controlplane/memory/onrequest.py) prefers h1 over the host with the most room;
    a host that has the model already still wins; a preferred host without room is passed over."""
    roomy, tight = HostRoom("h2", 1000.0), HostRoom("h1", 300.0, holdings=(Holding("idle", 200.0, 0.0, True),))
    assert place("m", NEED, [roomy, tight]).host == "h2"
    choice = place("m", NEED, [roomy, tight], prefer="h1")
    assert (choice.host, choice.reason) == ("h1", "evicts") and "where a request for it arrived" in choice.message
    assert place("m", NEED, [roomy, tight], has_it=["h2"], prefer="h1").host == "h2"
    full = HostRoom("h1", 300.0, holdings=(Holding("pinned", 250.0, 0.0, False),))
    assert place("m", NEED, [roomy, full], prefer="h1").host == "h2"
