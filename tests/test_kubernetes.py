"""deploy/kubernetes: every overlay renders (`kubectl kustomize`) and validates strictly against the
Kubernetes 1.30 and newer schemas; the single-host pod runs here as a kubelet would run it (tests/kubelet.py)
with its inference through the gateway, a container of its own in front of tritonserver: it keeps serving
through a SIGKILLed tritonctl sidecar (which adopts the running tritonserver and gateway), and a SIGKILLed
gateway container is started again by the kubelet with its routes. docs/kubernetes.md says what each piece is
for and what was not run here (a cluster, a GPU node)."""

from __future__ import annotations

import json
import secrets
import subprocess
import time
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import tritonclient.grpc as grpcclient
from packaging.version import Version
from tritonclient.utils import InferenceServerException

from controlplane.fleet.settings import from_settings as fleet_settings_from
from controlplane.settings.config import load_settings
from tests.gateway_traffic import Traffic
from tests.harness import answers, request_loop, wait_for, write_gen_model
from tests.kubelet import BIN, Kubelet, expand, render

OVERLAYS = ("single", "fleet")
OLDEST = Version("1.30")


def schema_versions() -> list[str]:
    """Every Kubernetes minor release from 1.30 to the newest whose schemas kubernetes-validate ships."""
    latest = Version(kubernetes_validate.latest_version())
    return [f"1.{minor}" for minor in range(OLDEST.minor, latest.minor + 1)]


def _one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind]
    assert len(found) == 1, f"{len(found)} {kind} objects"
    return found[0]


