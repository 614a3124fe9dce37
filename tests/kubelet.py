"""deploy/kubernetes rendered and run on this machine the way a kubelet runs its pod (no cluster here).

`render(overlay)` is `kubectl kustomize`. `Kubelet` takes the rendered StatefulSet's pod template and runs
it: init containers in order, a native sidecar (restartPolicy Always) started and its startup probe
passed before the next container starts, then the containers; each container's command, args and
environment as declared ($(VAR) expanded from its environment, Secrets from the test, the Downward API's
fieldRef and resourceFieldRef from the pod's own name and declared limits); the probes' own exec
commands, HTTP gets and TCP connects on their periods (liveness and readiness only after the startup probe
passed, failureThreshold failures in a row to count); a sidecar that exits is started again. Killing a
container kills every process it started, whatever session they moved to, as a runtime kills a container's
cgroup (each container's processes carry `KUBELET_CONTAINER=<pod>/<container>` in their environment, the
stand-in's cgroup); a stop sends SIGTERM to the container's own process first, as a runtime does.

What a host cannot do as a container runtime would, and how it stands in here: the images become local
programs (`tritonctl` the venv's, `tritonserver` the nvidia-pytriton wheel's with the backend directory
the image has by default made explicit, other commands from PATH); each volume becomes a temporary
directory (a ConfigMap's files written into it) and every mount path in the pod's strings (args, env
values, the ConfigMap's files) is rewritten to it, `/dev/shm` staying the host's; the pod's fixed ports
are rewritten to free loopback ports. Read-only mounts are not enforced and the containers run as this
user. Images' programs under /opt/tritonctl/bin (the tritonctl image's venv) are this venv's.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from controlplane.triton.launcher import _bundled_libs_dir, assemble_backend_dir, find_tritonserver, free_port

ROOT = Path(__file__).resolve().parent.parent
KUSTOMIZE = ROOT / "deploy" / "kubernetes"
BIN = Path(sys.executable).parent
IMAGE_BACKENDS = "/opt/tritonserver/backends"  # NVIDIA's image's default --backend-directory
IMAGE_VENV = "/opt/tritonctl/bin/"  # deploy/container/Containerfile's venv
CONTAINER_MARK = "KUBELET_CONTAINER"  # in every process of a container: what a kill of the container reaches

_QUANTITY = re.compile(r"^([0-9.]+)([a-zA-Z]*)$")
_SUFFIX = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30,
           "Ti": 2**40, "m": 1e-3}


def render(overlay: str) -> list[dict[str, Any]]:
    """`kubectl kustomize deploy/kubernetes/overlays/OVERLAY`: the objects it renders."""
    if shutil.which("kubectl") is None:
        import pytest

        pytest.fail("kubectl is not installed: run .ci/install-test-deps (Debian's kubernetes-client)")
    out = subprocess.run(["kubectl", "kustomize", str(KUSTOMIZE / "overlays" / overlay)], capture_output=True,
                         text=True, timeout=60, check=True)
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def quantity(text: str | int) -> float:
    """A Kubernetes resource quantity (`8Gi`, `250m`, `1`) as a number of units."""
    match = _QUANTITY.match(str(text))
    if match is None or match.group(2) not in _SUFFIX:
        raise ValueError(f"not a quantity: {text!r}")
    return float(match.group(1)) * _SUFFIX[match.group(2)]


def expand(text: str, env: dict[str, str]) -> str:
    """The kubelet's $(VAR) expansion: a defined VAR is replaced, $$ is a literal $, others stay as written."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)), text)


@dataclass
class Probe:
    kind: str  # startup | liveness | readiness
    spec: dict[str, Any]
    results: list[tuple[float, bool, int]] = field(default_factory=list)  # (time, ok, the container's restarts)
    failures: int = 0  # in a row


