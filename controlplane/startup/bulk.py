"""A first start's deploys loaded by the launching tritonserver's own start-up, not one load request each.

Why: Triton's explicit load request copies its whole model table and dependency graph under one global
lock (triton-inference-server/core, `ModelRepositoryManager::LoadUnloadModels`), so the n-th request
costs O(n) and a request per model O(N²): every model serving under auto policy on a first start took
43.6 s at 1,000 models and 2,228 s at 10,000, where `tritonserver --load-model=*` loads the same
repository in 1.0 s and 2.74 s (issue 39). Triton has no multi-model load request, but its start-up
loads a `--load-model` list in one pass of its load threads.

So when the daemon launches a fresh tritonserver at its start (a first start, a start after a reboot),
the start-up scan's changed models are captured, validated and recorded first (controlplane/startup/
record.py), and each one auto policy deploys alone is *staged* (controlplane/deploy/staged.py
`stage_many`: validated, its deployment begun, its tree published: the same deployment and audit rows
as any deploy, the same `BRING_UP` steps, each step's records written for the whole wave in one
transaction). The server is then launched with them and the models the registry already serves
(controlplane/startup/preload.py) in its `--load-model` list, and once it is live they are verified in
bulk, FINISH_CHUNK at a time: one repository index says which loaded; each loaded one goes on from `verify` (its served
digest, its smoke requests) and commits, each step's records again in one transaction (`finish_many`);
one that failed there is a failed deploy like any other, with Triton's reason from its log (rolled
back where a previous digest exists, quarantined when the content is at fault). If the launch with
preloads fails (a load that hangs), the server is launched without them and each staged deploy loads by
its own request, as before.

Not bulk (per-model loads as before, `eligible`): a memory budget (each load is admitted and measured
against the budget), a fleet host (it converges to the fleet's target, host by host), an external
tritonserver (it serves already; it is not started by the daemon), and `launch_loads_serving = false`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor
from contextlib import ExitStack
from dataclasses import dataclass, field

from controlplane.deploy.staged import finish_many, stage_many
from controlplane.deploy.steps import Staged
from controlplane.documents.results import Outcome
from controlplane.errors import TritonctlError, TritonError
from controlplane.ports import WavePlane
from controlplane.settings.config import Settings
from controlplane.store.records import SnapshotRecord
from controlplane.triton.capabilities import from_triton_reason
from controlplane.triton.client import IndexEntry
from controlplane.triton.serverlog import LogCursor, LogLine, parse_lines, reasons_for, summarise
from controlplane.vocab import WATCHER_ACTOR

log = logging.getLogger("tritonctl.startbulk")

READY = "READY"
# Staged deploys ended at a time once the server is live. All of a wave at once, every deploy's steps,
# records and outcome were held until the last one committed: the daemon's peak RSS in a first start
# under auto policy (issue 39); a chunk's are let go before the next one's are made.
FINISH_CHUNK = 500


def eligible(settings: Settings) -> bool:
    """Whether the daemon's start may load through a launching tritonserver's own start-up."""
    return (settings.launch_triton and settings.launch_loads_serving and not settings.fleet
            and settings.memory_budget_mb is None and settings.gpu_memory_budget_mb is None)


@dataclass
class Bulk:
    """A first start's staged deploys, and what became of them."""

    staged: list[Staged] = field(default_factory=list)  # emptied as they end (`finish_all`)
    handed_back: list[str] = field(default_factory=list)  # the source changed meanwhile: the watcher's path

    @property
    def names(self) -> list[str]:
        """What tritonserver's start-up loads: each deploy's name there (its private name with a gateway)."""
        return [s.bring_up.served_as for s in self.staged]


