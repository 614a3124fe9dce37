"""Signed webhooks in a fleet: two `tritonctl daemon --fleet` hosts on one real PostgreSQL registry, both
configured with the same `[[webhook]]`. Every event of the shared registry reaches the receiver, from
the leader only, under one delivery id each; when the leader is SIGKILLed, the next leader takes over
the deliveries (nothing lost, a duplicate only with the same delivery id), and events stay in order
per model.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.harness import wait_for, write_gen_model
from tests.pg import PostgresServer
from tests.test_fleet_e2e import MODEL, Fleet, running_fleet
from tests.test_webhooks_e2e import check_deliveries
from tests.webhook_receiver import Receiver

pytestmark = [pytest.mark.triton, pytest.mark.postgres, pytest.mark.slow]  # about 60 s

HOSTS = ["h1", "h2"]
SECRET = "fleet-webhook-secret-0123456789"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver(SECRET)
    yield server
    server.close()


@pytest.fixture
def fleet(tmp_path: Path, postgres: PostgresServer, receiver: Receiver) -> Iterator[Fleet]:
    secret = tmp_path / "hook.secret"
    secret.write_text(SECRET)
    secret.chmod(0o600)
    config = tmp_path / "tritonctl.toml"
    config.write_text(f'webhook_retry_max_s = 1.0\n\n[[webhook]]\nurl = "{receiver.url}"\nevents = ["*"]\n'
                      f'secret_file = "{secret}"\n')
    def configure(fl: Fleet) -> None:
        for host in HOSTS:
            fl.daemon(host).extra_args += ["--config", str(config)]

    with running_fleet(tmp_path, postgres.new_database("webhooks"), HOSTS, configure) as fl:
        yield fl


def test_the_leader_delivers_the_shared_registrys_events_once_and_a_new_leader_takes_over(
        fleet: Fleet, receiver: Receiver) -> None:
    write_gen_model(fleet.repo, MODEL, 1)
    fleet.wait_gen(1, HOSTS, 90)
    leader = wait_for(fleet.leader, 20, 0.2, "a leader")

    def audit() -> list[dict[str, object]]:
        return list(fleet.cli_json("audit", "--limit", "1000"))

    def delivered_all() -> bool:
        accepted = {r.document["id"] for r in receiver.accepted()}
        return {e["id"] for e in audit()} <= accepted

    wait_for(delivered_all, 60, 0.5, "the first events delivered")
    receiver.slow_s, receiver.mode = 4.0, "slow"  # the leader dies with a delivery in flight
    write_gen_model(fleet.repo, MODEL, 2)
    wait_for(lambda: any(r.answered == 200 for r in receiver.deliveries()), 60, 0.05, "a slow delivery")
    fleet.daemons[leader].kill()
    receiver.mode = "ok"
    survivor = next(h for h in HOSTS if h != leader)
    wait_for(lambda: fleet.leader() == survivor, 30, 0.2, f"{survivor} leads")
    fleet.wait_gen(2, [survivor], 90)
    time.sleep(1.0)
    wait_for(delivered_all, 90, 0.5, "every event of the shared registry delivered")
    events = audit()
    assert {e["host"] for e in events} >= set(HOSTS), "both hosts' events are in the shared registry"
    check_deliveries(receiver.deliveries(), events)
