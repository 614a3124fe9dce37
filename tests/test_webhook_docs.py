"""The webhook receiver docs/operations.md shows runs as shown: started as its own process, it accepts
what the delivery worker sends (a real registry, real HTTP on loopback), acts on a redelivery only once,
refuses a body signed with another secret, and refuses a replay: a request recorded earlier and sent
again (its old timestamp), or re-stamped without the secret."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from controlplane.outcomes.webhooks import Webhooks, signature
from controlplane.settings.config import WebhookTarget
from controlplane.store import migrate
from controlplane.store.registry import AuditEntry, Registry
from tests.clock import Clock
from tests.harness import wait_for

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent
SECRET = "docs-receiver-secret-0123"


def receiver_source() -> str:
    text = (ROOT / "docs" / "operations.md").read_text()
    match = re.search(r"<!-- webhook-receiver -->\n```python\n(.*?)```", text, re.DOTALL)
    assert match, "docs/operations.md has no webhook receiver example"
    return match.group(1)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    script = tmp_path / "receiver.py"
    script.write_text(receiver_source())
    secret = tmp_path / "webhook.secret"
    secret.write_text(SECRET + "\n")
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            text=True, env={"SECRET_FILE": str(secret), "PORT": str(port)})
    try:
        wait_for(lambda: listening(port), 20, 0.05, "the docs' receiver listening")
        yield proc, f"http://127.0.0.1:{port}/"
    finally:
        proc.kill()
        proc.wait()


def test_the_documented_receiver_accepts_signed_events_once_and_refuses_forged_ones(
        tmp_path: Path, receiver: tuple[subprocess.Popen[str], str]) -> None:
    proc, url = receiver
    registry = Registry(f"sqlite:///{tmp_path / 'registry.db'}", clock=Clock(datetime(2026, 6, 1)))
    migrate.upgrade(registry)
    registry.audit(AuditEntry("alice", "rollback", "resnet", "ab" * 32, "ok", "back to the good one"))
    webhooks = Webhooks(registry, [WebhookTarget(url, ("*",), tmp_path / "webhook.secret", SECRET)],
                        clock=registry.clock)
    webhooks.run_once(wait=True)
    [delivery] = webhooks.deliveries().deliveries
    assert (delivery.state, delivery.status_code) == ("delivered", 204)
    webhooks.redeliver(delivery.id)
    webhooks.run_once(wait=True)
    assert webhooks.deliveries().deliveries[0].attempts == 2

    body = b'{"id":1,"action":"deploy","model":"m","outcome":"ok","message":"forged"}'
    assert post(url, body, "f" * 32, signature("another-secret-xxxx", body, "f" * 32, int(time.time()))) == 401
    registry.close()
    proc.kill()
    out, _ = proc.communicate(timeout=10)
    assert out.splitlines() == ["rollback resnet ok back to the good one"]  # once, not for the redelivery


def post(url: str, body: bytes, delivery: str, signed: str) -> int:
    request = urllib.request.Request(url, data=body, method="POST", headers={
        "X-Tritonctl-Delivery": delivery, "X-Tritonctl-Signature-256": signed})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as refused:
        return refused.code


def test_the_documented_receiver_rejects_a_replayed_delivery(receiver: tuple[subprocess.Popen[str], str]) -> None:
    """The attacker holds a request tritonctl really sent (a proxy's log, a captured packet) but not the
    secret: sent again ten minutes later it is refused, and so is the same body and signature under a
    fresh timestamp or another delivery id; only the genuine, fresh request is acted on."""
    proc, url = receiver
    body = b'{"id":7,"action":"rollback","model":"resnet","outcome":"ok","message":"replayed"}'
    recorded_at = int(time.time()) - 600
    recorded = signature(SECRET, body, "a" * 32, recorded_at)
    assert post(url, body, "a" * 32, recorded) == 401  # too old
    restamped = recorded.replace(f"t={recorded_at}", f"t={int(time.time())}")
    assert post(url, body, "a" * 32, restamped) == 401  # the timestamp is signed
    fresh = signature(SECRET, body, "b" * 32, int(time.time()))
    assert post(url, body, "c" * 32, fresh) == 401  # so is the delivery id
    assert post(url, body, "b" * 32, fresh) == 204
    assert post(url, body, "b" * 32, fresh) == 204  # a replay within the window: acknowledged, not acted on
    proc.kill()
    out, _ = proc.communicate(timeout=10)
    assert out.splitlines() == ["rollback resnet ok replayed"]
