"""Triton made to serve what the registry says, every supervision round and after every start.

`Reconciler.reconcile` finishes the deployments a stopped daemon left open (`Deployer.recover`, steps
before the ensembles over them), plans from the registry's desired state against one repository-index
call (deploy/reconcile.py `plan`, over deploy/servedview.py), restores what Triton does not serve (in waves,
as many at once as Triton loads; a restore that keeps failing backs off in the `restores` book), sweeps
a change set's private step names once, and keeps the sentinel: a model seen READY, which supervision
asks Triton for between rounds (`restart_suspected`). A fresh tritonserver that loaded models in its
own start-up (`preloaded`) has those verified and audited as restores by the next round.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from controlplane.deploy.causes import RetryBook
from controlplane.deploy.engine import Deployer
from controlplane.deploy.reconcile import Drift, Plan, plan
from controlplane.deploy.servedview import ServedView
from controlplane.deploy.servingensembles import ServingEnsembles
from controlplane.documents.results import Outcome
from controlplane.errors import TritonctlError
from controlplane.outcomes.counters import Counters
from controlplane.store.records import ModelRecord
from controlplane.store.registry import AuditEntry, Registry
from controlplane.triton.client import TritonClient
from controlplane.vocab import SERVING_STATES, Result

log = logging.getLogger("tritonctl.reconcile")


class Reconciler:
    """Recoveries, restores and the sentinel of one daemon (see the module's docstring). `parallelism`:
    how many models go to Triton at once (the plane's setting, which SIGHUP may change)."""

    def __init__(self, registry: Registry, triton: TritonClient, deployer: Deployer,
                 serving_ensembles: ServingEnsembles, served_view: ServedView, counters: Counters,
                 restores: RetryBook, parallelism: Callable[[], int]) -> None:
        self.registry = registry
        self.triton = triton
        self.deployer = deployer
        self.serving_ensembles = serving_ensembles
        self.served_view = served_view
        self.counters = counters
        self.restores = restores
        self.parallelism = parallelism
        self.sentinel: str | None = None  # a model seen READY: supervision asks Triton for it (restart_suspected)
        self._swept = False  # private names left by a stopped daemon: removed once, at the first reconcile
        self._preloaded: set[str] = set()  # loaded in a fresh tritonserver's start-up, to verify
        self._planned: tuple[Any, Any, Any, Plan, set[str]] | None = None  # (desired, index, served, plan, READY)

    def note(self, outcome: Outcome) -> None:
        """An outcome subscriber: the first model a deploy or restore made serve is the sentinel until a
        reconcile picks one."""
        if self.sentinel is None and outcome.outcome == "ok" and outcome.action in ("deploy", "restore"):
            self.sentinel = outcome.model

    def reconcile(self) -> list[Drift]:
        """Compare desired and actual; restore what should serve; finish interrupted deployments."""
        if not self.triton.server_live():
            self.counters.triton_reachable = False
            return []
        self.counters.triton_reachable = True
        waiting: list[str] = []  # Triton still loads them: nothing may re-point them this round
        opened = self.registry.open_deployments()
        rank = {m: i for i, m in enumerate(self.serving_ensembles.steps_first([d.model for d in opened]))}
        for deployment in sorted(opened, key=lambda d: rank[d.model]):  # steps before ensembles
            if self.deployer.lock(deployment.model).locked():
                continue  # in flight in this process (one that finished since `opened` was read: recover sees it)
            outcome = self.deployer.recover(deployment)  # one model, or a change set's ensemble (rolled forward)
            if outcome is None:
                waiting.append(deployment.model)
                continue
            log.warning("%s: recovered interrupted %s: %s", deployment.model, deployment.kind, outcome.message)
        busy = [*self.deployer.busy_models(), *waiting]
        # plan() looks only at models meant to serve: do not list every model of the repository
        desired = self.registry.serving_models()
        index, served = self.served_view.public(self.triton, desired)
        memo = self._planned  # the same lists as the round before (deploy/servedview.py), nothing busy: the same plan
        if busy or memo is None or memo[0] is not desired or memo[1] is not index or memo[2] is not served:
            memo = (desired, index, served, plan(desired, index, served, busy),
                    {e.name for e in index if e.state == "READY"})
            self._planned = None if busy else memo
        result, ready = memo[3], memo[4]
        self.sentinel = next((m.name for m in desired if m.name in ready and m.active_digest), None)
        digests = dict(result.restore)
        self._audit_preloaded(desired, ready, digests, busy)
        for model, owed in self.restores.all().items():  # serves again, or no longer meant to: no backoff
            if digests.get(model) != owed.digest and model not in busy:
                self.restores.clear(model)
        now = time.time()
        due = [m for m in digests if not ((b := self.restores.get(m)) is not None and b.digest == digests[m]
                                          and b.due_at > now)]  # a restore that keeps failing backs off
        # steps before the ensembles over them; each wave at once, as many as Triton loads at once
        for wave in self.serving_ensembles.levels(due):
            self._each_at_once(wave, lambda model: self._restore(model, digests[model]))
        if not self._swept:  # private step names a stopped daemon left, once none a serving ensemble uses
            self._swept = self.deployer.sweep(list(self.serving_ensembles.get()))
        self.counters.drift = tuple(d for d in result.drift if d.kind == "unmanaged")
        return result.drift

    def preloaded(self, models: Sequence[str]) -> None:
        """A tritonserver was launched with these models loading in its own start-up
        (controlplane/startup/preload.py): the next reconcile verifies them and audits each one serving
        as a `restore` (the rest it restores itself, audited as usual)."""
        self._preloaded = set(models)

    def _audit_preloaded(self, desired: list[ModelRecord], ready: set[str], restore: dict[str, str],
                         busy: Sequence[str]) -> None:
        if not self._preloaded:
            return
        pending, self._preloaded = self._preloaded, set()
        skip = set(busy) | set(restore)
        self.registry.audit(*[
            AuditEntry("tritonctl", "restore", m.name, m.active_digest, Result.OK.value,
                       f"restored {(m.active_digest or '')[:12]} (loaded in tritonserver's start-up, "
                       "launch_loads_serving; verified READY with this digest)")
            for m in desired if m.name in pending and m.name in ready and m.name not in skip])

    def _each_at_once(self, models: list[str], fn: Callable[[str], None]) -> None:
        workers = min(self.parallelism(), len(models))
        if workers <= 1:
            for model in models:
                fn(model)
            return
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="restore") as pool:
            list(pool.map(fn, models))

    def _restore(self, model: str, digest: str) -> None:
        outcome = self.deployer.restore(model, digest, "reconcile: Triton did not serve it")
        if outcome is None:  # evicted or redeployed since the reconcile read the registry
            return
        if outcome.outcome == Result.OK:
            log.warning("%s: %s", model, outcome.message)
            return
        why = outcome.message.split("): ", 1)[-1]  # Triton's words, not the restore's preamble
        retry = self.restores.failed(model, digest, why, "restore")
        log.warning("%s: %s; retry %d in %d s", model, outcome.message, retry.attempt, retry.seconds_left())

    def restart_suspected(self) -> bool:
        """Between reconciles: the model last seen READY is not READY now and no operation of ours
        holds it. An external tritonserver restarted faster than a supervision round could see it
        down answers live but serves nothing (explicit mode); this is one readiness call."""
        name = self.sentinel
        if name is None or self.deployer.lock(name).locked():
            return False
        try:
            if self.triton.version_ready(name):
                return False
            return self.registry.get_model(name).state in SERVING_STATES  # not an operator's unload
        except TritonctlError:
            return False
