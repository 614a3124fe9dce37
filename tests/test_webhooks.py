"""Signed webhooks, the worker against a real registry (a SQLite file, migrated) and a real receiver on
loopback (tests/webhook_receiver.py), stepped one round at a time with a settable clock: the headers and
the signature, routing by action, order per model, backoff, 24 h then failed, redelivery, the outbox
written with the audit event, and the `[[webhook]]` tables' one-line errors.

The daemon end to end (a receiver down, erroring, then back; a daemon SIGKILLed mid-delivery) is in
tests/test_webhooks_e2e.py.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select

from controlplane.documents.events import event_document
from controlplane.errors import ConfigError, NotFoundError, UsageError
from controlplane.outcomes.webhooks import Backoff, Webhooks, signature
from controlplane.settings.config import WebhookTarget, load_settings
from controlplane.store import migrate, schema
from controlplane.store.registry import AuditEntry, AuditQuery, Registry
from tests.clock import Clock
from tests.webhook_receiver import Receiver

pytestmark = pytest.mark.unit

SECRET = "s3cret-s3cret-s3cret"
START = datetime(2026, 6, 1, 12, 0, 0)


@pytest.fixture
def clock() -> Clock:
    return Clock(START)


@pytest.fixture
def registry(tmp_path: Path, clock: Clock) -> Iterator[Registry]:
    reg = Registry(f"sqlite:///{tmp_path / 'registry.db'}", host="h1", clock=clock)
    migrate.upgrade(reg)
    yield reg
    reg.close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver(SECRET)
    yield server
    server.close()


def target(receiver: Receiver, events: tuple[str, ...] = ("*",)) -> WebhookTarget:
    return WebhookTarget(receiver.url, events, Path("/unused"), SECRET)


def worker(registry: Registry, clock: Clock, *targets: WebhookTarget) -> Webhooks:
    return Webhooks(registry, targets, clock=clock, backoff=Backoff(first_s=1.0, max_s=60.0))


def deploy(registry: Registry, model: str, digest: str = "ab" * 32, action: str = "deploy") -> None:
    registry.audit(AuditEntry("alice", action, model, digest, "ok", f"{action} {model}"))


def test_an_event_is_posted_with_its_document_and_a_valid_signature(registry: Registry, clock: Clock,
                                                                     receiver: Receiver) -> None:
    deploy(registry, "resnet")
    webhooks = worker(registry, clock, target(receiver))
    webhooks.run_once(wait=True)
    [got] = receiver.deliveries()
    [event] = registry.query_audit(AuditQuery())
    assert got.document == event_document(event)
    assert got.event == "deploy" and got.signature_ok
    [delivery] = webhooks.deliveries().deliveries
    assert (delivery.id, delivery.state, delivery.status_code, delivery.event_id) == \
           (got.delivery, "delivered", 204, event.id)
    webhooks.run_once(wait=True)
    assert len(receiver.deliveries()) == 1  # delivered once


def test_the_signature_covers_the_timestamp_the_delivery_id_and_the_body() -> None:
    body = b'{"id":1}'
    expected = hmac.new(b"key", b"1767225600." + b"d" * 32 + b"." + body, hashlib.sha256).hexdigest()
    assert signature("key", body, "d" * 32, 1767225600) == f"t=1767225600,sha256={expected}"
    # any of the three changed: another signature (a replay cannot move its timestamp or id)
    assert signature("key", body, "d" * 32, 1767225601) != signature("key", body, "d" * 32, 1767225600)
    assert signature("key", body, "e" * 32, 1767225600) != signature("key", body, "d" * 32, 1767225600)


def test_a_webhook_gets_only_the_actions_it_asked_for(registry: Registry, clock: Clock, receiver: Receiver) -> None:
    deploy(registry, "m", action="tag")
    deploy(registry, "m", action="rollback")
    worker(registry, clock, target(receiver, ("deploy", "rollback"))).run_once(wait=True)
    assert [r.event for r in receiver.deliveries()] == ["rollback"]


def test_a_failing_delivery_holds_back_its_model_only(registry: Registry, clock: Clock, receiver: Receiver) -> None:
    receiver.mode = "500"
    deploy(registry, "a", "a1" * 32)
    webhooks = worker(registry, clock, target(receiver))
    webhooks.run_once(wait=True)  # a1 fails
    receiver.mode = "ok"
    deploy(registry, "a", "a2" * 32)
    deploy(registry, "b", "b1" * 32)
    webhooks.run_once(wait=True)  # a1 waits for its retry: a2 waits behind it; b1 goes
    assert [(r.document["model"], r.answered) for r in receiver.deliveries()] == [("a", 500), ("b", 204)]
    a2, failing = webhooks.deliveries("pending").deliveries  # newest first
    assert (a2.attempts, a2.status_code) == (0, None)
    assert (failing.status_code, failing.answer, failing.attempts) == (500, "receiver is broken today", 1)
    clock.advance(seconds=2)  # past the first backoff (1 s ± 20 %)
    webhooks.run_once(wait=True)
    webhooks.run_once(wait=True)
    assert [r.document["digest"][:2] for r in receiver.deliveries()] == ["a1", "b1", "a1", "a2"]
    assert webhooks.counts() == {"pending": 0, "delivered": 3, "failed": 0}


def test_retries_back_off_then_end_failed_after_24_hours(registry: Registry, clock: Clock,
                                                          receiver: Receiver) -> None:
    receiver.mode = "500"
    deploy(registry, "a", "a1" * 32)
    deploy(registry, "a", "a2" * 32)
    webhooks = Webhooks(registry, [target(receiver)], clock=clock, backoff=Backoff(first_s=1.0, max_s=3600.0))
    webhooks.run_once(wait=True)
    [head] = webhooks.deliveries("pending").deliveries[-1:]
    waits = []
    while (now := {d.id: d for d in webhooks.deliveries().deliveries}[head.id]).state == "pending":
        assert now.next_attempt_at is not None
        waits.append((now.next_attempt_at - clock.now).total_seconds())
        clock.now = now.next_attempt_at
        webhooks.run_once(wait=True)
    # doubling from 1 s (± 20 %) up to the cap (1 h ± 20 %), until 24 h after the delivery was made
    assert 0.8 <= waits[0] <= 1.2 and 1.6 <= waits[1] <= 2.4 and 3.2 <= waits[2] <= 4.8
    # the last attempt is the last one due before the 24 h: at most one capped wait (1 h + 20 %) before it
    last_due = clock.now - START
    assert max(waits) <= 3600 * 1.2 and timedelta(hours=24) - timedelta(seconds=3600 * 1.2) <= last_due
    assert last_due <= timedelta(hours=24), last_due
    assert {r.document["digest"][:2] for r in receiver.deliveries()} == {"a1"}  # a2 waited behind it
    assert (now.status_code, now.answer, now.attempts) == (500, "receiver is broken today", len(waits) + 1)
    # kept as failed; the model's next event goes now
    receiver.mode = "ok"
    webhooks.run_once(wait=True)
    assert receiver.deliveries()[-1].document["digest"][:2] == "a2"
    assert webhooks.counts() == {"pending": 0, "delivered": 1, "failed": 1}


def test_ended_deliveries_are_kept_30_days_then_deleted(registry: Registry, clock: Clock,
                                                         receiver: Receiver) -> None:
    deploy(registry, "a")
    webhooks = worker(registry, clock, target(receiver))
    webhooks.run_once(wait=True)
    clock.advance(days=29)
    webhooks.run_once(wait=True)
    assert [d.state for d in webhooks.deliveries().deliveries] == ["delivered"]
    clock.advance(days=1, hours=1)
    webhooks.run_once(wait=True)
    assert webhooks.deliveries().deliveries == [] and len(registry.query_audit(AuditQuery())) == 1


def test_redeliver_sends_the_same_delivery_again(registry: Registry, clock: Clock, receiver: Receiver) -> None:
    deploy(registry, "a")
    webhooks = worker(registry, clock, target(receiver))
    webhooks.run_once(wait=True)
    [delivered] = webhooks.deliveries().deliveries
    again = webhooks.redeliver(delivered.id[:10])
    assert (again.id, again.state) == (delivered.id, "pending")
    webhooks.run_once(wait=True)
    first, second = receiver.deliveries()
    assert first.delivery == second.delivery == delivered.id and first.document == second.document
    with pytest.raises(NotFoundError):
        webhooks.redeliver("ffffffff")
    with pytest.raises(UsageError):
        webhooks.redeliver("not-hex")


def test_the_outbox_row_is_written_with_its_audit_event_or_not_at_all(registry: Registry) -> None:
    deploy(registry, "a")
    with pytest.raises(NotFoundError):  # the deployment is unknown: the transaction rolls back
        registry.finish_deployment(999, outcome="ok", error=None, audit=AuditEntry("x", "deploy", "a", None, "ok"),
                                   serving=None, model_state="serving")
    with registry.session() as session:
        events = session.scalar(select(func.count()).select_from(schema.AuditEvent))
        outbox = session.scalars(select(schema.WebhookOutbox.audit_id)).all()
        ids = session.scalars(select(schema.AuditEvent.id)).all()
    assert events == 1 and list(outbox) == list(ids)


def test_events_recorded_while_no_worker_runs_are_sent_later_and_none_twice(registry: Registry, clock: Clock,
                                                                             receiver: Receiver) -> None:
    for i in range(5):
        deploy(registry, f"m{i % 2}", f"{i:02d}" * 32)
    first = worker(registry, clock, target(receiver))
    second = worker(registry, clock, target(receiver))  # e.g. an old and a new fleet leader
    first.store.fan_out(lambda r: [(receiver.url, json.dumps(event_document(r)).encode())], clock.now,
                        timedelta(hours=24))
    assert second.store.fan_out(lambda r: [(receiver.url, b"{}")], clock.now, timedelta(hours=24)) == 0
    for _ in range(5):
        first.run_once(wait=True)
        second.run_once(wait=True)
    ids = [r.document["id"] for r in receiver.deliveries()]
    assert sorted(ids) == sorted({e.id for e in registry.query_audit(AuditQuery())})


def test_a_removed_webhook_ends_its_pending_deliveries(registry: Registry, clock: Clock, receiver: Receiver) -> None:
    receiver.mode = "500"
    deploy(registry, "a")
    webhooks = worker(registry, clock, target(receiver))
    webhooks.run_once(wait=True)
    webhooks.reconfigure([])
    webhooks.run_once(wait=True)
    [ended] = webhooks.deliveries().deliveries
    assert (ended.state, ended.answer) == ("failed", "webhook no longer configured")
    with pytest.raises(UsageError, match="no longer a configured webhook"):
        webhooks.redeliver(ended.id)


# -- the [[webhook]] tables ---------------------------------------------------------------------------


def secret_file(tmp_path: Path, mode: int = 0o600, text: str = SECRET) -> Path:
    path = tmp_path / "hook.secret"
    path.write_text(text + "\n")
    os.chmod(path, mode)
    return path


def config(tmp_path: Path, table: str) -> Path:
    path = tmp_path / "tritonctl.toml"
    path.write_text(f'state_dir = "{tmp_path}"\n\n[[webhook]]\n{table}\n')
    return path


def test_webhook_tables_are_read_with_their_secret(tmp_path: Path) -> None:
    secret = secret_file(tmp_path)
    path = config(tmp_path, f'url = "https://hooks.example.com/t"\nevents = ["deploy", "rollback"]\n'
                            f'secret_file = "{secret}"')
    [hook] = load_settings({}, env={}, config_file=path).webhook
    assert (hook.url, hook.events, hook.secret_file, hook.secret) == \
           ("https://hooks.example.com/t", ("deploy", "rollback"), secret, SECRET)
    assert SECRET not in repr(hook)
    assert hook.wants("deploy") and not hook.wants("tag")


@pytest.mark.parametrize(("table", "says"), [
    ('events = ["*"]\nsecret_file = "SECRET"', "url: missing"),
    ('url = "ftp://x"\nevents = ["*"]\nsecret_file = "SECRET"', "url: expected an http:// or https:// URL"),
    ('url = "http://x/h"\nevents = []\nsecret_file = "SECRET"', "events: expected a list of audit action names"),
    ('url = "http://x/h"\nevents = ["Deploy!"]\nsecret_file = "SECRET"', "events: expected"),
    ('url = "http://x/h"\nevents = ["*"]\nsecret_file = "SECRET"\ncolor = 1', "color: unknown key"),
    ('url = "http://x/h"\nevents = ["*"]\nsecret_file = "/nonexistent/s"', "secret_file: /nonexistent/s: cannot read"),
])
def test_a_bad_webhook_table_is_one_line_naming_the_file_and_field(tmp_path: Path, table: str, says: str) -> None:
    path = config(tmp_path, table.replace("SECRET", str(secret_file(tmp_path))))
    with pytest.raises(ConfigError) as caught:
        load_settings({}, env={}, config_file=path)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{path}: webhook: [[webhook]] #1: ") and says in message


@pytest.mark.parametrize(("mode", "text", "says"), [
    (0o644, SECRET, "mode 0644: others (or its group) may read or change it; chmod 600"),
    (0o620, SECRET, "mode 0620"),
    (0o600, "short", "the secret must be at least 16 characters"),
])
def test_a_secret_file_others_can_read_or_a_short_secret_is_refused(tmp_path: Path, mode: int, text: str,
                                                                   says: str) -> None:
    path = config(tmp_path, f'url = "http://x/h"\nevents = ["*"]\nsecret_file = "{secret_file(tmp_path, mode, text)}"')
    with pytest.raises(ConfigError, match="secret_file: .*" + says.replace("(", r"\(").replace(")", r"\)")):
        load_settings({}, env={}, config_file=path)


def test_the_same_url_twice_is_refused(tmp_path: Path) -> None:
    secret = secret_file(tmp_path)
    table = f'url = "http://x/h"\nevents = ["*"]\nsecret_file = "{secret}"'
    path = config(tmp_path, f"{table}\n\n[[webhook]]\n{table}")
    with pytest.raises(ConfigError, match="http://x/h is configured twice"):
        load_settings({}, env={}, config_file=path)


def test_an_idle_worker_sleeps_until_an_audit_event_wakes_it(registry: Registry, receiver: Receiver) -> None:
    """The daemon's worker (`wake_on_audit`: only this daemon writes its registry) no longer looks at the
    outbox every half second while nothing is pending (a third of an idle daemon's CPU at 1,000 serving
    models; issue 26): an audit event's commit wakes it, and the event is still POSTed at once."""
    import time

    from tests.harness import wait_for

    webhooks = Webhooks(registry, [target(receiver)], backoff=Backoff(first_s=1.0, max_s=60.0),
                        wake_on_audit=True)
    rounds: list[float] = []
    real = webhooks.store.fan_out
    webhooks.store.fan_out = lambda *a, **k: rounds.append(time.monotonic()) or real(*a, **k)  # type: ignore[method-assign]
    webhooks.start()
    try:
        time.sleep(3.0)
        assert len(rounds) <= 3, f"{len(rounds)} rounds in 3 s while idle (polling every 0.5 s: 6)"
        before = len(rounds)
        posted_at = time.monotonic()
        deploy(registry, "resnet")
        wait_for(lambda: receiver.deliveries(), 2.0, 0.02, "the event POSTed")
        assert time.monotonic() - posted_at < 1.0 and len(rounds) > before
    finally:
        webhooks.stop()
