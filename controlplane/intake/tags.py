"""Tags: names operators give a model's versions (`stable`, `canary`), and models that track one.

Why: operators name content by digest prefix today; a tag lets CI write every candidate under the manual
policy and promote by moving a name (TensorFlow Serving's version labels, MLflow's aliases). The rules:

- a tag name is lowercase letters, digits, `-`, `_`, `.`, at most 63 characters, starts with a letter or
  digit, and is not a hex string a digest prefix could be (so `diff MODEL stable 3f2a9c` is never ambiguous);
- a tag never points at invalid or collected content;
- for a model that tracks a tag (`policy MODEL track:NAME`) moving the tag deploys its digest with the
  usual verification (on a fleet: a rollout); if that deploy does not succeed the move is recorded as
  failed and the tag points at the digest that still serves: a tracked tag never names content that
  does not serve.

Every move, deletion and failed move is one row of `tag_moves` and one audit event (action `tag`), written
in one transaction by `Registry.move_tag`. The registry is the shared one on a fleet. This module decides;
the control API and the CLI only call it and print. It imports no SQLAlchemy (the read commands use it).
"""

from __future__ import annotations

import re
import threading
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

from controlplane.documents.results import PolicyResult, ServingAtResult, TagResult, TagsResult, VersionsResult
from controlplane.errors import ConflictError, NotFoundError, TagError, TritonctlError
from controlplane.intake.decision import Rule, decide, held
from controlplane.names import MIN_DIGEST_PREFIX, validate_digest, validate_model_name
from controlplane.store.records import ModelRecord, SnapshotRecord, TagRecord
from controlplane.vocab import Policy

if TYPE_CHECKING:
    from datetime import datetime

    from controlplane.deploy.engine import ProgressFn
    from controlplane.ports import TagTarget
    from controlplane.store.registry import Registry

MAX_TAG_LENGTH = 63
TRACK_PREFIX = "track:"

_TAG_RE = re.compile(r"[a-z0-9][a-z0-9._-]*", re.ASCII)
_HEX_RE = re.compile(r"[0-9a-f]+", re.ASCII)


class TagReader(Protocol):
    """What the read commands need: a Registry or a SqliteReader."""

    def find_model(self, name: str) -> ModelRecord | None: ...
    def get_snapshot(self, model: str, digest: str) -> SnapshotRecord: ...
    def list_tags(self, model: str | None = None) -> list[TagRecord]: ...
    def tags_at(self, when: datetime, model: str | None = None) -> list[TagRecord]: ...
    def tracks(self) -> dict[str, str]: ...


def validate_tag_name(name: str) -> str:
    """Return `name` if it is a valid tag name; TagError (exit 2) with a one-line reason if not."""
    if not isinstance(name, str) or not name:
        raise TagError("tag name is empty")
    shown = ascii(name) if len(name) <= 70 else ascii(name[:66]) + "..."
    if len(name) > MAX_TAG_LENGTH:
        raise TagError(f"tag name {shown} is longer than {MAX_TAG_LENGTH} characters")
    if not _TAG_RE.fullmatch(name):
        raise TagError(f"tag name {shown}: use lowercase letters, digits, '-', '_' and '.', "
                       "starting with a letter or digit")
    if len(name) >= MIN_DIGEST_PREFIX and _HEX_RE.fullmatch(name):
        raise TagError(f"tag name {shown} is a hex string that reads as a digest prefix; add a letter g-z or "
                       "a '-', e.g. 'v-" + name[:8] + "'")
    return name


def looks_like_digest(ref: str) -> bool:
    value = ref.lower().removeprefix("sha256:")
    return len(value) >= MIN_DIGEST_PREFIX and bool(_HEX_RE.fullmatch(value))


def find_tag(registry: TagReader, model: str, name: str) -> TagRecord | None:
    return next((t for t in registry.list_tags(model) if t.name == name), None)


def tag_digest(registry: TagReader, model: str, name: str) -> str:
    """The digest tag `name` of `model` points at (NotFoundError, exit 2, when there is no such tag)."""
    validate_tag_name(name)
    tag = find_tag(registry, model, name)
    if tag is None:
        raise NotFoundError(f"model '{model}' has no tag '{name}'; `tritonctl tags {model}` lists its tags")
    return tag.digest


def resolve_ref(registry: TagReader, model: str, ref: str) -> str:
    """A digest (prefix) or a tag name → what `get_snapshot` accepts (diff's `stable canary`)."""
    if looks_like_digest(ref):
        return validate_digest(ref)
    tag = find_tag(registry, model, ref)
    if tag is None:  # a mistyped digest reads as a tag name: say both were tried
        raise NotFoundError(f"'{ref}' is neither a digest nor a tag of '{model}'; `tritonctl versions {model}` "
                            f"lists its digests, `tritonctl tags {model}` its tags")
    return tag.digest


