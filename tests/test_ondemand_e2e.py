"""Policy ondemand, ensure and leases under a memory budget, against the real daemon and tritonserver.
(Issue 29's CI test; the budget's rules alone, the GPU budget and the refusal: tests/unit/test_budget.py.)

Six python models that each hold 40 MB once initialized, a budget that holds about three of them, the
global policy `ondemand` (nothing loads until ensured), one model protected by the `stable` tag. Three
clients pick models from a Zipf distribution, ensure (a lease), infer, release: no inference fails after
an ensure returned, the protected model is never unloaded, evictions happen. Also: concurrent ensures of
one model cause one load; `status` shows standby / loaded (leases: N, until ...); a lease that is not
renewed expires (audited) and the idle model is unloaded; the metrics count it all. The full-size run
(40 models × 100 MB, 1 GB, 5 minutes) is bench/ondemand.py.
"""

from __future__ import annotations

import random
import socket
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient

from controlplane.api.client import ControlClient
from controlplane.memory.footprint import rss_mb
from controlplane.memory.leases import MAX_LEASE_S
from tests.harness import DaemonProcess, copy_example, gen_config, infer_gen, python_model, python_stubs, wait_for

MODELS = [f"m{i}" for i in range(6)]
ALLOC = "self.hold = np.ones(40 * 1024 * 1024 // 8)"


def write_model(repo: Path, name: str, gen: int) -> None:
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    (repo / name / "config.pbtxt").write_text(gen_config(name, gen))
    (repo / name / "1" / "model.py").write_text(
        python_model("np.full_like(x, GEN, dtype=np.float32)", init=ALLOC, prelude=f"\nGEN = {gen}\n"))


def held_mb(server: int, server_base_mb: float) -> tuple[float, int]:
    """What the budget bounds, as bench/ondemand.py samples it: every python stub of the server, an
    evicted model's still exiting included, plus the server's growth; and how many stubs that was (none
    counted: the sample measured nothing)."""
    stubs = python_stubs(server)
    return sum(rss_mb(p) for p in stubs) + max(0.0, rss_mb(server) - server_base_mb), len(stubs)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.triton
