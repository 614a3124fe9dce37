"""What the source handed on and the intake has not handled yet: `status` shows such a model pending.

Owned by the intake (`Intake.in_hand`), read by `status` (controlplane/views/status.py) through the
control plane; `settling_reason` is the watcher's pending reason in `status` words.
"""

from __future__ import annotations

import threading


def settling_reason(since_s: float | None, waits: str | None = None) -> str:
    """`sync_reason` of a model the watcher has a check pending for: the seconds since its last change
    seen (None: none since the watcher was asked to look again) and why its last capture was put off."""
    if since_s is None:
        return f"settling: {waits}" if waits else "settling: the source is looked at again shortly"
    return f"settling: last change {since_s:.1f} s ago" + (f" (last look: {waits})" if waits else "")


class InHand:
    """Models the source handed on and not handled yet ("capturing"), and those the start-up scan
    still has to handle ("start-up scan"): `status` shows them sync pending. Safe from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._handed: dict[str, int] = {}
        self._startup: set[str] = set()

    def handed_on(self, model: str) -> None:
        with self._lock:
            self._handed[model] = self._handed.get(model, 0) + 1

    def handled(self, model: str) -> None:
        with self._lock:
            left = self._handed.get(model, 0) - 1
            if left > 0:
                self._handed[model] = left
            else:
                self._handed.pop(model, None)

    def starting(self, models: set[str]) -> None:
        """The start-up scan's models (an empty set: the scan is over)."""
        with self._lock:
            self._startup = set(models)

    def started(self, model: str) -> None:
        with self._lock:
            self._startup.discard(model)

    def holds(self, model: str) -> bool:
        """Whether `model` was handed on or is the start-up scan's, and not handled yet."""
        with self._lock:
            return model in self._handed or model in self._startup

    def reasons(self, settling: dict[str, float | None], waits: dict[str, str]) -> dict[str, str]:
        """`status`'s pending reasons: what the source is settling (`settling`, with why its last capture
        was put off, `waits`), then what was handed on and is not captured yet."""
        reasons = {model: settling_reason(since, waits.get(model)) for model, since in settling.items()}
        with self._lock:
            handed, startup = list(self._handed), list(self._startup)
        for model in handed:
            reasons.setdefault(model, "capturing")
        for model in startup:
            reasons.setdefault(model, "start-up scan")
        return reasons