def by_digest(tags: list[TagRecord]) -> dict[tuple[str, str], list[str]]:
    """(model, digest) → the names of the tags on it, sorted."""
    out: dict[tuple[str, str], list[str]] = {}
    for tag in tags:
        out.setdefault((tag.model, tag.digest), []).append(tag.name)
    return {key: sorted(names) for key, names in out.items()}


# -- read side (`tags`, `tags --at`, versions, audit --at) -------------------------------------------


def listing(registry: TagReader, model: str | None = None, at: str | None = None) -> TagsResult:
    """`tritonctl tags [MODEL] [--at T] --json`: {"at": T or null, "tags": [{model, name, digest, moved_by,
    moved_at}]}; with --at, where each tag pointed at T and who moved it there when."""
    from controlplane.base.clock import parse_time

    if model is not None:
        validate_model_name(model)
        if registry.find_model(model) is None:
            raise NotFoundError(f"model '{model}' is unknown to the registry")
    if at:
        moment = parse_time(at, "--at")
        rows = registry.tags_at(moment, model)
        return TagsResult(moment, rows)
    return TagsResult(None, registry.list_tags(model))


def annotate_versions(registry: TagReader, model: str, result: VersionsResult) -> VersionsResult:
    """`versions MODEL`: each digest's tags (key `tags`)."""
    tagged = by_digest(registry.list_tags(model))
    result.versions = [replace(row, tags=tuple(tagged.get((model, row.snapshot.digest), [])))
                       for row in result.versions]
    return result


def annotate_serving_at(registry: TagReader, result: ServingAtResult, model: str | None) -> ServingAtResult:
    """`audit --at T`: the tags that pointed at each served digest at T (key `tags`)."""
    result.tags = {key: names for key, names in by_digest(registry.tags_at(result.at, model)).items()}
    return result


# -- write side (the daemon) ---------------------------------------------------------------------------


def tag_registry(target: TagTarget) -> Registry:
    """Where tags live: the shared registry on a fleet, the host's own otherwise."""
    return target.tag_registry()


def _short(digest: str | None) -> str:
    return (digest or "none")[:12]


def _result(model: str, name: str, outcome: str, digest: str | None, old: str | None, message: str,
            deployed: bool, active: str | None) -> TagResult:
    return TagResult(model, name, outcome, digest, old, active, deployed, message)


def move(target: TagTarget, model: str, name: str, ref: str, actor: str, progress: ProgressFn | None = None,
         delete: bool = False) -> TagResult:
    """`tritonctl tag MODEL NAME [DIGEST]` / `--delete`: point NAME at DIGEST (default: what serves now)."""
    validate_model_name(model)
    validate_tag_name(name)
    registry = tag_registry(target)
    record = registry.find_model(model)
    if record is None:
        raise NotFoundError(f"model '{model}' is unknown to the registry; `tritonctl status` lists the models")
    current = find_tag(registry, model, name)
    old = current.digest if current else None
    if delete:
        if ref:
            raise TagError("tag --delete takes no DIGEST")
        if current is None:
            raise NotFoundError(f"model '{model}' has no tag '{name}'")
        if registry.tracks().get(model) == name:
            raise ConflictError(f"model '{model}' tracks tag '{name}'; set another policy first "
                           f"(`tritonctl policy {model} manual`)")
        message = f"tag {name} deleted (was {_short(old)})"
        registry.move_tag(model, name, None, actor=actor, message=message)
        return _result(model, name, "ok", None, old, message, False, record.active_digest)
    if ref:
        snap = registry.get_snapshot(model, resolve_ref(registry, model, ref))
    else:
        if not record.active_digest:
            raise ConflictError(f"model '{model}' serves nothing: give the DIGEST to tag")
        snap = registry.get_snapshot(model, record.active_digest)
    if not snap.valid:
        raise TagError(f"content {_short(snap.digest)} of '{model}' is invalid ({snap.first_error}); "
                       "a tag cannot point at it")
    if snap.collected:
        raise TagError(f"content {_short(snap.digest)} of '{model}' was collected by gc; a tag cannot point at it")
    message = f"tag {name}: {_short(old)} -> {_short(snap.digest)}"
    tracked = registry.tracks().get(model) == name
    rule = decide(record, snap, policy=Policy.AUTO, chosen=True).rule  # the tag chose it: pin and serving hold
    if not tracked or rule in (Rule.PINNED, Rule.SERVING):
        held = tracked and rule is Rule.PINNED and snap.digest != record.active_digest
        registry.move_tag(model, name, snap.digest, actor=actor,
                          message=message + ("; pinned: not deployed until unpin" if held else ""))
        return _result(model, name, "ok", snap.digest, old, message, False, record.active_digest)
    return _move_tracked(target, registry, model, name, snap.digest, old, actor, progress, message)


