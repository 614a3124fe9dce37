"""Prometheus metrics for the daemon (`--metrics-port`, off by default), on 127.0.0.1 only.

Counters and the duration histogram are fed as deploy outcomes happen (`observe`); everything that
describes current state (model states, quarantined digests, snapshots, store size, watcher backlog,
Triton reachability) is read at scrape time by a custom collector, so it cannot drift from the
registry. A dedicated `CollectorRegistry` keeps these apart from anything else in the process (no
process/GC collectors, no global state between tests).

Metrics (names are a contract; see docs/operations.md):
  tritonctl_deploys_total{outcome}          deploy/rollback operations by outcome (ok/noop/failed/rolled_back)
  tritonctl_rollbacks_total                 failed deploys rolled back to the last good snapshot
  tritonctl_deploy_duration_seconds         histogram of deploy/rollback operations (noops excluded)
  tritonctl_quarantined_digests             snapshots quarantined after a failed deploy
  tritonctl_model_state{model,state}        1 for each model's current state, 0 for the others
  tritonctl_snapshots_total                 snapshots recorded in the registry
  tritonctl_store_bytes                     bytes of file contents in the content store
  tritonctl_watcher_backlog                 models waiting for their settle check
  tritonctl_triton_reachable                1 if tritonserver answered at the last reconcile
  tritonctl_webhook_deliveries{state}       webhook deliveries by state (pending/delivered/failed)
  tritonctl_source_captures_total           model sources captured (snapshot taken) since the daemon started
  tritonctl_source_validations_total        captured contents validated since the daemon started
  tritonctl_source_records_total            captured contents recorded in the registry since the daemon started
  tritonctl_bakes_total{outcome}            bakes ended since the daemon started: ok (passed), failed, inconclusive
  tritonctl_gateway_route_weight{model,digest}  the percent of a model's requests the gateway routes to each digest
                                            (a canary's step: docs/bake.md); none without a gateway
  tritonctl_startup_models_total{result}    models the start-up scans found `unchanged` (by signature; no file
                                            read) or `changed` (new, changed, or owed a deploy: captured)
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol, overload

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.samples import Sample

from controlplane.bake.figures import BAKE_OUTCOMES
from controlplane.deploy.engine import Outcome
from controlplane.errors import ConfigError
from controlplane.vocab import ModelState, Result

log = logging.getLogger("tritonctl.metrics")

LISTEN_HOST = "127.0.0.1"
DEPLOY_ACTIONS = ("deploy", "rollback")  # operations that put a snapshot into Triton
OUTCOMES = tuple(r.value for r in (Result.OK, Result.NOOP, Result.FAILED, Result.ROLLED_BACK))
MODEL_STATES = tuple(s.value for s in ModelState)
DURATION_BUCKETS_S = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
STORE_SIZE_TTL_S = 15.0  # walking the object store on every scrape would cost I/O for nothing
HELP = {
    "bakes": "Bakes of new digests ended, by outcome (ok: passed; failed: rolled back; inconclusive)",
    "deploys": "Deploy and rollback operations by outcome",
    "rollbacks": "Failed deploys rolled back to the last good snapshot",
    "duration": "Duration of deploy and rollback operations (noops excluded)",
    "model_state": "1 for the model's current state in the registry, 0 for the other states",
    "quarantined": "Snapshots quarantined after a failed deploy",
    "snapshots": "Snapshots (distinct model contents) recorded in the registry",
    "store_bytes": "Bytes of file contents in the content-addressed store (deduplicated)",
    "backlog": "Models waiting for their settle check",
    "reachable": "1 if tritonserver answered at the last reconcile",
    "webhooks": "Webhook deliveries by state (ended ones are kept 30 days)",
    "captures": "Model sources captured (snapshot taken) since the daemon started",
    "validations": "Captured contents validated since the daemon started",
    "records": "Captured contents recorded in the registry since the daemon started",
    "startup": "Models the start-up scans found unchanged by signature (no file read) or changed",
    "loads": "Model loads in tritonserver: by a load request each (request), or deploys its start-up loaded (startup)",
    "evictions": "Models unloaded to keep the memory budget (budget) or idle under policy ondemand (idle)",
    "ondemand_loads": "Models loaded by ensure (policy ondemand, or any model ensured while not loaded)",
    "lease_expiries": "Leases that expired without being renewed or released",
    "route_weight": "Percent of the model's requests the gateway routes to the digest (a canary step splits them)",
}
DELIVERY_STATES = ("pending", "delivered", "failed")


class _StoreSize:
    """On-disk bytes of the content store's objects, cached for a few seconds."""

    def __init__(self, objects: Path) -> None:
        self.objects = objects
        self._lock = threading.Lock()
        self._value = 0
        self._at = float("-inf")

    def __call__(self) -> int:
        with self._lock:
            if time.monotonic() - self._at < STORE_SIZE_TTL_S:
                return self._value
            total = 0
            for dirpath, _dirs, files in os.walk(self.objects):
                for name in files:
                    try:
                        total += os.lstat(os.path.join(dirpath, name)).st_size
                    except OSError:
                        pass  # collected while we walked
            self._value, self._at = total, time.monotonic()
            return total


