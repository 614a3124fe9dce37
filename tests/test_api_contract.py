"""The control API's contract, tested as its clients test it, against a real daemon (TCP listener with a token, a
launched tritonserver, the README's example models):

- schemathesis (`--checks all`, its stateful phase included, several fixed seeds, a bounded number of examples)
  generates requests from the served `GET /v1/openapi.json` and fails on any answer the document does not promise:
  a 500, a schema-valid request refused, a schema-violating one accepted, a 405 without `Allow`, an answer whose
  body the document does not describe. The event stream (endless by design) is left out.
- a client generated from the served document (datamodel-code-generator, at test time into a temporary directory)
  parses every answer of the README's "Using it" commands, each through its HTTP route.
"""

from __future__ import annotations

import http.client
import importlib.util
import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import DaemonProcess, copy_example, token_daemon, wait_for

TOKEN = "0123456789abcdef0123456789abcdef"
MODELS = ("linear", "sentiment_tokenizer", "sentiment_classifier", "sentiment_pipeline")
BIN = Path(sys.executable).parent
# Several seeds (issue 57: seed 577 found the unbounded `bake_s` that seed 45 had not): each run explores other
# requests; 577 stays in the list.
SEEDS = (45, 577, 2024)
MAX_EXAMPLES = 20


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonProcess, str]]:
    base = tmp_path_factory.mktemp("contract")
    repo = base / "repo"
    repo.mkdir()
    for name in MODELS:
        copy_example(name, repo)
    proc, address, _ = token_daemon(repo, base, TOKEN)
    for name in MODELS:
        wait_for(lambda n=name: proc.model_status(n).get("state") == "serving", 90, 0.5, f"{name} serving")
    yield proc, address
    assert proc.stop() == 0, proc.log_tail()


def _call(address: str, method: str, path: str, body: Any = None) -> tuple[int, str, bytes]:
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=300)
    headers = {"Authorization": f"Bearer {TOKEN}", "x-tritonctl-actor": "contract-test"}
    data = None
    if body is not None:
        data, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
    conn.request(method, path, body=data, headers=headers)
    answer = conn.getresponse()
    out = answer.status, answer.getheader("content-type") or "", answer.read()
    conn.close()
    return out


def _class_name(component: str) -> str:
    """datamodel-code-generator's class for a component: Audit_event → AuditEvent."""
    return "".join(part[:1].upper() + part[1:] for part in component.split("_"))


def _components(schema: dict[str, Any]) -> list[str]:
    refs = [schema] if "$ref" in schema else schema.get("oneOf", [])
    return [ref["$ref"].rsplit("/", 1)[1] for ref in refs]


def _parses(models: Any, components: list[str], document: Any) -> str:
    """The component among `components` whose generated class parses `document` (the first that does)."""
    problems = []
    for component in components:
        try:
            getattr(models, _class_name(component)).model_validate(document)
            return component
        except Exception as exc:  # noqa: BLE001 - collected for the assertion's message
            problems.append(f"{component}: {exc}")
    raise AssertionError(f"no generated class parses {json.dumps(document)[:300]}: {problems}")


