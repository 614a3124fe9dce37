"""The published JSON Schemas themselves (docs/schemas/, docs/json.md): well-formed, one per
`--json` command, closed, every key typed and listed, in step with the vocabulary and with the results
dataclasses that make the documents.

tests/test_json_contract.py validates real documents against them; this file (the fast tier) checks
what a real run cannot: that a results dataclass with every field set (no null, no empty list) matches
its schema and fills every field the schema has, so the schema has no field the code lost, and the
code no field the schema lacks, whatever a scenario happens to leave null.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Any

import click
import pytest
from jsonschema import Draft202012Validator

from cli.main import cli
from controlplane.documents.access import TokenCreated, TokenList, TokenRow
from controlplane.documents.results import (
    AuditResult,
    DbUpgradeResult,
    DiffResult,
    FileChange,
    FileSize,
    GcResult,
    HoldResult,
    LeaseResult,
    MigrationRow,
    Outcome,
    PinResult,
    PolicyResult,
    ServingAtResult,
    StatusResult,
    StatusRow,
    TagResult,
    TagsResult,
    VersionRow,
    VersionsResult,
    VersionState,
    WebhookDeliveriesResult,
)
from controlplane.documents.validation import ValidationReport
from controlplane.fleet.results import FleetMatrix, HostRow, MatrixCell, MatrixRow, PlacementCell
from controlplane.store.records import (
    AuditRecord,
    CompletedConfigRecord,
    DeliveryRecord,
    FootprintRecord,
    Rollout,
    ServingRecord,
    SnapshotRecord,
    Step,
    TagRecord,
    TokenRecord,
)
from controlplane.validation.fields import ERROR, WARNING
from controlplane.validation.modelconfig import Problem, ValidationResult
from controlplane.vocab import Cause, ModelState, Result, SyncState
from tests import jsonschemas

D1, D2, D3 = "d1" * 32, "d2" * 32, "d3" * 32
T = datetime(2026, 11, 1, 12, 0, 0, 250000)
JSON_DOC = jsonschemas.ROOT / "docs" / "json.md"  # the JSON contract (the README links it)


def _json_commands() -> list[str]:
    found = []

    def walk(group: click.Group, path: tuple[str, ...]) -> None:
        ctx = click.Context(group)
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            if isinstance(command, click.Group):
                if any(p.name == "as_json" for p in command.params):  # `webhooks` lists, `webhooks redeliver` acts
                    found.append("-".join((*path, name)))
                walk(command, (*path, name))
            elif command is not None and any(p.name == "as_json" for p in command.params):
                found.append("-".join((*path, name)))

    walk(cli, ())
    return sorted(found)


def _subschemas(schema: Any, where: str = "$") -> list[tuple[str, dict[str, Any]]]:
    """Every schema object inside `schema` (definitions included), with where it is."""
    found: list[tuple[str, dict[str, Any]]] = []
    if isinstance(schema, dict):
        if any(k in schema for k in ("type", "properties", "items", "$ref", "anyOf", "oneOf", "enum", "const")):
            found.append((where, schema))
        for key, value in schema.items():
            if key in ("properties", "$defs"):
                for name, sub in value.items():
                    found += _subschemas(sub, f"{where}.{name}")
            elif key in ("items", "additionalProperties"):
                found += _subschemas(value, f"{where}[]" if key == "items" else f"{where}.*")
            elif key in ("anyOf", "oneOf"):
                for i, sub in enumerate(value):
                    found += _subschemas(sub, f"{where}|{i}")
    return found


# --- the schemas as files ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", jsonschemas.names())
def test_each_schema_is_a_draft_2020_12_schema(name: str) -> None:
    schema = jsonschemas.load(name)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"] == f"{name}.schema.json" and schema["title"] and schema["description"]
    Draft202012Validator.check_schema(schema)


def test_every_json_command_has_a_schema_and_every_schema_a_command() -> None:
    commands = _json_commands()
    assert set(commands) == set(jsonschemas.SCHEMA_OF), (
        f"`--json` commands without a schema in tests/jsonschemas.py SCHEMA_OF: "
        f"{sorted(set(commands) - set(jsonschemas.SCHEMA_OF))}; listed but gone: "
        f"{sorted(set(jsonschemas.SCHEMA_OF) - set(commands))}")
    published = set(jsonschemas.names())
    wanted = set(jsonschemas.SCHEMA_OF.values()) | set(jsonschemas.FLAG_SCHEMAS)
    assert wanted <= published, f"no docs/schemas/<name>.schema.json for {sorted(wanted - published)}"
    assert published <= wanted, f"schemas no command prints: {sorted(published - wanted)}"


@pytest.mark.parametrize("name", jsonschemas.names())
def test_every_object_is_closed_and_requires_every_key_it_always_has(name: str) -> None:
    """A key the code emits that the schema lacks fails validation (additionalProperties: false); a
    key that is not always there says so ("Present only ...")."""
    for where, sub in _subschemas(jsonschemas.load(name)):
        types = sub.get("type")
        if "properties" in sub:
            assert sub.get("additionalProperties") is False, f"{name}: {where} is not closed"
            for key, prop in sub["properties"].items():
                if key not in sub.get("required", []):
                    assert str(prop.get("description", "")).startswith("Present only"), (
                        f"{name}: {where}.{key} is optional but does not say when it is present")
        elif types == "object" or (isinstance(types, list) and "object" in types):
            opaque = where.rsplit(".", 1)[-1] in jsonschemas.OPAQUE
            assert opaque or isinstance(sub.get("additionalProperties"), dict), (
                f"{name}: {where} is an object with neither its keys nor its values' schema")
        if types == "array" or (isinstance(types, list) and "array" in types):
            assert isinstance(sub.get("items"), dict), f"{name}: {where} is a list whose items have no schema"
        assert types != [] and "{}" != str(sub), f"{name}: {where} accepts anything"


def test_shared_definitions_are_the_same_in_every_schema() -> None:
    """Each schema stands alone (the HTTP API's OpenAPI document references them one by one); a
    definition they share (`digest`, `time`, `problem`, `policy`) is written the same in each."""
    seen: dict[str, tuple[str, Any]] = {}
    for name in jsonschemas.names():
        for key, definition in jsonschemas.load(name).get("$defs", {}).items():
            first = seen.setdefault(key, (name, definition))
            assert definition == first[1], f"$defs.{key} differs between {first[0]} and {name}"


def _enum(name: str, *path: str) -> set[Any]:
    schema: Any = jsonschemas.load(name)
    for key in path:
        schema = jsonschemas.resolve(schema, jsonschemas.load(name))[key]
    return set(jsonschemas.resolve(schema, jsonschemas.load(name))["enum"])


def test_enumerations_are_the_vocabulary() -> None:
    """A new state, sync state, cause or outcome in controlplane/vocab.py needs its schema updated."""
    assert _enum("status", "$defs", "model", "properties", "state") == {s.value for s in ModelState}
    assert _enum("status", "$defs", "model", "properties", "sync") == {s.value for s in SyncState}
    assert _enum("load", "$defs", "outcome", "properties", "cause") == {c.value for c in Cause}
    assert _enum("load", "$defs", "outcome", "properties", "outcome") == (
        {r.value for r in Result} - {Result.INVALID.value, Result.SKIPPED.value, Result.INCONCLUSIVE.value,
                                     Result.WARNING.value}) | {"accepted"}
    assert _enum("audit", "$defs", "event", "properties", "outcome") == {r.value for r in Result}
    assert _enum("validate", "$defs", "problem", "properties", "severity") == {ERROR, WARNING}


def test_the_json_reference_links_every_schema_and_names_its_fields() -> None:
    section = JSON_DOC.read_text().split("# JSON output", 1)[1]
    for name in jsonschemas.names():
        assert f"](schemas/{name}.schema.json)" in section, f"docs/json.md does not link {name}"
        keys = {path.rsplit(".", 1)[-1] for path in jsonschemas.fields(jsonschemas.load(name))}
        missing = sorted(k for k in keys if f'"{k}"' not in section)
        assert not missing, f"docs/json.md does not name {missing} of {name}.schema.json"


# --- the results dataclasses, every field set ------------------------------------------------------------


def _snapshot(digest: str) -> SnapshotRecord:
    return SnapshotRecord(manifest="{}", config={"name": "m", "backend": "python"}, versions=[1, 2],
                          served_versions=[2], valid=False,
                          problems=[{"file": "config.pbtxt", "field": "input[0].dims", "message": "missing",
                                     "severity": "error"}],
                          total_bytes=120, model="m", digest=digest, first_seen=T, last_seen=T, quarantined=True,
                          quarantine_reason="initialize() raised", collected=True)


def _canary() -> dict[str, Any]:
    """A canary's document as the bake writes it (controlplane/bake/canary.py), at its second step, paused."""
    from controlplane.bake.canary import Canary
    from controlplane.deploy.aliases import Lane, Target

    canary = Canary((10, "pause", 100), (Lane("m", Target("m__d1d1d1d1", D1), Target("m__d2d2d2d2", D2)),),
                    step_started=1767225600.0)
    canary.history.append({"step": 0, "weight": 10, "started": "2026-01-01T00:00:00Z",
                           "ended": "2026-01-01T00:01:00Z", "outcome": "passed", "requests": 312, "failures": 0})
    canary.begin(1, 1767225660.0, {})
    document = canary.to_json(60.0, now=1767225670.0)
    document["seconds_left"] = 50  # a running step's (paused: null); the schema types both
    return document


def _traffic() -> dict[str, Any]:
    """A row's traffic as the gateway's figures give it (controlplane/gateway/figures.py `Figures.to_json`)."""
    from controlplane.gateway.figures import Figures

    figures = Figures()
    slot = figures.slot("m", D1, "m__" + D1[:8])
    slot.grpc.requests, slot.http.requests = 3, 1
    slot.grpc.fail("model")
    slot.grpc.observe(0.004)
    slot.http.fail("client")
    figures.last["m"] = 1767225600.0
    return figures.to_json()["models"]["m"]


def _shadow() -> dict[str, Any]:
    """A shadow's document as the bake writes it (controlplane/bake/shadow.py), rolled back on a disagreement whose
    inputs were kept, with the gateway's figures (controlplane/gateway/shadow.py `ShadowState.to_json`)."""
    from controlplane.bake.shadow import ShadowPhase

    latency = {"buckets": [0.001, 0.01], "cumulative": [3, 30], "count": 30, "sum_s": 0.09}
    phase = ShadowPhase("0123abcd89ef4567", 300.0, 1767225600.0, keep_inputs=True, figures={
        "copied": 31, "pairs": 30, "agreed": 29, "disagreed": 1, "errors": {"shadow": 0, "serving": 0},
        "skipped": {"rate": 2, "busy": 0}, "latency": {"serving": latency, "shadow": latency},
        "disagreements": [{"kind": "value", "output": "y", "index": 3, "serving": 1.0, "shadow": 1.5,
                           "time": 1767225601.5, "protocol": "grpc",
                           "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [0.1, 0.2, 0.3, 0.9],
                                       "truncated": False}, {"error": "the request's inputs could not be read"}]}]})
    phase.end("rolled_back", "shadow agreement 0.97 < 1 over 30 pairs (1 disagreed)", 1767225602.0)
    document = phase.to_json(now=1767225602.0)
    document["seconds_left"] = 298  # a running shadow's (ended: null); the schema types both
    return document


