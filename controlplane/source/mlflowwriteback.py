"""The MLflow source's write-back: `tritonctl.*` tags on every model version tritonctl captured
(docs/mlflow.md "What tritonctl writes back").

What a version's tags say comes from a `ServingView`: on a single host `HostView` (this host's
registry: its serving digest, quarantine, the model's last deployment); in a fleet
`controlplane.fleet.mlflowview.FleetView` (the shared registry: which live hosts serve which digest, the
fleet's target, quarantine, rollouts), which writes only while this daemon leads the fleet, so two hosts
never write a version's tags from two views. The same poller thread that polls MLflow runs the
write-back after each poll; a failed write is logged and retried at the next poll and never blocks a
deploy. The served version's MLflow aliases become tritonctl tags of its digest (in a fleet, in the
shared registry, where a fleet's tags live).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from typing import Any, NamedTuple, Protocol

from controlplane.errors import MLflowError, StoreError, TagError
from controlplane.remote.mlflowrest import MLflowRest
from controlplane.store.records import AuditEntry, TagRecord
from controlplane.vocab import SERVING_STATES, Result

log = logging.getLogger("tritonctl.mlflow")

STATE_TAG, DIGEST_TAG, HOSTS_TAG = "tritonctl.state", "tritonctl.digest", "tritonctl.hosts"
ACTOR = "mlflow"  # the actor of the tritonctl tags that mirror MLflow aliases
Key = tuple[str, str]  # (model, version)


class TagRegistry(Protocol):
    """Where the served version's aliases become tritonctl tags."""

    def list_tags(self, model: str | None = None) -> list[TagRecord]: ...
    def move_tag(self, model: str, name: str, digest: str | None, *, actor: str, outcome: str = "ok",
                 message: str = "", attempted: str | None = None) -> str | None: ...


class RegistryView(TagRegistry, Protocol):
    """What the source reads and writes in tritonctl's registry (a Registry): its audit, its tags, and
    on a single host what the write-back reads."""

    def find_model(self, name: str) -> Any: ...
    def get_snapshot(self, model: str, digest: str) -> Any: ...
    def last_deployments(self, models: Any = None) -> Mapping[str, Any]: ...
    def audit(self, *entries: AuditEntry) -> None: ...
    def last_event_id(self) -> int: ...


class Standing(NamedTuple):
    """What serves of one (model, digest): its `tritonctl.state` (None: nothing to say now), the hosts
    serving it (None: not a fleet), and whether it is what the model serves (its aliases become tags)."""

    state: str | None
    hosts: tuple[str, ...] | None
    served: bool


class ServingView(Protocol):
    fleet: bool  # True: `tritonctl.hosts` is written, and a new writer first reads what MLflow holds

    @property
    def tags(self) -> TagRegistry: ...
    def writes(self) -> bool: ...  # whether this daemon writes back now (a fleet: while it leads)
    def look(self) -> object: ...  # reads what it needs; a marker that changes when any of it changed
    def standings(self, pairs: set[tuple[str, str]]) -> dict[tuple[str, str], Standing]: ...


class HostView:
    """A single host: what its own registry says."""

    fleet = False

    def __init__(self, registry: RegistryView) -> None:
        self.registry = registry

    @property
    def tags(self) -> TagRegistry:
        return self.registry

    def writes(self) -> bool:
        return True

    def look(self) -> object:
        return self.registry.last_event_id()  # every deploy, rollback and quarantine is an audit event

    def standings(self, pairs: set[tuple[str, str]]) -> dict[tuple[str, str], Standing]:
        models = sorted({m for m, _ in pairs})
        lasts = self.registry.last_deployments(models) if models else {}
        records = {m: self.registry.find_model(m) for m in models}
        found: dict[tuple[str, str], Standing] = {}
        for model, digest in pairs:
            record = records.get(model)
            if record is not None:
                state = self._state(model, digest, record, lasts.get(model))
                found[(model, digest)] = Standing(state, None, state == "serving")
        return found

    def _state(self, model: str, digest: str, record: Any, last: Any) -> str | None:
        if record.active_digest == digest and record.state in SERVING_STATES and record.removed_at is None:
            return "serving"
        try:
            if self.registry.get_snapshot(model, digest).quarantined:
                return "quarantined"
        except Exception:  # noqa: BLE001 - collected or unknown: nothing to say
            pass
        if last is not None and last.digest == digest and last.outcome in (Result.ROLLED_BACK, Result.FAILED):
            return str(last.outcome)
        if record.active_digest == digest and record.removed_at is not None:
            return "serving"  # removed from MLflow, still serving (as a deleted directory does)
        return None


def hosts_text(hosts: tuple[str, ...] | None) -> str | None:
    """`tritonctl.hosts`: the host names, sorted, comma-separated (None: no tag)."""
    return ",".join(sorted(hosts)) if hosts else None


