"""The `--json` contract: every command's document matches its published JSON Schema
(docs/schemas/<command>.schema.json, docs/json.md), field by field and type by type.

Each document comes from a real run: the daemon commands against one real daemon with its launched
tritonserver, the fleet views against a real PostgreSQL registry filled through the fleet store (and
the fleet's pin / policy documents from `FleetVerbs` over it), and validate / db upgrade offline.

The schemas are closed (`additionalProperties: false`) and list every key the code always emits as
`required`, so:

- a key missing, or a value of another type (a string where a list was, a number for null): the
  test fails (a script that reads it would break);
- a key the code emits that the schema lacks: the test fails. Adding a field means adding it to the
  schema (typed, required if always there) and to docs/json.md;
- nullable fields are unions with null, so null proves nothing about their other type: the scenario
  makes every field hold a value at least once (test_every_field_holds_a_value_in_some_real_document),
  except the few listed in UNFILLED with the reason; tests/test_json_schemas.py types those from the
  results dataclasses filled in full.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from click.testing import CliRunner

from cli.main import cli
from controlplane.triton.launcher import RECORD_FILE, RESTRICTED_HEADER
from tests import jsonschemas, registry_fixtures
from tests.cli_helpers import invoke
from tests.harness import (
    DaemonProcess,
    answers,
    example_daemon,
    gen_config,
    python_model,
    served_name,
    upstream_url,
    wait_for,
    write_gen_model,
)
from tests.test_cli_daemon_commands import StandInPlane
from tests.webhook_receiver import Receiver

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "model_repository"
D1, D2 = "d1" * 32, "d2" * 32
SHADOW_S = 15  # `load shadowed --shadow`: read while it runs (a loaded machine is slow); nothing waits for its end
WEBHOOK_SECRET = "json-contract-webhook-secret"

# Fields no real run here fills, and why (typed by tests/test_json_schemas.py from the dataclasses).
UNFILLED: dict[str, str] = {
    "webhooks-redeliver:#delivery.finished_at": "a delivery sent again is pending again: null by construction "
                                                "(the schema shares the delivery definition with `webhooks`)",
    "status:#model.footprint.gpu_memory_mb": "GPU memory is measured only with NVML on a GPU (none here); "
                                             "tests/unit/test_budget.py declares it as the stand-in",
    "versions:#version.footprint.gpu_memory_mb": "as status's: no GPU here",
    "versions:#version.bake_warning": "this scenario's daemon does not bake: tests/test_bake_e2e.py checks a "
                                      "versions document with a bake's warning against the schema",
    **{f"rollouts:{field}": "this scenario's fleet does not bake (bake_s 0): tests/test_fleet_bake_e2e.py "
                            "checks rollouts documents with a canary's bake and its steps' figures against the schema"
       for field in ("$[].bake", "#bake.digest", "#bake.failure_ratio", "#bake.failures", "#bake.hosts",
                     "#bake.latency_ms", "#bake.latency_stat", "#bake.reason", "#bake.requests", "#bake.started",
                     "#bake.state", "#bake.until", "#bake.wave", "#step.figures", "#step.figures.failures",
                     "#step.figures.requests", "#step.figures.success", "#step.figures.success_ns",
                     "#bake.canary", "#bake.canary.steps", "#bake.canary.step", "#bake.canary.weight",
                     "#bake.canary.step_started", "#bake.canary.zero", "#bake.canary.zero.requests",
                     "#bake.canary.zero.failures", "#bake.canary.zero.success", "#bake.canary.zero.success_ns",
                     "#bake.canary.history", "#bake.canary.history[].step", "#bake.canary.history[].weight",
                     "#bake.canary.history[].started", "#bake.canary.history[].ended",
                     "#bake.canary.history[].outcome", "#bake.canary.history[].requests",
                     "#bake.canary.history[].failures")},
    **{f"status:#model.canary{field}": "this scenario's daemon switches at once (tests/harness.py "
                                       "SWITCH_AT_ONCE_ENV: canary steps [100]) and its one canary is read in its "
                                       "shadow, before any step ended: tests/test_json_schemas.py types a canary "
                                       "from the bake's own record, tests/test_canary_e2e.py checks real ones "
                                       "against the schema"
       for field in (".history", ".history[].step", ".history[].weight", ".history[].started", ".history[].ended",
                     ".history[].outcome", ".history[].requests", ".history[].failures")},
    **{f"versions:#version.canary{field}": "as status's `canary`: this scenario switches at once"
       for field in ("", ".weights", ".state", ".reason")},
    **{f"token-create:#created.{field}": "a token just created is not revoked: null by construction (`token "
                                         "list` and `token revoke` fill it)" for field in ("revoked_at", "revoked_by")},
    "audit:#event.claimed": "the CLI over the socket declares its own user (no claim): "
                            "tests/test_identity_e2e.py checks audit documents with a forged actor's claim",
    **{f"{doc}:{field}": "this scenario's models have complete configs: tests/test_autocomplete_e2e.py checks the "
                         "documents of models whose config Triton completes at load against the schema"
       for doc, fields in (("status", ("#model.completed_config", "#model.completed_config.config",
                                       "#model.completed_config.recorded_at")),
                           ("versions", ("#version.completed_config", "#version.completed_config.config",
                                         "#version.completed_config.recorded_at")),
                           ("diff", ("$.completed_config_diff",)))
       for field in fields},
    "status:#model.shadow.disagreements[].inputs[].error": "only where a disagreeing request's inputs cannot be "
                                                           "read (shared memory): tests/test_json_schemas.py types "
                                                           "it from a shadow's record",
    "status:$.registry_unreachable_since": "a time only while the registry is down: "
                                           "tests/test_fleet_outage_e2e.py crashes PostgreSQL for it",
    **{f"status:#model.bake{field}": "this scenario's daemon does not bake (bake_s 0): its one bake is a shadow's "
                                     "(`load --shadow`), read before any step: tests/test_bake_e2e.py checks its "
                                     "status documents against the schema with every field of `bake` filled "
                                     "(traffic, a latency baseline)"
       for field in (".failure_ratio", ".latency_ms", ".baseline_latency_ms", ".latency_stat")},
}


def run_json(*args: str) -> Any:
    result = CliRunner().invoke(cli, [*args, "--json"])
    assert result.exit_code in (0, 1), result.output  # `load` of a model that fails exits 1, still with JSON
    return json.loads(result.stdout)


def schema_of(document: str) -> str:
    """tests' document names ("load-failed", "tag-move") -> the schema it must match."""
    for prefix in ("audit-at", "status-fleet", "db-upgrade", "webhooks-redeliver", "token-create", "token-list",
                   "token-revoke"):
        if document.startswith(prefix):
            return prefix
    command = document.split("-")[0]
    return jsonschemas.SCHEMA_OF[command]