def test_a_generated_client_parses_every_answer_of_using_it(daemon: tuple[DaemonProcess, str], tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    _, address = daemon
    status, _, raw = _call(address, "GET", "/v1/openapi.json")
    assert status == 200
    spec = json.loads(raw)
    (tmp_path / "openapi.json").write_bytes(raw)
    generated = tmp_path / "tritonctl_models.py"
    subprocess.run([str(BIN / "datamodel-codegen"), "--input", str(tmp_path / "openapi.json"),
                    "--input-file-type", "openapi", "--output", str(generated),
                    "--output-model-type", "pydantic_v2.BaseModel"], check=True, capture_output=True, timeout=300)
    module_spec = importlib.util.spec_from_file_location("tritonctl_models", generated)
    assert module_spec is not None and module_spec.loader is not None
    models = importlib.util.module_from_spec(module_spec)
    monkeypatch.setitem(sys.modules, "tritonctl_models", models)  # pydantic resolves generics through it
    module_spec.loader.exec_module(models)

    # README "Using it", each line through its route (`validate` is offline: no route).
    calls = [
        ("status", "GET", "/v1/models", None),
        ("load linear", "POST", "/v1/models/linear/load", {}),
        ("versions linear", "GET", "/v1/models/linear/versions", None),
        ("pin linear", "PUT", "/v1/models/linear/pin", None),
        ("unpin linear", "DELETE", "/v1/models/linear/pin", None),
        ("policy linear manual", "PUT", "/v1/models/linear/policy", {"policy": "manual"}),
        ("policy linear inherit", "PUT", "/v1/models/linear/policy", {"policy": "inherit"}),
        ("audit --model linear --since 2h", "GET", "/v1/audit?model=linear&since=2h", None),
        ("unload sentiment_pipeline --dependents", "POST", "/v1/models/sentiment_pipeline/unload",
         {"dependents": True}),
        ("load sentiment_pipeline", "POST", "/v1/models/sentiment_pipeline/load", {}),
        ("gc --keep 5", "POST", "/v1/gc", {"keep": 5}),
        ("webhooks", "GET", "/v1/webhooks/deliveries", None),
    ]
    for command, method, path, body in calls:
        status, media, raw = _call(address, method, path, body)
        assert status == 200, f"{command}: {status} {raw[:300]!r}"
        route = path.split("?")[0].replace("/linear", "/{model}").replace("/sentiment_pipeline", "/{model}")
        content = spec["paths"][route][method.lower()]["responses"]["200"]["content"]
        assert media in content, f"{command}: {media} is not documented ({list(content)})"
        components = _components(content[media]["schema"])
        if media == "application/x-ndjson":
            parsed = [_parses(models, components, json.loads(line)) for line in raw.splitlines() if line.strip()]
            assert parsed[-1].endswith("Line") and parsed[-1] not in ("ProgressLine", "ErrorLine"), (command, parsed)
        else:
            _parses(models, components, json.loads(raw))


# A load's canary steps must rise to 100 ([10, 100], not [50, 10]): a rule of the body that JSON Schema cannot
# say, so a schema-valid body may be refused 400 with that rule named. Only that operation may answer 400 to
# a schema-valid request; every other status rule of `--checks all` holds for it too.
SCHEMATHESIS_TOML = """
[[operations]]
include-path = "/v1/models/{model}/load"
include-method = "POST"
checks.positive_data_acceptance.expected-statuses = ["2xx", "3xx", "400", "401", "403", "404", "409", "429", "5xx"]
"""


@pytest.mark.slow
@pytest.mark.parametrize(("caller", "seed"), [*(("admin", seed) for seed in SEEDS), ("viewer", SEEDS[0])])
def test_schemathesis_finds_the_document_and_the_server_agree(daemon: tuple[DaemonProcess, str],
                                                              tmp_path: Path, caller: str, seed: int) -> None:
    """As the shared token (admin: every route does its work), with several seeds, and as a personal viewer token
    (issue 56: each write is refused 403 as the document says, and nothing answers 500)."""
    schemathesis = shutil.which("schemathesis", path=str(BIN)) or shutil.which("schemathesis")
    assert schemathesis is not None, "schemathesis is in the test extra (setup.cfg)"
    proc, address = daemon
    token = TOKEN
    if caller == "viewer":
        token = proc.json("token", "create", f"schemathesis-{tmp_path.name[-8:]}", "--role", "viewer")["token"]
    (tmp_path / "schemathesis.toml").write_text(SCHEMATHESIS_TOML)
    run = subprocess.run(
        [schemathesis, "run", f"http://{address}/v1/openapi.json", "-H", f"Authorization: Bearer {token}",
         "--checks", "all", "--exclude-path", "/v1/events", "--seed", str(seed), "--max-examples", str(MAX_EXAMPLES),
         "--generation-database", "none", "--request-timeout", "120", "--no-color"],
        capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-2000:]
    for phase in ("Coverage", "Fuzzing", "Stateful"):
        assert f"✅ {phase}" in run.stdout, run.stdout[-4000:]
