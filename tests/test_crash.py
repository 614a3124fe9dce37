"""The control plane crashes, the data plane does not notice: SIGKILLed daemons against a real tritonserver.

A probe model answers its code generation (model.py's constant), weights generation (a file it
reads from its model directory in initialize(), after a sleep that can outlast a daemon restart)
and config generation (the `gen` parameter of the config Triton parsed), so an answer mixing
trees — what re-pointing `serving/` under a load still running inside Triton produces — is visible
in the answer itself. Each round
writes a new generation, SIGKILLs the daemon at a random moment of its deploy, restarts it, and
checks: no mixed answer, no failed request, and the registry, `serving/` and Triton agree. A
launched tritonserver survives its daemon's SIGKILL and is adopted on restart.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from controlplane.store.registry import Registry
from controlplane.triton.launcher import TritonServer
from tests.harness import DaemonProcess, served_name, wait_for

PROBE_CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "gen" data_type: TYPE_FP32 dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
parameters {{ key: "gen" value {{ string_value: "{gen}" }} }}
"""

# initialize() sleeps, then reads its "weights" from the model directory Triton gave it, as real
# models do: a load lasts long enough for kills to land inside it, and a `serving/` link re-pointed
# under it makes the weights come from another tree than the config and code.
PROBE_MODEL = """import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils

CODE_GEN = {gen}


class TritonPythonModel:
    def initialize(self, args):
        time.sleep({init_s})
        config = json.loads(args["model_config"])
        self.config_gen = int(config["parameters"]["gen"]["string_value"])
        with open(os.path.join(args["model_repository"], args["model_version"], "weights.txt")) as handle:
            self.weights_gen = int(handle.read())

    def execute(self, requests):
        value = CODE_GEN * 10000 + self.weights_gen * 100 + self.config_gen
        out = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("gen", np.full_like(x, value, dtype=np.float32))]))
        return out
"""


def write_probe(repo: Path, name: str, gen: int, init_s: float = 0.0) -> None:
    model = repo / name
    (model / "1").mkdir(parents=True, exist_ok=True)
    (model / "config.pbtxt").write_text(PROBE_CONFIG.format(name=name, gen=gen))
    (model / "1" / "model.py").write_text(PROBE_MODEL.format(gen=gen, init_s=init_s))
    (model / "1" / "weights.txt").write_text(str(gen))
    smoke = {"requests": [{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [0]}],
                           "outputs": [{"name": "gen", "data": [gen * 10101]}]}]}
    (model / "smoke.json").write_text(json.dumps(smoke))


def probe(client: grpcclient.InferenceServerClient, name: str) -> tuple[int, int, int]:
    """(code, weights, config) generations of one answer."""
    x = grpcclient.InferInput("x", [1, 1], "FP32")
    x.set_data_from_numpy(np.zeros((1, 1), dtype=np.float32))
    value = int(client.infer(name, [x], client_timeout=10).as_numpy("gen")[0][0])
    return value // 10000, value // 100 % 100, value % 100


def answers(client: grpcclient.InferenceServerClient, name: str, gen: int) -> bool:
    try:
        return probe(client, name) == (gen, gen, gen)
    except Exception:  # noqa: BLE001 - not loaded yet
        return False


@contextmanager
def probe_loop(url: str, name: str, threads: int = 2) -> Iterator[dict[str, Any]]:
    """Clients in a closed loop counting ok, failed and mixed (code, weights, config differ) answers."""
    stats: dict[str, Any] = {"ok": 0, "failed": 0, "mixed": 0, "errors": [], "gens": {}}
    stop = threading.Event()
    lock = threading.Lock()

    def worker() -> None:
        client = grpcclient.InferenceServerClient(url)
        try:
            while not stop.is_set():
                try:
                    code, weights, config = probe(client, name)
                except Exception as exc:  # noqa: BLE001 - counted and reported by the test
                    with lock:
                        stats["failed"] += 1
                        if len(stats["errors"]) < 5:
                            stats["errors"].append(str(exc))
                    continue
                with lock:
                    stats["ok"] += 1
                    stats["gens"][code] = stats["gens"].get(code, 0) + 1
                    if not code == weights == config:
                        stats["mixed"] += 1
                        if len(stats["errors"]) < 5:
                            stats["errors"].append(f"mixed answer: code {code}, weights {weights}, config {config}")
        finally:
            client.close()

    workers = [threading.Thread(target=worker, daemon=True) for _ in range(threads)]
    for w in workers:
        w.start()
    try:
        yield stats
    finally:
        stop.set()
        for w in workers:
            w.join(15)


