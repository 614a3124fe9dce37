"""What served when, as the model page draws it: one band per digest, the audit's events as marks.

Pure functions over the JSON documents the API answers (`versions --json`, `audit --json`), so the page
shows exactly what the CLI and the API say. A digest serves from a successful deploy or rollback of it
until the next successful deploy, rollback or unload; a deploy that rolled back leaves the digest before
it serving and marks the failed digest's band with Triton's reason. Positions are percentages of the
span from the first event to `now`, so the band needs no script to draw.

A canary (docs/bake.md "Canary steps") is its own band within the bands: from each step's `canary` audit
line below 100 % until the next one (or the canary's end), the new digest's band carries a canary segment
with its weight, and the band of the digest that served before it one with the rest of the requests (it
still served them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from controlplane.bake.canary import CANARY_ACTION, STEP_LINE
from controlplane.bake.shadow import SHADOW_ACTION
from controlplane.vocab import BAKE_ACTOR  # a failed bake's rollback (docs/bake.md): `rolled_back`, its digest serves

# Which audit actions put a mark on the timeline, and the letter the mark shows (colour is never the only
# signal: each mark is a letter with its kind spelled out in the legend and the title).
MARK_KINDS = {"deploy": "D", "rollback": "R", "quarantine": "Q", "tag": "T", "changeset": "C", "unload": "U",
              "pin": "P", "unpin": "P", "policy": "P", "bake": "B", "canary": "W", "shadow": "S"}
SERVES = ("deploy", "rollback")
GOOD = ("ok", "noop")
# Drawing (static/web.css): a mark is about 1rem wide, centred on its moment, on a band at least 20rem wide, so
# two marks closer than 6 % of the span would overlap: the later one goes down a lane. The served strip (and a
# canary's share under it) is above the lanes, so no mark hides a band, however short (a digest that served
# under a second).
MARK_GAP_PCT = 6.0
STRIP_REM = 1.55  # the served strip and a canary's share under it; lane k's marks are at STRIP_REM + k * LANE_REM
LANE_REM = 1.6


def parse_iso(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(timezone.utc)


def mark_kind(event: dict[str, Any]) -> str:
    """deploy, rollback, quarantine, tag, changeset, ... (a deploy that rolled back is a rollback mark)."""
    action, outcome = event["action"], event["outcome"]
    if action == "skip" or outcome == "invalid":
        return "quarantine"
    if action == "deploy" and outcome == "rolled_back":
        return "rollback"
    return action


@dataclass
class Mark:
    kind: str
    letter: str
    left: float  # percent of the span
    event: dict[str, Any]
    lane: int = 0  # marks closer than MARK_GAP_PCT go down a lane: none covers another

    @property
    def top(self) -> float:
        """rem from the band's top (below the served strip)."""
        return round(STRIP_REM + self.lane * LANE_REM, 2)

    @property
    def title(self) -> str:
        e = self.event
        claimed = f" (claimed {e['claimed']})" if e.get("claimed") else ""
        return f"{self.kind}: {e['action']} {e['outcome']} by {e['actor']}{claimed} at {e['time']}" + (
            f": {e['message']}" if e.get("message") else "")


@dataclass
class Band:
    digest: str
    segments: list[tuple[float, float]] = field(default_factory=list)  # (left %, width %) while it served
    marks: list[Mark] = field(default_factory=list)
    serving_now: bool = False
    canary: list[tuple[float, float, int]] = field(default_factory=list)  # (left %, width %, percent of requests)

    @property
    def height(self) -> float:
        """rem: the served strip and one lane per row of marks (at least one)."""
        return height(self.marks)


def height(marks: list[Mark]) -> float:
    return round(STRIP_REM + max([m.lane + 1 for m in marks] or [1]) * LANE_REM, 2)


def lay_out(marks: list[Mark]) -> None:
    """Give each mark the first lane whose last mark is MARK_GAP_PCT or more to its left (in time order)."""
    ends: list[float] = []  # each lane's last mark
    for mark in sorted(marks, key=lambda m: (m.left, m.event.get("id", 0))):
        lane = next((i for i, end in enumerate(ends) if mark.left - end >= MARK_GAP_PCT), len(ends))
        if lane == len(ends):
            ends.append(mark.left)
        ends[lane] = mark.left
        mark.lane = lane


@dataclass
class Timeline:
    start: datetime | None
    end: datetime
    bands: list[Band]
    other_marks: list[Mark]  # events naming no digest (a change set, an unload)

    @property
    def other_height(self) -> float:
        return height(self.other_marks)


