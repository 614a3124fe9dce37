"""The start-up scan's capture workers (controlplane/startup/cores.py, issue 39): a model captured and
validated in a worker process is recorded exactly as the daemon's own capture and validation record
it, a bad config included (the same one-line problem naming its file and field); and config.pbtxt
parsed once (controlplane/validation/modelconfig.py) gives what the text parse gives, on the
validation corpus and on the texts where proto2 and proto3 parse differently."""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import pytest
from google.protobuf import json_format

from controlplane.errors import ModelConfigError
from controlplane.intake import recording as intake
from controlplane.snapshot import ContentStore
from controlplane.source.local import LocalCapture
from controlplane.startup.cores import POOL_FROM, Cores, cpu_count
from controlplane.store.registry import Registry
from controlplane.validation.modelconfig import _parse, parse_config_text, validate_model_dir
from tests.harness import DaemonProcess
from tests.unit.test_startup_loads import ENSEMBLE  # an ensemble over `base`

CORPUS = Path(__file__).parent / "corpus"

PYTHON = """name: "base"
backend: "python"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "gen" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""


def _write(model: Path, config: str, version: str | None = "1", files: dict[str, str] | None = None) -> None:
    model.mkdir(parents=True)
    (model / "config.pbtxt").write_text(config)
    if version is not None:
        (model / version).mkdir()
    for rel, text in (files or {}).items():
        (model / rel).write_text(text)


def _mixed_repository(repo: Path) -> list[str]:
    _write(repo / "base", PYTHON, files={"1/model.py": "class TritonPythonModel:\n    pass\n"})
    _write(repo / "ens", ENSEMBLE.format(name="ens"))
    _write(repo / "unparsable", 'name: "unparsable"\nbackend: "python"\nmax_batch_size: "eight"\n',
           files={"1/model.py": ""})
    _write(repo / "badfield", PYTHON.replace('"base"', '"badfield"').replace("max_batch_size: 8", "max_batch_size: -3"),
           files={"1/model.py": ""})
    _write(repo / "noversion", ENSEMBLE.format(name="noversion"), version=None)
    _write(repo / "nomodelpy", PYTHON.replace('"base"', '"nomodelpy"'))
    _write(repo / "twin", ENSEMBLE.format(name="ens"))  # the same content as ens: one tree, built once
    old = time.time() - 5  # older than the racy-signature window: a trusted signature
    for root, dirs, files in os.walk(repo):
        for name in [*dirs, *files]:
            os.utime(os.path.join(root, name), (old, old))
    return sorted(os.listdir(repo))


def _recorded(registry: Registry, captured: tuple, result: object) -> tuple:
    (snapshot, signature, trusted), content = captured, intake.validated(registry, captured[0], result)
    return snapshot.digest, snapshot.entries, signature, trusted, content


def test_a_worker_records_what_the_daemon_records_bad_configs_included(tmp_path: Path, registry: Registry) -> None:
    repo = tmp_path / "repo"
    names = _mixed_repository(repo)
    jobs = [LocalCapture(repo, name, None, 0.0, None, (str(repo),)) for name in names]
    here = ContentStore(tmp_path / "here")
    inline = {}
    for job in jobs:
        captured = job.run(here)
        inline[job.model] = _recorded(registry, captured,
                                      validate_model_dir(here.tree_path(captured.snapshot.digest), name=job.model))
    store = ContentStore(tmp_path / "workers")
    with Cores(store, len(jobs), workers=2, pool_from=1) as cores:
        assert cores.active
        done = dict(zip(names, cores.capture_many(jobs) or [], strict=True))
    assert all(d is not None for d in done.values())
    workers = {name: _recorded(registry, d[0], d[1]) for name, d in done.items() if d is not None}
    assert workers == inline
    bad = [p for p in workers["unparsable"][4].problems if p["severity"] == "error"]
    assert bad == [{"file": "unparsable/config.pbtxt", "field": "3:17",
                    "message": 'Couldn\'t parse integer: "eight"', "severity": "error"}]
    assert not workers["badfield"][4].valid
    assert any(p["file"] == "badfield/config.pbtxt" and p["field"] == "max_batch_size"
               for p in workers["badfield"][4].problems)
    assert workers["base"][4].valid and workers["ens"][4].valid
    assert store.files_read == len([e for e in inline.values() for x in e[1] if x.kind == "file"])  # remembered
    again = ContentStore(tmp_path / "workers")  # the worker's stat cache entries reached the daemon's journal
    files_read = again.files_read
    again.capture(repo / "base", "base")
    assert again.files_read == files_read  # nothing read again


def test_a_capture_that_fails_in_a_worker_is_left_to_the_model_s_own_path(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    _write(repo / "held", PYTHON, files={"1/model.py": "", ".tritonctl-hold": ""})
    _write(repo / "base", PYTHON, files={"1/model.py": ""})
    jobs = [LocalCapture(repo, name, None, 0.0, None, (str(repo),)) for name in ("held", "base")]
    with Cores(ContentStore(tmp_path / "store"), 2, workers=2, pool_from=1) as cores:
        held, base = cores.capture_many(jobs) or [None, None]
    assert held is None  # on hold: the per-model path captures it again and says so
    assert base is not None and base[0].snapshot.model == "base"
    few = Cores(ContentStore(tmp_path / "store"), 10, workers=2, pool_from=200)
    assert not few.active  # a small wave captures in the daemon: no worker started
    assert few.capture_many(jobs) is None


def test_when_the_workers_die_the_daemon_captures(tmp_path: Path) -> None:
    """A worker killed (the OOM killer, an operator's kill): the wave goes on in the daemon."""
    repo = tmp_path / "repo"
    _write(repo / "base", PYTHON, files={"1/model.py": ""})
    job = LocalCapture(repo, "base", None, 0.0, None, (str(repo),))
    with Cores(ContentStore(tmp_path / "store"), 1, workers=2, pool_from=1) as cores:
        assert cores.capture_many([job]) is not None
        for pid in list(cores._started._processes if cores._started else []):  # noqa: SLF001 - the workers' pids
            os.kill(pid, signal.SIGKILL)
        assert cores.capture_many([job]) is None  # the caller captures in the daemon
        assert not cores.active


def _configs() -> list[str]:
    texts = []
    for path in sorted(CORPUS.rglob("config.pbtxt")):
        try:
            texts.append(path.read_bytes().decode())
        except (UnicodeDecodeError, IsADirectoryError):
            continue  # refused before any parse
    return [*texts,
            'name: "m" max_batch_size: 0 max_batch_size: 8',  # proto3 takes the second; proto2 refuses
            'name: "m" input [ { name: "x" data_type: 99 dims: [ 1 ] } ]',  # an enum number proto2 refuses
            'name: "m" input [ { name: "x" data_type: 11 dims: [ 1 ] } ] dynamic_batching { }',
            'name: "m" max_batch_size: 4 max_batch_size: 8', 'name: "m" nonsense: 1', ""]


def test_one_parse_gives_what_the_text_parse_gives(tmp_path: Path) -> None:
    texts = _configs()
    assert len(texts) > 80
    for i, text in enumerate(texts):
        model = tmp_path / str(i) / "m"
        _write(model, text)
        result = validate_model_dir(model, name="m")
        try:
            expected = json_format.MessageToDict(_parse(text), preserving_proto_field_name=True)
        except Exception:  # noqa: BLE001 - the text parse refuses it: so does the validation, in its words
            with pytest.raises(ModelConfigError) as refused:
                parse_config_text(text, "m/config.pbtxt")
            where, _, reason = str(refused.value).removeprefix("m/config.pbtxt:").partition(": ")
            assert result.config is None, text
            assert any(p.file == "m/config.pbtxt" and p.field == where and p.message == reason
                       for p in result.problems), (text, result.problems)
            continue
        assert result.config == expected, text


@pytest.mark.triton
@pytest.mark.skipif(cpu_count() < 2, reason="capture workers start only where there is more than one core")
def test_a_first_start_records_through_the_workers_what_the_daemon_records(tmp_path: Path) -> None:
    """A real first start (policy manual) of a wave over POOL_FROM models: captured in worker
    processes (its log says so), and every snapshot the registry holds, the bad ones included, is the
    one the daemon's own capture path (`intake.validate` of the stored tree) makes of it."""
    repo = tmp_path / "repo"
    names = _mixed_repository(repo)
    for i in range(POOL_FROM):
        _write(repo / f"m{i:04d}", ENSEMBLE.format(name=f"m{i:04d}"))
    old = time.time() - 5
    for entry in repo.iterdir():
        os.utime(entry, (old, old))
    daemon = DaemonProcess(repo, tmp_path / "state", extra_args=["--policy", "manual"]).start()
    try:
        # the ensembles' wave (the step models' wave is too small for workers)
        assert re.search(rf"capturing {POOL_FROM + 3} models in \d+ worker processes", daemon.log_tail(1 << 24)), (
            daemon.log_tail())
    finally:
        assert daemon.stop() == 0, daemon.log_tail()
    registry = Registry(f"sqlite:///{tmp_path / 'state' / 'registry.db'}")
    store = ContentStore(tmp_path / "state" / "store")
    try:
        for name in [*names, "m0000", f"m{POOL_FROM - 1:04d}"]:
            [snap] = registry.list_snapshots(name)
            here = intake.validate(registry, store, store.load(name, snap.digest))
            assert (snap.config, snap.versions, snap.served_versions, snap.valid, snap.problems) == (
                here.config, here.versions, here.served_versions, here.valid, here.problems), name
        [bad] = registry.list_snapshots("unparsable")
        assert bad.first_error == "unparsable/config.pbtxt: 3:17: Couldn't parse integer: \"eight\""
    finally:
        registry.close()
