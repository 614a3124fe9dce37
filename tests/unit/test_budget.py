"""controlplane/memory/budget.py over a real SQLite registry: the GPU budget, whose footprints this machine cannot
measure (no GPU), exercised with declared footprints as the stand-in (docs: README "Memory budget");
the eviction order and what is never evicted; the refusal naming the budget, the footprint and the holders.
The host-memory budget against the real tritonserver is tests/test_budget_e2e.py."""

from __future__ import annotations

from datetime import timedelta

import pytest

from controlplane.errors import BudgetError
from controlplane.memory import budget
from controlplane.memory.budget import Hooks, MemoryGuard
from controlplane.memory.footprint import Meter, declared
from controlplane.store import schema
from controlplane.store.records import ModelRecord
from controlplane.store.registry import Registry, utcnow

GPU = {"parameters": {"tritonctl.gpu_footprint_mb": {"string_value": "400"}}}


class Plane:
    """The guard's hooks over the registry: eviction marks the model unloaded, as the Deployer's does."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self.last: dict[str, float] = {}
        self.leased: set[str] = set()
        self.evicted: list[str] = []

    def evict(self, model: str, why: str) -> bool:
        self.evicted.append(model)
        self.registry.update_model(model, state="unloaded")
        return True

    def hooks(self) -> Hooks:
        return Hooks(last_used=lambda: dict(self.last), held=lambda m: m in self.leased, evict=self.evict)


def serve(registry: Registry, model: str, gpu_mb: float, *, pinned: bool = False) -> str:
    digest = model[0] * 64
    registry.ensure_model(model)
    with registry.session() as session:
        row = session.query(schema.Model).filter_by(name=model).one()
        row.state, row.active_digest, row.pinned = "serving", digest, pinned
        row.active_since = utcnow() - timedelta(hours=1)
    registry.record_footprint(model, digest, None, gpu_mb, "declared")
    return digest


def test_a_declared_footprint_is_read_from_the_config_parameters() -> None:
    assert declared(GPU) is not None and declared(GPU).gpu_memory_mb == 400.0  # type: ignore[union-attr]
    assert declared({"parameters": {"tritonctl.footprint_mb": {"string_value": "ten"}}}) is None
    assert declared(None) is None


def test_gpu_budget_evicts_least_recently_used_first_never_leased_pinned_or_protected(registry: Registry) -> None:
    plane = Plane(registry)
    for name in ("old", "recent", "leased", "pinned", "guarded"):
        serve(registry, name, 200, pinned=name == "pinned")
    registry.move_tag("guarded", "stable", "g" * 64, actor="test")
    plane.last = {"old": 1000.0, "recent": 2_000_000_000.0}  # "recent" inferred last (seconds since the epoch)
    plane.leased = {"leased"}
    guard = MemoryGuard(registry, Meter(), plane.hooks(), gpu_memory_budget_mb=1200)
    ticket = guard.admit("new", "n" * 64, GPU, None)  # 5 × 200 + 400 > 1200: one must go
    assert plane.evicted == ["old"]
    guard.settle(ticket, loaded=True)  # nothing measurable here: the declared footprint is recorded
    assert registry.footprints(["new"])[("new", "n" * 64)].gpu_memory_mb == 400.0

    plane.evicted.clear()
    serve(registry, "new", 400)
    with pytest.raises(BudgetError) as refused:  # 900 cannot fit beside the 600 no one may evict: none is evicted
        guard.admit("big", "x" * 64, {"parameters": {"tritonctl.gpu_footprint_mb": {"string_value": "900"}}}, None)
    assert plane.evicted == []
    message = str(refused.value)
    assert "needs 900 MB per GPU" in message and "gpu_memory_budget_mb = 1200 MB" in message
    assert all(name in message for name in ("leased", "pinned", "guarded")), message
    assert "recent" not in message and "new " not in message  # evictable: not what holds the memory

    guard.admit("mid", "m" * 64, {"parameters": {"tritonctl.gpu_footprint_mb": {"string_value": "550"}}}, None)
    assert plane.evicted == ["new", "recent"]  # 600 + 600 + 550 > 1200: the least recently used two go


def test_no_budget_evicts_nothing(registry: Registry) -> None:
    plane = Plane(registry)
    serve(registry, "a", 10_000)
    guard = MemoryGuard(registry, Meter(), plane.hooks())
    guard.settle(guard.admit("b", "b" * 64, GPU, None), loaded=True)
    assert plane.evicted == []


def test_a_staged_copy_counts_beside_the_serving_model_until_settled(registry: Registry) -> None:
    """A change set stages a step's new content under a private name while the step still serves
    (controlplane/deploy/plans.py): both count. Room for the copy is made by evicting another idle model,
    never the step itself; until the copy is settled it holds its footprint, named as a holder."""
    plane = Plane(registry)
    serve(registry, "step", 600)
    serve(registry, "idle", 300)
    guard = MemoryGuard(registry, Meter(), plane.hooks(), gpu_memory_budget_mb=1300)
    copy = guard.admit("step", "n" * 64, GPU, None, name="step__nnnnnnnn")  # the step's own 600 MB: 1500 > 1300
    assert plane.evicted == ["idle"]
    plane.leased.add("step")  # in use: the next load cannot evict it
    small = {"parameters": {"tritonctl.gpu_footprint_mb": {"string_value": "200"}}}
    with pytest.raises(BudgetError) as refused:  # 600 + the copy's 600 + 200 > 1300
        guard.admit("other", "o" * 64, small, None)
    assert "step__nnnnnnnn 600 MB" in str(refused.value), refused.value
    guard.settle(copy, loaded=True)  # measured (declared here) just before the copy is dropped
    guard.settle(guard.admit("other", "o" * 64, small, None), loaded=True)  # 600 + 200 fits
    assert plane.evicted == ["idle"]


def test_stubs_that_outlive_the_wait_for_them_count_as_held(registry: Registry,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """An evicted model's stubs normally exit about a second after Triton's unload; the budget waits for
    the last evicted model's stubs before evicting the next, at most EXIT_WAIT_S. A stub that outlives that
    wait (bench/results/ondemand.json: one ran 30 s on a loaded machine) still holds its memory, so it
    counts as held until it exits and the next admission makes room for it too. A real server cannot show
    a lingering stub on demand: the stubs here are stand-in pids, the only fake of this file."""
    plane = Plane(registry)
    for name in ("a", "b", "c"):
        serve(registry, name, 400)
        plane.last[name] = {"a": 1.0, "b": 2.0, "c": 3.0}[name]  # least recently used first: a, b, c
    alive = {"a": {4001}, "b": {4002}}  # the stubs each unload leaves running
    monkeypatch.setattr(budget, "stub_pids", lambda model, server=None: set(alive.get(model, set())))
    monkeypatch.setattr(budget, "running", lambda pids: 4001 in pids)  # a's stub never exits; b's does
    monkeypatch.setattr(budget, "EXIT_WAIT_S", 0.05)
    guard = MemoryGuard(registry, Meter(), plane.hooks(), gpu_memory_budget_mb=1300)
    guard.settle(guard.admit("new", "n" * 64, GPU, None), loaded=True)  # 1200 + 400 > 1300: a goes
    serve(registry, "new", 400)
    assert plane.evicted == ["a"]
    guard.admit("next", "x" * 64, GPU, None)  # b goes; a's stub outlived the wait: it counts, so c goes too
    assert plane.evicted == ["a", "b", "c"]
    held = dict(guard.holdings())
    assert held["a (evicted, exiting)"] == {"memory_mb": 0.0, "gpu_memory_mb": 400.0}
    assert "b (evicted, exiting)" not in held and "c (evicted, exiting)" not in held  # exited; evicted last


def test_the_idle_sweep_reads_the_serving_models_again_only_after_a_registry_write(
        registry: Registry, monkeypatch: pytest.MonkeyPatch) -> None:
    """The on-demand sweep runs every second. Reading every serving model each time was 42 % of an idle
    daemon's CPU at 1,000 models under policy auto (py-spy; issue 26): it reads them again only once
    the registry was written."""
    import threading
    import time

    from controlplane.memory.leases import LeaseBook
    from controlplane.memory.ondemand import OnDemand

    for name in ("a", "b"):
        serve(registry, name, 100)
    reads: list[int] = []
    real = registry.list_models
    monkeypatch.setattr(registry, "list_models", lambda *a, **k: reads.append(1) or real(*a, **k))
    deployer = type("Deployer", (), {"lock": staticmethod(lambda _m: threading.Lock())})()
    triton = type("Triton", (), {"last_inferences": staticmethod(lambda: {"b": time.time()})})()  # b: in use
    sweep = OnDemand(registry, deployer, triton, LeaseBook(), lambda m: m.policy or "auto",  # type: ignore[arg-type]
                     lambda: 60.0).sweep
    assert sweep() == [] and sweep() == [] and len(reads) == 1  # nothing on demand; read once
    registry.update_model("b", policy="ondemand")  # a write: the next sweep reads again, and sees it
    assert sweep() == [] and len(reads) == 2


def test_the_idle_sweep_looks_at_each_serving_models_policy_only_after_a_change(registry: Registry) -> None:
    """Picking the on-demand models out of every serving one each second grows with N (issue 26: idle CPU
    at 10,000 serving models): the sweep does it again only after a registry write or a new default
    policy (a reload), and still finds a model whose policy became ondemand."""
    import threading
    import time

    from controlplane.memory.leases import LeaseBook
    from controlplane.memory.ondemand import OnDemand

    for name in ("a", "b", "c"):
        serve(registry, name, 100)
    default = ["auto"]
    asked: list[str] = []

    def policy_of(m: ModelRecord) -> str:
        asked.append(m.name)
        return m.policy or default[0]

    evicted: list[str] = []

    def evict(model: str, actor: str, reason: str, unless: object = None) -> bool:
        evicted.append(model)
        return True

    deployer = type("Deployer", (), {"lock": staticmethod(lambda _m: threading.Lock()),
                                     "evict": staticmethod(evict)})()
    triton = type("Triton", (), {"last_inferences": staticmethod(lambda: {"b": time.time()})})()  # b: in use
    ondemand = OnDemand(registry, deployer, triton, LeaseBook(), policy_of, lambda: 60.0)  # type: ignore[arg-type]
    assert ondemand.sweep() == []
    looked = len(asked)
    assert ondemand.sweep() == [] and ondemand.sweep() == []
    assert [n for n in asked[looked:] if n] == []  # only the default policy was asked, no model's
    registry.update_model("b", policy="ondemand")  # a write: looked at again; b is in use, so it stays
    looked = len(asked)
    assert ondemand.sweep() == [] and {"a", "b", "c"} <= set(asked[looked:]) and evicted == []
    default[0] = "ondemand"  # a reload: a and c follow the default now, idle since they served an hour ago
    assert sorted(ondemand.sweep()) == ["a", "c"] and sorted(evicted) == ["a", "c"]


def test_blocked_says_whether_a_load_waits_for_room_or_never_finds_it(registry: Registry) -> None:
    """A request's load (controlplane/memory/onrequest.py) is refused at once when the pinned and protected
    models alone leave no room, and waits while leased ones hold it (a lease ends)."""
    plane = Plane(registry)
    serve(registry, "pinned", 600, pinned=True)
    serve(registry, "leased", 400)
    serve(registry, "idle", 300)
    plane.leased = {"leased"}
    guard = MemoryGuard(registry, Meter(), plane.hooks(), gpu_memory_budget_mb=1200)
    small = {"parameters": {"tritonctl.gpu_footprint_mb": {"string_value": "150"}}}
    assert guard.blocked("new", "n" * 64, small) is None  # evicting idle makes room: not blocked
    mid = {"parameters": {"tritonctl.gpu_footprint_mb": {"string_value": "500"}}}
    message, never = guard.blocked("new", "n" * 64, mid) or ("", True)
    assert not never and "leased 400 MB" in message and "pinned 600 MB" in message, message  # waits for the lease
    big = {"parameters": {"tritonctl.gpu_footprint_mb": {"string_value": "700"}}}
    message, never = guard.blocked("new", "n" * 64, big) or ("", False)
    assert never and "gpu_memory_budget_mb = 1200 MB" in message, message  # 600 pinned + 700 > 1200
    assert plane.evicted == []  # a question only