def stage_all(plane: WavePlane, deploy: Sequence[tuple[str, str]], pool: Executor,
              staged: dict[str, SnapshotRecord]) -> Bulk:
    """Stage each (model, digest) the start-up scan recorded and may deploy alone, under its capture lock
    and only if its source still holds that content (`deploy_alone`'s rule), all of them at once
    (controlplane/deploy/staged.py). A model whose capture lock another thread holds (a change handed on
    meanwhile) is handed back too: the wave never waits for one lock while it holds others. `staged`: the
    deploys staged so far (an ensemble's steps among them count as served: the same start-up loads them
    first); the ones staged here are added."""
    out = Bulk()
    overrides = dict(staged)
    with ExitStack() as captures:
        items: list[tuple[str, str]] = []
        for model, digest in deploy:
            lock = plane.capture_lock(model)
            if not lock.acquire(blocking=False):
                out.handed_back.append(model)
                continue
            captures.callback(lock.release)
            entry = plane.source_graph.entry(model)
            if entry is None or entry.digest != digest or plane.source_changed(model, unknown=False):
                out.handed_back.append(model)
            else:
                items.append((model, digest))
        for result in stage_many(plane.deployer, items, WATCHER_ACTOR, pool, overrides):
            if isinstance(result, Staged):  # else refused: its outcome is reported like any deploy's
                out.staged.append(result)
                staged[result.model] = result.snap
    return out


def startup_failure(name: str, entry: IndexEntry | None, lines_reason: str, url: str) -> TritonctlError:
    """The error of a model the start-up did not load, with Triton's reason (its log, else its index)."""
    reason = lines_reason or (entry.reason if entry is not None else "") or "not loaded"
    message = f"load '{name}' in tritonserver's start-up: {reason}"
    return from_triton_reason(message, url) or TritonError(message)


def log_lines(cursor: LogCursor) -> list[LogLine]:
    """The launched server's log since `cursor`: its start-up's reasons for the loads that failed."""
    return parse_lines(cursor.read_new())


def finish_all(plane: WavePlane, bulk: Bulk, *, loaded: bool, lines: Sequence[LogLine],
               index: Callable[[], list[IndexEntry]], url: str, pool: Executor) -> None:
    """End the staged deploys once the server is live. `loaded`: it was launched with them (verified in
    bulk from one repository index; the reasons of those that failed from its start-up's log `lines`);
    not `loaded`: each is loaded by its own request."""
    if not bulk.staged:
        return
    failures: dict[str, TritonctlError] = {}
    indexed: dict[str, list[str]] = {}  # READY versions per model, from the one index
    if loaded:
        entries: dict[str, IndexEntry] = {}
        try:
            for entry in index():
                if entry.state == READY or entry.name not in entries:
                    entries[entry.name] = entry
                if entry.state == READY and entry.version:
                    indexed.setdefault(entry.name, []).append(entry.version)
        except TritonctlError as exc:
            log.warning("repository index after tritonserver's start-up: %s; verifying each model", exc)
            entries = {s.bring_up.served_as: IndexEntry(s.bring_up.served_as, "", READY, "") for s in bulk.staged}
        for s in bulk.staged:
            name = s.bring_up.served_as  # its name in tritonserver (a private name with a gateway)
            found = entries.get(name)
            if found is None or found.state != READY:
                failures[s.model] = startup_failure(name, found, summarise(reasons_for(name, lines)), url)
        plane.counts.add("startup_loads", len(bulk.staged) - len(failures))

    def finish(s: Staged) -> Outcome:  # one by one: loaded by its own request, or failed in the start-up
        return plane.deployer.finish_staged(s, failure=failures.get(s.model))

    count = len(bulk.staged)
    alone = [s for s in bulk.staged if not loaded or s.model in failures]
    together = [s for s in bulk.staged if loaded and s.model not in failures]
    bulk.staged = []  # each ended deploy let go, its steps and records with it (see FINISH_CHUNK)
    for chunk in _chunks(alone):  # each outcome reported as it ends, like any deploy's
        list(pool.map(finish, chunk))
    for chunk in _chunks(together):  # verified, smoke-tested and committed together
        finish_many(plane.deployer, chunk, indexed, pool)
    log.info("start-up: %d models deployed through tritonserver's start-up (%d failed there)%s",
             count, len(failures), "" if loaded else "; launched without them: one load request each")


def _chunks(staged: list[Staged]) -> Iterator[list[Staged]]:
    """`staged` in chunks of FINISH_CHUNK, each taken out of it as it is handed on."""
    while staged:
        chunk = staged[:FINISH_CHUNK]
        del staged[:FINISH_CHUNK]
        yield chunk