# --- the daemon and its history ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    """The daemon's webhook receiver: answers 500 until the scenario's end (pending deliveries with an
    answer), then accepts them (delivered ones)."""
    server = Receiver(WEBHOOK_SECRET)
    server.mode = "500"
    yield server
    server.close()


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, receiver: Receiver) -> Iterator[DaemonProcess]:
    base = tmp_path_factory.mktemp("json-contract")
    secret = base / "hook.secret"
    secret.write_text(WEBHOOK_SECRET)
    secret.chmod(0o600)
    config = base / "tritonctl.toml"
    # shadow_keep_inputs: the shadow's first disagreements show their inputs (no shadow runs without
    # `load --shadow`: shadow_s stays 0)
    config.write_text(f'webhook_retry_max_s = 1.0\nshadow_keep_inputs = true\n\n[[webhook]]\nurl = "{receiver.url}"\n'
                      f'events = ["*"]\nsecret_file = "{secret}"\n')
    with example_daemon(base, extra_args=["--config", str(config)]) as proc:
        yield proc


def _write_torchy(repo: Path) -> None:
    """A model whose backend this tritonserver lacks: its deploy fails for the environment (retried)."""
    torchy = repo / "torchy"
    (torchy / "1").mkdir(parents=True)
    (torchy / "1" / "model.pt").write_bytes(b"not a model")
    (torchy / "config.pbtxt").write_text(
        'name: "torchy"\nbackend: "pytorch"\nmax_batch_size: 0\n'
        'input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
    )


def _write_shadowed(repo: Path, gen: int) -> None:
    """`shadowed`: generation 1 answers its input x; generation 2 the same up to x = 0.5 and x + 1 above it,
    so its shadow's pairs agree on some requests and disagree on others."""
    expr = "x.astype(np.float32)" if gen == 1 else "np.where(x > 0.5, x + 1, x).astype(np.float32)"
    (repo / "shadowed" / "1").mkdir(parents=True, exist_ok=True)
    (repo / "shadowed" / "config.pbtxt").write_text(gen_config("shadowed", gen))
    (repo / "shadowed" / "1" / "model.py").write_text(python_model(expr))


