"""Prometheus metrics: the collector against a real registry (fast), and the real daemon's endpoint
scraped and parsed while it deploys `linear` and then rolls back a broken edit of it."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from controlplane.deploy.engine import Outcome
from controlplane.errors import ConfigError
from controlplane.outcomes.counters import Counters
from controlplane.outcomes.metrics import Metrics
from controlplane.outcomes.webhooks import Webhooks
from controlplane.settings.config import WebhookTarget
from controlplane.snapshot import ContentStore
from controlplane.store import migrate
from controlplane.store.registry import AuditEntry, Registry
from tests.harness import DaemonProcess, copy_example, wait_for
from tests.webhook_receiver import Receiver

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples[(name, tuple(sorted(labels.items())))]


# -- the collector, in process ----------------------------------------------------------------------


@pytest.fixture
def plane(tmp_path: Path) -> Iterator[Any]:
    registry = Registry(f"sqlite:///{tmp_path / 'registry.db'}")
    migrate.upgrade(registry)
    store = ContentStore(tmp_path / "store")
    yield SimpleNamespace(registry=registry, store=store, counters=Counters())
    registry.close()


@pytest.fixture
def metrics(plane: Any) -> Iterator[Metrics]:
    m = Metrics(plane, free_port())
    m.start()
    yield m
    m.stop()


def outcome(action: str, result: str, ms: int = 1500) -> Outcome:
    return Outcome("linear", action, result, "a" * 64, "b" * 64, "", ms)


def test_empty_daemon_exposes_every_metric(metrics: Metrics) -> None:
    samples = scrape(metrics.port)
    for result in ("ok", "noop", "failed", "rolled_back"):
        assert value(samples, "tritonctl_deploys_total", outcome=result) == 0
    assert value(samples, "tritonctl_rollbacks_total") == 0
    assert value(samples, "tritonctl_deploy_duration_seconds_count") == 0
    assert value(samples, "tritonctl_quarantined_digests") == 0
    assert value(samples, "tritonctl_snapshots_total") == 0
    assert value(samples, "tritonctl_store_bytes") == 0
    assert value(samples, "tritonctl_watcher_backlog") == 0
    assert value(samples, "tritonctl_triton_reachable") == 0
    assert all(value(samples, "tritonctl_webhook_deliveries", state=s) == 0 for s in ("pending", "delivered", "failed"))
    assert not any(name.startswith(("process_", "python_")) for name, _ in samples), "dedicated registry only"


def test_outcomes_are_counted(metrics: Metrics, plane: Any) -> None:
    metrics.observe(outcome("deploy", "ok", 2500))
    metrics.observe(outcome("deploy", "rolled_back", 4000))
    metrics.observe(outcome("rollback", "ok", 500))
    metrics.observe(outcome("deploy", "noop", 1))
    metrics.observe(outcome("restore", "ok"))  # reconcile's restore is not a deploy
    metrics.observe(outcome("recover", "rolled_back"))  # crash recovery rolled back: counted
    plane.registry.update_model("linear", state="serving")
    plane.registry.update_model("broken", state="failed")
    plane.counters.triton_reachable = True
    metrics.backlog = lambda: 3
    samples = scrape(metrics.port)
    assert value(samples, "tritonctl_deploys_total", outcome="ok") == 2
    assert value(samples, "tritonctl_deploys_total", outcome="rolled_back") == 1
    assert value(samples, "tritonctl_deploys_total", outcome="noop") == 1
    assert value(samples, "tritonctl_rollbacks_total") == 2
    assert value(samples, "tritonctl_deploy_duration_seconds_count") == 3  # noop excluded
    assert value(samples, "tritonctl_deploy_duration_seconds_sum") == pytest.approx(7.0)
    assert value(samples, "tritonctl_deploy_duration_seconds_bucket", le="1.0") == 1
    assert value(samples, "tritonctl_model_state", model="linear", state="serving") == 1
    assert value(samples, "tritonctl_model_state", model="linear", state="failed") == 0
    assert value(samples, "tritonctl_model_state", model="broken", state="failed") == 1
    assert value(samples, "tritonctl_watcher_backlog") == 3
    assert value(samples, "tritonctl_triton_reachable") == 1


def test_the_gateways_route_weights_are_a_gauge_per_model_and_digest(metrics: Metrics, plane: Any) -> None:
    """tritonctl_gateway_route_weight{model,digest}: what the route table gives each digest now, a canary's
    split included (issue 55); nothing without a gateway."""
    assert not [name for name, _ in scrape(metrics.port) if name == "tritonctl_gateway_route_weight"]
    from controlplane.deploy.aliases import Lane, Routed, Target
    from tests.unit.test_deploy_routed import StandinRoutes

    aliases = Routed(StandinRoutes())
    plane.deployer = SimpleNamespace(aliases=aliases)
    new, old = Target("linear__bbbbbbbb", "b" * 64), Target("linear__aaaaaaaa", "a" * 64)
    aliases.switch({"linear": Lane("linear", new, old).at(10)})
    samples = scrape(metrics.port)
    assert value(samples, "tritonctl_gateway_route_weight", model="linear", digest="b" * 64) == 10
    assert value(samples, "tritonctl_gateway_route_weight", model="linear", digest="a" * 64) == 90
    aliases.switch({"linear": new})
    samples = scrape(metrics.port)
    assert value(samples, "tritonctl_gateway_route_weight", model="linear", digest="b" * 64) == 100
    assert ("tritonctl_gateway_route_weight", (("digest", "a" * 64), ("model", "linear"))) not in samples


def test_webhook_deliveries_are_counted_by_state(metrics: Metrics, plane: Any) -> None:
    receiver = Receiver("metrics-webhook-secret")
    receiver.mode = "500"
    try:
        for model in ("a", "b"):
            plane.registry.audit(AuditEntry("alice", "deploy", model, "ab" * 32, "ok"))
        plane.webhooks = Webhooks(plane.registry, [WebhookTarget(receiver.url, ("*",), Path("/unused"), "x" * 16)])
        plane.webhooks.run_once(wait=True)
        samples = scrape(metrics.port)
        assert value(samples, "tritonctl_webhook_deliveries", state="pending") == 2
        plane.webhooks.reconfigure([])  # the receiver is no longer configured: its deliveries end failed
        plane.webhooks.run_once(wait=True)
        samples = scrape(metrics.port)
        assert value(samples, "tritonctl_webhook_deliveries", state="pending") == 0
        assert value(samples, "tritonctl_webhook_deliveries", state="failed") == 2
    finally:
        receiver.close()


def test_a_failing_query_does_not_fail_the_scrape(metrics: Metrics, plane: Any) -> None:
    plane.registry.engine.dispose()
    (Path(plane.registry.url.removeprefix("sqlite:///"))).unlink()
    Path(plane.registry.url.removeprefix("sqlite:///")).mkdir()  # the database cannot be opened now
    samples = scrape(metrics.port)
    assert ("tritonctl_model_state", ()) not in samples
    assert value(samples, "tritonctl_deploys_total", outcome="ok") == 0
    assert value(samples, "tritonctl_triton_reachable") == 0


def test_port_in_use_is_a_one_line_error(plane: Any) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        m = Metrics(plane, busy.getsockname()[1])
        with pytest.raises(ConfigError, match=r"^metrics_port: cannot listen on 127\.0\.0\.1:\d+: "):
            m.start()


def test_stop_closes_the_endpoint(plane: Any) -> None:
    m = Metrics(plane, free_port())
    m.start()
    scrape(m.port)
    m.stop()
    with pytest.raises(urllib.error.URLError):
        scrape(m.port)


# -- the real daemon ------------------------------------------------------------------------------

BROKEN_INIT = """
    def initialize(self, args):
        raise RuntimeError("broken on purpose")
