"""The `--json` contract: every command's document keeps its keys and their value types (README "JSON
output"; the dataclasses of controlplane/results.py). Fields may be added, never removed or retyped.

Each document comes from a real run: the daemon commands against one real daemon with its launched
tritonserver, the fleet views against a real PostgreSQL registry filled through the fleet store (and
the fleet's pin / policy documents from `FleetVerbs` over it), and validate / db upgrade offline.
Each document's shape (keys and value types; values replaced by their type, a list by the union of
its elements' shapes, a model's `config` (Triton's own schema) by "<dict>") is compared with
tests/golden/<command>.json:

- a key missing, or a value of another type: the test fails (a script that reads it would break);
- a key added: the test fails and asks to regenerate the golden files (review the diff, then commit):
      UPDATE_GOLDEN=1 pytest tests/test_json_contract.py
- null is compatible with every type: many fields are nullable (the digest of an unloaded model, the
  model of a `gc` event), and which of them a run leaves null is not the contract.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as grpcclient
from click.testing import CliRunner

from cli.main import cli
from tests.cli_helpers import invoke
from tests.harness import DaemonProcess, answers, example_daemon, wait_for, write_gen_model

GOLDEN = Path(__file__).resolve().parent / "golden"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"
EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "model_repository"
D1, D2 = "d1" * 32, "d2" * 32


OPAQUE = {"config"}  # values whose keys are data (a model's config.pbtxt as JSON), not the contract's


def shape(value: Any) -> Any:
    """A document's shape: dicts keep their keys, a list is the union of its elements' shapes, scalars
    become their type."""
    if isinstance(value, dict):
        return {key: (f"<{type(item).__name__}>" if key in OPAQUE and item is not None else shape(item))
                for key, item in value.items()}
    if isinstance(value, list):
        merged: Any = None
        for item in value:
            merged = merge(merged, shape(item))
        return [] if not value else [merged]
    if value is None:
        return None
    return f"<{type(value).__name__}>"


def merge(a: Any, b: Any) -> Any:
    """The union of two shapes: every key of either; a type where one of them is null."""
    if a is None:
        return b
    if isinstance(a, dict) and isinstance(b, dict):
        return {**b, **{key: merge(item, b.get(key)) for key, item in a.items()}}
    if isinstance(a, list) and isinstance(b, list):
        return [merge(a[0] if a else None, b[0] if b else None)] if a or b else []
    return a


def differences(golden: Any, actual: Any, where: str = "$") -> tuple[list[str], list[str]]:
    """(breaking: keys removed or retyped, added: keys the golden file lacks)."""
    if isinstance(golden, dict) and isinstance(actual, dict):
        breaking, added = [], []
        for key, item in golden.items():
            if key not in actual:
                breaking.append(f"{where}.{key}: removed")
                continue
            b, a = differences(item, actual[key], f"{where}.{key}")
            breaking += b
            added += a
        added += [f"{where}.{key}: added" for key in actual if key not in golden]
        return breaking, added
    if isinstance(golden, list) and isinstance(actual, list):
        if golden and actual:
            return differences(golden[0], actual[0], f"{where}[]")
        if golden and not actual:
            return [f"{where}: the run produced an empty list; the contract test needs at least one element"], []
        return [], []  # the golden file leaves the elements open (an empty list when it was written)
    if golden is None or actual is None:
        return [], []
    if golden != actual and not (golden == "<float>" and actual == "<int>"):
        return [f"{where}: {golden} became {actual}"], []
    return [], []


def check(command: str, document: Any) -> None:
    path = GOLDEN / f"{command}.json"
    actual = shape(document)
    if UPDATE or not path.exists():
        if not UPDATE:
            pytest.fail(f"{path.name} is missing: generate it with UPDATE_GOLDEN=1 pytest {__file__}")
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(actual, indent=2) + "\n")
        return
    golden = json.loads(path.read_text())
    breaking, added = differences(golden, actual)
    assert not breaking, f"`{command} --json` broke its contract (README \"JSON output\"): {breaking}"
    assert not added, (f"`{command} --json` has new keys {added}: regenerate the golden files with "
                       f"UPDATE_GOLDEN=1 pytest tests/test_json_contract.py, and list them in README \"JSON output\"")


def run_json(*args: str) -> Any:
    result = CliRunner().invoke(cli, [*args, "--json"])
    assert result.exit_code in (0, 1), result.output  # `load` of a model that fails exits 1, still with JSON
    return json.loads(result.stdout)


# --- the daemon and its history ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    with example_daemon(tmp_path_factory.mktemp("json-contract")) as proc:
        yield proc


@pytest.fixture(scope="module")
def documents(daemon: DaemonProcess) -> dict[str, Any]:
    """One scenario, every daemon and history command's --json: two generations of `gen`, a model whose
    backend this tritonserver lacks (its deploy fails: `load --failed`), a rollback, policy, pin/unpin,
    an unload, gc."""
    sd = ("--state-dir", str(daemon.state_dir))
    torchy = daemon.repository / "torchy"
    (torchy / "1").mkdir(parents=True)
    (torchy / "1" / "model.pt").write_bytes(b"not a model")
    (torchy / "config.pbtxt").write_text(
        'name: "torchy"\nbackend: "pytorch"\nmax_batch_size: 0\n'
        'input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
    )
    client = grpcclient.InferenceServerClient(daemon.triton_url())
    try:
        write_gen_model(daemon.repository, "gen", 1)
        wait_for(lambda: answers(client, "gen", 1), 60, 0.1, "gen 1 served")
        write_gen_model(daemon.repository, "gen", 2)
        wait_for(lambda: answers(client, "gen", 2), 60, 0.1, "gen 2 served")
    finally:
        client.close()
    docs: dict[str, Any] = {}
    wait_for(lambda: daemon.model_status("torchy").get("next_retry_s") is not None, 60, 0.2, "torchy failed")
    docs["status"] = run_json("status", *sd)
    docs["load-failed"] = run_json("load", "--failed", *sd)
    versions = run_json("versions", "gen", *sd)
    docs["versions"] = versions
    docs["diff"] = run_json("diff", "gen", versions[1]["digest"], versions[0]["digest"], *sd)
    docs["load"] = run_json("load", "linear", *sd)
    docs["tag"] = run_json("tag", "linear", "stable", *sd)
    docs["rollback"] = run_json("rollback", "gen", *sd)
    docs["policy"] = run_json("policy", "gen", "manual", *sd)
    docs["pin"] = run_json("pin", "gen", *sd)
    docs["unpin"] = run_json("unpin", "gen", *sd)
    docs["unload"] = run_json("unload", "gen", *sd)
    docs["load-no-wait"] = run_json("load", "gen", "--no-wait", *sd)
    docs["gc"] = run_json("gc", "--keep", "0", *sd)
    docs["audit"] = run_json("audit", "--limit", "50", *sd)
    docs["audit-at"] = run_json("audit", "--at", "0s", *sd)
    return docs


@pytest.mark.parametrize("command", ["status", "versions", "diff", "load", "load-no-wait", "load-failed", "rollback",
                                     "unload", "tag",
                                     "policy", "pin", "unpin", "gc", "audit", "audit-at"])
def test_daemon_and_history_documents_keep_their_shape(documents: dict[str, Any], command: str) -> None:
    check(command, documents[command])


def test_the_scenario_produced_what_the_contract_describes(documents: dict[str, Any]) -> None:
    """The documents above are the interesting ones (not empty lists, not errors)."""
    assert {row["model"] for row in documents["status"]["models"]} == {"linear", "gen", "torchy"}
    assert [(o["model"], o["outcome"]) for o in documents["load-failed"]] == [("torchy", "failed")]
    assert documents["rollback"]["outcome"] == "ok" and documents["unload"]["outcome"] == "ok"
    assert documents["diff"]["changed"] and documents["audit"] and documents["audit-at"]["models"]
    assert documents["load-no-wait"]["outcome"] == "accepted"


# --- offline: validate, db upgrade ----------------------------------------------------------------------


def test_validate_document_keeps_its_shape() -> None:
    document = run_json("validate", str(EXAMPLES / "linear"), str(EXAMPLES / "README.md"))
    assert document[1]["problems"], "README.md is not a model directory: a warning"
    check("validate", [document[0] | {"problems": document[1]["problems"]}])


def test_db_upgrade_document_keeps_its_shape(tmp_path: Path) -> None:
    document = run_json("db", "upgrade", "--state-dir", str(tmp_path))
    assert document["from"] is None and document["to"], document  # a new registry: from null
    check("db-upgrade", document)


# --- the fleet views, from a real PostgreSQL registry -----------------------------------------------------


def test_fleet_documents_keep_their_shape(pg_url: str, tmp_path: Path) -> None:
    from types import SimpleNamespace

    from controlplane.fleet.verbs import FleetVerbs
    from controlplane.store import migrate
    from controlplane.store.fleet import FleetStore, audit_event
    from controlplane.store.records import utcnow
    from controlplane.store.registry import Registry

    registry = Registry(pg_url, host="h1")
    local = Registry(f"sqlite:///{tmp_path / 'registry.db'}")
    try:
        migrate.upgrade(registry)
        store = FleetStore(registry)
        for host in ("h1", "h2"):
            store.heartbeat(host, f"127.0.0.1:800{host[1]}", "1.0", utcnow())
        with store.session() as session:
            store.set_target(session, "m", D1)
        rollout = store.create_rollout("m", D2, D1, "alice", [["h1"], ["h2"]])
        [step] = store.claim("h1")
        store.finish_step(step, "ok", "serving", host="h1", serving=D2,
                          audit=audit_event("fleet", "deploy", "m", D2, "ok", "serving"))
        store.report("h2", {"m": (D1, "serving")})
        target = store.targets()["m"]
        registry.move_tag("m", "stable", target, actor="alice")  # status --fleet: the tags of the target
        # pin / unpin / policy on a fleet (`fleet: true`) and on one host (`--host h1`: held), as the
        # control API returns them; the member is a stand-in holding the real shared and local registries.
        migrate.upgrade(local)
        local.ensure_model("m")
        member = SimpleNamespace(host="h1", registry=registry, plane=SimpleNamespace(registry=local),
                                 settings=SimpleNamespace(policy="auto"), report_now=lambda: None)
        verbs = FleetVerbs(member)  # type: ignore[arg-type]
        check("pin-fleet", verbs.set_pin("m", True, "alice", "").to_json())
        check("policy-fleet", verbs.set_policy("m", "manual", "alice", "").to_json())
        check("pin-host", verbs.set_pin("m", True, "alice", "h1").to_json())
        check("policy-host", verbs.set_policy("m", "inherit", "alice", "h1").to_json())
    finally:
        registry.close()
        local.close()
    db = ("--db-url", pg_url)
    check("hosts", run_json("hosts", *db))
    rollouts = run_json("rollouts", *db)
    assert rollouts[0]["id"] == rollout and rollouts[0]["steps"][0]["finished_at"]
    check("rollouts", rollouts)
    matrix = run_json("status", "--fleet", *db)
    assert set(matrix["models"][0]["hosts"]) == {"h1", "h2"}
    assert matrix["models"][0]["tags"] == ["stable"]
    assert f"{target[:12]} stable" in invoke(["status", "--fleet", *db]).stdout  # after the digest, like versions
    # The host names are data, not keys of the contract: one cell's shape stands for all.
    matrix["models"][0]["hosts"] = {"HOST": matrix["models"][0]["hosts"]["h1"]}
    check("status-fleet", matrix)


# --- the comparison itself ----------------------------------------------------------------------------


def test_a_removed_or_retyped_key_breaks_and_an_added_key_asks_for_regeneration() -> None:
    golden = shape({"model": "m", "digest": None, "rows": [{"n": 1}, {"n": 2, "extra": True}]})
    assert golden == {"model": "<str>", "digest": None, "rows": [{"n": "<int>", "extra": "<bool>"}]}
    assert differences(golden, shape({"model": "m", "digest": "d", "rows": [{"n": 3, "extra": False}]})) == ([], [])
    breaking, _ = differences(golden, shape({"digest": "d", "rows": [{"n": "3", "extra": False}]}))
    assert breaking == ["$.model: removed", "$.rows[].n: <int> became <str>"]
    _, added = differences(golden, shape({"model": "m", "digest": None, "rows": [], "new": 1}))
    assert added == ["$.new: added"]


# --- every --json has a golden file, and README "JSON output" names its keys ---------------------------------


def _json_commands() -> list[str]:
    import click

    found = []

    def walk(group: click.Group, path: tuple[str, ...]) -> None:
        ctx = click.Context(group)
        for name in group.list_commands(ctx):
            command = group.get_command(ctx, name)
            if isinstance(command, click.Group):
                walk(command, (*path, name))
            elif command is not None and any(p.name == "as_json" for p in command.params):
                found.append("-".join((*path, name)))

    walk(cli, ())
    return found


def _keys(golden: Any) -> set[str]:
    if isinstance(golden, dict):
        return {k for k in golden if k != "HOST"} | {k for v in golden.values() for k in _keys(v)}
    if isinstance(golden, list):
        return {k for v in golden for k in _keys(v)}
    return set()


def test_every_json_command_has_a_golden_file_and_its_keys_are_in_the_readme() -> None:
    readme = (GOLDEN.parent.parent / "README.md").read_text()
    section = readme.split("### JSON output", 1)[1].split("\n### ", 1)[0]
    goldens = {p.stem for p in GOLDEN.glob("*.json")}
    for command in _json_commands():
        assert command in goldens, f"`{command} --json` has no golden file (tests/golden/{command}.json)"
        assert f"`{command.replace('-', ' ')}" in section or f"|{command}" in section or f"{command}|" in section, \
            f"README \"JSON output\" does not list `{command} --json`"
    for name in goldens:
        missing = sorted(k for k in _keys(json.loads((GOLDEN / f"{name}.json").read_text()))
                         if f'"{k}"' not in section)
        assert not missing, f"README \"JSON output\" does not name {missing} of `{name} --json`"