def _shadow_in_progress(daemon: DaemonProcess) -> tuple[dict[str, Any], dict[str, Any]]:
    """`load shadowed --shadow`: generation 2 gets copies of the requests the test sends through the gateway
    (fewer than bake_min_requests: no verdict while it runs); (load's document, `status shadowed` once every
    pair was compared, the shadow still running)."""
    sd = ("--state-dir", str(daemon.state_dir))
    run_json("policy", "shadowed", "manual", *sd)
    _write_shadowed(daemon.repository, 2)
    loaded = run_json("load", "shadowed", "--shadow", f"{SHADOW_S}s", *sd)
    assert loaded["outcome"] == "ok", loaded
    sent = [0.1, 0.2, 0.3, 0.7, 0.8, 0.9]  # the last three disagree
    client = grpcclient.InferenceServerClient(daemon.triton_url())
    try:
        for value in sent:
            time.sleep(0.05)  # under the gateway's copy rate (docs/gateway.md): every request is copied
            x = grpcclient.InferInput("x", [1, 1], "FP32")
            x.set_data_from_numpy(np.full((1, 1), value, dtype=np.float32))
            got = float(client.infer("shadowed", [x], client_timeout=10).as_numpy("gen")[0][0])
            assert got == pytest.approx(value), "a client got the shadow's answer"
    finally:
        client.close()

    def compared() -> dict[str, Any] | None:
        document: dict[str, Any] = run_json("status", "shadowed", *sd)
        shadow = document["models"][0]["shadow"] or {}
        return document if shadow.get("pairs", 0) >= len(sent) else None

    return loaded, dict(wait_for(compared, SHADOW_S, 0.2, "the shadow's pairs compared"))


def _write_invalid(repo: Path) -> None:
    """A model validation refuses (an input without dims): recorded invalid, with its problems."""
    (repo / "invalid" / "1").mkdir(parents=True)
    (repo / "invalid" / "1" / "model.py").write_text("class TritonPythonModel:\n    pass\n")
    (repo / "invalid" / "config.pbtxt").write_text(
        'name: "invalid"\nbackend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "x" data_type: TYPE_FP32 } ]\n'
        'output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
    )


