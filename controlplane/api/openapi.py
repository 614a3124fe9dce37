"""The served OpenAPI document made self-contained: the published --json schemas bundled under `components`.

Why: a client generator or a validator reads `GET /v1/openapi.json` alone; a `$ref` to a file the daemon does
not serve leaves a 200 answer undescribed. Each route's result is the JSON Schema published for the CLI's
`--json` document (docs/schemas/NAME.schema.json, the one source of truth), copied in as
`components.schemas.<Name>` with its `$defs` as `<Name>_<def>` and every `$ref` rewritten to point there.
Streamed operations (application/x-ndjson) document their line: a progress step, the result, or an error;
the event stream documents its two event types and their data.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from typing import Any

from controlplane import errors
from controlplane.api.protocol import NDJSON

# docs/schemas in a clone (an editable install); an installed wheel carries them in share/ (setup.cfg data_files).
SCHEMAS_DIRS = (Path(__file__).resolve().parents[2] / "docs" / "schemas",
                Path(sys.prefix) / "share" / "tritonctl" / "schemas")
COMPONENTS = "#/components/schemas/"
PROGRESS_LINE = "ProgressLine"
ERROR_LINE = "ErrorLine"
AUDIT_EVENT = "Audit_event"
STATE_EVENT = "StateEvent"

PROGRESS_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["progress"], "additionalProperties": False,
    "description": "One step of the operation, as it happens",
    "properties": {"progress": {"type": "object", "required": ["model", "step", "state", "message", "digest"],
                                "additionalProperties": False, "properties": {
        "model": {"type": "string"},
        "step": {"type": "string", "description": "the deploy step (capture, validate, load, smoke, ...; on a "
                                                  "fleet also `canary HOST`, `wave N HOST`)"},
        "state": {"type": "string", "description": "the step's state: started, ok, failed, skipped, ..."},
        "message": {"type": "string"},
        "digest": {"type": "string", "description": "the digest the step is about, or empty"}}}},
}
STATE_EVENT_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["model", "state", "reason", "time"], "additionalProperties": False,
    "description": "`event: state` data (no id; not replayed on resume)",
    "properties": {
        "model": {"type": "string"},
        "state": {"type": "string", "description": "settling, deploying, the registry's state when that ends "
                                                   "(serving, failed, ...), rolled_back, quarantined or drift"},
        "reason": {"type": "string"},
        "time": {"type": "string", "description": "ISO 8601 UTC"}},
}
EVENTS_DESCRIPTION = (
    "Server-sent events. `event: audit` (with `id:`, the audit log's id): data is an audit record, "
    f"`{COMPONENTS}{AUDIT_EVENT}` (the object a webhook receives). `event: state` (no id): data is "
    f"`{COMPONENTS}{STATE_EVENT}`. Lines starting with `:` are comments (keepalive). Resume with Last-Event-ID "
    "or ?after=ID.")


def component_name(stem: str) -> str:
    """docs/schemas/status-fleet.schema.json → StatusFleet."""
    return "".join(part.capitalize() for part in stem.split("-"))


def _rewrite(node: Any, name: str) -> Any:
    """The schema with its own `#/$defs/X` references pointing at `components.schemas.<name>_X`."""
    if isinstance(node, dict):
        out = {}
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str) and value.startswith("#/$defs/"):
                out[key] = f"{COMPONENTS}{name}_{value.removeprefix('#/$defs/')}"
            else:
                out[key] = _rewrite(value, name)
        return out
    if isinstance(node, list):
        return [_rewrite(item, name) for item in node]
    return node


def schema_file(stem: str) -> Path:
    """docs/schemas/<stem>.schema.json where this copy of tritonctl has it."""
    for directory in SCHEMAS_DIRS:
        if (directory / f"{stem}.schema.json").is_file():
            return directory / f"{stem}.schema.json"
    raise errors.ConfigError(f"{stem}.schema.json: not in {' or '.join(str(d) for d in SCHEMAS_DIRS)}; "
                             "reinstall tritonctl")


def bundle(stem: str, schemas: dict[str, Any]) -> str:
    """Copy docs/schemas/<stem>.schema.json and its $defs into `schemas`; the component's name."""
    name = component_name(stem)
    if name in schemas:
        return name
    document = json.loads(schema_file(stem).read_text(encoding="utf-8"))
    defs = document.pop("$defs", {})
    for key in ("$schema", "$id"):
        document.pop(key, None)
    document["description"] = (f"{document.get('description', '')} "
                               f"(docs/schemas/{stem}.schema.json)").strip()
    schemas[name] = _rewrite(document, name)
    for key, value in defs.items():
        schemas[f"{name}_{key}"] = _rewrite(value, name)
    return name


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"{COMPONENTS}{name}"}


def result_schema(names: str, media: str, chosen_by: str, schemas: dict[str, Any]) -> dict[str, Any]:
    """A route's 200 answer: the bundled schema ("a|b": one of two, the second chosen by `chosen_by`); for
    NDJSON, the schema of one line (a progress step, then the result or an error)."""
    stems = names.split("|")
    refs = [ref(bundle(stem, schemas)) for stem in stems]
    described = " or ".join(f"docs/schemas/{stem}.schema.json" for stem in stems)
    if len(refs) > 1:
        result: dict[str, Any] = {"oneOf": refs, "description": f"{described} (the second with {chosen_by})"}
    else:
        result = {**refs[0]}
    if media != NDJSON:
        return result
    line = f"{component_name(stems[0])}Line"
    schemas[line] = {"type": "object", "required": ["result"], "additionalProperties": False,
                     "description": "The stream's last line when the operation ended: its --json document",
                     "properties": {"result": result}}
    return {"description": "Each line of the stream, one JSON document per line: `progress` lines as the steps "
                           "happen, then one `result` line, or one `error` line when it failed midway",
            "oneOf": [ref(PROGRESS_LINE), ref(line), ref(ERROR_LINE)]}


def add_line_schemas(schemas: dict[str, Any], error_schema: dict[str, Any]) -> None:
    schemas[PROGRESS_LINE] = copy.deepcopy(PROGRESS_SCHEMA)
    schemas[ERROR_LINE] = {"type": "object", "required": ["error"], "additionalProperties": False,
                           "description": "The stream's last line when the operation failed after it started",
                           "properties": {"error": copy.deepcopy(error_schema["properties"]["error"])}}


def document_events(operation: dict[str, Any], schemas: dict[str, Any]) -> None:
    """/v1/events: its two event types and their data, in the document."""
    bundle("audit", schemas)
    schemas[STATE_EVENT] = copy.deepcopy(STATE_EVENT_SCHEMA)
    operation["description"] = EVENTS_DESCRIPTION
    operation["responses"]["200"] = {"description": EVENTS_DESCRIPTION, "content": {"text/event-stream": {
        "schema": {"type": "string"},
        "x-events": {"audit": {"id": "the audit log's id", "data": ref(AUDIT_EVENT)},
                     "state": {"data": ref(STATE_EVENT)}}}}}
