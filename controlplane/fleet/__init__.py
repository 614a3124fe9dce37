"""Scale-out: one control plane for a fleet of tritonservers sharing a PostgreSQL registry.

Every host runs `tritonctl daemon --fleet --host NAME` next to its own tritonserver. The daemons elect
one leader (a PostgreSQL advisory lock); the leader watches the source repository, records snapshots,
ships their content through a shared object store and drives rollouts (canary, then waves, rollback
everywhere on a failure). Every host deploys with its own single-host state machine and reports each
step to the fleet tables. Off (and never imported) unless `--fleet` is given. See docs/fleet.md.
"""