@pytest.fixture(scope="module")
def documents(daemon: DaemonProcess, receiver: Receiver) -> dict[str, Any]:
    """One scenario, every daemon and history command's --json, each field filled at least once: two
    generations of `gen` (a file added, one removed), a model whose backend this tritonserver lacks
    (environment fault, retried: `load --failed`), one whose initialize() raises (content fault,
    quarantined), one validation refuses, a shadow in progress (`load --shadow`, requests through the
    gateway, its first disagreements with their inputs), tags moved, a tracked tag, a rollback, policy,
    pin/unpin, an unload, gc."""
    sd = ("--state-dir", str(daemon.state_dir))
    repo = daemon.repository
    _write_torchy(repo)
    _write_invalid(repo)
    write_gen_model(repo, "crashy", 1, init="raise RuntimeError('crashy refuses to start')")
    _write_shadowed(repo, 1)
    (repo / "gen").mkdir()
    (repo / "gen" / "notes.txt").write_text("generation 1\n")
    client = grpcclient.InferenceServerClient(daemon.triton_url())
    try:
        write_gen_model(repo, "gen", 1)
        wait_for(lambda: answers(client, "gen", 1), 60, 0.1, "gen 1 served")
        (repo / "gen" / "notes.txt").unlink()
        (repo / "gen" / "labels.txt").write_text("positive\nnegative\n")
        write_gen_model(repo, "gen", 2)
        wait_for(lambda: answers(client, "gen", 2), 60, 0.1, "gen 2 served")
    finally:
        client.close()
    docs: dict[str, Any] = {}
    wait_for(lambda: daemon.model_status("torchy").get("next_retry_s") is not None, 60, 0.2, "torchy failed")
    wait_for(lambda: any(v["quarantined"] for v in daemon.json("versions", "crashy")), 60, 0.2, "crashy quarantined")
    wait_for(lambda: daemon.json("versions", "invalid"), 60, 0.2, "invalid recorded")
    wait_for(lambda: daemon.model_status("shadowed").get("state") == "serving", 60, 0.2, "shadowed serving")
    docs["load-shadow"], docs["status-shadow"] = _shadow_in_progress(daemon)
    docs["status"] = run_json("status", *sd)
    docs["load-failed"] = run_json("load", "--failed", *sd)
    versions = run_json("versions", "gen", *sd)
    docs["versions"] = versions
    docs["versions-crashy"] = run_json("versions", "crashy", *sd)
    docs["versions-invalid"] = run_json("versions", "invalid", *sd)
    docs["diff"] = run_json("diff", "gen", versions[1]["digest"], versions[0]["digest"], *sd)
    docs["load"] = run_json("load", "linear", *sd)
    docs["tag"] = run_json("tag", "linear", "stable", *sd)
    run_json("tag", "gen", "stable", *sd)
    docs["tag-move"] = run_json("tag", "gen", "stable", versions[1]["digest"], *sd)
    docs["versions-tagged"] = run_json("versions", "gen", *sd)
    docs["policy-track"] = run_json("policy", "linear", "track:stable", *sd)
    docs["rollback"] = run_json("rollback", "gen", *sd)
    docs["policy"] = run_json("policy", "gen", "manual", *sd)
    docs["pin"] = run_json("pin", "gen", *sd)
    docs["unpin"] = run_json("unpin", "gen", *sd)
    docs["unload"] = run_json("unload", "gen", *sd)
    docs["load-no-wait"] = run_json("load", "gen", "--no-wait", *sd)
    run_json("policy", "gen", "ondemand", *sd)
    docs["ensure"] = run_json("ensure", "gen", "--for", "10m", *sd)
    docs["status-ondemand"] = run_json("status", "gen", *sd)
    docs["ensure-renewed"] = run_json("lease", "renew", "gen", docs["ensure"]["lease"], "--for", "5m", *sd)
    docs["gc"] = run_json("gc", "--keep", "0", *sd)
    docs["audit"] = run_json("audit", "--limit", "100", *sd)
    docs["audit-at"] = run_json("audit", "--at", "0s", *sd)
    docs["tags"] = run_json("tags", *sd)
    docs["tags-at"] = run_json("tags", "--at", "0s", *sd)
    docs["status-late"] = run_json("status", *sd)
    docs["status-drift"] = _status_with_drift(daemon)
    docs["webhooks-pending"] = run_json("webhooks", "--state", "pending", *sd)
    receiver.mode = "ok"
    wait_for(lambda: not run_json("webhooks", "--state", "pending", *sd), 60, 0.3, "every webhook delivered")
    docs["webhooks"] = run_json("webhooks", "--limit", "1000", *sd)
    # the newest delivery of a model's event (the newest of all may be one without a model, as gc's: then
    # the document's `model` would be null and its type never checked)
    newest_of_a_model = next(d for d in docs["webhooks"] if d["model"])
    docs["webhooks-redeliver"] = run_json("webhooks", "redeliver", newest_of_a_model["id"], *sd)
    docs["token-create"] = run_json("token", "create", "contract", "--role", "viewer", "--expires", "30d", *sd)
    docs["token-revoke"] = run_json("token", "revoke", "contract", *sd)
    docs["token-list"] = run_json("token", "list", *sd)
    return docs


