"""The bad-input corpus through the real daemon: each broken model replaces a serving one in the watched
repository. For every case: its one-line error (offline where possible, Triton's or the smoke check's
otherwise), nothing deployed, the previous version still answering, the daemon still running.

Cases are swapped in the way careful writers publish (a complete directory renamed into place), one
after another over the same serving model, so the test also shows that nothing accumulates.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from controlplane.store.registry import AuditQuery, Registry
from tests import corpus_gen
from tests.harness import DaemonProcess, copy_example, wait_for

CORPUS = Path(__file__).parent / "corpus"
CASES: list[dict[str, Any]] = json.loads((CORPUS / "cases.json").read_text())


def _linear_answers(client: grpcclient.InferenceServerClient) -> bool:
    x = grpcclient.InferInput("x", [1, 3], "FP32")
    x.set_data_from_numpy(np.array([[1, 2, 3]], dtype=np.float32))
    return float(client.infer("linear", [x], client_timeout=10).as_numpy("y")[0][0]) == 6.0


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    base = tmp_path_factory.mktemp("corpus")
    repo = base / "repo"
    repo.mkdir()
    copy_example("linear", repo)
    proc = DaemonProcess(repo, base / "state", settle_s=0.1).start()
    wait_for(lambda: proc.model_status("linear").get("state") == "serving", 30, what="good linear serving")
    yield proc
    assert proc.stop() == 0, proc.log_tail()


def _swap_in(repo: Path, source: Path, name: str, note: str | None, copy: bool = True) -> None:
    """Publish `source` as repo/<name> by renaming a complete copy (or `source` itself) into place."""
    staging = repo / f".staging-{time.monotonic_ns()}"
    if copy:
        shutil.copytree(source, staging, symlinks=True)
    else:
        source.rename(staging)
    if note is not None:
        (staging / "CASE.txt").write_text(note)  # distinct content per case: a new snapshot each time
    target = repo / name
    retired = repo / f".retired-{time.monotonic_ns()}"
    if target.exists() or target.is_symlink():
        target.rename(retired)
    staging.rename(target)
    shutil.rmtree(retired, ignore_errors=True)


def _new_events(registry: Registry, model: str | None, after_id: int) -> list[Any]:
    events = registry.query_audit(AuditQuery(model=model, limit=50))
    return [e for e in events if e.id > after_id and e.action in ("snapshot", "deploy", "remove")
            and e.outcome in ("invalid", "failed", "rolled_back", "ok")]


def _last_id(registry: Registry) -> int:
    events = registry.query_audit(AuditQuery(limit=1))
    return events[0].id if events else 0


def test_every_corpus_case_is_refused_and_linear_keeps_serving(daemon: DaemonProcess) -> None:
    registry = Registry(f"sqlite:///{daemon.state_dir / 'registry.db'}")
    client = grpcclient.InferenceServerClient(daemon.triton_url())
    good = registry.get_model("linear").active_digest
    failures: list[str] = []
    try:
        for case in CASES:
            name, model = case["case"], case["model"]
            with tempfile.TemporaryDirectory(dir=daemon.repository, prefix=".gen-") as tmp:
                # generated cases (FIFOs, symlinks, odd names) are made inside the repository's
                # ignored area and renamed in, since a copy cannot carry them
                if case.get("generated"):
                    source = corpus_gen.GENERATORS[name](Path(tmp))
                    note = None
                else:
                    source = CORPUS / name / model
                    note = name
                try:
                    target_name = source.name
                except UnicodeError:  # pragma: no cover - names are str here
                    target_name = model
                before = _last_id(registry)
                _swap_in(daemon.repository, source, target_name, note, copy=not case.get("generated"))
                valid_name = all(c.isascii() and (c.isalnum() or c in "_.-") for c in target_name) \
                    and ".." not in target_name and not target_name.startswith(("-", "."))
                audit_model = target_name if valid_name else None
                try:
                    # a stored case's own events (the previous case of the same model name may still
                    # be recording its removal)
                    generated = bool(case.get("generated"))
                    events = wait_for(lambda m=audit_model, b=before, g=generated: [
                        e for e in _new_events(registry, m, b) if g or e.action != "remove"], 30, 0.05,
                        f"an audit event for case {name}")
                except AssertionError as exc:
                    failures.append(f"{name}: {exc}")
                    continue
                failures += _check_case(case, events, registry, target_name if valid_name else None)
                if target_name != "linear":
                    shutil.rmtree(daemon.repository / target_name, ignore_errors=True)
            assert daemon.proc is not None and daemon.proc.poll() is None, f"daemon died on {name}"
            if not wait_for(lambda: _linear_answers(client), 30, 0.1, f"linear answering after {name}"):
                failures.append(f"{name}: linear stopped answering")
        assert registry.get_model("linear").active_digest == good, "a broken case became active"
    finally:
        registry.close()
        client.close()
    assert not failures, "\n".join(failures)


def _check_case(case: dict[str, Any], events: list[Any], registry: Registry, model: str | None) -> list[str]:
    name = case["case"]
    last = events[0]
    if "\n" in last.message:
        return [f"{name}: message is not one line"]
    if last.action == "deploy" and last.outcome == "ok":
        return [f"{name}: a broken model deployed"]
    if case["runtime"] is not None:
        if last.action != "deploy":
            deploys = wait_for(lambda: [e for e in _new_events(registry, model, events[-1].id - 1)
                                        if e.action == "deploy"], 60, 0.1, f"{name} deploy outcome")
            last = deploys[0]
        if last.outcome != "rolled_back":
            return [f"{name}: expected rolled_back, got {last.outcome}: {last.message}"]
        return []
    if last.action == "snapshot" and last.outcome == "ok":  # valid content, refused at deploy (environment)
        deploys = wait_for(lambda: [e for e in _new_events(registry, model, events[-1].id - 1)
                                    if e.action == "deploy"], 60, 0.1, f"{name} deploy outcome")
        last = deploys[0]
        if last.outcome != "failed" or not case.get("environment"):
            return [f"{name}: expected an environment fault at deploy, got {last.outcome}: {last.message}"]
        return []
    if last.action == "remove" and case.get("generated"):
        return []  # the model directory became a dangling link: recorded as removed, still serving
    if last.outcome not in ("invalid", "failed"):
        return [f"{name}: expected refusal, got {last.action} {last.outcome}"]
    offline = case.get("offline")
    if offline and model is not None and last.outcome == "invalid" and not case.get("generated"):
        snap = registry.get_snapshot(model, last.digest)
        hits = [p for p in snap.problems
                if p["field"] == offline["field"] and offline["contains"] in p["message"]]
        if not hits:
            return [f"{name}: expected {offline} among {snap.problems}"]
    return []
