"""A real MLflow tracking server for tests: `mlflow server` (SQLite backend store, `--serve-artifacts`)
on a free loopback port, from a virtual environment of its own.

Why a venv of its own: the server's package (`mlflow`) pulls numpy 2, pandas, pyarrow, scikit-learn and
Flask, which the project's pins (numpy<2 for tritonclient's stack) do not allow in the test venv. The
project itself needs only the client side (`tritonctl[mlflow]`). `.ci/install-test-deps` builds the venv
once (`python -m tests.mlflowserver --install`); a test that finds none builds it then (minutes, once).
`TRITONCTL_TEST_MLFLOW_VENV` names another one.

Models are logged the way a training job does, over MLflow's REST API (the same calls `MlflowClient`
makes): an experiment, a run, the model directory's files as the run's artifacts, a registered model, a
version whose source is `runs:/<run>/<path>`, and the alias moved with `set_registered_model_alias`.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane.remote.mlflowrest import MLflowRest
from tests.s3server import free_port

MLFLOW_VERSION = "3.17.2"
VENV = Path(os.environ.get("TRITONCTL_TEST_MLFLOW_VENV")
            or Path.home() / ".cache" / "tritonctl-tests" / f"mlflow-server-{MLFLOW_VERSION}")


def install(venv: Path = VENV) -> Path:
    """The server's venv (built once): its `mlflow` executable."""
    exe = venv / "bin" / "mlflow"
    if not exe.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", f"mlflow=={MLFLOW_VERSION}"], check=True)
    return exe


def template_db(venv: Path = VENV) -> Path:
    """An empty backend store with MLflow's schema migrated (made once: the migrations are most of a
    fresh server's start-up); each server starts from a copy."""
    template = venv / "template.db"
    if not template.exists():
        tmp = venv / f"template-{os.getpid()}.db"
        subprocess.run([str(install(venv)), "db", "upgrade", f"sqlite:///{tmp}"], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        tmp.replace(template)
    return template


class MLflowServer:
    """One `mlflow server` over a directory; `stop()` and `start()` again keep its store and port."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.rest = MLflowRest(self.url, env={}, timeout_s=30)
        self.experiment = ""

    @property
    def log_path(self) -> Path:
        return self.base / "mlflow-server.log"

    def start(self, wait: bool = True) -> None:
        exe = install()
        db = self.base / "mlflow.db"
        if not db.exists():
            shutil.copyfile(template_db(), db)
        args = [str(exe), "server", "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
                "--backend-store-uri", f"sqlite:///{self.base / 'mlflow.db'}",
                "--artifacts-destination", str(self.base / "artifacts"), "--serve-artifacts"]
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the process
        env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
        # no job runner (GenAI jobs: five more processes each importing mlflow, most of a start's CPU)
        env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        log.close()
        if wait:
            self.wait_up()

    def wait_up(self) -> None:
        """Until /health answers (the first time: an experiment for the runs made then)."""
        assert self.proc is not None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"mlflow server exited:\n{self.log_path.read_text()[-3000:]}"
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as answer:  # noqa: S310
                    if answer.status == 200:
                        break
            except OSError:
                time.sleep(0.3)
        else:
            raise AssertionError(f"mlflow server not up:\n{self.log_path.read_text()[-3000:]}")
        if not self.experiment:
            self.experiment = self.rest.call("POST", "experiments/create", "experiment",
                                             name=f"e2e-{uuid.uuid4().hex[:8]}")["experiment_id"]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self.proc = None

    # -- what a training job does ----------------------------------------------------------------------
    def log_files(self, files: dict[str, str | bytes], artifact_path: str) -> str:
        """A new run with `files` (path -> content) logged under `artifact_path`: the run's id."""
        run = self.rest.call("POST", "runs/create", "run", experiment_id=self.experiment)["run"]["info"]
        base = str(run["artifact_uri"]).removeprefix("mlflow-artifacts:").lstrip("/")
        for rel, content in files.items():
            data = content.encode() if isinstance(content, str) else content
            self.rest.put_artifact(f"{base}/{artifact_path}/{rel}", data)
        return str(run["run_id"])

    def register(self, name: str, files: dict[str, str | bytes], artifact_path: str = "model") -> str:
        """Log `files` in a new run and register them as a new version of `name`: the version."""
        run = self.log_files(files, artifact_path)
        try:
            self.rest.call("POST", "registered-models/create", name, name=name)
        except Exception as exc:  # noqa: BLE001 - it exists already
            if "already exists" not in str(exc) and "RESOURCE_ALREADY_EXISTS" not in str(exc):
                raise
        version = self.rest.call("POST", "model-versions/create", name, name=name,
                                 source=f"runs:/{run}/{artifact_path}", run_id=run)["model_version"]
        return str(version["version"])

    def set_alias(self, name: str, alias: str, version: str) -> None:
        self.rest.call("POST", "registered-models/alias", name, name=name, alias=alias, version=version)

    def delete_alias(self, name: str, alias: str) -> None:
        self.rest.call("DELETE", "registered-models/alias", name, name=name, alias=alias)

    def version_tags(self, name: str, version: str) -> dict[str, str]:
        answer = self.rest.call("GET", "model-versions/get", name, name=name, version=version)["model_version"]
        return {t["key"]: t["value"] for t in answer.get("tags", [])}


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MLflowServer]:
    """A server starting (not waited for: a user starts a daemon beside it meanwhile; `wait_up`)."""
    server = MLflowServer(tmp_path_factory.mktemp("mlflow"))
    server.start(wait=False)
    yield server
    server.stop()


if __name__ == "__main__":  # `python -m tests.mlflowserver --install`: build the server's venv
    if sys.argv[1:] != ["--install"]:
        raise SystemExit("usage: python -m tests.mlflowserver --install")
    print(install())