def agree(state: Path, client: grpcclient.InferenceServerClient, name: str) -> str | None:
    """The digest the registry, serving/ and Triton all agree on (None: not (yet) in agreement). `serving/`
    is the tree Triton serves `name` from: with a gateway the one of the private name its route points at
    (tests/harness.py served_name), asked for through the gateway by the public name."""
    registry = Registry(f"sqlite:///{state / 'registry.db'}")
    try:
        found = registry.find_model(name)
        if registry.open_deployments() or found is None:
            return None
        active = found.active_digest
    finally:
        registry.close()
    try:
        served = client.get_model_config(name, as_json=True)["config"]["parameters"]["tritonctl.digest"]
        served_as = served_name(state, name)
        if served_as is None:  # no route yet
            return None
        published = (state / "serving" / served_as / "config.pbtxt").read_text()
    except Exception:  # noqa: BLE001 - not loaded / not published yet
        return None
    if active and served["string_value"] == active and active in published:
        return active
    return None


def open_step(state: Path) -> str:
    """The step the killed daemon's deployment had reached ('idle' when none was open)."""
    registry = Registry(f"sqlite:///{state / 'registry.db'}")
    try:
        steps = [d.step for d in registry.open_deployments()]
    finally:
        registry.close()
    return steps[0] if steps else "idle"


def wait_step(state: Path, step: str, timeout_s: float) -> None:
    """Poll the registry (read-only, a few ms apart) until a deployment is open at `step`."""
    deadline = time.monotonic() + timeout_s
    db = sqlite3.connect(f"file:{state / 'registry.db'}?mode=ro", uri=True, timeout=1.0)
    try:
        while time.monotonic() < deadline:
            try:
                rows = db.execute("SELECT step FROM deployments WHERE finished_at IS NULL").fetchall()
            except sqlite3.OperationalError:
                rows = []
            if any(r[0] == step for r in rows):
                return
            time.sleep(0.0005)
    finally:
        db.close()