@pytest.mark.alone  # it sums its python stubs' memory: stubs that exit late on a busy machine count too
def test_ondemand_models_under_a_budget_serve_every_ensured_inference(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    for i, name in enumerate(MODELS):
        write_model(repo, name, i + 1)
    for name in ("sentiment_tokenizer", "sentiment_classifier", "sentiment_pipeline"):
        copy_example(name, repo)
    metrics_port = free_port()
    daemon = DaemonProcess(repo, tmp_path / "state", env={"TRITONCTL_IDLE_UNLOAD_S": "2"},
                           extra_args=["--policy", "ondemand", "--memory-budget-mb", "260",
                                       "--metrics-port", str(metrics_port)]).start()
    client = ControlClient(socket=daemon.state_dir / "tritonctl.sock")
    try:
        wait_for(lambda: len(daemon.status()["models"]) == len(MODELS) + 3, 60, 0.3, "every model recorded")
        server = int(daemon.triton_pid() or 0)
        server_base_mb = rss_mb(server)  # nothing loaded yet (policy ondemand)
        rows = {row["model"]: row for row in daemon.status()["models"] if row["model"] in MODELS}
        assert all(row["ondemand"]["state"] == "standby" and row["state"] == "new" for row in rows.values()), rows
        assert "standby" in daemon.run("status").output

        # concurrent ensures of one model: one load, every caller answered READY with the same digest
        answers: list[dict[str, object]] = []
        callers = [threading.Thread(target=lambda: answers.append(client.ensure("m0", 600))) for _ in range(4)]
        for t in callers:
            t.start()
        for t in callers:
            t.join(120)
        assert len(answers) == 4 and len({a["digest"] for a in answers}) == 1, answers
        assert sum(1 for a in answers if a["loaded"]) == 1, answers
        assert [e["outcome"] for e in daemon.audit("--model", "m0", "--action", "ondemand")] == ["ok"]
        assert daemon.run("tag", "m0", "stable").exit_code == 0  # protected from here on
        status_m0 = daemon.model_status("m0")
        assert status_m0["ondemand"]["state"] == "loaded" and status_m0["ondemand"]["leases"] == 4
        assert "loaded (leases: 4, until" in daemon.run("status", "m0").output
        # its footprint, measured at load: the stub's resident memory holds the 40 MB array
        footprint = daemon.json("versions", "m0")[0]["footprint"]
        assert footprint["source"] == "measured" and 40 <= footprint["memory_mb"] <= 160, footprint
        assert status_m0["footprint"] == footprint
        wide = daemon.run("status", "m0", "-o", "wide").output
        assert "MEMORY" in wide and f"{footprint['memory_mb']:.0f} MB" in wide, wide
        for a in answers:
            client.release_lease("m0", str(a["lease"]))

        # Zipf-ish clients: ensure, infer, release; nothing fails after an ensure returned
        failures: list[str] = []
        done = {"inferences": 0}
        stop = time.monotonic() + 10
        weights = [1 / (k + 1) for k in range(len(MODELS))]
        triton_url = daemon.triton_url()

        def worker(seed: int) -> None:
            rng = random.Random(seed)
            own = ControlClient(socket=daemon.state_dir / "tritonctl.sock")
            grpc = grpcclient.InferenceServerClient(triton_url)
            try:
                while time.monotonic() < stop:
                    name = rng.choices(MODELS, weights)[0]
                    lease = own.ensure(name, 30)
                    try:
                        got = infer_gen(grpc, name)
                        if got != MODELS.index(name) + 1:
                            failures.append(f"{name} answered {got}")
                        done["inferences"] += 1
                    except Exception as exc:  # noqa: BLE001 - every failure after an ensure is the finding
                        failures.append(f"{name}: {exc}")
                    finally:
                        own.release_lease(name, str(lease["lease"]))
            except Exception as exc:  # noqa: BLE001 - an ensure that failed is a finding too
                failures.append(f"worker {seed}: {exc}")
            finally:
                grpc.close()

        samples: list[tuple[float, int]] = []

        def sampler() -> None:  # every 0.25 s while the clients run, as the benchmark does every 0.5 s
            while any(t.is_alive() for t in workers):
                samples.append(held_mb(server, server_base_mb))
                time.sleep(0.25)

        workers = [threading.Thread(target=worker, args=(seed,)) for seed in range(3)]
        for t in workers:
            t.start()
        watching = threading.Thread(target=sampler)
        watching.start()
        for t in workers:
            t.join(180)
        watching.join(10)
        assert failures == [] and done["inferences"] >= 10, (failures, done)
        # the budget's bound: over it by at most one model's footprint (an evicted model still exiting)
        footprints = [v["footprint"]["memory_mb"] for m in MODELS for v in daemon.json("versions", m)
                      if v.get("footprint")]
        assert samples and max(n for _, n in samples) > 0, "no sample counted a python stub: nothing was measured"
        held = max(mb for mb, _ in samples)
        assert held <= 260 + max(footprints), (held, sorted(footprints))
        assert not daemon.audit("--action", "restore"), "a reconcile reloaded a model behind the budget's back"
        evictions = daemon.audit("--action", "evict")
        assert any(e["actor"] == "tritonctl:budget" for e in evictions), f"the budget never evicted: {evictions}"
        assert "m0" not in {e["model"] for e in evictions}, "the protected model was unloaded"
        assert daemon.model_status("m0")["state"] == "serving"

        # an ensemble: its steps are ensured first, under leases its own renews and releases; the longest lease
        # is granted (its steps' leases, longer by the wait, are held at the maximum, not refused)
        pipeline = client.ensure("sentiment_pipeline", MAX_LEASE_S)
        steps = ("sentiment_tokenizer", "sentiment_classifier")
        assert all(daemon.model_status(s)["ondemand"]["leases"] == 1 for s in steps)
        client.release_lease("sentiment_pipeline", str(pipeline["lease"]))
        assert all(daemon.model_status(s)["ondemand"]["leases"] == 0 for s in (*steps, "sentiment_pipeline"))

        # a lease that is not renewed expires, then the idle model is unloaded: standby again
        lease = client.ensure("m5", 1)
        assert client.renew_lease("m5", str(lease["lease"]), 1)["lease"] == lease["lease"]
        wait_for(lambda: daemon.audit("--action", "lease_expired", "--model", "m5"), 30, 0.3, "m5's lease expired")
        wait_for(lambda: daemon.model_status("m5")["ondemand"]["state"] == "standby", 30, 0.3, "m5 unloaded when idle")
        assert daemon.run("lease", "renew", "m5", str(lease["lease"])).exit_code == 2  # gone: an unknown lease

        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as response:
            text = response.read().decode()
        counted = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
                   if line.startswith(("tritonctl_evictions_total", "tritonctl_ondemand_loads_total",
                                       "tritonctl_lease_expiries_total"))}
        assert counted['tritonctl_evictions_total{reason="idle"}'] >= 1, counted
        assert counted["tritonctl_ondemand_loads_total"] >= 2 and counted["tritonctl_lease_expiries_total"] >= 1
    finally:
        assert daemon.stop() == 0, daemon.log_tail()