def _move_tracked(target: TagTarget, registry: Registry, model: str, name: str, digest: str, old: str | None,
                  actor: str, progress: ProgressFn | None, message: str) -> TagResult:
    """Deploy first (what serves keeps serving meanwhile), then record the move: ok, or failed with the tag
    back on the digest that still serves."""
    with _lock(model):
        active: str | None = None
        try:
            outcome = target.deploy_tagged(model, digest, actor, progress)  # on a fleet: a rollout
            state, detail, active = outcome.outcome, outcome.message, outcome.active_digest
        except TritonctlError as exc:
            state, detail = "failed", str(exc)
        if state in ("ok", "noop"):
            text = f"{message}; deployed ({detail})"
            registry.move_tag(model, name, digest, actor=actor, message=text)
            return _result(model, name, "ok", digest, old, text, True, digest)
        target.forget_retry(model)  # the move failed: no later retry may deploy what the tag does not name
        serving = registry.find_model(model)
        still = active or (serving.active_digest if serving else None) or old
        text = (f"tag {name}: move to {_short(digest)} failed ({state}: {detail}); "
                f"{name} stays at {_short(still)}, which serves")
        registry.move_tag(model, name, still, actor=actor, outcome="failed", message=text, attempted=digest)
        return _result(model, name, state, still, old, text, True, still)


_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


def _lock(model: str) -> threading.Lock:
    """One tracked move (or follow) of a model at a time in this daemon."""
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(model, threading.Lock())


def follow(target: TagTarget, model: str, actor: str) -> TagResult | None:
    """A tracking model not serving its tag's digest (just set to track, unpinned): deploy it; a failed
    deploy points the tag back at what serves. None when there is nothing to do."""
    registry = tag_registry(target)
    record = registry.find_model(model)
    track = registry.tracks().get(model)
    if record is None or not track:
        return None
    tag = find_tag(registry, model, track)
    if tag is None:
        return None
    # pinned or serving it: nothing to do; invalid or quarantined content fails the move (the tag goes back)
    if decide(record, registry.get_snapshot(model, tag.digest), policy=Policy.AUTO, chosen=True).rule in (
            Rule.PINNED, Rule.SERVING):
        return None
    message = f"tag {tag.name}: {_short(record.active_digest)} -> {_short(tag.digest)} (tracking)"
    return _move_tracked(target, registry, model, tag.name, tag.digest, tag.digest, actor, None, message)


def refuse_host(policy: str, host: str) -> None:
    """`policy MODEL track:NAME --host H` is refused (exit 2): a tag and the models tracking it are the
    fleet's, in the shared registry, so no single host can track one on its own."""
    if host and policy.startswith(TRACK_PREFIX):
        raise TagError(f"policy {policy} takes no --host {host}: tracking is fleet-wide (the tag lives in the "
                       "shared registry); run it without --host")


def set_track(target: TagTarget, model: str, policy: str, actor: str, through: str = "") -> PolicyResult:
    """`policy MODEL track:NAME`: the model serves whatever NAME points to (deployed in the background
    when it serves something else now). `through`: on a fleet, the host the command came through
    (controlplane.fleet.verbs), named in the audit event like any fleet policy change."""
    validate_model_name(model)
    name = validate_tag_name(policy[len(TRACK_PREFIX):])
    registry = tag_registry(target)
    if registry.find_model(model) is None:
        raise NotFoundError(f"model '{model}' is unknown to the registry")
    digest = tag_digest(registry, model, name)
    where = f" on the fleet (through {through})" if through else ""
    registry.set_track(model, name, actor, message=f"policy track:{name}{where} (tag {name} is at {_short(digest)})")
    record = registry.get_model(model)
    if digest != record.active_digest and held(record) is None:
        threading.Thread(target=_follow_logged, args=(target, model, actor), name=f"track-{model}",
                         daemon=True).start()
    return PolicyResult(model, f"{TRACK_PREFIX}{name}", inherited=False, fleet=bool(through), tag=name,
                        digest=digest)


def _follow_logged(target: TagTarget, model: str, actor: str) -> None:
    import logging

    try:
        follow(target, model, actor)
    except TritonctlError as exc:
        logging.getLogger("tritonctl.tags").error("%s: following its tag failed: %s", model, exc)


def untrack(target: TagTarget, model: str) -> None:
    """Any other policy ends tracking."""
    registry = tag_registry(target)
    if model in registry.tracks():
        registry.set_track(model, None, "")
