"""What an MLflow source writes back in a fleet (docs/mlflow.md "In a fleet"): the fleet's view, read
from the shared registry, never one host's own.

Every daemon of a fleet polls MLflow (whichever leads hands the alias moves to its leader duties), but
only the leader writes the `tritonctl.*` tags, each round from the shared record: which live hosts
serve which digest (`host_models`, each host's reports and steps), the fleet's target, the shared
quarantine and the rollouts that ended `rolled_back`. So two daemons never write one version's tags from
two views; around a change of leader both would write the same values. The new leader first reads the
tags MLflow holds (controlplane/source/mlflowwriteback.py `WriteBack._adopt`) and goes on from them.
"""

from __future__ import annotations

from collections.abc import Callable

from controlplane.source.mlflowwriteback import Standing, TagRegistry
from controlplane.store.fleet import FleetStore
from controlplane.store.registry import Registry
from controlplane.vocab import SERVING_STATES

HOLDING = (*SERVING_STATES, "held")  # a host's model that serves its digest (held: an operator's --host action)


class FleetView:
    """A `ServingView` over the shared registry; it writes while `leads()`."""

    fleet = True

    def __init__(self, shared: Registry, leads: Callable[[], bool], liveness_s: float) -> None:
        self.shared = shared
        self.store = FleetStore(shared)
        self.leads = leads
        self.liveness_s = liveness_s
        self._held: list[tuple[str, str, str, str]] = []
        self._live: set[str] = set()
        self._targets: dict[str, str] = {}

    @property
    def tags(self) -> TagRegistry:
        return self.shared  # a fleet's tags live in the shared registry

    def writes(self) -> bool:
        return self.leads()

    def look(self) -> object:
        """Which host holds which digest, who is alive, the targets, and the newest audit event (each
        step, quarantine and rollout end is one): three small queries a round, on the leader."""
        self._held = self.store.held_digests()
        self._live = set(self.store.live_hosts(self.liveness_s))
        self._targets = self.store.targets()
        return (self.shared.last_event_id(), tuple(self._held), tuple(sorted(self._live)),
                tuple(sorted(self._targets.items())))

    def standings(self, pairs: set[tuple[str, str]]) -> dict[tuple[str, str], Standing]:
        hosts: dict[tuple[str, str], list[str]] = {}
        for model, host, digest, held in self._held:
            if held in HOLDING and host in self._live:
                hosts.setdefault((model, digest), []).append(host)
        ended: dict[tuple[str, str], str] = {}  # (model, digest) -> how its newest finished rollout ended
        if any(pair not in hosts for pair in pairs):
            for rollout in reversed(self.store.rollouts(("done", "rolled_back"), limit=200)):
                ended[(rollout.model, rollout.digest)] = rollout.state
        found: dict[tuple[str, str], Standing] = {}
        for model, digest in pairs:
            serving = tuple(sorted(hosts.get((model, digest), ())))
            state: str | None = "serving" if serving else None
            if state is None:
                state = "quarantined" if self._quarantined(model, digest) else None
            if state is None and ended.get((model, digest)) == "rolled_back":
                state = "rolled_back"
            found[(model, digest)] = Standing(state, serving, self._targets.get(model) == digest and bool(serving))
        return found

    def _quarantined(self, model: str, digest: str) -> bool:
        try:
            return bool(self.shared.get_snapshot(model, digest).quarantined)
        except Exception:  # noqa: BLE001 - not recorded in the shared registry (yet), or collected
            return False
