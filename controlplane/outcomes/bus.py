"""Where every finished operation's `Outcome` goes: the subscribers wired once at start.

The deploy engine reports each outcome (a deploy, rollback, restore, unload, eviction, change set) to one
`Outcomes`; the control plane subscribes its own bookkeeping first (retries, restores, the served view,
the sentinel, the last action), then the daemon subscribes what reports it (the log line, Prometheus,
systemd's STATUS=). Nothing reached back up through a chain of callbacks: each subscriber is called
in the order it was wired, with the same outcome.
"""

from __future__ import annotations

from collections.abc import Callable

from controlplane.documents.results import Outcome

Subscriber = Callable[[Outcome], None]


class Outcomes:
    """The subscribers of finished operations, called in the order they subscribed."""

    def __init__(self) -> None:
        self._subscribers: list[Subscriber] = []

    def subscribe(self, subscriber: Subscriber) -> None:
        self._subscribers.append(subscriber)

    def publish(self, outcome: Outcome) -> None:
        for subscriber in list(self._subscribers):
            subscriber(outcome)