def build_timeline(versions: list[dict[str, Any]], events: list[dict[str, Any]], now: datetime) -> Timeline:
    """Bands in the order the digests were first seen (newest first, like `versions`)."""
    ordered = sorted(events, key=lambda e: (e["time"], e["id"]))
    times = [t for t in (parse_iso(e["time"]) for e in ordered) if t]
    times += [t for t in (parse_iso(v.get("first_seen")) for v in versions) if t]
    start = min(times) if times else None
    span = max((now - start).total_seconds(), 1.0) if start else 1.0

    def pos(moment: datetime) -> float:
        return 0.0 if start is None else round(min(max((moment - start).total_seconds() / span, 0.0), 1.0) * 100, 2)

    bands = {v["digest"]: Band(v["digest"]) for v in versions}
    other: list[Mark] = []
    serving: tuple[str, float] | None = None
    before: dict[str, str] = {}  # a digest -> the one that served before its deploy (a canary splits with it)
    split: dict[str, tuple[float, int]] = {}  # a digest whose canary step runs -> (since %, its weight)

    def end_split(digest: str, at: float) -> None:
        left, weight = split.pop(digest)
        bands[digest].canary.append((left, round(at - left, 2), weight))
        if before.get(digest) in bands:
            bands[before[digest]].canary.append((left, round(at - left, 2), 100 - weight))

    for event in ordered:
        moment = parse_iso(event["time"])
        if moment is None:
            continue
        kind, digest = mark_kind(event), event.get("digest")
        if event["action"] in (CANARY_ACTION, SHADOW_ACTION) and digest:
            bands.setdefault(digest, Band(digest))
            if digest in split:
                end_split(digest, pos(moment))
            step = STEP_LINE.match(event.get("message") or "")
            if step is not None and int(step.group(3)) < 100:
                split[digest] = (pos(moment), int(step.group(3)))
            elif event["action"] == SHADOW_ACTION and (event.get("message") or "").startswith("shadow of "):
                split[digest] = (pos(moment), 0)  # copies only: every request on the previous digest
        if kind in MARK_KINDS:
            mark = Mark(kind, MARK_KINDS[kind], pos(moment), event)
            band = bands.get(digest) if digest else None
            if band is None and digest:
                band = bands.setdefault(digest, Band(digest))
            (band.marks if band else other).append(mark)
        took = event["outcome"] in GOOD or (event["outcome"] == "rolled_back" and event["actor"] == BAKE_ACTOR)
        ends_serving = (event["action"] in SERVES and took and digest) or (
            event["action"] == "unload" and event["outcome"] in GOOD)
        if ends_serving:
            starts = event["action"] != "unload"  # a deploy or rollback starts its digest's band
            left_by = serving[0] if serving else None
            if serving and (not starts or serving[0] != digest):
                left = serving[1]
                bands[serving[0]].segments.append((left, round(pos(moment) - left, 2)))
                serving = None
            if starts and serving is None and digest:
                if left_by is not None and left_by != digest:
                    before[digest] = left_by
                serving = (digest, pos(moment))
    for digest in list(split):
        end_split(digest, 100.0)
    if serving:
        bands[serving[0]].segments.append((serving[1], round(100.0 - serving[1], 2)))
        bands[serving[0]].serving_now = True
    _quarantines(versions, ordered, bands, pos)
    for band in bands.values():
        lay_out(band.marks)
    lay_out(other)
    return Timeline(start, now, list(bands.values()), other)


def _quarantines(versions: list[dict[str, Any]], ordered: list[dict[str, Any]], bands: dict[str, Band],
                 pos: Any) -> None:
    """A Q mark on each quarantined digest's band where it was quarantined: the first deploy of it that failed
    or rolled back by its content's fault (a bake's rollback quarantines nothing), when no audit event of
    its own (a skip, an invalid snapshot) marks it already."""
    for version in versions:
        band = bands.get(version["digest"])
        if not version.get("quarantined") or band is None or any(m.kind == "quarantine" for m in band.marks):
            continue
        event = next((e for e in ordered if e.get("digest") == version["digest"] and e["action"] == "deploy"
                      and e["outcome"] in ("rolled_back", "failed") and e["actor"] != BAKE_ACTOR), None)
        moment = parse_iso(event["time"]) if event else None
        if event is None or moment is None:
            continue
        reason = version.get("quarantine_reason") or event.get("message") or ""
        band.marks.append(Mark("quarantine", MARK_KINDS["quarantine"], pos(moment),
                               {**event, "action": "quarantine", "message": reason}))


# A config.pbtxt line that sets a field: `  max_batch_size: 8`, `name: "x"`.
FIELD_LINE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*:\s*(.+?)\s*$")


@dataclass(frozen=True)
class FieldChange:
    field: str
    a: str  # "" when the field is not in a
    b: str


def config_field_changes(unified_diff: str | None) -> list[FieldChange]:
    """The `field: value` lines of config.pbtxt that the diff removes and adds, paired by field name (a
    field inside a block is named by its own key: `dims`, `kind`; the file's diff below shows where)."""
    if not unified_diff:
        return []
    removed: dict[str, list[str]] = {}
    added: dict[str, list[str]] = {}
    for line in unified_diff.splitlines():
        if line.startswith(("---", "+++", "@@")) or line[:1] not in ("-", "+"):
            continue
        match = FIELD_LINE.match(line[1:])
        if match:
            (removed if line[0] == "-" else added).setdefault(match.group(1), []).append(match.group(2))
    changes = []
    for name in list(dict.fromkeys([*removed, *added])):
        a, b = removed.get(name, []), added.get(name, [])
        for i in range(max(len(a), len(b))):
            changes.append(FieldChange(name, a[i] if i < len(a) else "", b[i] if i < len(b) else ""))
    return changes
