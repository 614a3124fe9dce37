"""`status`'s table: its columns and cells, cut to fit a narrow terminal (cli/plain.py draws it).

Why a module of its own: render.py formats every command's output, and the status table is the one that
carries most of the rules (what each column shows, what a narrow terminal cuts first, a bake's time left), so
it stays readable apart. render.py re-exports what other commands share: `age`, `footprint_cell`, `_when`,
`_short`, `_tagged`.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any


def _when(value: Any) -> str:
    """The one time format of tables: ISO 8601 UTC to the second with a Z (JSON keeps the fraction)."""
    if not value:
        return "-"
    return str(value).split(".")[0].rstrip("Z") + "Z"


def _short(digest: Any) -> str:
    return str(digest)[:12] if digest else "-"


_MODEL_STATE_STYLE = {"serving": "green", "degraded": "yellow", "failed": "bold red", "unloaded": "dim"}
_SYNC_STYLE = {"synced": "green", "pending": "cyan", "held": "yellow", "invalid": "bold red", "removed": "dim"}
_STATUS_COLUMNS = ["MODEL", "STATE", "SYNC", "DIGEST", "VERSIONS", "AGE"]
_WIDE_COLUMNS = ["SINCE", "POLICY", "PINNED", "DRIFT", "SOURCE", "MEMORY", "SYNC REASON", "LAST ERROR", "CONFIG"]
STATUS_WIDTH = 100  # the default table fits here (README "Using it"); `-o wide` shows the rest


def age(value: Any, now: datetime | None = None) -> str:
    """kubectl-style age of an ISO 8601 'Z' time: 45s, 12m, 3h5m, 4d, 2y; '-' when unknown."""
    if not value:
        return "-"
    try:
        moment = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return "-"
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    seconds = int(((now or datetime.now(timezone.utc)) - moment).total_seconds())
    if seconds < 0:
        return "0s"
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 60:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    days = hours // 24
    return f"{days}d" if days < 730 else f"{days // 365}y"


def _tagged(row: dict[str, Any], digest: Any) -> str:
    """A short digest followed by the tags on it (controlplane/intake/tags.py), e.g. '3f2a9c1b2c3d stable,canary'."""
    names = row.get("tags") or []
    return _short(digest) + (f" {','.join(names)}" if names else "")


def footprint_cell(footprint: Any) -> str:
    """'97 MB' (host memory), '97 MB + 512 MB GPU', 'declared 100 MB'; '-' when unknown."""
    if not isinstance(footprint, dict) or footprint.get("memory_mb") is None and footprint.get("gpu_memory_mb") is None:
        return "-"
    parts = [f"{footprint['memory_mb']:.0f} MB"] if footprint.get("memory_mb") is not None else []
    if footprint.get("gpu_memory_mb") is not None:
        parts.append(f"{footprint['gpu_memory_mb']:.0f} MB GPU")
    text = " + ".join(parts)
    return f"declared {text}" if footprint.get("source") == "declared" else text


def completed_cell(completed: Any) -> str:
    """The config Triton completed for a model whose auto_complete_config completes it: 'completed by Triton:
    x FP32[3] -> y FP32[3]; max_batch_size 8'; '' when none is recorded."""
    config = completed.get("config") if isinstance(completed, dict) else None
    if not isinstance(config, dict):
        return ""
    io = [", ".join(f"{t.get('name')} {str(t.get('data_type', '')).removeprefix('TYPE_')}"
                    f"[{','.join(map(str, t.get('dims') or []))}]" for t in config.get(kind) or []) or "none"
          for kind in ("input", "output")]
    return (f"completed by Triton: {io[0]} -> {io[1]}; max_batch_size {config.get('max_batch_size', 0)}"
            + ("; dynamic batching" if "dynamic_batching" in config else ""))


def _ondemand_cell(row: dict[str, Any]) -> str:
    """Policy ondemand: 'standby', 'loading' or 'loaded (leases: N, until HH:MM:SS)' in the STATE column."""
    standing = row.get("ondemand")
    if not isinstance(standing, dict):
        return ""
    if standing.get("state") != "loaded":
        return str(standing.get("state", ""))
    until = str(standing.get("until") or "")
    return f"loaded (leases: {standing.get('leases', 0)}" + (f", until {until[11:19]})" if until else ")")


def _versions_cell(row: dict[str, Any]) -> str:
    """'1,2' when every version is READY, else each one with its state ('1:READY 2:UNAVAILABLE')."""
    versions = row.get("versions") or []
    if not versions:
        return "-"
    if all(v.get("state") == "READY" for v in versions):
        return ",".join(str(v.get("version", "")) for v in versions)
    return " ".join(f"{v.get('version', '')}:{v.get('state', '')}" for v in versions)


def _status_title(data: dict[str, Any]) -> str:
    reachable = data.get("triton_reachable")
    urls = " ".join(f"{k.split('_')[1]} {data[k]}" for k in ("triton_grpc_url", "triton_http_url") if data.get(k))
    exposed = " (KEY EXPOSED: other users can read its command line)" if data.get("triton_key_exposed") else ""
    return f"triton {urls or data.get('triton_url', '')}" + ("" if reachable else " (UNREACHABLE)") + exposed