def _rollout() -> dict[str, Any]:
    """A digest's last rollout (`versions`), read back from its audit lines (controlplane/bake/canary.py)."""
    from controlplane.bake.canary import histories

    lines = ["rolled_back at 10% (step 1/2): failure ratio 0.20 > 0.01 over 25 requests (5 failed)",
             "step 1/2: 10% of the requests for 60 s"]
    entries = [AuditRecord(i, T, "tritonctl:bake", "canary", "m", D1, "ok", 1, line) for i, line in enumerate(lines)]
    return histories(entries)[D1]


COMPLETED = CompletedConfigRecord("m", D1, {"name": "m", "backend": "python", "max_batch_size": 8, "input": [
    {"name": "x", "data_type": "TYPE_FP32", "dims": ["3"]}]}, T)


def _full_documents() -> dict[str, list[Any]]:
    """Per schema, documents made by the results dataclasses with every field holding a value."""
    outcome = Outcome("m", "load", Result.FAILED, D1, D2, "load refused", 12, cause=Cause.CONTENT)
    row = StatusRow("m", ModelState.SERVING, [VersionState("1", "READY", "")], D1, T, "track:stable", True,
                    "wrong_digest", "Triton serves d2d2d2d2d2d2, should serve d1d1d1d1d1d1", "load refused", False,
                    source_digest=D2, sync=SyncState.HELD, sync_reason="pinned", next_retry_s=3, tags=["stable"],
                    footprint=FootprintRecord("m", D1, 97.5, 512.0, "measured", T),
                    ondemand={"state": "loaded", "leases": 2, "until": "2026-01-01T00:10:00Z"},
                    bake={"state": "failed", "digest": D1, "started": "2026-01-01T00:00:00Z",
                          "until": "2026-01-01T00:05:00Z", "requests": 312, "failures": 66, "failure_ratio": 0.2115,
                          "latency_ms": 4.2, "baseline_latency_ms": 3.9, "latency_stat": "p99",
                          "reason": "failure ratio 0.21 > 0.01 over 312 requests (66 failed)"},
                    completed_config=COMPLETED, canary=_canary(), shadow=_shadow(), traffic=_traffic())
    step = Step(7, 3, "h1", 1, "deploy", D1, "ok", "serving", model="m", started_at=T, finished_at=T)
    baked = Step(8, 4, "h1", 0, "bake", D1, "failed", "failure ratio 0.21 > 0.01 over 312 requests (66 failed)",
                 model="m", started_at=T, finished_at=T,
                 figures={"requests": 312, "failures": 66, "success": 246, "success_ns": 984000000})
    bake = {"state": "failed", "digest": D1, "started": "2026-12-03T07:12:02Z", "until": "2026-12-03T07:17:02Z",
            "requests": 312, "failures": 66, "failure_ratio": 0.2115, "latency_ms": 4.0, "latency_stat": "mean",
            "reason": "failure ratio 0.21 > 0.01 over 312 requests (66 failed)", "wave": 0, "hosts": ["h1"],
            "canary": {"steps": [10, 100], "step": 1, "weight": 100, "step_started": 1796282000.5,
                       "zero": {"requests": 31, "failures": 0, "success": 31, "success_ns": 99000000},
                       "history": [{"step": 0, "weight": 10, "started": "2026-12-03T07:12:02Z",
                                    "ended": "2026-12-03T07:13:02Z", "outcome": "passed", "requests": 31,
                                    "failures": 0}]}}
    problem = Problem("config.pbtxt", "input[0].dims", "missing", ERROR)
    validation = ValidationResult("m", Path("/srv/models/m"), [problem], {"name": "m"}, [1], [1])
    return {
        "status": [StatusResult(True, "127.0.0.1:8001", "127.0.0.1:8000", {"mode": "inotify", "reason": "local ext4"},
                                [row], gateway={"pid": 4242, "grpc_url": "127.0.0.1:8001",
                                                "http_url": "http://127.0.0.1:8000",
                                                "metrics_url": "http://127.0.0.1:8002/metrics",
                                                "upstream_grpc_url": "127.0.0.1:41001"}).to_json(),
                   StatusResult(True, "127.0.0.1:8001", None, {"mode": None, "reason": "no source repository"}, [row],
                                registry_reachable=False, registry_unreachable_since="2026-12-03T07:12:02Z",
                                registry_reason="registry postgresql://db/fleet: connection refused").to_json()],
        "load": [outcome.to_json(), [outcome.to_json()]],
        "versions": [VersionsResult("m", [VersionRow(_snapshot(D1), True, ("stable",),
                                                     FootprintRecord("m", D1, 97.5, 0.0, "declared", T),
                                                     "memory 450 MB, 4.5 x the previous digest's 100 MB "
                                                     "(bake_warn_load_ratio 2)", COMPLETED, _rollout())]).to_json()],
        "diff": [DiffResult("m", D1, D2, [FileSize("b.txt", 3)], [FileSize("a.txt", 2)],
                            [FileChange("config.pbtxt", 10, 12, "@@ -1 +1 @@")], "@@ -4 +4 @@").to_json()],
        "audit": [AuditResult([AuditRecord(1, T, "token:alice", "deploy", "m", D1, "ok", 12, "served", "h1",
                                           "bob")]).to_json()],
        "token-create": [TokenCreated(_token(), "tct_0123456789abcdef_" + "A" * 43, T).to_json()],
        "token-list": [TokenList([_token()], T).to_json()],
        "token-revoke": [TokenRow(_token(), T).to_json()],
        "audit-at": [ServingAtResult(T, [ServingRecord("m", D1, [1], T, "h1")], {("m", D1): ["stable"]}).to_json()],
        "validate": [ValidationReport([validation]).to_json()],
        "policy": [PolicyResult("m", "track:stable", False, fleet=True, host="h1", tag="stable", digest=D1).to_json()],
        "pin": [PinResult("m", True, D1, fleet=True).to_json(), HoldResult("m", "h1", True, D1).to_json()],
        "gc": [GcResult(1, 2, 300).to_json()],
        "lease": [LeaseResult("m", D1, "3f2a9c1b2c3d4e5f", T, True, 1400, True, "h2", "10.0.0.2:8001",
                              "http://10.0.0.2:8000").to_json()],
        "db-upgrade": [DbUpgradeResult("0004", "0005", [MigrationRow("0005", "Tags")], "/s/registry.db.before-0004")
                       .to_json(), DbUpgradeResult(None, "0010", [], None, dry_run=True).to_json()],
        "hosts": [[HostRow("h1", "127.0.0.1:8001", "0.1.0", T, T, 1.5, True, True, True).to_json()]],
        "rollouts": [[Rollout(3, "m", D1, D2, "rolled_back", "alice", T, T, "canary failed", [step]).to_json(),
                      Rollout(4, "m", D1, D2, "rolled_back", "fleet", T, T, "bake failed: failure ratio 0.21 > 0.01",
                              [step, baked], bake).to_json()]],
        "status-fleet": [FleetMatrix([MatrixRow("m", D1, {"h1": MatrixCell(D2, "serving", T, True, True)},
                                                ("stable",), PlacementCell("h1", "loaded", D2, 2, T))]).to_json()],
        "tags": [TagsResult(T, [TagRecord("m", "stable", D1, "alice", T)]).to_json()],
        "tag": [TagResult("m", "stable", "ok", D1, D2, D3, True, "moved").to_json()],
        "webhooks": [WebhookDeliveriesResult([_delivery()]).to_json()],
        "webhooks-redeliver": [_delivery().to_json()],
    }