@dataclass
class Container:
    spec: dict[str, Any]
    sidecar: bool
    argv: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    started: bool = False  # the startup probe passed (or there is none)
    ready: bool = False
    restarts: int = 0
    probes: dict[str, Probe] = field(default_factory=dict)
    # (time, ready) at each change of `ready`: how long the container was out of its pod's readiness
    ready_changes: list[tuple[float, bool]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return str(self.spec["name"])


class Kubelet:
    """Runs one pod (`pod_spec`: a pod template's spec) with its volumes under `workdir`."""

    def __init__(self, pod_name: str, pod_spec: dict[str, Any], objects: list[dict[str, Any]],
                 secrets: dict[str, dict[str, str]], workdir: Path) -> None:
        self.pod_name, self.spec, self.secrets, self.workdir = pod_name, pod_spec, secrets, workdir
        self.config_maps = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ConfigMap"}
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        self.volumes = {v["name"]: self._volume(v) for v in pod_spec.get("volumes", [])}
        self.ports: dict[int, int] = {}
        for c in [*pod_spec.get("initContainers", []), *pod_spec["containers"]]:
            for port in c.get("ports", []):
                self.ports[int(port["containerPort"])] = free_port()
        self.containers = [Container(c, c.get("restartPolicy") == "Always") for c in pod_spec.get("initContainers", [])]
        self.containers += [Container(c, False) for c in pod_spec["containers"]]
        self.paths: dict[str, str] = {}  # mount path -> host directory (every container's)
        for c in self.containers:
            for mount in c.spec.get("volumeMounts", []):
                if mount["mountPath"] != "/dev/shm":
                    self.paths[mount["mountPath"]] = str(self.volume_dir(mount["name"]))
        for port in self._loopback_ports():
            self.ports.setdefault(port, free_port())
        for spec in pod_spec.get("volumes", []):  # ConfigMap files hold mount paths and ports too
            if "configMap" in spec:
                for key, text in self.config_maps[spec["configMap"]["name"]].get("data", {}).items():
                    (self.volumes[spec["name"]] / key).write_text(self.translate(text))
        self.threads: list[threading.Thread] = []

    # --- the pod's strings on this host ---------------------------------------------------------------
    def _loopback_ports(self) -> set[int]:
        """Ports a container listens on for the pod's loopback only (tritonctl's metrics_port)."""
        found: set[int] = set()
        for cm in self.config_maps.values():
            for text in cm.get("data", {}).values():
                found |= {int(p) for p in re.findall(r"^metrics_port\s*=\s*(\d+)", text, re.M)}
        return found

    def translate(self, text: str) -> str:
        """Mount paths to their host directories, the pod's ports to this host's free ones."""
        # one pass each: a host directory (under /tmp) is never rewritten again by the /tmp mount
        mounts = "|".join(re.escape(m) for m in sorted(self.paths, key=len, reverse=True))
        text = re.sub(rf"(?<![\w/.-])({mounts})(?![\w.-])", lambda m: self.paths[m.group(1)], text)
        ports = "|".join(str(p) for p in self.ports)
        return re.sub(rf"(?<=[=:\s])({ports})\b", lambda m: str(self.ports[int(m.group(1))]), text)

    def _volume(self, spec: dict[str, Any]) -> Path:
        path = self.workdir / "volumes" / spec["name"]
        path.mkdir(parents=True, exist_ok=True)
        return path

    def volume_dir(self, name: str) -> Path:
        """A volume's directory; a volumeClaimTemplate's claim (not among the pod's volumes) gets one too."""
        if name not in self.volumes:
            self.volumes[name] = self._volume({"name": name})
        return self.volumes[name]

    def container(self, name: str) -> Container:
        return next(c for c in self.containers if c.name == name)

    def _limit(self, container: str, resource: str, divisor: str) -> str:
        spec = self.container(container).spec
        kind, _, what = resource.partition(".")
        value = spec.get("resources", {}).get(kind, {}).get(what)
        if value is None:
            raise AssertionError(f"{container} declares no {resource}: the node's allocatable would be used")
        return str(math.ceil(quantity(value) / quantity(divisor)))

    def environment(self, c: Container) -> dict[str, str]:
        """The container's declared environment, resolved as the kubelet resolves it."""
        env: dict[str, str] = {}
        for source in c.spec.get("envFrom", []):
            ref = source.get("secretRef")
            if ref is not None and ref["name"] in self.secrets:
                env.update(self.secrets[ref["name"]])
            elif ref is not None and not ref.get("optional"):
                raise AssertionError(f"{c.name}: envFrom Secret {ref['name']} missing")
        for var in c.spec.get("env", []):
            name = var["name"]
            if "value" in var:
                env[name] = self.translate(expand(var["value"], env))
                continue
            ref = var["valueFrom"]
            if "secretKeyRef" in ref:
                env[name] = self.secrets[ref["secretKeyRef"]["name"]][ref["secretKeyRef"]["key"]]
            elif "fieldRef" in ref:
                assert ref["fieldRef"]["fieldPath"] == "metadata.name", ref
                env[name] = self.pod_name
            elif "resourceFieldRef" in ref:
                r = ref["resourceFieldRef"]
                env[name] = self._limit(r.get("containerName", c.name), r["resource"], r.get("divisor", "1"))
            else:
                raise AssertionError(f"{c.name}: env {name}: {ref} not supported here")
        return env

    def _argv(self, c: Container, env: dict[str, str]) -> list[str]:
        words = [self.translate(expand(w, env)) for w in [*c.spec.get("command", []), *c.spec.get("args", [])]]
        program = words[0]
        if program == "tritonserver":
            server = find_tritonserver()
            backends = assemble_backend_dir(self.workdir / "image" / "backends", server)
            return [str(server), f"--backend-directory={backends}", *words[1:]]
        if program == "tritonctl":
            return [str(BIN / "tritonctl"), *words[1:]]
        if program.startswith(IMAGE_VENV):
            return [str(BIN / program.removeprefix(IMAGE_VENV)), *words[1:]]
        found = shutil.which(program)
        assert found, f"{c.name}: {program} not found on this host"
        return [found, *words[1:]]

    def _process_env(self, declared: dict[str, str], argv: list[str] | None = None) -> dict[str, str]:
        """The container's environment: what it declares over a bare one (PATH, HOME). The wheel's
        tritonserver needs its bundled libraries and this interpreter's python3 for its python stub."""
        home = self.workdir / "home"
        home.mkdir(exist_ok=True)
        env = {"PATH": os.pathsep.join([str(BIN), os.environ.get("PATH", "/usr/bin:/bin")]), "HOME": str(home),
               "LANG": "C.UTF-8"}
        server = find_tritonserver()
        libs = _bundled_libs_dir(server)
        if argv and argv[0] == str(server) and libs is not None:
            env["LD_LIBRARY_PATH"] = str(libs)
        env.update(declared)
        return env

    # --- running ------------------------------------------------------------------------------------
    def _start(self, c: Container) -> None:
        c.env = self.environment(c)
        c.argv = self._argv(c, c.env)
        log = open(self.workdir / f"{c.name}.log", "ab")  # noqa: SIM115 - owned by the process
        env = {**self._process_env(c.env, c.argv), CONTAINER_MARK: self.mark(c)}
        c.proc = subprocess.Popen(c.argv, stdout=log, stderr=subprocess.STDOUT, cwd=self.workdir, env=env,
                                  start_new_session=True)
        log.close()
        c.started = "startupProbe" not in c.spec
        self._set_ready(c, False)
        # a fresh run of every probe; their results (across restarts) kept for the test to read
        c.probes = {kind: Probe(kind, c.spec[f"{kind}Probe"], c.probes[kind].results if kind in c.probes else [])
                    for kind in ("startup", "liveness", "readiness") if f"{kind}Probe" in c.spec}

    def _set_ready(self, c: Container, ready: bool) -> None:
        if c.ready != ready or not c.ready_changes:
            c.ready_changes.append((time.monotonic(), ready))
        c.ready = ready

    def _probe_once(self, c: Container, probe: Probe) -> bool:
        spec, timeout = probe.spec, float(probe.spec.get("timeoutSeconds", 1))
        try:
            if "exec" in spec:
                argv = [self.translate(w) for w in spec["exec"]["command"]]
                return subprocess.run(argv, capture_output=True, timeout=timeout, env=self._process_env(c.env),
                                      cwd=self.workdir).returncode == 0
            if "tcpSocket" in spec:
                import socket

                with socket.create_connection(("127.0.0.1", self._port(c, spec["tcpSocket"]["port"])), timeout):
                    return True
            get = spec["httpGet"]
            url = f"http://127.0.0.1:{self._port(c, get['port'])}{get.get('path', '/')}"
            with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - loopback
                return 200 <= response.status < 400
        except Exception:  # noqa: BLE001 - a probe that errs or times out failed
            return False

    def _port(self, c: Container, port: int | str) -> int:
        """A probe's port (a number, or a name of the container's ports) on this host."""
        if isinstance(port, str):
            port = next(p["containerPort"] for p in c.spec.get("ports", []) if p["name"] == port)
        return self.ports[int(port)]

    def _probe_loop(self, c: Container, kind: str, generation: int) -> None:
        """One probe of one container run (`generation`: its restart count when it started)."""
        probe = c.probes[kind]
        period = float(probe.spec.get("periodSeconds", 10))
        threshold = int(probe.spec.get("failureThreshold", 3))
        time.sleep(float(probe.spec.get("initialDelaySeconds", 0)))
        while not self.stop_event.is_set() and c.restarts == generation:
            if kind != "startup" and not c.started:
                time.sleep(0.05)
                continue
            ok = self._probe_once(c, probe)
            with self.lock:
                if c.restarts != generation:
                    return
                probe.results.append((time.monotonic(), ok, generation))
                probe.failures = 0 if ok else probe.failures + 1
                if kind == "startup":
                    if ok:
                        c.started = True
                        return
                    if probe.failures >= threshold:
                        self._kill(c)  # restarted by the supervisor
                        return
                elif kind == "readiness":
                    if ok:
                        self._set_ready(c, True)
                    elif probe.failures >= threshold:
                        self._set_ready(c, False)
                elif kind == "liveness" and probe.failures >= threshold:
                    self._kill(c)
                    return
            self.stop_event.wait(period)

    def _run_probes(self, c: Container) -> None:
        for kind in c.probes:
            t = threading.Thread(target=self._probe_loop, args=(c, kind, c.restarts), daemon=True,
                                 name=f"probe-{c.name}-{kind}")
            t.start()
            self.threads.append(t)

    def mark(self, c: Container) -> str:
        return f"{self.pod_name}/{c.name}"

    def processes(self, c: Container) -> list[int]:
        """Every live process the container started (its mark in their environment), in any session."""
        mark = f"{CONTAINER_MARK}={self.mark(c)}".encode()
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                if mark in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                    found.append(int(entry))
            except OSError:
                continue
        return found

    def _kill(self, c: Container, sig: int = signal.SIGKILL) -> None:
        """SIGTERM: the container's own process group (a runtime signals the container's first process);
        SIGKILL: every process of the container (a runtime kills its cgroup)."""
        if c.proc is not None and c.proc.poll() is None:
            try:
                os.killpg(c.proc.pid, sig)
            except ProcessLookupError:
                pass
        if sig == signal.SIGKILL:
            for pid in self.processes(c):
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass

    def _supervise(self) -> None:
        """restartPolicy Always: a container that exited is started again (with its probes anew)."""
        while not self.stop_event.wait(0.2):
            for c in self.containers:
                with self.lock:
                    if c.proc is None or c.proc.poll() is None or self.stop_event.is_set():
                        continue
                    self._set_ready(c, False)  # exited: not ready from now (before its restart is counted,
                    c.restarts += 1             # so that no reader sees the new run with the old run's readiness)
                    self._start(c)
                self._run_probes(c)

    def start(self, timeout_s: float = 120.0) -> None:
        """Start the pod: each init container in turn (a sidecar until its startup probe passed), then
        the containers."""
        for c in self.containers:
            self._start(c)
            self._run_probes(c)
            if c.sidecar:
                self.wait_for(lambda c=c: c.started, timeout_s, f"{c.name}'s startup probe")
            elif c.spec in self.spec.get("initContainers", []):
                assert c.proc is not None and c.proc.wait(timeout_s) == 0, f"init container {c.name} failed"
        supervisor = threading.Thread(target=self._supervise, daemon=True, name="kubelet-supervise")
        supervisor.start()
        self.threads.append(supervisor)

    def wait_for(self, predicate: Any, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not predicate():
            for c in self.containers:
                if c.proc is not None and c.proc.poll() is not None and not c.sidecar:
                    raise AssertionError(f"{c.name} exited {c.proc.returncode}: {self.log_tail(c.name)}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s}s waiting for {what}; logs: "
                                     + " | ".join(f"{c.name}: {self.log_tail(c.name, 1500)}" for c in self.containers))
            time.sleep(0.1)

    def pod_ready(self) -> bool:
        """The pod's Ready condition: every container (a sidecar included) ready."""
        return all(c.ready for c in self.containers if c.sidecar or c.spec in self.spec["containers"])

    def kill(self, name: str) -> None:
        """SIGKILL one container's processes (the supervisor starts it again)."""
        with self.lock:
            self._kill(self.container(name))

    def log_tail(self, name: str, chars: int = 3000) -> str:
        try:
            return (self.workdir / f"{name}.log").read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self) -> None:
        """Pod deletion: SIGTERM the containers, then the sidecars in reverse order, within the grace period."""
        self.stop_event.set()
        grace = float(self.spec.get("terminationGracePeriodSeconds", 30))
        mains = [c for c in self.containers if not c.sidecar]
        sidecars = [c for c in reversed(self.containers) if c.sidecar]
        for group in (mains, sidecars):
            for c in group:
                self._kill(c, signal.SIGTERM)
            deadline = time.monotonic() + grace
            for c in group:
                if c.proc is None:
                    continue
                try:
                    c.proc.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    self._kill(c)
                    c.proc.wait()
