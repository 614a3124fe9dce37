"""Corpus cases that git cannot hold, written at test time into a temporary directory.

Empty directories, symlinks (dangling, looping, escaping the model), FIFOs, sockets, an 8 GiB sparse
file and model names that are not UTF-8, contain spaces or unicode, or start with a dash. Each
generator takes a fresh base directory, writes `<base>/<case>/<model>` (plus whatever must lie
outside the model) and returns the model directory. tests/corpus/cases.json lists them with
`"generated": true`; `GENERATORS` maps each case name to its function.
"""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path

MODEL_PY = '''import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            y = x.sum(axis=-1, keepdims=True).astype(np.float32)
            responses.append(pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("y", y)]))
        return responses
'''


def config_text(name: str | None = "linear", extra: str = "") -> str:
    """A valid python-backend config.pbtxt (y = sum of x), with `extra` appended."""
    head = f'name: "{name}"\n' if name is not None else ""
    return (
        head
        + 'backend: "python"\nmax_batch_size: 4\n'
        + 'input [ { name: "x" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
        + 'output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        + 'instance_group [ { kind: KIND_CPU } ]\n'
        + extra
    )


def write_model(model_dir: Path, versions: tuple[int, ...] = (1,), extra: str = "",
                name: str | None = None) -> Path:
    """A valid model directory: config.pbtxt and `<v>/model.py` for each version. The config's name
    is `name`, or the directory's name; "" leaves it out (Triton fills it in)."""
    model_dir.mkdir(parents=True, exist_ok=True)
    config_name = model_dir.name if name is None else (name or None)
    (model_dir / "config.pbtxt").write_text(config_text(config_name, extra))
    for version in versions:
        (model_dir / str(version)).mkdir(exist_ok=True)
        (model_dir / str(version) / "model.py").write_text(MODEL_PY)
    return model_dir


def _case(base: Path, case: str, model: str = "linear") -> Path:
    return base / case / model


def gen_empty_model_dir(base: Path) -> Path:
    model = _case(base, "gen_empty_model_dir")
    model.mkdir(parents=True)
    return model


def gen_empty_version_dir(base: Path) -> Path:
    model = _case(base, "gen_empty_version_dir")
    model.mkdir(parents=True)
    (model / "config.pbtxt").write_text(config_text())
    (model / "1").mkdir()
    return model


def gen_symlink_config_escapes(base: Path) -> Path:
    model = write_model(_case(base, "gen_symlink_config_escapes"))
    outside = base / "gen_symlink_config_escapes" / "outside.pbtxt"
    outside.write_text(config_text())
    (model / "config.pbtxt").unlink()
    (model / "config.pbtxt").symlink_to(outside)
    return model


def gen_symlink_model_py_escapes(base: Path) -> Path:
    model = write_model(_case(base, "gen_symlink_model_py_escapes"))
    outside = base / "gen_symlink_model_py_escapes" / "shared_model.py"
    outside.write_text(MODEL_PY)
    (model / "1" / "model.py").unlink()
    (model / "1" / "model.py").symlink_to(Path("..") / ".." / "shared_model.py")
    return model


def gen_symlink_version_escapes(base: Path) -> Path:
    model = write_model(_case(base, "gen_symlink_version_escapes"), versions=())
    outside = base / "gen_symlink_version_escapes" / "outside_version"
    outside.mkdir()
    (outside / "model.py").write_text(MODEL_PY)
    (model / "1").symlink_to(Path("..") / "outside_version")
    return model


def gen_symlink_dangling(base: Path) -> Path:
    model = write_model(_case(base, "gen_symlink_dangling"))
    (model / "1" / "weights.bin").symlink_to("weights-that-were-deleted.bin")
    return model


def gen_symlink_loop(base: Path) -> Path:
    model = write_model(_case(base, "gen_symlink_loop"))
    (model / "1" / "a").symlink_to("b")
    (model / "1" / "b").symlink_to("a")
    return model


def gen_fifo_config(base: Path) -> Path:
    model = write_model(_case(base, "gen_fifo_config"))
    (model / "config.pbtxt").unlink()
    os.mkfifo(model / "config.pbtxt")
    return model


def gen_fifo_in_version(base: Path) -> Path:
    model = write_model(_case(base, "gen_fifo_in_version"))
    os.mkfifo(model / "1" / "input.fifo")
    return model


def gen_socket_in_version(base: Path) -> Path:
    model = write_model(_case(base, "gen_socket_in_version"))
    target = model / "1" / "control.sock"
    short = Path(tempfile.mkdtemp(prefix="s")) / "s"  # AF_UNIX paths are limited to ~107 bytes
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(short))
    os.rename(short, target)
    short.parent.rmdir()
    return model


def gen_huge_sparse_config(base: Path) -> Path:
    model = write_model(_case(base, "gen_huge_sparse_config"))
    with open(model / "config.pbtxt", "r+b") as fh:
        fh.truncate(8 << 30)  # 8 GiB, all holes: costs nothing unless someone reads it
    return model


def gen_dangling_model_dir(base: Path) -> Path:
    model = _case(base, "gen_dangling_model_dir")
    model.parent.mkdir(parents=True)
    model.symlink_to("linear-that-was-removed")
    return model


def _named(base: Path, case: str, name: str | bytes) -> Path:
    parent = base / case
    parent.mkdir(parents=True)
    raw = os.path.join(os.fsencode(parent), name if isinstance(name, bytes) else os.fsencode(name))
    model = Path(os.fsdecode(raw))
    return write_model(model, name="")


def gen_non_utf8_model_name(base: Path) -> Path:
    return _named(base, "gen_non_utf8_model_name", b"m\xff")


def gen_unicode_model_name(base: Path) -> Path:
    return _named(base, "gen_unicode_model_name", "\u6a21\u578b")


def gen_space_model_name(base: Path) -> Path:
    return _named(base, "gen_space_model_name", "my model")


def gen_leading_dash_model_name(base: Path) -> Path:
    return _named(base, "gen_leading_dash_model_name", "-linear")


def gen_dotdot_model_name(base: Path) -> Path:
    return _named(base, "gen_dotdot_model_name", "linear..v2")


def gen_newline_version_dir(base: Path) -> Path:
    model = write_model(_case(base, "gen_newline_version_dir"), versions=())
    (model / "1\n").mkdir()
    (model / "1\n" / "model.py").write_text(MODEL_PY)
    return model


GENERATORS: dict[str, Callable[[Path], Path]] = {
    name: fn for name, fn in globals().items() if name.startswith("gen_") and callable(fn)
}
