"""Signed webhooks: the daemon's delivery worker, and the service behind `tritonctl webhooks`.

Every audit event lands in the registry's outbox in its own transaction (controlplane/store/outbox.py).
This worker, a thread of the daemon (in a fleet: of the leader only, over the shared registry), fans each
event out to the `[[webhook]]` tables that want its action and POSTs it: the body is the event document
(controlplane/documents/events.py), with `X-Tritonctl-Event` (the action), `X-Tritonctl-Delivery` (the delivery's
id, the same on every retry) and `X-Tritonctl-Signature-256: t=<unix seconds>,sha256=<hex HMAC-SHA256,
keyed with the webhook's secret, of "<t>.<delivery id>." followed by the body>`: each try is signed when
it is sent, so a receiver that rejects old timestamps and remembers delivery ids cannot be replayed to
(docs/operations.md "Webhooks signatures"). A 2xx answer delivers it; anything else (no connection,
a timeout, another status) retries it with exponential backoff until 24 h after it was made, then it is
kept as `failed`. Deliveries of one model to one URL go out one at a time, in event order: a delivery
waiting for a retry holds back the later ones of its model, never those of other models or URLs.

At least once: a delivery is marked delivered only after the receiver answered 2xx, so a daemon killed
in between sends it again after its restart, with the same delivery id (receivers deduplicate by it).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import random
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta

from controlplane import __version__
from controlplane.documents.events import event_body, event_document
from controlplane.documents.results import WebhookDeliveriesResult
from controlplane.errors import StoreError
from controlplane.settings.config import Settings, WebhookTarget
from controlplane.store.outbox import DELIVERED, DELIVERY_STATES, FAILED, PENDING, DeliveryStore, Outgoing
from controlplane.store.records import AuditRecord, DeliveryRecord, utcnow
from controlplane.store.registry import Registry

log = logging.getLogger("tritonctl.webhooks")

RETRY_FOR = timedelta(hours=24)  # a delivery not delivered by then is kept as failed
KEEP_FOR = timedelta(days=30)  # ended deliveries are listed this long, then deleted (the audit log stays)
PRUNE_EVERY = timedelta(hours=1)
SEND_TIMEOUT_S = 10.0  # one POST: connect, send, answer
POLL_S = 0.5  # how often the worker looks at the outbox and the due deliveries (idle: ~0.5 % of a core)
# With `wake_on_audit` (a registry only this daemon writes) and nothing pending, the worker sleeps until a
# committed audit event wakes it, and looks this often anyway: polling every POLL_S was a third of an
# idle daemon's CPU (py-spy, 1,000 serving models; issue 26)
IDLE_POLL_S = 10.0
SENDERS = 4  # POSTs in flight at once (one per lane)
ANSWER_BYTES = 500


def signature(secret: str, body: bytes, delivery: str, timestamp: int) -> str:
    """The `X-Tritonctl-Signature-256` header's value for `body` of `delivery` sent at `timestamp` (unix
    seconds): `t=<timestamp>,sha256=<hex HMAC-SHA256 of "<timestamp>.<delivery>." + body>`."""
    signed = f"{timestamp}.{delivery}.".encode() + body
    return f"t={timestamp},sha256=" + hmac.new(secret.encode("utf-8"), signed, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Backoff:
    """Seconds before retry n (1-based): first_s doubling up to max_s, each with ±20 % jitter so that
    deliveries failing together do not retry together."""

    first_s: float = 1.0
    max_s: float = 300.0

    def delay_s(self, attempts: int) -> float:
        base = min(self.max_s, self.first_s * 2 ** max(0, attempts - 1))
        return base * random.uniform(0.8, 1.2)


@dataclass(frozen=True)
class Answer:
    """What one POST got: a status (None: no answer at all) and the start of the answer or the error."""

    status: int | None
    text: str

    @property
    def delivered(self) -> bool:
        return self.status is not None and 200 <= self.status < 300


def post(target: WebhookTarget, outgoing: Outgoing, timeout_s: float = SEND_TIMEOUT_S) -> Answer:
    """POST one delivery to its webhook (the standard library's HTTP client; no redirects followed)."""
    request = urllib.request.Request(outgoing.url, data=outgoing.body, method="POST", headers={
        "Content-Type": "application/json",
        "User-Agent": f"tritonctl-webhook/{__version__}",
        "X-Tritonctl-Event": outgoing.action,
        "X-Tritonctl-Delivery": outgoing.id,
        # signed now, with the wall clock (the receiver's clock judges it), at every try
        "X-Tritonctl-Signature-256": signature(target.secret, outgoing.body, outgoing.id, int(time.time())),
    })
    try:
        with _OPENER.open(request, timeout=timeout_s) as response:
            return Answer(response.status, _text(response.read(ANSWER_BYTES)))
    except urllib.error.HTTPError as exc:
        try:
            text = _text(exc.read(ANSWER_BYTES))
        except OSError:
            text = ""
        return Answer(exc.code, text or str(exc.reason))
    except urllib.error.URLError as exc:
        return Answer(None, f"no answer: {exc.reason}")
    except (OSError, ValueError) as exc:  # a timeout, a reset connection, a bad URL
        return Answer(None, f"no answer: {exc}")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None  # a 3xx is an answer that is not a delivery: retried, and shown to the operator


_OPENER = urllib.request.build_opener(_NoRedirect)


def _text(raw: bytes) -> str:
    return " ".join(raw.decode("utf-8", "replace").split())


class Webhooks:
    """The delivery worker of one registry, and what `tritonctl webhooks` asks of it."""

    def __init__(self, registry: Registry, targets: Sequence[WebhookTarget], *,
                 active: Callable[[], bool] = lambda: True, backoff: Backoff | None = None,
                 clock: Callable[[], datetime] = utcnow,
                 send: Callable[[WebhookTarget, Outgoing], Answer] = post, wake_on_audit: bool = False) -> None:
        self.store = DeliveryStore(registry)
        self.health = registry.health  # an outage is told once, there (controlplane/store/health.py)
        self.targets: dict[str, WebhookTarget] = {t.url: t for t in targets}
        self.active = active  # in a fleet: whether this daemon leads now
        self.backoff = backoff or Backoff()
        self.clock = clock
        self.send = send
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._posted = threading.Event()  # a POST ended since the last round
        self._thread: threading.Thread | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._in_flight: set[str] = set()
        self._lock = threading.Lock()
        self._pruned_at: datetime | None = None
        self._routed: set[str] | None = None  # the URLs whose absence last ended pending deliveries
        self._pending = True  # whether the last round left deliveries pending (due later, or in flight)
        # In a fleet other hosts write the shared registry's events: only polling sees them.
        self._idle_s = IDLE_POLL_S if wake_on_audit else POLL_S
        if wake_on_audit:
            registry.audit_listeners.append(self.wake)

    # -- configuration (SIGHUP) -------------------------------------------------------------------

    def reconfigure(self, targets: Sequence[WebhookTarget], backoff: Backoff | None = None) -> None:
        """New `[[webhook]]` tables (and secrets) from the next round on."""
        with self._lock:
            self.targets = {t.url: t for t in targets}
            if backoff is not None:
                self.backoff = backoff
        self._wake.set()

    # -- the worker -------------------------------------------------------------------------------

    def start(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=SENDERS, thread_name_prefix="webhook")
        self._thread = threading.Thread(target=self._run, name="webhooks", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop sending; a POST in flight is left to finish on its own (it is sent again after the next
        start if it was not recorded delivered)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def wake(self) -> None:
        """Look at the outbox now (a committed audit event; a reload)."""
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()  # before the round: a wake during it makes the wait below return at once
            started = time.monotonic()
            try:
                if self.active():
                    self.run_once()
            except StoreError as exc:  # the registry busy or unreachable: one line, the round comes again
                if not self.health.told(exc):
                    log.error("webhook delivery round: %s; retrying", exc)
                self._stop.wait(1.0)
            except Exception:  # noqa: BLE001 - an unexpected failure must not end deliveries for good
                log.exception("webhook delivery round failed; retrying")
                self._stop.wait(1.0)
            with self._lock:
                busy = self._pending or bool(self._in_flight)
            self._wake.wait(POLL_S if busy else self._idle_s)
            # At most one round per POLL_S, as when it only polled (a deploy's audit events must not
            # each cost a round), except after a POST ended: its lane's next delivery may go at once.
            if not self._posted.is_set():
                self._stop.wait(max(0.0, started + POLL_S - time.monotonic()))
            self._posted.clear()

    def run_once(self, wait: bool = False) -> int:
        """One round: fan new events out, end deliveries to removed webhooks, delete those ended 30 days
        ago (hourly), send what is due.
        Returns how many POSTs it started (`wait`: and waits for them; tests step it this way)."""
        with self._lock:
            targets = dict(self.targets)
        now = self.clock()
        while self.store.fan_out(lambda record: self._route(record, targets), now, RETRY_FOR):
            pass
        if set(targets) != self._routed:  # at start and after a reload: not a write every round
            self.store.fail_unrouted(list(targets), now)
            self._routed = set(targets)
        if self._pruned_at is None or now - self._pruned_at >= PRUNE_EVERY:
            self.store.prune(now - KEEP_FOR)
            self._pruned_at = now
        started = []
        due, pending = self.store.lanes(now, list(targets)) if targets else ([], False)
        with self._lock:
            self._pending = pending
        for outgoing in due:
            with self._lock:
                if outgoing.id in self._in_flight:
                    continue
                self._in_flight.add(outgoing.id)
            if self._pool is None or wait:
                self._deliver(targets[outgoing.url], outgoing)
            else:
                started.append(self._pool.submit(self._deliver, targets[outgoing.url], outgoing))
        return len(started)

    @staticmethod
    def _route(record: AuditRecord, targets: dict[str, WebhookTarget]) -> list[tuple[str, bytes]]:
        wanted = [url for url, target in targets.items() if target.wants(record.action)]
        if not wanted:
            return []
        body = event_body(event_document(record))
        return [(url, body) for url in wanted]

    def _deliver(self, target: WebhookTarget, outgoing: Outgoing) -> None:
        try:
            answer = self.send(target, outgoing)
            now = self.clock()
            attempts = outgoing.attempts + 1
            if answer.delivered:
                state, retry_at = DELIVERED, None
            else:
                retry_at = now + timedelta(seconds=self.backoff.delay_s(attempts))
                state = FAILED if retry_at > outgoing.retry_until else PENDING
                log.warning("webhook %s delivery %s (event %s, %s %s): %s%s", outgoing.url, outgoing.id[:12],
                            outgoing.event_id, outgoing.action, outgoing.model or "-",
                            answer.status or "", f" {answer.text}" if answer.text else "")
            self.store.finish_attempt(outgoing.id, state=state, status_code=answer.status, answer=answer.text,
                                      now=now, next_attempt_at=retry_at)
            if state == FAILED:
                log.error("webhook %s delivery %s failed for good after %d attempts", outgoing.url,
                          outgoing.id[:12], attempts)
        except Exception:  # noqa: BLE001 - logged; the delivery stays pending and is tried again
            log.exception("webhook delivery %s", outgoing.id)
        finally:
            with self._lock:
                self._in_flight.discard(outgoing.id)
            self._posted.set()
            self._wake.set()  # the lane's next delivery may go now

    # -- what the CLI asks (through the control API) -----------------------------------------------

    def deliveries(self, state: str | None = None, limit: int = 100) -> WebhookDeliveriesResult:
        """`tritonctl webhooks`: deliveries newest first (`state`: only pending, delivered or failed)."""
        if state is not None and state not in DELIVERY_STATES:
            from controlplane.errors import UsageError

            raise UsageError(f"state {state!r}: expected one of {', '.join(DELIVERY_STATES)}")
        return WebhookDeliveriesResult(self.store.list(state, limit))

    def redeliver(self, delivery_id: str) -> DeliveryRecord:
        """`tritonctl webhooks redeliver ID`: send a delivery again (same id), first in its model's lane."""
        with self._lock:
            urls = list(self.targets)
        record = self.store.redeliver(delivery_id, self.clock(), RETRY_FOR, urls)
        self._wake.set()
        return record

    def counts(self) -> dict[str, int]:
        return {state: self.store.count(state) for state in (PENDING, DELIVERED, FAILED)}


def for_registry(settings: Settings, registry: Registry, *, fleet: bool, active: Callable[[], bool]) -> Webhooks:
    """The daemon's delivery worker over `registry`'s events: a single host's own, or in a fleet the shared
    registry's, sent only while `active` (this daemon leads); a fleet's events come from every host, so it
    polls rather than waking on this host's audit writes."""
    return Webhooks(registry, settings.webhook, active=active if fleet else (lambda: True),
                    backoff=Backoff(max_s=settings.webhook_retry_max_s), wake_on_audit=not fleet)
