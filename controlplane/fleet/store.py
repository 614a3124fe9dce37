"""The fleet's tables, as the fleet's modules (and bench/, tests) have always imported them.

The SQL lives in controlplane.store.fleet (all SQL and ORM stays inside controlplane/store/); this
module only names it for the fleet.
"""

from controlplane.store.fleet import CHANNEL, OPEN_ROLLOUT, FleetStore, Rollout, Step, audit_event

__all__ = ["CHANNEL", "OPEN_ROLLOUT", "FleetStore", "Rollout", "Step", "audit_event"]