def tritonservers_on(serving: Path) -> list[int]:
    """Pids of tritonserver processes whose repository is `serving` (zombies excluded)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if stat[stat.rfind(")") + 2] == "Z":
            continue
        if cmdline and Path(cmdline[0].decode(errors="replace")).name == "tritonserver" and \
                f"--model-repository={serving}".encode() in cmdline:
            pids.append(int(entry))
    return pids


# A load that outlasts a daemon restart (about 2-4 s on a busy 2-core machine): the restarted daemon
# meets the killed one's load still running inside Triton.
LONG_LOAD_S = 7.0
SHORT_LOAD_S = 0.3
TARGETS = ["any", "any", "published", "published", "intent", "loaded", "verified"]


def random_kills(tmp_path: Path, kills: int, seed: int, targets: list[str] | None = None) -> dict[str, Any]:
    """`kills` rounds of edit → SIGKILL at a random moment → restart against an external tritonserver."""
    rng = random.Random(seed)
    repo, state = tmp_path / "repo", tmp_path / "state"
    repo.mkdir()
    write_probe(repo, "probe", 1, init_s=SHORT_LOAD_S)
    server = TritonServer(model_repository=state / "serving", workdir=tmp_path / "triton")
    server.start()
    daemon = DaemonProcess(repo, state, launch=False, extra_args=["--triton-url", server.grpc_url])
    steps: dict[str, int] = {}
    restarts: list[float] = []
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        daemon.start()
        wait_for(lambda: agree(state, client, "probe"), 60, 0.2, "generation 1 serving")
        with probe_loop(server.grpc_url, "probe") as stats:
            for round_, gen in enumerate(range(2, kills + 2)):
                # Some kills at a uniformly random moment of a deploy with a long load (settle 0.2 s,
                # capture, publish, load, verify, smoke); the others a random few ms after the deploy
                # reaches a chosen step, so that every step gets some (short ones are rarely hit by chance).
                target = targets[round_ % len(targets)] if targets else rng.choice(TARGETS)
                write_probe(repo, "probe", gen, init_s=LONG_LOAD_S if target in ("any", "published") else SHORT_LOAD_S)
                if target == "any":
                    time.sleep(rng.uniform(0.15, 3.0))
                else:
                    wait_step(state, target, 10.0)
                    # 'loaded' lasts only as long as the READY and digest checks (a few ms): kill at once
                    time.sleep(0.0 if target == "loaded" else rng.uniform(0.0, 0.03))
                daemon.kill()
                step = open_step(state)
                steps[step] = steps.get(step, 0) + 1
                started = time.monotonic()
                daemon.start()
                restarts.append(round(time.monotonic() - started, 1))
                wait_for(lambda: agree(state, client, "probe"), 120, 0.2, "registry, serving/ and Triton agree")
                # The restarted daemon rolls the interrupted deploy forward or back, then deploys the
                # source's content: the newest generation serves before the next round.
                wait_for(lambda g=gen: answers(client, "probe", g) and agree(state, client, "probe"), 120, 0.2,
                         f"generation {gen} serving")
        log = daemon.log_tail(10_000_000)
        result = {"kills": kills, "steps": steps, "ok": stats["ok"], "failed": stats["failed"],
                  "mixed": stats["mixed"], "errors": stats["errors"], "restart_s": restarts,
                  "rolled_forward": log.count("recovered interrupted deploy: rolled forward"),
                  "rolled_back": log.count("recovered interrupted deploy: rolled back")}
        print("random kills:", json.dumps(result))
        return result
    finally:
        client.close()
        daemon.stop()
        server.stop()


def test_random_sigkills_never_serve_a_mixed_model(tmp_path: Path) -> None:
    """A kill during a load that outlasts the restart, and one after verify."""
    result = random_kills(tmp_path, kills=2, seed=16, targets=["published", "verified"])
    assert result["mixed"] == 0 and result["failed"] == 0, result
    assert result["ok"] > 0 and result["rolled_forward"] >= 1, result


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_thirty_random_sigkills_never_serve_a_mixed_model(tmp_path: Path) -> None:
    result = random_kills(tmp_path, kills=30, seed=1616)
    assert result["mixed"] == 0 and result["failed"] == 0, result
    assert result["ok"] > 0, result
    # 'loaded' lasts only as long as the READY and digest checks, a millisecond or two since they read
    # protobuf messages: chance no longer finds it in 30 kills. tests/test_faults.py kills the daemon
    # right after the load (after_load), three times, deterministically.
    assert {"published", "verified"} <= set(result["steps"]), result


def test_sigkilled_daemon_leaves_its_launched_tritonserver_serving_and_adopts_it(tmp_path: Path) -> None:
    """SIGKILL under a request loop: 0 failed requests, the restarted daemon adopts the server (one
    tritonserver for the state dir). With keep_triton a SIGTERM leaves it serving too; without, SIGTERM
    stops it as before."""
    repo, state = tmp_path / "repo", tmp_path / "state"
    repo.mkdir()
    write_probe(repo, "kept", 1)
    daemon = DaemonProcess(repo, state).start()
    try:
        url = daemon.triton_url()
        client = grpcclient.InferenceServerClient(url)
        wait_for(lambda: agree(state, client, "kept"), 60, 0.2, "generation 1 serving")
        pid = daemon.triton_pid()
        record = state / "triton" / "server.json"
        assert record.stat().st_mode & 0o777 == 0o600
        assert json.loads(record.read_text())["pid"] == pid
        with probe_loop(url, "kept") as stats:
            daemon.kill()
            time.sleep(1.0)  # the control plane is gone; inference is not
            assert tritonservers_on(state / "serving") == [pid]
            daemon.env = {"TRITONCTL_KEEP_TRITON": "true"}
            daemon.start()
            wait_for(lambda: agree(state, client, "kept"), 60, 0.2, "reconciled after the restart")
            write_probe(repo, "kept", 2)  # the adopted server takes the new daemon's loads
            wait_for(lambda: answers(client, "kept", 2), 60, 0.2, "generation 2 through the adopted server")
            assert daemon.triton_url() == url
            assert tritonservers_on(state / "serving") == [pid], "exactly one tritonserver, the adopted one"
            assert "adopted the running tritonserver" in daemon.log_tail(20000)
            assert daemon.proc is not None
            daemon.proc.send_signal(signal.SIGTERM)  # keep_triton: stopped on purpose, still serving
            assert daemon.proc.wait(60) == 0
            assert tritonservers_on(state / "serving") == [pid] and record.exists()
            assert probe(client, "kept") == (2, 2, 2)
        assert stats["failed"] == 0 and stats["mixed"] == 0, stats
        assert stats["ok"] > 0
        daemon.env = {}
        daemon.start()
        assert tritonservers_on(state / "serving") == [pid], "adopted again"
        client.close()
        assert daemon.stop() == 0
        assert tritonservers_on(state / "serving") == [], "without keep_triton SIGTERM stops a launched server"
        assert not record.exists()
    finally:
        daemon.stop()
