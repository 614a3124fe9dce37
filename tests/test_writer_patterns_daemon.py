"""README Guarantees, the writer-pattern row, through the real daemon, registry and tritonserver.

Each model is a probe: it answers with the generation written in its config.pbtxt (`parameters gen`,
read in initialize) and the one written in its model.py (`GEN = n`, the file's last line, so a partly
written model.py has none and does not load). While a writer edits the source the way people do
(chunks with pauses, editor temp+rename, `cp -r`, `rsync -a`, delete+recreate, two models at once,
config and code in either order), a client keeps asking. Every answer must agree with itself
(0 mixed answers), and every edit must end served.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.harness import DaemonProcess, wait_for

pytestmark = pytest.mark.slow
PAUSE = 0.15  # writers pause less than the settle window
SETTLE = 0.5

CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 0
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ 1 ] }} ]
output [ {{ name: "gens" data_type: TYPE_FP32 dims: [ 2 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
parameters {{ key: "gen" value {{ string_value: "{gen}" }} }}
"""

CODE = '''import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.config_gen = float(config["parameters"]["gen"]["string_value"])

    def execute(self, requests):
        gens = np.array([self.config_gen, float(GEN)], dtype=np.float32)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("gens", gens)]) for _ in requests]


GEN = {gen}
'''


def write_probe(root: Path, name: str, gen: int) -> Path:
    model = root / name
    (model / "1").mkdir(parents=True, exist_ok=True)
    (model / "config.pbtxt").write_text(CONFIG.format(name=name, gen=gen))
    (model / "1" / "model.py").write_text(CODE.format(gen=gen))
    return model


def ask(client: grpcclient.InferenceServerClient, name: str) -> tuple[float, float] | None:
    x = grpcclient.InferInput("x", [1], "FP32")
    x.set_data_from_numpy(np.zeros(1, dtype=np.float32))
    try:
        out = client.infer(name, [x], client_timeout=10).as_numpy("gens")
    except Exception:  # noqa: BLE001 - not loaded (yet): not an answer
        return None
    return float(out[0]), float(out[1])


class Probe:
    """Asks `names` in a loop; keeps every answer."""

    def __init__(self, url: str, names: list[str]) -> None:
        self.answers: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(url,), daemon=True)
        self._thread.start()

    def _run(self, url: str) -> None:
        client = grpcclient.InferenceServerClient(url)
        while not self._stop.is_set():
            for name, answers in self.answers.items():
                got = ask(client, name)
                if got is not None:
                    answers.append(got)
            time.sleep(0.02)
        client.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(15)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    base = tmp_path_factory.mktemp("writers")
    repo = base / "repo"
    repo.mkdir()
    proc = DaemonProcess(repo, base / "state", settle_s=SETTLE).start()
    yield proc
    assert proc.stop() == 0, proc.log_tail()


def write_in_chunks(path: Path, text: str, chunks: int = 4) -> None:
    step = -(-len(text) // chunks)
    with open(path, "w") as fh:
        for i in range(0, len(text), step):
            fh.write(text[i : i + step])
            fh.flush()
            time.sleep(PAUSE)


def editor_save(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.swp")
    tmp.write_text(text)
    time.sleep(PAUSE)
    tmp.rename(path)


def check(daemon: DaemonProcess, names: list[str], edit: Callable[[int], None], staging: Path) -> None:
    client = grpcclient.InferenceServerClient(daemon.triton_url())
    for name in names:
        write_probe(daemon.repository, name, 1)
    for name in names:
        wait_for(lambda n=name: ask(client, n) == (1.0, 1.0), 60, 0.1, f"{name} generation 1")
    probe = Probe(daemon.triton_url(), names)
    try:
        edit(2)
        for name in names:
            wait_for(lambda n=name: ask(client, n) == (2.0, 2.0), 60, 0.1, f"{name} generation 2 served")
    finally:
        probe.stop()
        client.close()
    for name, answers in probe.answers.items():
        mixed = [a for a in answers if a[0] != a[1]]
        assert answers and not mixed, f"{name}: {len(mixed)} mixed answers of {len(answers)}: {mixed[:3]}"


def test_file_written_in_chunks_with_pauses(daemon: DaemonProcess, tmp_path: Path) -> None:
    repo = daemon.repository
    check(daemon, ["chunks"], lambda g: (write_in_chunks(repo / "chunks" / "config.pbtxt",
                                                         CONFIG.format(name="chunks", gen=g)),
                                         write_in_chunks(repo / "chunks" / "1" / "model.py", CODE.format(gen=g))),
          tmp_path)


def test_editor_save_temp_and_rename(daemon: DaemonProcess, tmp_path: Path) -> None:
    repo = daemon.repository
    check(daemon, ["editor"], lambda g: (editor_save(repo / "editor" / "1" / "model.py", CODE.format(gen=g)),
                                         editor_save(repo / "editor" / "config.pbtxt",
                                                     CONFIG.format(name="editor", gen=g))), tmp_path)


@pytest.mark.parametrize("tool", ["cp", "rsync"])
def test_copy_over_the_model(daemon: DaemonProcess, tmp_path: Path, tool: str) -> None:
    name = f"copied_{tool}"

    def edit(gen: int) -> None:
        src = write_probe(tmp_path / "staging", name, gen)
        args = ["cp", "-r", f"{src}/.", str(daemon.repository / name)] if tool == "cp" else \
            ["rsync", "-a", "--checksum", f"{src}/", f"{daemon.repository / name}/"]
        # --checksum: rsync's quick check skips a file whose size and mtime (whole seconds) match; the
        # generations are the same size and, with a fast deploy, written within one second: plain -a
        # then copied nothing (generation 2 never arrived, seen once in CI)
        subprocess.run(args, check=True)

    if tool == "rsync" and shutil.which("rsync") is None:
        pytest.fail("rsync is not installed: run .ci/install-test-deps")
    check(daemon, [name], edit, tmp_path)


def test_delete_and_recreate(daemon: DaemonProcess, tmp_path: Path) -> None:
    def edit(gen: int) -> None:
        shutil.rmtree(daemon.repository / "recreated")
        time.sleep(PAUSE)
        write_probe(daemon.repository, "recreated", gen)

    check(daemon, ["recreated"], edit, tmp_path)


def test_two_models_at_once(daemon: DaemonProcess, tmp_path: Path) -> None:
    def edit(gen: int) -> None:
        for path_name in ("config.pbtxt", "1/model.py"):
            for name in ("pair_a", "pair_b"):
                text = CONFIG.format(name=name, gen=gen) if path_name == "config.pbtxt" else CODE.format(gen=gen)
                write_in_chunks(daemon.repository / name / path_name, text, 2)

    check(daemon, ["pair_a", "pair_b"], edit, tmp_path)


@pytest.mark.parametrize("config_first", [True, False], ids=["config-then-code", "code-then-config"])
def test_config_and_code_in_either_order(daemon: DaemonProcess, tmp_path: Path, config_first: bool) -> None:
    name = "order_cfg" if config_first else "order_code"

    def edit(gen: int) -> None:
        steps = [lambda: (daemon.repository / name / "config.pbtxt").write_text(CONFIG.format(name=name, gen=gen)),
                 lambda: (daemon.repository / name / "1" / "model.py").write_text(CODE.format(gen=gen))]
        for step in steps if config_first else steps[::-1]:
            step()
            time.sleep(PAUSE)

    check(daemon, [name], edit, tmp_path)
