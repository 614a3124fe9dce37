"""Load: 8 concurrent CLI clients issue mixed load/unload/rollback/status while the watcher sees edits.

Proves: no lost or duplicated deploy (every operation a client saw finish has exactly one deployment
row and one audit event, or, refused before Triton, its audit event alone), per-model operations
strictly serialized (no two deployments of a model overlap in time), and the daemon still answers
afterwards. The default run lasts ~12 s; the long variant (`pytest -m slow`) runs for three minutes.
"""

from __future__ import annotations

import itertools
import json
import random
import subprocess
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from controlplane.store import schema
from controlplane.store.registry import Registry
from tests.harness import TRITONCTL, DaemonProcess, wait_for, write_gen_model

MODELS = ["alpha", "beta", "gamma"]


def _client(daemon: DaemonProcess, seed: int, until: float, results: list[dict[str, object]]) -> None:
    rng = random.Random(seed)
    while time.monotonic() < until:
        model = rng.choice(MODELS)
        op = rng.choice(["load", "load", "rollback", "unload", "status"])
        args = [TRITONCTL, op, model, "--json", "--state-dir", str(daemon.state_dir)]
        if op == "status":
            args = [TRITONCTL, "status", "--json", "--state-dir", str(daemon.state_dir)]
        proc = subprocess.run(args, capture_output=True, text=True, timeout=120)
        outcome, message = None, ""
        if proc.returncode in (0, 1) and proc.stdout.strip().startswith("{"):
            answer = json.loads(proc.stdout)
            outcome, message = answer.get("outcome"), str(answer.get("message", ""))
        results.append({"op": op, "model": model, "rc": proc.returncode, "outcome": outcome,
                        "message": message, "stderr": proc.stderr.strip()})


def _editor(repo: Path, until: float) -> None:
    rng = random.Random(99)
    gen = 100
    while time.monotonic() < until:
        gen += 1
        write_gen_model(repo, rng.choice(MODELS), gen)
        time.sleep(rng.uniform(0.3, 1.5))


def _run(tmp_path: Path, seconds: float) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    for i, name in enumerate(MODELS):
        write_gen_model(repo, name, i + 1)
    daemon = DaemonProcess(repo, tmp_path / "state").start()
    try:
        for name in MODELS:
            wait_for(lambda n=name: daemon.model_status(n).get("state") == "serving", 30, what=f"{name} serving")
        results: list[dict[str, object]] = []
        until = time.monotonic() + seconds
        threads = [threading.Thread(target=_client, args=(daemon, seed, until, results)) for seed in range(8)]
        threads.append(threading.Thread(target=_editor, args=(repo, until)))
        for t in threads:
            t.start()
        for t in threads:
            t.join(seconds + 180)
        assert daemon.proc is not None and daemon.proc.poll() is None, daemon.log_tail()
        unexpected = [r for r in results if r["rc"] not in (0, 1)
                      and "no previous good version" not in str(r["stderr"])
                      and "pinned" not in str(r["stderr"])]
        assert not unexpected, unexpected[:5]
        assert len(results) >= 8

        registry = Registry(f"sqlite:///{daemon.state_dir / 'registry.db'}")
        try:
            wait_for(lambda: not registry.open_deployments(), 60, what="all deployments finished")
            with registry.engine.connect() as conn:
                deployments = conn.execute(select(schema.Deployment)).all()
                audits = conn.execute(select(schema.AuditEvent)).all()
        finally:
            registry.close()
        # Strictly serialized per model: no two deployments of a model overlap.
        for name in MODELS:
            spans = sorted((d.started_at, d.finished_at) for d in deployments if d.model == name)
            for (_, end), (start, _) in itertools.pairwise(spans):
                assert end <= start, f"{name}: overlapping deployments"
        # No lost or duplicated deploy: each finished deployment has exactly one audit event.
        audit_keys: dict[tuple[str, str, object], int] = {}
        for a in audits:
            key = (a.model, a.action, a.time)
            audit_keys[key] = audit_keys.get(key, 0) + 1
        for d in deployments:
            assert audit_keys.get((d.model, d.kind, d.finished_at)) == 1, f"deployment {d.id} not audited once"
        # Every operation a client saw finish with an outcome left its trace: a deployment row, or,
        # for one refused before it reached Triton (steps.refuse: quarantined content, no room in the
        # memory budget, an ensemble's steps missing), an audit event of its own and no row.
        finished = [r for r in results if r["op"] != "status" and r["outcome"] in ("ok", "failed", "rolled_back")]
        client_deploys = [d for d in deployments if d.actor not in ("watcher", "tritonctl")]
        deployed = {(d.model, d.kind, d.finished_at) for d in deployments}
        refused = [a for a in audits if a.actor not in ("watcher", "tritonctl") and a.outcome == "failed"
                   and a.action in ("deploy", "rollback", "unload") and (a.model, a.action, a.time) not in deployed]
        refusals = [(a.model, a.action, a.message) for a in refused]
        not_ok = [r for r in finished if r["outcome"] != "ok"][:10]
        refused_seen = [r for r in finished if r["outcome"] == "failed"
                        and any(r["model"] == a.model and r["message"] == a.message for a in refused)]
        assert len(refused_seen) == len(refused), (refusals, not_ok)
        assert len(client_deploys) == len(finished) - len(refused), (refusals, not_ok)
        status = daemon.status()
        assert status["triton_reachable"] is True
    finally:
        assert daemon.stop() == 0


def test_eight_concurrent_clients_with_edits(tmp_path: Path) -> None:
    _run(tmp_path, 12)


@pytest.mark.slow
def test_eight_concurrent_clients_for_three_minutes(tmp_path: Path) -> None:
    _run(tmp_path, 180)
