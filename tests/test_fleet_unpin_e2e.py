"""rollback -> pin -> edit -> unpin serves the edit, on a fleet of three hosts the same as on a single host
(issue 24; slow: three daemons with their tritonservers and a PostgreSQL, plus one single-host daemon).

The operator rolls a model back, pins it, edits its source (recorded, not deployed: pinned) and unpins
it: nothing holds the model any more, so the source's newest content goes out by the usual rules. On a
single host `unpin` looks at the source again; on a fleet it asks the leader to (wherever the command
came in), which proposes a rollout of the edit to every host.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient

from tests.harness import DaemonProcess, infer_gen, wait_for, write_gen_model
from tests.pg import PostgresServer
from tests.test_fleet_e2e import Fleet, running_fleet

HOSTS = ["h1", "h2", "h3"]
PROBE = "probe"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, postgres: PostgresServer) -> Iterator[Fleet]:
    with running_fleet(tmp_path_factory.mktemp("unpinfleet"), postgres.new_database("unpinfleet"), HOSTS) as fl:
        yield fl


def _gen(client: grpcclient.InferenceServerClient) -> float | None:
    try:
        return infer_gen(client, PROBE)
    except Exception:  # noqa: BLE001 - not loaded (yet)
        return None


def rollback_pin_edit_unpin(repo: Path, cli: DaemonProcess, gens: Callable[[], list[float | None]],
                            recorded: Callable[[], int]) -> None:
    """The operator's sequence through the CLI; `gens`: what every host serves now."""
    write_gen_model(repo, PROBE, 1)
    wait_for(lambda: gens() == [1.0] * len(gens()), 120, 0.2, "generation 1 everywhere")
    write_gen_model(repo, PROBE, 2)
    wait_for(lambda: gens() == [2.0] * len(gens()), 60, 0.2, "generation 2 everywhere")
    cli.cli("rollback", PROBE)
    wait_for(lambda: gens() == [1.0] * len(gens()), 60, 0.2, "rolled back to generation 1 everywhere")
    cli.cli("pin", PROBE)
    before = recorded()
    write_gen_model(repo, PROBE, 3)
    wait_for(lambda: recorded() > before, 30, 0.2, "the edit recorded while pinned")
    assert gens() == [1.0] * len(gens()), "pinned: the edit is recorded, not deployed"
    cli.cli("unpin", PROBE)
    wait_for(lambda: gens() == [3.0] * len(gens()), 30, 0.2, "the edit served everywhere after unpin")


def test_on_a_fleet_unpin_serves_the_edit_on_every_host(fleet: Fleet) -> None:
    def gens() -> list[float | None]:
        return [_gen(fleet.clients[h]) for h in HOSTS]

    # through a host that is not the canary (nor, usually, the leader): the leader learns of the unpin
    rollback_pin_edit_unpin(fleet.repo, fleet.daemons["h3"], gens, lambda: len(fleet.cli_json("versions", PROBE)))
    events = fleet.cli_json("audit", "--model", PROBE, "--action", "unpin")
    assert events and "through h3" in events[0]["message"], events


def test_on_a_single_host_unpin_serves_the_edit(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    daemon = DaemonProcess(repo, tmp_path / "state", settle_s=0.2)
    daemon.start()
    try:
        client = grpcclient.InferenceServerClient(daemon.triton_url())
        try:
            rollback_pin_edit_unpin(repo, daemon, lambda: [_gen(client)], lambda: len(daemon.json("versions", PROBE)))
        finally:
            client.close()
    finally:
        daemon.stop()
