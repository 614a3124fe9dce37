"""outcome → **subscribers**: where every finished operation's `Outcome` goes.

`bus` (the subscribers, wired once at start), and each subscriber: `bookkeeping` (last action, retries,
restores, served view), `reconciler` (Triton made to serve what the registry says), `log` (the log line
and systemd's STATUS=), `metrics` (Prometheus), `counters` (what the daemon counts about itself),
`webhooks` (signed deliveries of the audit events).
"""
