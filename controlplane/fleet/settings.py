"""Fleet settings: daemon settings like any other (flag > TRITONCTL_* > config file > default, see
controlplane/settings/config.py), validated together here once `fleet` is on."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from controlplane.errors import ConfigError
from controlplane.settings.config import Settings


@dataclass(frozen=True)
class FleetSettings:
    shared_store: Path | str  # a directory or s3://BUCKET/PREFIX every host can read; the leader writes it
    canary_hosts: tuple[str, ...] = ()  # explicit canary set; default: the first `canary_count` by name
    canary_count: int = 1
    wave_size: int = 2  # hosts per wave after the canaries
    heartbeat_s: float = 1.0
    host_timeout_s: float = 10.0  # a host silent this long is left out of new waves (it converges later)
    poll_s: float = 1.0  # LISTEN/NOTIFY wakes hosts at once; this is the fallback poll
    converge_s: float = 2.0  # how often a host compares what it serves with the fleet's target
    # a rollout's bake (controlplane/fleet/bake.py): the canary wave bakes on the daemon's bake limits
    # (`bake_s` long), each later wave `wave_bake_s` long; 0: that wave does not bake
    bake: Settings = Settings()  # the daemon's settings, for their bake limits (`bake_s`, `bake_max_*`, ...)
    wave_bake_s: float = 0.0


def from_settings(settings: Settings) -> FleetSettings:
    """The fleet part of the daemon's settings (called when `fleet` is on, and again on SIGHUP)."""
    return fleet_settings(settings.db_url, settings.host, settings.shared_store, settings.canary_hosts,
                          settings.canary_count, settings.wave_size, heartbeat_s=settings.heartbeat_s,
                          host_timeout_s=settings.liveness_s, converge_s=settings.converge_s,
                          bake=settings, wave_bake_s=settings.wave_bake_s)


def fleet_settings(db_url: str | None, host: str, shared_store: Path | str | None, canary_hosts: str | None,
                   canary_count: int | None, wave_size: int | None, *, heartbeat_s: float = 1.0,
                   host_timeout_s: float = 10.0, converge_s: float = 2.0, bake: Settings | None = None,
                   wave_bake_s: float = 0.0) -> FleetSettings:
    """Validate the fleet flags against the daemon's settings (one-line ConfigErrors)."""
    if not db_url or not db_url.startswith("postgresql"):
        raise ConfigError("fleet: --fleet needs --db-url postgresql+psycopg://... (the shared registry)")
    if not host:
        raise ConfigError("fleet: --fleet needs --host NAME (this host's name in the fleet)")
    if shared_store is None:
        raise ConfigError("fleet: --fleet needs --shared-store DIR (snapshot content for every host)")
    if canary_count is not None and canary_count < 1:
        raise ConfigError("fleet: --canary-count must be at least 1")
    if wave_size is not None and wave_size < 1:
        raise ConfigError("fleet: --wave-size must be at least 1")
    canaries = tuple(h.strip() for h in (canary_hosts or "").split(",") if h.strip())
    if host_timeout_s <= heartbeat_s:
        raise ConfigError(f"fleet: liveness_s ({host_timeout_s:g}) must be longer than heartbeat_s ({heartbeat_s:g})")
    store: Path | str = str(shared_store) if str(shared_store).startswith("s3://") else Path(shared_store)
    return FleetSettings(shared_store=store, canary_hosts=canaries, canary_count=canary_count or 1,
                         wave_size=wave_size or 2, heartbeat_s=heartbeat_s, host_timeout_s=host_timeout_s,
                         converge_s=converge_s, bake=bake or FleetSettings.bake, wave_bake_s=wave_bake_s)