class Observed(Protocol):
    """What the gauges read at scrape time (the daemon passes its control plane; metrics imports no
    module above its layer): the registry, the content store's root, the Triton and pipeline counters,
    and, where the daemon has them, the webhook worker, the on-demand book and the memory guard."""

    registry: Any
    store: Any
    counters: Any
    triton: Any  # its load_requests

    @property
    def counts(self) -> Any: ...


class ModelStates(Sequence[Sample]):
    """tritonctl_model_state's samples, each made only as the exposition reads it: built beforehand,
    with a label dict each, the family was 5 samples per model, 13 MB at 10,000 models, built again
    at every scrape while the registry was written (a first start) and held between scrapes; scrapes
    during a first start raised the daemon's peak RSS by 40 MB at 5,000 models (issue 39)."""

    def __init__(self, name: str, models: Sequence[tuple[str, str]]) -> None:
        self.name = name
        self.models = models  # (model, its state)

    def __iter__(self) -> Iterator[Sample]:
        for model, current in self.models:
            for state in MODEL_STATES if current in MODEL_STATES else (*MODEL_STATES, current):
                yield Sample(self.name, {"model": model, "state": state}, 1.0 if state == current else 0.0)

    def __len__(self) -> int:
        return sum(len(MODEL_STATES) + (current not in MODEL_STATES) for _, current in self.models)

    @overload
    def __getitem__(self, index: int) -> Sample: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Sample]: ...

    def __getitem__(self, index: int | slice) -> Sample | Sequence[Sample]:
        return list(self)[index]


class ModelStateFamily(GaugeMetricFamily):
    """tritonctl_model_state{model,state}: 1 for each model's state, 0 for the others (`ModelStates`)."""

    def __init__(self, models: Sequence[tuple[str, str]]) -> None:
        super().__init__("tritonctl_model_state", HELP["model_state"], labels=["model", "state"])
        self.samples = ModelStates(self.name, models)  # type: ignore[assignment]  # a list's reader