def _token() -> TokenRecord:
    return TokenRecord("alice", "deployer", "uid:0(root)", T, T, T, "token:admin")


def _delivery() -> DeliveryRecord:
    return DeliveryRecord("ab" * 16, 7, "deploy", "m", "https://hooks.example.com/t", "pending", 2, T, T, T, T, 500,
                          "receiver is broken today")


@pytest.mark.parametrize("name", jsonschemas.names())
def test_the_results_dataclasses_filled_in_full_match_their_schema_and_fill_it(name: str) -> None:
    documents = _full_documents()[name]
    schema = jsonschemas.load(name)
    filled: set[str] = set()
    for document in documents:
        jsonschemas.assert_valid(name, document)
        filled |= set(jsonschemas.filled(document, schema))
    unfilled = sorted(set(jsonschemas.fields(schema)) - filled)
    assert not unfilled, f"{name}.schema.json has fields the dataclasses never emit: {unfilled}"


def test_every_schema_has_its_full_documents() -> None:
    assert set(_full_documents()) == set(jsonschemas.names())


# --- what the schemas refuse --------------------------------------------------------------------------


def test_a_key_added_removed_or_retyped_fails() -> None:
    document = TagResult("m", "stable", "ok", D1, None, D1, False, "moved").to_json()
    jsonschemas.assert_valid("tag", document)
    assert "Additional properties" in jsonschemas.problems("tag", {**document, "new": 1})[0]
    assert "'deployed' is a required property" in jsonschemas.problems(
        "tag", {k: v for k, v in document.items() if k != "deployed"})[0]
    assert jsonschemas.problems("tag", {**document, "old_digest": 5})
    assert jsonschemas.problems("tag", {**document, "digest": "not-a-digest"})
    status = StatusResult(True, "u", None, {"mode": None, "reason": "no source repository"}, []).to_json()
    jsonschemas.assert_valid("status", status)
    assert jsonschemas.problems("status", {**status, "models": [{"model": "m"}]})
    assert jsonschemas.problems("status", {**status, "watch": {"mode": "fanotify", "reason": ""}})