class WriteBack:
    """Brings each captured version's `tritonctl.*` tags up to date, from a `ServingView`."""

    def __init__(self, rest: MLflowRest, view: ServingView) -> None:
        self.rest = rest
        self.view = view
        self._lock = threading.Lock()
        # (model, version) -> (state, digest, hosts) as last written (or, in a fleet, read from MLflow)
        self._written: dict[Key, tuple[str | None, str, str | None]] = {}
        self._adopted: dict[Key, str] = {}  # versions another writer (a former leader) captured
        self._writing = False  # a fleet: whether this daemon wrote back at the last round
        self._clean_at: tuple[object, str, int] | None = None  # the marker when nothing was left to do

    def forget(self, model: str, version: str) -> None:
        """A version captured again: its tags are written (again) at the next round."""
        with self._lock:
            self._written.pop((model, version), None)

    def run(self, captured: dict[Key, str], aliases: dict[str, dict[str, list[str]]]) -> int:
        """One round; how many versions were tagged. A failure is logged and retried at the next round."""
        if not self.view.writes():
            self._writing = False
            return 0
        if not self._writing and self.view.fleet and not self._adopt():
            return 0  # a new leader compares with what MLflow holds already: read at the next round
        self._writing = True
        captured = {**self._adopted, **captured}
        # Nothing to look at unless what the view reads, the aliases or the versions captured changed
        # since a round that left nothing to retry: a quiet registry costs the view's look alone.
        try:
            marker = (self.view.look(), repr(sorted(aliases.items())), len(captured))
            if marker == self._clean_at:
                return 0
            standings = self.view.standings({(m, d) for (m, _v), d in captured.items()})
        except StoreError as exc:  # the registry's health tells the outage, once
            log.debug("the write-back waits for the registry: %s", exc)
            return 0
        tagged, retry = 0, False
        for (model, version), digest in sorted(captured.items()):
            standing = standings.get((model, digest))
            if standing is None:
                continue
            with self._lock:
                before = self._written.get((model, version))
            state = standing.state
            if state is None and before is not None and before[0] != "serving":
                state = before[0]  # rolled back, failed, quarantined: said until it serves again
            if standing.served:
                self._mirror_aliases(model, version, digest, aliases)
            hosts = hosts_text(standing.hosts) if state == "serving" else None
            written = (state, digest, hosts)
            if before == written:
                continue
            try:
                self._write(model, version, written, before)
            except MLflowError as exc:
                if not exc.missing:  # a deleted version has nothing to tag
                    log.warning("%s; the write-back is retried at the next poll", exc)
                    retry = True
                    continue
            with self._lock:
                self._written[(model, version)] = written
            tagged += 1
        # the start's marker: what changed meanwhile (and the tags moved above) is looked at next round
        self._clean_at = None if retry else marker
        return tagged

    def _write(self, model: str, version: str, written: tuple[str | None, str, str | None],
               before: tuple[str | None, str, str | None] | None) -> None:
        state, digest, hosts = written
        if state is not None:
            self.rest.set_version_tag(model, version, STATE_TAG, state)
        elif before is None or before[0] is not None:
            self.rest.delete_version_tag(model, version, STATE_TAG)
        self.rest.set_version_tag(model, version, DIGEST_TAG, digest)
        if not self.view.fleet:
            return
        if hosts is not None:
            self.rest.set_version_tag(model, version, HOSTS_TAG, hosts)
        elif before is None or before[2] is not None:
            try:
                self.rest.delete_version_tag(model, version, HOSTS_TAG)
            except MLflowError as exc:
                if not exc.missing:  # no such tag: nothing to delete
                    raise

    def _adopt(self) -> bool:
        """The versions MLflow shows tagged by tritonctl (by whichever daemon led before), and their tags
        as they are: compared with, and kept current, from now on. False: MLflow did not answer."""
        try:
            versions = list(self.rest.tagged_versions(DIGEST_TAG))
        except MLflowError as exc:
            if exc.answered and not exc.auth:  # a server that cannot search versions by tag (older MLflow)
                log.warning("%s; the write-back goes on with the versions this daemon captured", exc)
                return True
            log.warning("%s; the write-back reads the tagged versions at the next poll", exc)
            return False
        adopted: dict[Key, str] = {}
        written: dict[Key, tuple[str | None, str, str | None]] = {}
        for row in versions:
            tags = {str(t.get("key")): str(t.get("value")) for t in row.get("tags", ()) or ()}
            key = (str(row.get("name")), str(row.get("version")))
            if tags.get(DIGEST_TAG):
                adopted[key] = tags[DIGEST_TAG]
                written[key] = (tags.get(STATE_TAG), tags[DIGEST_TAG], tags.get(HOSTS_TAG))
        with self._lock:
            self._adopted = adopted
            self._written = written  # what MLflow holds now, whoever wrote it
        self._clean_at = None
        log.info("MLflow write-back: this daemon leads; %d tagged version(s) read from MLflow", len(adopted))
        return True

    def _mirror_aliases(self, model: str, version: str, digest: str, aliases: dict[str, dict[str, list[str]]]) -> None:
        """The served version's MLflow aliases as tritonctl tags of its digest (`status`, `versions`)."""
        registry = self.view.tags
        wanted = {a.lower() for a in aliases.get(model, {}).get(version, [])}
        current = {t.name: t for t in registry.list_tags(model)}
        for alias in sorted(wanted):
            tag = current.get(alias)
            if tag is not None and tag.digest == digest:
                continue
            try:
                registry.move_tag(model, alias, digest, actor=ACTOR,
                                  message=f"MLflow alias {alias} names version {version}")
            except (TagError, ValueError) as exc:
                log.info("%s: MLflow alias %s is not a tritonctl tag: %s", model, alias, exc)
        for name, tag in current.items():
            if tag.moved_by == ACTOR and name not in wanted:
                registry.move_tag(model, name, None, actor=ACTOR,
                                  message=f"MLflow alias {name} no longer names the served version")
