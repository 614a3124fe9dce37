"""The published JSON Schemas of the `--json` documents (docs/schemas/<command>.schema.json), for tests.

One schema per command's document (docs/json.md lists the mapping); `load`, `rollback` and
`unload` share `load`, `pin` and `unpin` share `pin`. Helpers here validate a document against its
schema (Draft 2020-12, `jsonschema`), and walk a schema's fields (`$.models[].drift`) so a test can
say which fields a run produced with a value, not null and not empty.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

ROOT = Path(__file__).resolve().parent.parent
SCHEMAS = ROOT / "docs" / "schemas"

# Each `--json` command (click's path, joined by "-") -> its schema; a flag that changes the document
# (`audit --at`, `status --fleet`) has a schema of its own, named here after the command.
SCHEMA_OF = {
    "status": "status", "load": "load", "rollback": "load", "unload": "load", "versions": "versions",
    "diff": "diff", "audit": "audit", "validate": "validate", "policy": "policy", "pin": "pin", "unpin": "pin",
    "gc": "gc", "db-upgrade": "db-upgrade", "hosts": "hosts", "rollouts": "rollouts", "tag": "tag", "tags": "tags",
    "webhooks": "webhooks", "webhooks-redeliver": "webhooks-redeliver",
    "ensure": "lease", "lease-renew": "lease", "lease-release": "lease",
    "token-create": "token-create", "token-list": "token-list", "token-revoke": "token-revoke",
}
FLAG_SCHEMAS = {"audit-at": "audit --at T", "status-fleet": "status --fleet"}
# Values whose keys are data, not the contract's: a model's config.pbtxt as JSON (Triton's own schema).
OPAQUE = {"config"}


def names() -> list[str]:
    return sorted(p.name.removesuffix(".schema.json") for p in SCHEMAS.glob("*.schema.json"))


@cache
def load(name: str) -> dict[str, Any]:
    return dict(json.loads((SCHEMAS / f"{name}.schema.json").read_text()))


def problems(name: str, document: Any) -> list[str]:
    """Why `document` does not match schema `name` (empty: it does), the most telling reason first."""
    validator = Draft202012Validator(load(name))
    errors = list(validator.iter_errors(document))
    if not errors:
        return []
    first = best_match(errors)
    where = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first.absolute_path)
    return [f"{where}: {first.message}"] + [e.message for e in errors if e is not first]


def assert_valid(name: str, document: Any) -> None:
    found = problems(name, document)
    assert not found, f"this --json document does not match docs/schemas/{name}.schema.json: {found[0]}"


def resolve(schema: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        ref = schema["$ref"]
        assert ref.startswith("#/$defs/"), f"only local $refs: {ref}"
        schema = {**root["$defs"][ref.removeprefix("#/$defs/")], **{k: v for k, v in schema.items() if k != "$ref"}}
    return schema


def branches(schema: dict[str, Any], root: dict[str, Any], where: str = "$") -> list[tuple[str, dict[str, Any]]]:
    """The alternatives of `schema` (anyOf / oneOf unfolded, $refs followed), each with where it is: a
    definition's fields are named after it (`#model.drift`), wherever it is used, so a field counts
    as checked when any document that uses the definition fills it."""
    if "$ref" in schema:
        where = "#" + schema["$ref"].removeprefix("#/$defs/")
    schema = resolve(schema, root)
    alternatives = schema.get("anyOf") or schema.get("oneOf")
    if alternatives:
        return [b for alt in alternatives for b in branches(alt, root, where)]
    return [(where, schema)]


def fields(schema: dict[str, Any], root: dict[str, Any] | None = None, where: str = "$") -> Iterator[str]:
    """Every field a document of `schema` can hold: `$.triton_url`, `#model.drift`, `#cell.held`."""
    root = root or schema
    for at, branch in branches(schema, root, where):
        if branch.get("type") == "array" and "items" in branch:
            yield from fields(branch["items"], root, f"{at}[]")
        for key, sub in branch.get("properties", {}).items():
            yield f"{at}.{key}"
            if key not in OPAQUE:
                yield from fields(sub, root, f"{at}.{key}")
        extra = branch.get("additionalProperties")
        if isinstance(extra, dict):
            yield from fields(extra, root, f"{at}.*")


def filled(document: Any, schema: dict[str, Any], root: dict[str, Any] | None = None,
           where: str = "$") -> Iterator[str]:
    """The fields (as `fields` names them) of `document` that hold a value: not null, not an empty list
    or object."""
    root = root or schema
    matching = [(at, b) for at, b in branches(schema, root, where)
                if Draft202012Validator({**b, "$defs": root.get("$defs", {})}).is_valid(document)]
    for at, branch in matching[:1]:
        if isinstance(document, list):
            for item in document:
                yield from filled(item, branch["items"], root, f"{at}[]")
        elif isinstance(document, dict):
            props, extra = branch.get("properties", {}), branch.get("additionalProperties")
            for key, value in document.items():
                sub = props.get(key, extra if isinstance(extra, dict) else None)
                path = f"{at}.{key}" if key in props else f"{at}.*"
                if value is None or value == [] or value == {} or sub is None:
                    continue
                if key in props:
                    yield path
                if key not in OPAQUE:
                    yield from filled(value, sub, root, path)
