"""The webhook receiver docs/operations.md shows runs as shown: started as its own process, it accepts
what the delivery worker sends (a real registry, real HTTP on loopback), acts on a redelivery only once,
and refuses a body signed with another secret."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from controlplane.config import WebhookTarget
from controlplane.store import migrate
from controlplane.store.registry import AuditEntry, Registry
from controlplane.webhooks import Webhooks, signature
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

    body = b'{"id":1,"action":"deploy"}'
    forged = urllib.request.Request(url, data=body, method="POST", headers={
        "X-Tritonctl-Delivery": "f" * 32, "X-Tritonctl-Signature-256": signature("another-secret-xxxx", body)})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(forged, timeout=10)
    assert refused.value.code == 401
    registry.close()
    proc.kill()
    out, _ = proc.communicate(timeout=10)
    assert out.splitlines() == ["rollback resnet ok back to the good one"]  # once, not for the redelivery