"""


@pytest.mark.triton
def test_daemon_metrics_show_a_deploy_and_a_rollback(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    copy_example("linear", repo)
    port = free_port()
    daemon = DaemonProcess(repo, tmp_path / "state", extra_args=["--metrics-port", str(port)]).start()
    try:
        # The control API answers before the initial deploy finished (READY=1 waits for it; see
        # test_systemd): wait for the deploy to be counted.
        samples = wait_for(lambda: (s := scrape(port)) and value(s, "tritonctl_deploys_total", outcome="ok") and s,
                           60, 0.1, "the initial deploy counted")
        assert value(samples, "tritonctl_deploys_total", outcome="ok") == 1
        assert value(samples, "tritonctl_deploy_duration_seconds_count") == 1
        assert value(samples, "tritonctl_model_state", model="linear", state="serving") == 1
        assert value(samples, "tritonctl_snapshots_total") == 1
        assert value(samples, "tritonctl_store_bytes") > 0
        assert value(samples, "tritonctl_triton_reachable") == 1
        assert value(samples, "tritonctl_quarantined_digests") == 0
        assert value(samples, "tritonctl_rollbacks_total") == 0

        model_py = repo / "linear" / "1" / "model.py"
        model_py.write_text(model_py.read_text().replace("class TritonPythonModel:\n",
                                                         "class TritonPythonModel:" + BROKEN_INIT))
        wait_for(lambda: daemon.audit("--model", "linear", "--outcome", "rolled_back"), 60, 0.5, "the rollback")
        samples = wait_for(lambda: (s := scrape(port)) and value(s, "tritonctl_rollbacks_total") == 1 and s,
                           10, 0.1, "rollback counted")
        assert value(samples, "tritonctl_deploys_total", outcome="rolled_back") == 1
        assert value(samples, "tritonctl_deploys_total", outcome="ok") == 1
        assert value(samples, "tritonctl_deploy_duration_seconds_count") == 2
        assert value(samples, "tritonctl_quarantined_digests") == 1
        assert value(samples, "tritonctl_snapshots_total") == 2
        assert value(samples, "tritonctl_model_state", model="linear", state="serving") == 1  # the old one
        assert value(samples, "tritonctl_watcher_backlog") == 0
    finally:
        assert daemon.stop() == 0, daemon.log_tail()
    with pytest.raises(urllib.error.URLError):
        scrape(port)


@pytest.mark.triton
def test_daemon_with_metrics_port_in_use_fails_cleanly(tmp_path: Path) -> None:
    """The port is checked before anything starts (issue 47): exit 2, one line, no tritonserver."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        daemon = DaemonProcess(tmp_path / "repo", tmp_path / "state", extra_args=["--metrics-port", str(port)])
        (tmp_path / "repo").mkdir()
        daemon.start(wait=False)
        try:
            assert daemon.proc is not None
            assert daemon.proc.wait(60) == 2, daemon.log_tail()
            assert f"error: metrics_port: cannot listen on 127.0.0.1:{port}: " in daemon.log_tail()
            assert daemon.triton_pid() is None, "a failed start left its tritonserver running"
        finally:
            daemon.stop()  # kills whatever is left
