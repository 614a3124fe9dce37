"""What a tritonserver that completes python models' configs costs each load: with and without
`--disable-auto-complete-config` (tritonctl's `triton_auto_complete`, issue 57).

Triton takes auto-complete for the whole server; with it on, the python backend starts a stub to run each
model's `auto_complete_config` and sleeps 1 s afterwards, whatever the config holds. Two real
tritonservers (the wheel's 2.51), off and on, in alternating rounds:

- one explicit load each of fresh trivial python models (a new directory per load, then unloaded): a
  complete config.pbtxt, the same with an `auto_complete_config` method, and (on only) no config.pbtxt
  and a partial one (`backend: "python"`) whose method declares the tensors;
- a start-up that loads `--models` such models in Triton's own start-up (`--load-model`, 4 load threads):
  the seconds until it is live.

    python bench/autocomplete_load.py                   # 8 loads a kind, 40 models at start-up, 2 rounds
    python bench/autocomplete_load.py --quick           # 3 loads, 8 models, 1 round
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as c  # noqa: E402
import tritonclient.grpc as grpcclient  # noqa: E402

from controlplane.triton.launcher import TritonServer  # noqa: E402

NAME = "autocomplete_load"
EXECUTE = '''import triton_python_backend_utils as pb_utils


class TritonPythonModel:
{method}
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", pb_utils.get_input_tensor_by_name(r, "x")
                                                                 .as_numpy())]) for r in requests]
'''
METHOD = '''    @staticmethod
    def auto_complete_config(config):
        config.add_input({"name": "x", "data_type": "TYPE_FP32", "dims": [3]})
        config.add_output({"name": "y", "data_type": "TYPE_FP32", "dims": [3]})
        config.set_max_batch_size(8)
        return config
'''
COMPLETE = ('backend: "python"\nmax_batch_size: 8\ninput [ { name: "x" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
            'output [ { name: "y" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
            'instance_group [ { kind: KIND_CPU count: 1 } ]\n')
# (kind, config.pbtxt or None, with the method, loads with auto-complete off too)
KINDS = (("complete config", COMPLETE, False, True), ("complete config + method", COMPLETE, True, True),
         ("no config.pbtxt, method", None, True, False), ("partial config, method", 'backend: "python"\n', True, False))


def _write(repo: Path, name: str, config: str | None, method: bool) -> None:
    model = repo / name
    shutil.rmtree(model, ignore_errors=True)
    (model / "1").mkdir(parents=True)
    if config is not None:
        (model / "config.pbtxt").write_text(config)
    (model / "1" / "model.py").write_text(EXECUTE.format(method=METHOD if method else ""))


def _loads(base: Path, completes: bool, loads: int, rnd: int) -> dict[str, list[float]]:
    repo = base / f"loads-{completes}-{rnd}"
    server = TritonServer(model_repository=repo, workdir=base / f"work-{completes}-{rnd}",
                          disable_auto_complete=not completes)
    server.start()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    out: dict[str, list[float]] = {}
    try:
        for kind, config, method, both in KINDS:
            if not (both or completes):
                continue
            for i in range(loads):
                name = f"m{len(out)}_{i}"
                _write(repo, name, config, method)
                started = time.monotonic()
                client.load_model(name, client_timeout=120)
                out.setdefault(kind, []).append(time.monotonic() - started)
                client.unload_model(name, client_timeout=30)
    finally:
        client.close()
        server.stop()
    return out


def _startup(base: Path, completes: bool, models: int, rnd: int) -> float:
    repo = base / f"start-{completes}-{rnd}"
    for i in range(models):
        _write(repo, f"m{i}", COMPLETE, False)
    server = TritonServer(model_repository=repo, workdir=base / f"swork-{completes}-{rnd}",
                          disable_auto_complete=not completes, extra_args=["--model-load-thread-count=4"])
    started = time.monotonic()
    server.start(live_timeout_s=600, load=[f"m{i}" for i in range(models)])
    live = time.monotonic() - started
    server.stop()
    return live


def run(args: Any, console: Any) -> dict[str, Any]:
    report = c.base_report(NAME, args.argv, args.quick, c.machine_info())
    loads: dict[str, dict[str, list[float]]] = {"off": {}, "on": {}}
    starts: dict[str, list[float]] = {"off": [], "on": []}
    with tempfile.TemporaryDirectory(prefix="tritonctl-autocomplete-") as tmp:
        for rnd in range(args.rounds):
            for mode in ("off", "on"):
                for kind, values in _loads(Path(tmp), mode == "on", args.loads, rnd).items():
                    loads[mode].setdefault(kind, []).extend(values)
                starts[mode].append(_startup(Path(tmp), mode == "on", args.models, rnd))
    rows = []
    for mode in ("off", "on"):
        for kind, values in loads[mode].items():
            rows.append(c.Row(f"one python load: {kind}", f"auto-complete {mode}", c.fmt_s(c.median(values)),
                              note=f"median of {len(values)}; {min(values):.2f}-{max(values):.2f} s",
                              value=round(c.median(values), 3)))
    for mode in ("off", "on"):
        rows.append(c.Row(f"start-up loading {args.models} python models (4 load threads)", f"auto-complete {mode}",
                          c.fmt_s(c.median(starts[mode])), note="live after: " + ", ".join(f"{s:.1f} s"
                                                                                        for s in starts[mode]),
                          value=round(c.median(starts[mode]), 2)))
    report.update(loads=loads, startups=starts, models=args.models, rows=[r.to_json() for r in rows])
    return report


def render(report: dict[str, Any], console: Any) -> None:
    c.render_report("python model loads with and without auto-complete (tritonserver 2.51)", report, console)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="3 loads a kind, 8 models at start-up, 1 round")
    parser.add_argument("--loads", type=int, default=8)
    parser.add_argument("--models", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=2)

    def prepare(args: Any) -> None:
        if args.quick:
            args.loads, args.models, args.rounds = 3, 8, 1

    return c.bench_main(NAME, parser, argv, run, prepare=prepare, render=render, check=False,
                        exit_code=lambda args, report: 0)


if __name__ == "__main__":
    sys.exit(main())