def canary_text(canary: dict[str, Any], shadow: dict[str, Any] | None = None) -> str:
    """A canary in progress (`canary 10% 42s left`, `canary 10% paused: tritonctl promote`, its shadow first:
    `shadow 42s left, 120 pairs, agreement 1.00`); "" once it ended."""
    left, state = canary.get("seconds_left"), canary.get("state")
    if state == "shadow":
        text = f"shadow {left}s left" if left is not None else "shadow"
        if shadow and shadow.get("pairs"):
            text += f", {shadow['pairs']} pairs, agreement {shadow.get('agreement') or 0:.2f}"
        return text
    if state not in ("running", "paused"):
        return ""
    return f"canary {canary.get('weight')}%" + (" paused: tritonctl promote" if state == "paused" else
                                                 f" {left}s left" if left is not None else "")


def rollout_text(history: dict[str, Any]) -> str:
    """A rollout's history (`versions`): `canary 10% → 100% done`, `canary 10% rolled back`."""
    steps = " → ".join(f"{w}%" for w in history.get("weights") or []) or "-"
    return f"canary {steps} {str(history.get('state') or '').replace('_', ' ')}"


def seconds_left(until: Any, now: datetime | None = None) -> int | None:
    """Whole seconds from now to an ISO 8601 'Z' time (0 once past); None when unknown."""
    try:
        moment = datetime.fromisoformat(str(until).replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return max(0, round((moment - (now or datetime.now(timezone.utc))).total_seconds()))


def baking(row: dict[str, Any]) -> str:
    """'baking: 212 s left' while the row's model bakes (docs/bake.md), else ''."""
    bake = row.get("bake")
    if not isinstance(bake, dict) or bake.get("state") != "baking":
        return ""
    left = seconds_left(bake.get("until"))
    return "baking" if left is None else f"baking: {left} s left"


def bake_line(model: str, bake: dict[str, Any]) -> str:
    """What `load --bake` prints once the deploy ended: the bake that began, its end and time left."""
    left = seconds_left(bake.get("until"))
    return (f"bake: {model} {_short(bake.get('digest'))} bakes until {bake.get('until')}"
            + ("" if left is None else f" ({left} s left)")
            + f"; rolled back by itself if it fails; `tritonctl promote {model}` ends it now")


def _status_cells(row: dict[str, Any], wide: bool) -> list[tuple[str, str]]:
    """One row of the status table: (text, style) per column. SYNC, always shown, also says a canary in progress
    or, else, a bake's time left (its JSON `sync` stays what it is: the canary and the bake are keys of their own)."""
    state, sync = _ondemand_cell(row) or str(row.get("state", "")), str(row.get("sync") or "-")
    canary = canary_text(row["canary"], row.get("shadow")) if row.get("canary") else ""
    bake = "" if canary else baking(row)
    cells = [(str(row["model"]), ""), (state, _MODEL_STATE_STYLE.get(state, "")),
             (f"{sync} {canary}" if canary else bake or sync, "cyan" if bake else _SYNC_STYLE.get(sync, "")),
             (_tagged(row, row.get("digest")), ""), (_versions_cell(row), ""), (age(row.get("since")), "")]
    if wide:
        cells += [(str(text), "") for text in (
            _when(row.get("since")), row.get("policy", ""), "yes" if row.get("pinned") else "no",
            row.get("drift") or "-", _short(row.get("source_digest")), footprint_cell(row.get("footprint")),
            row.get("sync_reason") or "",
            row.get("last_error") or "", completed_cell(row.get("completed_config")) or "-")]
    return cells


# Least important first: what a narrow terminal cuts (to whole words and an ellipsis), then leaves out.
# MODEL, STATE and SYNC are always shown.
_STATUS_CUT = ("DIGEST", "VERSIONS", "STATE")
_STATUS_DROP = ("AGE", "VERSIONS", "DIGEST")


def status_lines(data: dict[str, Any], wide: bool, max_width: int | None = None) -> list[str]:
    """The status table (cli/plain.py). It fits the terminal (STATUS_WIDTH off one) by cutting and then
    leaving out the least important columns; `-o wide` keeps every column whole and lets the lines run
    on, as kubectl does."""
    from cli.plain import UNLIMITED, fit, table, width

    headers = _STATUS_COLUMNS + (_WIDE_COLUMNS if wide else [])
    rows = [_status_cells(row, wide) for row in data.get("models", [])]
    if not wide:
        headers, rows = fit(headers, rows, width(False, STATUS_WIDTH) if max_width is None else max_width,
                            cut_first=_STATUS_CUT, drop_first=_STATUS_DROP)
    lines = table(_status_title(data), headers, rows, UNLIMITED, title_style="italic")
    assert lines is not None  # an unlimited width always fits
    return lines
