"""controlplane/startup/preload.py without a server: which models a fresh tritonserver loads in its own
start-up, and how the daemon tells its start-up loads progress from a hang (Triton's log lines)."""

from __future__ import annotations

from pathlib import Path

import pytest

from controlplane.deploy.publish import ServingRepository
from controlplane.errors import LauncherError
from controlplane.settings.config import Settings
from controlplane.startup.preload import LoadProgress, models_to_preload, preload_timeout_s
from controlplane.store import schema
from controlplane.store.registry import Registry

LOADED = 'I1202 05:08:14.713808 14386 model_lifecycle.cc:839] "successfully loaded \'{}\'"\n'
FAILED = 'I1202 05:08:14.914385 14386 model_lifecycle.cc:777] "failed to load \'{}\'"\n'
FAILED_DETAIL = ('E1202 05:08:14.914369 14386 model_lifecycle.cc:642] "failed to load \'{}\' version 1: '
                 'Internal: RuntimeError: boom\\n"\n')


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_progress_counts_each_finished_load_once_and_only_what_the_launch_appended(tmp_path: Path) -> None:
    log = tmp_path / "tritonserver.log"
    log.write_text(LOADED.format("from_an_earlier_run"))
    clock = Clock()
    progress = LoadProgress(log, total=3, stall_s=10, clock=clock)
    with log.open("a") as out:
        out.write(LOADED.format("a") + FAILED_DETAIL.format("b") + FAILED.format("b"))
        out.write(LOADED.format("c")[:30])  # a line Triton is still writing
    assert progress.poll() == 2
    with log.open("a") as out:
        out.write(LOADED.format("c")[30:])
    assert progress.poll() == 3


def test_progress_raises_only_once_no_load_finished_for_the_stall_window(tmp_path: Path) -> None:
    log = tmp_path / "tritonserver.log"
    clock = Clock()
    progress = LoadProgress(log, total=2, stall_s=10, clock=clock)  # no log yet: the server is starting
    clock.now += 9
    progress.check()
    log.write_text(LOADED.format("a"))
    clock.now += 9  # 18 s since the start, but a load finished just now
    progress.check()
    clock.now += 9.5
    progress.check()
    clock.now += 1
    with pytest.raises(LauncherError, match=r"1 of 2 finished, none in the last 10 s"):
        progress.check()


def test_the_launch_timeout_covers_every_wave_of_load_threads() -> None:
    settings = Settings(triton_load_threads=4, load_timeout_s=120.0)
    assert preload_timeout_s(settings, 4) == 60 + 120
    assert preload_timeout_s(settings, 5) == 60 + 2 * 120


def _serving(registry: Registry, serving: ServingRepository, tmp_path: Path, name: str, state: str,
             published: bool = True) -> None:
    registry.ensure_model(name)
    with registry.session() as session:
        row = session.query(schema.Model).filter_by(name=name).one()
        row.state, row.active_digest = state, "d" * 64
    if published:
        tree = tmp_path / "trees" / name
        tree.mkdir(parents=True)
        serving.link_path(name).symlink_to(tree)


def test_a_fresh_server_preloads_the_published_models_meant_to_serve_not_an_interrupted_one(
        registry: Registry, tmp_path: Path) -> None:
    serving = ServingRepository(tmp_path / "serving", tmp_path / "published")
    _serving(registry, serving, tmp_path, "serves", "serving")
    _serving(registry, serving, tmp_path, "degraded", "degraded")
    _serving(registry, serving, tmp_path, "unloaded", "unloaded")
    _serving(registry, serving, tmp_path, "unpublished", "serving", published=False)
    _serving(registry, serving, tmp_path, "interrupted", "serving")
    registry.begin_deployment("interrupted", "deploy", "e" * 64, "d" * 64, "tester")  # crash recovery decides
    assert models_to_preload(Settings(), registry, serving) == {"degraded": ["degraded"], "serves": ["serves"]}
    # each load must be admitted by the budget, the fleet's target decides, or the operator said no
    for off in (Settings(memory_budget_mb=1000.0), Settings(gpu_memory_budget_mb=1000.0), Settings(fleet=True),
                Settings(launch_loads_serving=False)):
        assert models_to_preload(off, registry, serving) == {}


def test_with_a_gateway_each_model_preloads_under_the_names_its_route_left(registry: Registry, tmp_path: Path) -> None:
    """With a gateway Triton knows only private names: a model is preloaded when its route (the routes file the
    gateway kept) points at its active digest, under every name of that route (a canary's two), published."""
    from controlplane.gateway.routes import Route, Target

    serving = ServingRepository(tmp_path / "serving", tmp_path / "published")
    active, older = "d" * 64, "c" * 64
    for name, state in (("one", "serving"), ("split", "serving"), ("stale", "serving"), ("unrouted", "serving"),
                        ("half", "serving")):
        _serving(registry, serving, tmp_path, name, state, published=False)
    for tree in ("one__dddddddd", "split__dddddddd", "split__cccccccc", "stale__cccccccc", "unrouted"):
        (tmp_path / "trees" / tree).mkdir(parents=True)
        serving.link_path(tree).symlink_to(tmp_path / "trees" / tree)
    routes = {
        "one": Route("one", (Target("one__dddddddd", active),)),
        "split": Route("split", (Target("split__dddddddd", active, 10), Target("split__cccccccc", older, 90))),
        "stale": Route("stale", (Target("stale__cccccccc", older),)),  # not the registry's digest: restored
        "half": Route("half", (Target("half__dddddddd", active),)),  # its tree is not published
    }
    preloads = models_to_preload(Settings(launch_triton=True), registry, serving, routes)
    assert preloads == {"one": ["one__dddddddd"], "split": ["split__dddddddd", "split__cccccccc"]}
    # a deploy open over it (this start's staged one, or a crash's) loads another name: what the route reaches
    # serves until that deploy switches it (in place, the same name: not preloaded, as above)
    registry.begin_deployment("one", "deploy", "e" * 64, active, "tester")
    assert models_to_preload(Settings(launch_triton=True), registry, serving, routes) == preloads
    # without a gateway (no routes): each model under its own name, published as such
    assert models_to_preload(Settings(), registry, serving) == {"unrouted": ["unrouted"]}