def _by_name(items: list[dict[str, Any]], name: str) -> dict[str, Any]:
    return next(i for i in items if i["name"] == name)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_renders_and_validates_strictly(overlay: str) -> None:
    objects = render(overlay)
    assert len(schema_versions()) >= 2
    for version in schema_versions():
        for obj in objects:
            # strict: a field the schema does not know (a misspelt or too new one) is an error
            kubernetes_validate.validate(obj, version, strict=True)

    spec = _one(objects, "StatefulSet")["spec"]
    pod = spec["template"]["spec"]
    sidecar = _by_name(pod["initContainers"], "tritonctl")
    gateway = _by_name(pod["initContainers"], "gateway")
    triton = _by_name(pod["containers"], "tritonserver")
    assert sidecar["restartPolicy"] == "Always"  # a native sidecar
    # the gateway: a native sidecar of its own, started first, in front of tritonserver's ports
    assert gateway["restartPolicy"] == "Always" and pod["initContainers"][0]["name"] == "gateway"
    assert gateway["command"][-2:] == ["-m", "controlplane.gateway"]
    args = gateway["args"]
    flags = dict(zip(args[::2], args[1::2], strict=True))
    assert flags["--triton-grpc"] == "127.0.0.1:8101" and flags["--triton-http"] == "127.0.0.1:8100"
    assert flags["--grpc-address"].endswith(":8001") and flags["--http-address"].endswith(":8000")
    assert flags["--control-socket"] == "/var/lib/tritonctl/gateway/gateway.sock"
    assert {"--http-port=8100", "--grpc-port=8101", "--metrics-port=8102"} <= set(triton["args"])
    gateway_ports = {p["name"]: p["containerPort"] for p in gateway["ports"]}
    assert gateway_ports == {"http": 8000, "grpc": 8001, "metrics": 8002}
    assert all(p["name"].startswith("triton-") for p in triton["ports"])
    assert sidecar["readinessProbe"]["exec"]["command"][-1].endswith("/v1/ready")
    assert sidecar["livenessProbe"]["exec"]["command"][-1].endswith("/v1/live")
    assert "startupProbe" in sidecar
    budget = _by_name(sidecar["env"], "TRITONCTL_MEMORY_BUDGET_MB")["valueFrom"]["resourceFieldRef"]
    assert budget == {"containerName": "tritonserver", "resource": "limits.memory", "divisor": "1Mi"}
    assert triton["image"].startswith("nvcr.io/nvidia/tritonserver:")
    assert {"--model-control-mode=explicit", "--strict-readiness=false",
            "--model-repository=/var/lib/tritonctl/serving"} <= set(triton["args"])
    assert any(a.startswith("--grpc-restricted-protocol=model-repository:") for a in triton["args"])
    assert _by_name(triton["volumeMounts"], "state")["readOnly"] is True  # tritonctl alone writes serving/
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["shareProcessNamespace"] is True  # footprints: tritonctl sees Triton's python stubs
    ports = {s["metadata"]["name"]: {p["port"] for p in s["spec"]["ports"]} for s in objects if s["kind"] == "Service"}
    assert ports == {"triton": {8000, 8001}, "triton-metrics": {8002}}
    targets = {p["targetPort"] for s in objects if s["kind"] == "Service" for p in s["spec"]["ports"]}
    assert targets <= set(gateway_ports), "every Service targets the gateway's ports, none tritonserver's"
    assert "tritonctl.toml" in _one(objects, "ConfigMap")["data"]
    if overlay == "single":
        assert spec["replicas"] == 1
        assert _one(objects, "PersistentVolumeClaim")["metadata"]["name"] == "tritonctl-models"
        assert [t["metadata"]["name"] for t in spec["volumeClaimTemplates"]] == ["state"]  # the registry's
    else:
        assert spec["replicas"] > 1
        assert sidecar["args"][-3:] == ["--fleet", "--host", "$(POD_NAME)"]
        assert _by_name(sidecar["env"], "POD_NAME")["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
        assert _by_name(sidecar["env"], "TRITONCTL_DB_URL")["valueFrom"]["secretKeyRef"]["name"] == "tritonctl-fleet"
        assert _by_name(sidecar["env"], "TRITONCTL_SHARED_STORE")["value"].startswith("s3://")
        assert _one(objects, "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1


def test_strict_validation_rejects_what_the_schema_lacks() -> None:
    """The check above means something: an unknown field fails, and a native sidecar needs 1.28's schema."""
    statefulset = _one(render("single"), "StatefulSet")
    sidecar = statefulset["spec"]["template"]["spec"]["initContainers"][0]
    with pytest.raises(kubernetes_validate.ValidationError, match="restartPolicy"):
        kubernetes_validate.validate(statefulset, "1.27", strict=True)
    sidecar["restartPolcy"] = "Always"
    with pytest.raises(kubernetes_validate.ValidationError, match="restartPolcy"):
        kubernetes_validate.validate(statefulset, str(OLDEST), strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_gives_tritonctl_settings_it_accepts(overlay: str, tmp_path: Path) -> None:
    """The sidecar's ConfigMap, environment and flags as the daemon merges them: valid, and what the pod means."""
    objects = render(overlay)
    statefulset = _one(objects, "StatefulSet")
    fake = {"tritonctl-triton-key": {"key": "k" * 32},
            "tritonctl-fleet": {"db-url": "postgresql+psycopg://tritonctl@db/tritonctl"}}
    kubelet = Kubelet("triton-1", statefulset["spec"]["template"]["spec"], objects, fake, tmp_path)
    sidecar = kubelet.container("tritonctl")
    env = kubelet.environment(sidecar)
    args = [expand(a, env) for a in sidecar.spec["args"]]
    assert args[:2] == ["daemon", "--config"]
    flags: dict[str, Any] = {"fleet": True if "--fleet" in args else None,
                             "host": args[args.index("--host") + 1] if "--host" in args else None}
    settings = load_settings(flags, env, Path(kubelet.translate(args[2])))
    assert settings.triton_url == f"127.0.0.1:{kubelet.ports[8101]}" and not settings.launch_triton
    assert settings.gateway_control_socket == kubelet.volume_dir("state") / "gateway" / "gateway.sock"
    assert settings.routes_traffic  # the gateway carries the traffic: tritonctl's private names, its route table
    assert settings.triton_key == "k" * 32
    assert settings.memory_budget_mb == 8192.0
    assert settings.state_dir == kubelet.volume_dir("state")
    if overlay == "single":
        assert settings.repository == kubelet.volume_dir("models") and not settings.fleet
    else:
        fleet_settings_from(settings)  # what --fleet needs is all there
        assert settings.fleet and settings.host == "triton-1"  # the pod's name
        assert str(settings.repository_url).startswith("s3://") and str(settings.shared_store).startswith("s3://")


def _loads(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.mark.triton
def test_single_pod_survives_a_killed_sidecar(tmp_path: Path) -> None:
    objects = render("single")
    statefulset = _one(objects, "StatefulSet")
    name = f"{statefulset['metadata']['name']}-0"
    kubelet = Kubelet(name, statefulset["spec"]["template"]["spec"], objects,
                      {"tritonctl-triton-key": {"key": secrets.token_hex(16)}}, tmp_path)
    loads = tmp_path / "loads.txt"  # one line each time Triton initializes the model
    write_gen_model(kubelet.volume_dir("models"), "gen", 1, init=f"open({str(loads)!r}, 'a').write('load\\n')")
    sidecar, triton = kubelet.container("tritonctl"), kubelet.container("tritonserver")
    gateway = kubelet.container("gateway")
    kubelet.start()
    try:
        kubelet.wait_for(kubelet.pod_ready, 120, "the pod Ready")
        # as declared: the limit through the Downward API, Triton's readiness and its restricted protocol
        assert sidecar.env["TRITONCTL_MEMORY_BUDGET_MB"] == "8192"  # limits.memory 8Gi / 1Mi
        assert sidecar.proc is not None and triton.proc is not None
        environ = Path(f"/proc/{sidecar.proc.pid}/environ").read_bytes().split(b"\0")
        assert b"TRITONCTL_MEMORY_BUDGET_MB=8192" in environ
        assert "--strict-readiness=false" in triton.argv
        url = f"127.0.0.1:{kubelet.ports[8001]}"  # the Service's gRPC port: the gateway's
        client = grpcclient.InferenceServerClient(url)
        assert answers(client, "gen", 1)
        assert gateway.proc is not None and str(kubelet.ports[8001]) in " ".join(gateway.argv)
        assert client.get_model_metadata("gen").name == "gen"  # public names: the gateway in front
        assert [p for p in kubelet.volume_dir("state").joinpath("serving").iterdir() if p.name.startswith("gen__")]
        with pytest.raises(InferenceServerException):
            client.unload_model("gen")  # refused: only tritonctl loads and unloads
        gateway_pid = gateway.proc.pid
        triton_pid = triton.proc.pid
        # the budget can count: the sidecar sees Triton's stubs (shareProcessNamespace) and measured the load
        status = subprocess.run([str(BIN / "tritonctl"), "status", "--json", "--state-dir",
                                 str(kubelet.volume_dir("state"))], capture_output=True, text=True, timeout=60)
        row = next(r for r in json.loads(status.stdout)["models"] if r["model"] == "gen")
        assert row["footprint"]["source"] == "measured" and row["footprint"]["memory_mb"] > 0, row

        with request_loop(url, "gen") as stats:
            wait_for(lambda: stats["ok"] >= 20, 30, what="requests answered")
            killed_at = time.monotonic()
            kubelet.kill("tritonctl")
            kubelet.wait_for(lambda: sidecar.restarts == 1 and sidecar.ready, 90, "the restarted sidecar Ready")
            back_at = time.monotonic()
            # it adopted the running tritonserver: same process, the model not loaded again; the gateway, a
            # container of its own, never noticed (a kill of the tritonctl container kills all its processes)
            assert triton.proc.pid == triton_pid and triton.proc.poll() is None
            assert gateway.proc.pid == gateway_pid and gateway.restarts == 0 and gateway.proc.poll() is None
            assert _loads(loads) == 1
            write_gen_model(kubelet.volume_dir("models"), "gen", 2,
                            init=f"open({str(loads)!r}, 'a').write('load\\n')")  # an edit after the restart
            wait_for(lambda: answers(client, "gen", 2), 60, what="the edit served")
            served_at = time.monotonic()
            wait_for(lambda: stats["gens"].get(2.0, 0) >= 10, 30, what="clients answered by the edit")
        client.close()
        assert stats["failed"] == 0, stats["errors"]
        assert _loads(loads) == 2
        # the deploy of the edit left the pod Ready (Triton not strict; tritonctl's readiness tolerates it)
        assert all(ready for at, ready in sidecar.ready_changes if at > back_at), (back_at, sidecar.ready_changes)
        assert all(ready for at, ready in triton.ready_changes if at > back_at)
        # the probes ran their own commands on their periods
        readiness = sidecar.probes["readiness"].results
        assert {run for _, ok, run in readiness if ok} == {0, 1}  # Ready before the kill and after it
        liveness = sidecar.probes["liveness"].results
        assert liveness and all(ok for _, ok, _ in liveness)

        def same_run_gaps() -> list[float]:
            runs = sidecar.probes["readiness"].results
            return [b[0] - a[0] for a, b in zip(runs, runs[1:], strict=False) if a[2] == b[2]]

        kubelet.wait_for(same_run_gaps, 15, "two readiness probes of one run")  # a quick test can end first
        gaps = same_run_gaps()
        assert gaps and min(gaps) >= 4.5, gaps  # periodSeconds 5
        assert [run for _, ok, run in sidecar.probes["startup"].results if ok] == [0, 1]
        print(f"sidecar out of the pod's readiness {back_at - killed_at:.1f} s after SIGKILL; "
              f"edit served {served_at - back_at:.1f} s after; {stats['ok']} requests, 0 failed")
        _gateway_container_killed(kubelet)
    finally:
        kubelet.stop()


def _gateway_container_killed(kubelet: Kubelet) -> None:
    """SIGKILL the gateway container under gRPC and HTTP clients (a request every 20 ms each): the kubelet starts
    it again, it serves its routes file at once (the same digests answer, public names), tritonctl and
    tritonserver are not restarted; the clients' failures are bounded by the outage and none fails after."""
    gateway, sidecar, triton = (kubelet.container(n) for n in ("gateway", "tritonctl", "tritonserver"))
    assert gateway.proc is not None and triton.proc is not None
    pid, triton_pid, sidecar_restarts = gateway.proc.pid, triton.proc.pid, sidecar.restarts
    with Traffic(f"127.0.0.1:{kubelet.ports[8001]}", f"127.0.0.1:{kubelet.ports[8000]}", "gen",
                 period_s=0.02) as traffic:
        wait_for(lambda: traffic.answered() >= 20, 30, what="clients answered through the gateway")
        killed = time.monotonic()
        kubelet.kill("gateway")
        kubelet.wait_for(lambda: gateway.restarts == 1 and gateway.ready, 60, "the gateway container Ready again")
        started = time.monotonic()
        wait_for(lambda: all(any(s.error is None for s in traffic.since(started) if s.protocol == p)
                             for p in ("grpc", "http")), 60, what="both protocols answered again")
        time.sleep(1.0)
    samples = traffic.samples
    answered = {s.answer for s in samples if s.answer is not None}
    assert answered <= {(1,), (2,)} and answered, answered  # its routes file: the digests tritonctl routed
    assert gateway.proc.pid != pid and triton.proc.pid == triton_pid and sidecar.restarts == sidecar_restarts
    failed = [s for s in samples if s.error is not None]
    last = max((s.ended for s in failed), default=killed)
    assert not [s for s in failed if s.ended < killed], failed[:3]
    assert len(failed) <= 2 * (last - killed) / 0.02 + 10, (len(failed), last - killed)
    print(f"gateway container SIGKILLed: Ready again {started - killed:.1f} s later; {len(failed)} of "
          f"{len(samples)} requests failed, the last {last - killed:.1f} s after the kill")