def _status_with_drift(daemon: DaemonProcess) -> dict[str, Any]:
    """Triton unloads `linear` behind the daemon's back (with the daemon's key, from its launched-server
    record, on tritonserver's own port behind the gateway: the name it serves `linear` under): `status`
    reports the drift until the reconcile loads it again, so unload until one does."""
    record = json.loads((daemon.state_dir / "triton" / RECORD_FILE).read_text())
    headers = {f"triton-grpc-protocol-{RESTRICTED_HEADER}": record["restricted_key"]}
    client = grpcclient.InferenceServerClient(upstream_url(daemon))

    def drifted() -> dict[str, Any] | None:
        name = served_name(daemon.state_dir, "linear")
        assert name is not None, "linear has no route"
        client.unload_model(name, headers=headers)
        document: dict[str, Any] = run_json("status", "linear", "--state-dir", str(daemon.state_dir))
        return document if document["models"][0]["drift"] else None

    try:
        return dict(wait_for(drifted, 60, 0.5, "status reports linear's drift"))
    finally:
        client.close()


DAEMON_DOCUMENTS = ["status", "status-shadow", "load-shadow", "status-late", "status-drift", "versions",
                    "versions-crashy", "versions-invalid", "versions-tagged", "diff", "load", "load-no-wait",
                    "load-failed", "rollback", "unload", "tag",
                    "tag-move", "tags", "tags-at", "policy", "policy-track", "pin", "unpin", "gc", "audit", "audit-at",
                    "webhooks", "webhooks-pending", "webhooks-redeliver", "ensure", "ensure-renewed",
                    "status-ondemand", "token-create", "token-revoke", "token-list"]


@pytest.mark.parametrize("name", DAEMON_DOCUMENTS)
def test_daemon_and_history_documents_match_their_schema(documents: dict[str, Any], name: str) -> None:
    jsonschemas.assert_valid(schema_of(name), documents[name])


def test_the_scenario_produced_what_the_contract_describes(documents: dict[str, Any]) -> None:
    """The documents above are the interesting ones (not empty lists, not errors)."""
    assert {row["model"] for row in documents["status"]["models"]} == {"linear", "gen", "torchy", "crashy", "invalid",
                                                                       "shadowed"}
    assert ("torchy", "failed") in [(o["model"], o["outcome"]) for o in documents["load-failed"]]
    assert documents["rollback"]["outcome"] == "ok" and documents["unload"]["outcome"] == "ok"
    assert documents["diff"]["changed"] and documents["audit"] and documents["audit-at"]["models"]
    assert [f["path"] for f in documents["diff"]["added"]] == ["labels.txt"]
    assert [f["path"] for f in documents["diff"]["removed"]] == ["notes.txt"]
    assert documents["load-no-wait"]["outcome"] == "accepted"
    assert documents["versions-crashy"][0]["quarantine_reason"]
    assert documents["versions-invalid"][0]["first_error"] and not documents["versions-invalid"][0]["valid"]
    assert documents["tag-move"]["old_digest"] == documents["versions"][0]["digest"]
    assert documents["policy-track"]["policy"] == "track:stable"
    assert documents["webhooks-pending"] and {d["state"] for d in documents["webhooks"]} == {"delivered"}
    assert documents["webhooks-redeliver"]["state"] == "pending"
    assert documents["status-ondemand"]["models"][0]["ondemand"]["state"] == "loaded"
    assert documents["ensure-renewed"]["lease"] == documents["ensure"]["lease"]
    [shadowed] = documents["status-shadow"]["models"]
    shadow = shadowed["shadow"]  # in progress: copies of the test's requests compared, half of them disagreeing
    assert (shadow["state"], shadowed["canary"]["state"]) == ("running", "shadow"), shadowed
    assert shadow["seconds_left"] is not None and shadow["copied"] >= 6 and shadow["pairs"] >= 6, shadow
    assert shadow["agreed"] >= 3 and shadow["disagreed"] >= 3 and shadow["keep_inputs"] is True, shadow
    first = shadow["disagreements"][0]
    assert (first["kind"], first["output"], first["inputs"][0]["name"]) == ("value", "gen", "x"), first
    assert first["inputs"][0]["data"][0] > 0.5 and first["shadow"] == pytest.approx(first["serving"] + 1), first
    [drifted] = documents["status-drift"]["models"]
    assert drifted["drift"] == "missing" and "should serve" in drifted["drift_detail"], drifted