class StateCollector:
    """Gauges read from the registry and the running plane at scrape time."""

    def __init__(self, plane: Observed, backlog: Callable[[], int | None]) -> None:
        self.plane = plane
        self.backlog = backlog
        self.store_size = _StoreSize(plane.store.root / "objects")
        self._states: tuple[int, Metric] | None = None  # (registry writes, the model-state family then)

    def collect(self) -> Iterator[Metric]:
        # Each family on its own: one failing query must not fail the whole scrape.
        for build in (self._model_state, self._quarantined, self._snapshots, self._store_bytes,
                      self._backlog, self._reachable, self._webhooks, self._pipeline, self._ondemand,
                      self._bakes, self._route_weights):
            try:
                yield from build()
            except Exception as exc:  # noqa: BLE001 - e.g. the database is locked; a scrape must still answer
                log.warning("metrics: %s: %s", build.__name__.lstrip("_"), exc)

    def _model_state(self) -> Iterable[Metric]:
        registry = self.plane.registry
        writes = getattr(registry, "writes", None)  # built again only after the registry was written
        if self._states is not None and writes is not None and self._states[0] == writes:
            yield self._states[1]
            return
        family = ModelStateFamily([(model.name, model.state) for model in registry.list_models()])
        if writes is not None:
            self._states = (writes, family)
        yield family

    def _quarantined(self) -> Iterable[Metric]:
        count = self.plane.registry.count_quarantined()
        yield GaugeMetricFamily("tritonctl_quarantined_digests", HELP["quarantined"], value=count)

    def _snapshots(self) -> Iterable[Metric]:
        count = self.plane.registry.count_snapshots()
        yield CounterMetricFamily("tritonctl_snapshots", HELP["snapshots"], value=count)

    def _store_bytes(self) -> Iterable[Metric]:
        yield GaugeMetricFamily("tritonctl_store_bytes", HELP["store_bytes"], value=self.store_size())

    def _backlog(self) -> Iterable[Metric]:
        yield GaugeMetricFamily("tritonctl_watcher_backlog", HELP["backlog"], value=self.backlog() or 0)

    def _webhooks(self) -> Iterable[Metric]:
        worker = getattr(self.plane, "webhooks", None)
        counts = worker.counts() if worker is not None else {}
        family = GaugeMetricFamily("tritonctl_webhook_deliveries", HELP["webhooks"], labels=["state"])
        for state in DELIVERY_STATES:
            family.add_metric([state], float(counts.get(state, 0)))
        yield family

    def _reachable(self) -> Iterable[Metric]:
        reachable = 1.0 if self.plane.counters.triton_reachable else 0.0
        yield GaugeMetricFamily("tritonctl_triton_reachable", HELP["reachable"], value=reachable)


    def _pipeline(self) -> Iterable[Metric]:
        counts = self.plane.counts
        for name in ("captures", "validations", "records"):
            yield CounterMetricFamily(f"tritonctl_source_{name}", HELP[name], value=counts.get(name))
        family = CounterMetricFamily("tritonctl_startup_models", HELP["startup"], labels=["result"])
        family.add_metric(["unchanged"], counts.get("start_unchanged"))
        family.add_metric(["changed"], counts.get("start_changed"))
        yield family
        loads = CounterMetricFamily("tritonctl_triton_loads", HELP["loads"], labels=["via"])
        loads.add_metric(["request"], float(getattr(self.plane.triton, "load_requests", 0)))
        loads.add_metric(["startup"], counts.get("startup_loads"))
        yield loads


    def _ondemand(self) -> Iterable[Metric]:
        ondemand, guard = getattr(self.plane, "ondemand", None), getattr(self.plane, "guard", None)
        counts = dict(ondemand.counts) if ondemand is not None else {}
        family = CounterMetricFamily("tritonctl_evictions", HELP["evictions"], labels=["reason"])
        family.add_metric(["budget"], float(guard.evictions if guard is not None else 0))
        family.add_metric(["idle"], float(counts.get("evictions_idle", 0)))
        yield family
        yield CounterMetricFamily("tritonctl_ondemand_loads", HELP["ondemand_loads"], value=counts.get("loads", 0))
        yield CounterMetricFamily("tritonctl_lease_expiries", HELP["lease_expiries"],
                                  value=counts.get("lease_expiries", 0))


    def _bakes(self) -> Iterable[Metric]:
        baker = getattr(self.plane, "baker", None)
        counts = dict(baker.counts) if baker is not None else {}
        family = CounterMetricFamily("tritonctl_bakes", HELP["bakes"], labels=["outcome"])
        for outcome in BAKE_OUTCOMES:
            family.add_metric([outcome], float(counts.get(outcome, 0)))
        yield family

    def _route_weights(self) -> Iterable[Metric]:
        deployer = getattr(self.plane, "deployer", None)
        weights = getattr(getattr(deployer, "aliases", None), "weights", None)
        family = GaugeMetricFamily("tritonctl_gateway_route_weight", HELP["route_weight"], labels=["model", "digest"])
        for model, digests in sorted((weights() if callable(weights) else {}).items()):
            for digest, weight in sorted(digests.items()):
                family.add_metric([model, digest], float(weight))
        yield family


class Metrics:
    """The daemon's metrics and their HTTP endpoint (`start` / `stop`)."""

    def __init__(self, plane: Observed, port: int, host: str = LISTEN_HOST, *,
                 backlog: Callable[[], int] | None = None) -> None:
        """`backlog`: the watcher's count of models waiting for their settle check (None: no watcher)."""
        self.port = port
        self.host = host
        self.registry = CollectorRegistry()
        self.backlog = backlog
        self.deploys = Counter("tritonctl_deploys", HELP["deploys"], ["outcome"], registry=self.registry)
        for outcome in OUTCOMES:
            self.deploys.labels(outcome)  # present at 0 from the first scrape
        self.rollbacks = Counter("tritonctl_rollbacks", HELP["rollbacks"], registry=self.registry)
        self.duration = Histogram("tritonctl_deploy_duration_seconds", HELP["duration"],
                                  buckets=DURATION_BUCKETS_S, registry=self.registry)
        self.registry.register(StateCollector(plane, lambda: self.backlog() if self.backlog else 0))
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def observe(self, outcome: Outcome) -> None:
        """Count one finished operation (called from the deployer's thread)."""
        if outcome.outcome == Result.ROLLED_BACK:
            self.rollbacks.inc()
        if outcome.action not in DEPLOY_ACTIONS:
            return
        self.deploys.labels(str(outcome.outcome)).inc()
        if outcome.outcome != Result.NOOP:
            self.duration.observe(outcome.duration_ms / 1000.0)

    def start(self) -> None:
        try:
            self._server, self._thread = start_http_server(self.port, self.host, self.registry)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise ConfigError(f"metrics_port: cannot listen on {self.host}:{self.port}: {reason}") from None
        log.info("metrics on http://%s:%s/metrics", self.host, self.port)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(5)
            self._thread = None
