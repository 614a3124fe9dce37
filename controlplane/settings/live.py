"""The settings the daemon runs with now, which a SIGHUP reload replaces (controlplane/runtime/reload.py)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from controlplane.settings.config import Settings


class LiveSettings:
    """The settings the daemon runs with now: what a SIGHUP reload replaces (`set`). The parts that must
    see a reload hold this and ask it (`live()`, or one setting: `live.getter("idle_unload_s")`), so no
    part is handed a callback into the control plane for them."""

    def __init__(self, settings: Settings) -> None:
        self._now = settings

    def __call__(self) -> Settings:
        return self._now

    def set(self, settings: Settings) -> None:
        self._now = settings

    def getter(self, name: str) -> Callable[[], Any]:
        """A reader of one setting, as it is at each call."""
        return functools.partial(self._get, name)

    def _get(self, name: str) -> Any:
        return getattr(self._now, name)

    def policy_of(self, model: Any) -> str:
        """A model's effective policy: its own, else the configured default (`model.policy`)."""
        return str(model.policy or self._now.policy)