# --- offline: validate, db upgrade ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def offline_documents(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    state = tmp_path_factory.mktemp("db-upgrade")
    # a plain file beside model directories passes in silence (issue 47): given alone, it gets its warning
    docs = {"validate": run_json("validate", str(EXAMPLES / "linear"))
            + run_json("validate", str(EXAMPLES / "README.md")),
            "db-upgrade": run_json("db", "upgrade", "--state-dir", str(state))}
    docs["db-upgrade-again"] = run_json("db", "upgrade", "--state-dir", str(state))
    earlier = tmp_path_factory.mktemp("db-upgrade-earlier")  # a registry an earlier release wrote: copied first
    registry_fixtures.build(f"sqlite:///{earlier / 'registry.db'}", "0005")
    docs["db-upgrade-earlier"] = run_json("db", "upgrade", "--state-dir", str(earlier))
    return docs


@pytest.mark.parametrize("name", ["validate", "db-upgrade", "db-upgrade-again", "db-upgrade-earlier"])
def test_offline_documents_match_their_schema(offline_documents: dict[str, Any], name: str) -> None:
    jsonschemas.assert_valid(schema_of(name), offline_documents[name])


def test_the_offline_runs_produced_what_the_contract_describes(offline_documents: dict[str, Any]) -> None:
    assert offline_documents["validate"][1]["problems"], "README.md alone is not a model directory: a warning"
    new, again = offline_documents["db-upgrade"], offline_documents["db-upgrade-again"]
    assert new["from"] is None and new["to"], new  # a new registry: from null
    assert again["from"] == again["to"] == new["to"], again
    earlier = offline_documents["db-upgrade-earlier"]
    assert earlier["from"] == "0005" and earlier["to"] == new["to"] and earlier["backup"], earlier


# --- the fleet views, from a real PostgreSQL registry -----------------------------------------------------


@pytest.fixture(scope="module")
def fleet_documents(postgres: Any, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from concurrent import futures
    from types import SimpleNamespace

    from controlplane.api.server import ApiServer
    from controlplane.fleet.ondemand import FleetOnDemand
    from controlplane.fleet.verbs import FleetVerbs
    from controlplane.settings.config import Settings
    from controlplane.store import migrate
    from controlplane.store.fleet import FleetStore, audit_event
    from controlplane.store.placements import PlacementStore
    from controlplane.store.records import ServingRecord, utcnow
    from controlplane.store.registry import AuditEntry, Registry

    pg_url = postgres.new_database()
    tmp_path = tmp_path_factory.mktemp("fleet-json")
    registry = Registry(pg_url, host="h1")
    local = Registry(f"sqlite:///{tmp_path / 'registry.db'}")
    docs: dict[str, Any] = {}
    try:
        migrate.upgrade(registry)
        store = FleetStore(registry)
        for host in ("h1", "h2"):
            store.heartbeat(host, f"127.0.0.1:800{host[1]}", "1.0", utcnow(), http_url=f"http://127.0.0.1:900{host[1]}",
                            budgets=(1000.0, None))
        with store.session() as session:
            store.set_target(session, "m", D1)
        rollout = store.create_rollout("m", D2, D1, "alice", [["h1"], ["h2"]])
        [step] = store.claim("h1")
        store.finish_step(step, "ok", "serving", host="h1", serving=D2,
                          audit=audit_event("fleet", "deploy", "m", D2, "ok", "serving"))
        store.report("h2", {"m": (D1, "serving")}, {"m": (120.0, None, True)})
        # an on-demand model placed on h2 through h1, loaded there, its lease renewed through h1
        placements = PlacementStore(registry)
        lease_id = "0123456789abcdef"
        placements.place("od", D1, {"memory_mb": 100.0}, ["h1", "h2"], lambda rooms, has_it: ("h2", "placed on h2"),
                         (lease_id, utcnow() + timedelta(minutes=10), "alice"), "h1")
        placements.mark("od", "h2", D1, "loaded", "loaded on h2")
        ondemand = FleetOnDemand("h1", SimpleNamespace(), registry, Settings,  # type: ignore[arg-type]
                                 lambda: SimpleNamespace(host_timeout_s=10.0))  # type: ignore[arg-type,return-value]
        docs["ensure-fleet"] = ondemand.renew("od", lease_id, 600).to_json()
        # a second rollout that failed: finished, with its error
        failed = store.create_rollout("m", D1, D2, "bob", [["h2"]])
        store.set_rollout(failed, "rolled_back", "canary h2 failed: load refused")
        target = store.targets()["m"]
        registry.move_tag("m", "stable", target, actor="alice")  # status --fleet: the tags of the target
        # pin / unpin / policy on a fleet (`fleet: true`) and on one host (`--host h1`: held), as the
        # control API returns them; the member is a stand-in holding the real shared and local registries.
        migrate.upgrade(local)
        # h1 serves D2 (a deploy recorded as the daemon records one): what `pin --host h1` reports
        deployment = local.begin_deployment("m", "deploy", D2, None, "fleet")
        local.finish_deployment(deployment.id, outcome="ok", error=None, model_state="serving",
                                audit=AuditEntry("fleet", "deploy", "m", D2, "ok"), serving=ServingRecord("m", D2, [1]))
        member = SimpleNamespace(host="h1", registry=registry, plane=SimpleNamespace(registry=local),
                                 settings=SimpleNamespace(policy="auto"), report_now=lambda: None)
        verbs = FleetVerbs(member)  # type: ignore[arg-type]
        docs["pin-fleet"] = verbs.set_pin("m", True, "alice", "").to_json()
        docs["policy-fleet"] = verbs.set_policy("m", "manual", "alice", "").to_json()
        docs["pin-host"] = verbs.set_pin("m", True, "alice", "h1").to_json()
        docs["policy-host"] = verbs.set_policy("m", "inherit", "alice", "h1").to_json()
    finally:
        registry.close()
        local.close()
    # Each view as a fleet member's daemon answers it (one HTTP call: the real ApiServer, its plane's fleet
    # registry the shared one), and as `--db-url` reads it without a daemon: the same documents.
    shared = Registry(pg_url, host="h1")
    plane = StandInPlane()
    plane.fleet = SimpleNamespace(registry=shared)  # type: ignore[attr-defined]
    server = ApiServer(plane, futures.ThreadPoolExecutor(max_workers=1),  # type: ignore[arg-type]
                       Settings(state_dir=tmp_path / "member"))
    server.start()
    try:
        sd = ("--state-dir", str(tmp_path / "member"))
        docs["hosts"] = run_json("hosts", *sd)
        docs["rollouts"] = run_json("rollouts", *sd)
        docs["status-fleet"] = run_json("status", "--fleet", *sd)
        docs["status-fleet-text"] = invoke(["status", "--fleet", *sd]).stdout
    finally:
        server.stop(0.1)
        shared.close()
    db = ("--db-url", pg_url)
    docs["db-url"] = {"hosts": run_json("hosts", *db), "rollouts": run_json("rollouts", *db),
                      "status-fleet": run_json("status", "--fleet", *db)}
    docs["rollout-ids"] = (rollout, failed)
    docs["target"] = target
    return docs


FLEET_DOCUMENTS = ["pin-fleet", "policy-fleet", "pin-host", "policy-host", "hosts", "rollouts", "status-fleet",
                   "ensure-fleet"]


@pytest.mark.parametrize("name", FLEET_DOCUMENTS)
def test_fleet_documents_match_their_schema(fleet_documents: dict[str, Any], name: str) -> None:
    jsonschemas.assert_valid(schema_of(name), fleet_documents[name])


def test_the_fleet_scenario_produced_what_the_contract_describes(fleet_documents: dict[str, Any]) -> None:
    for name in ("hosts", "rollouts", "status-fleet"):  # the daemon's answer is what --db-url reads
        direct = fleet_documents["db-url"][name]
        if name == "hosts":  # the heartbeat's age moves on between the two reads
            direct = [{**row, "age_s": theirs["age_s"]}
                      for row, theirs in zip(direct, fleet_documents[name], strict=True)]
        assert direct == fleet_documents[name], name
    rollout, failed = fleet_documents["rollout-ids"]
    rollouts = {r["id"]: r for r in fleet_documents["rollouts"]}
    assert rollouts[rollout]["steps"][0]["finished_at"]
    assert rollouts[failed]["state"] == "rolled_back" and rollouts[failed]["error"] and rollouts[failed]["finished_at"]
    matrix = fleet_documents["status-fleet"]
    assert set(matrix["models"][0]["hosts"]) == {"h1", "h2"}
    assert matrix["models"][0]["tags"] == ["stable"]
    target = fleet_documents["target"]
    assert f"{target[:12]} stable" in fleet_documents["status-fleet-text"]  # after the digest, like versions
    assert fleet_documents["pin-host"]["held"] is True and fleet_documents["policy-host"]["held"] is True
    assert fleet_documents["pin-host"]["digest"] == D2
    assert fleet_documents["pin-fleet"]["fleet"] is True and fleet_documents["policy-fleet"]["fleet"] is True
    placed = {row["model"]: row["placement"] for row in matrix["models"]}
    assert placed["m"] is None and placed["od"]["host"] == "h2" and placed["od"]["leases"] == 1
    lease = fleet_documents["ensure-fleet"]
    assert (lease["host"], lease["grpc_url"], lease["http_url"]) == ("h2", "127.0.0.1:8002", "http://127.0.0.1:9002")


# --- null proves nothing: every field holds a value somewhere ------------------------------------------------


def test_every_field_holds_a_value_in_some_real_document(documents: dict[str, Any], offline_documents: dict[str, Any],
                                                         fleet_documents: dict[str, Any]) -> None:
    """A nullable field validates as null whatever its other type says: each field of each schema must
    hold a value (not null, not an empty list) in at least one real document, so its type is checked.
    UNFILLED lists the exceptions with their reason; it must not list a field the run did fill."""
    everything = {**documents, **offline_documents, **{k: fleet_documents[k] for k in FLEET_DOCUMENTS}}
    seen: set[str] = set()
    for name, document in everything.items():
        schema = schema_of(name)
        seen |= {f"{schema}:{path}" for path in jsonschemas.filled(document, jsonschemas.load(schema))}
    every = {f"{name}:{path}" for name in jsonschemas.names() for path in jsonschemas.fields(jsonschemas.load(name))}
    missing = sorted(every - seen - set(UNFILLED))
    assert not missing, f"no real document fills these fields, so their type is never checked: {missing}"
    stale = sorted(set(UNFILLED) & seen)
    assert not stale, f"UNFILLED lists fields the run did fill: {stale}"
    assert set(UNFILLED) <= every, sorted(set(UNFILLED) - every)
