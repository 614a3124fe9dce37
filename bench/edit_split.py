"""Where one edit's time goes while N models serve (issue 26, target (c)): the daemon's part and Triton's.

One python model renamed into a repository of N served models (bench/scale.py's: one python model and
ensembles over it), `--edits` times. Per edit, from the rename to the daemon's `deploy ok`:

  daemon, before the load request  rename -> the daemon's `load start` line (watch, capture, validate,
                                   record, decide, publish)
  Triton, before its load          `load start` -> Triton's `loading: M:1` log line
  Triton's own load                `loading` -> `successfully loaded 'M'` (what bench/scale.py's (c) takes out)
  Triton, after its load           `successfully loaded` -> the daemon's `load ok` line (the request's answer)
  daemon, after the load           `load ok` -> `deploy ok` (verify, smoke, commit)

The daemon's lines are timed as this script sees them appear in its log (polled every 2 ms); Triton's
from the timestamps of its own log. The first run of a size deploys every model (auto policy: minutes
at 5,000) with `--keep-triton`; `--workdir` keeps that state, so a later run restarts on it, adopting
the kept tritonserver, and only edits.

    python bench/edit_split.py --models 5000 --workdir /tmp/split5000
    python bench/edit_split.py --quick                # 50 models, 2 edits
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as c  # noqa: E402
import scale  # noqa: E402

NAME = "edit_split"
PARTS = ("daemon_before_s", "triton_before_load_s", "triton_load_s", "triton_after_load_s", "daemon_after_s")
TRITON_LINE = re.compile(r"^I(\d{2})(\d{2}) (\d{2}):(\d{2}):(\d{2})\.(\d{6})")


def _triton_time(line: str, year: int) -> float | None:
    """Epoch seconds of a Triton log line (`I1202 10:37:19.171623 ...`, UTC on this machine)."""
    m = TRITON_LINE.match(line)
    if m is None:
        return None
    month, day, hour, minute, second, micro = (int(g) for g in m.groups())
    return datetime(year, month, day, hour, minute, second, micro, tzinfo=timezone.utc).timestamp()


def _edit(workdir: Path, log: Path, name: str, timeout_s: float) -> dict[str, float]:
    c.write_pair_model(workdir / "staging", name, 1)
    seen: dict[str, float] = {}
    renamed_at, t0 = time.time(), time.monotonic()
    os.rename(workdir / "staging" / name, workdir / "repo" / name)
    marks = {"load_start": f"{name} load start", "load_ok": f"{name} load ok", "deploy_ok": f"{name} deploy ok"}
    offset = 0
    with open(log, "rb") as handle:
        while "deploy_ok" not in seen:
            if time.monotonic() - t0 > timeout_s:
                raise SystemExit(f"{name}: no deploy ok within {timeout_s:g} s")
            handle.seek(offset)
            chunk = handle.read()
            offset += len(chunk)
            now = time.monotonic() - t0
            text = chunk.decode(errors="replace")
            for key, needle in marks.items():
                if key not in seen and needle in text:
                    seen[key] = now
            time.sleep(0.002)
    triton_log = (workdir / "state" / "triton" / "tritonserver.log").read_text(errors="replace")
    year = datetime.now(timezone.utc).year
    loading = loaded = None
    served = c.served_as(name)
    for line in triton_log.splitlines():
        if re.search(rf'"loading: {served}:', line):
            loading = _triton_time(line, year)
        elif re.search(rf"successfully loaded '{served}'", line):
            loaded = _triton_time(line, year)
    if loading is None or loaded is None:
        raise SystemExit(f"{name}: Triton's log has no load of it")
    loading_s, loaded_s = loading - renamed_at, loaded - renamed_at
    return {"daemon_before_s": round(seen["load_start"], 4),
            "triton_before_load_s": round(loading_s - seen["load_start"], 4),
            "triton_load_s": round(loaded_s - loading_s, 4),
            "triton_after_load_s": round(seen["load_ok"] - loaded_s, 4),
            "daemon_after_s": round(seen["deploy_ok"] - seen["load_ok"], 4),
            "total_s": round(seen["deploy_ok"], 4)}


def run(args: argparse.Namespace, console: Any) -> dict[str, Any]:
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # as an installed tritonctl: bytecode read (bench/scale.py)
    if args.quick:
        args.models, args.edits = 50, 2
    report = c.base_report(NAME, args.argv, args.quick, c.machine_info())
    with c.workspace(NAME) as scratch:
        workdir = Path(args.workdir) if args.workdir else scratch
        fresh = not (workdir / "state").exists()
        if fresh:
            scale.make_repository(workdir / "repo", args.models)
            (workdir / "staging").mkdir(parents=True, exist_ok=True)
            time.sleep(1.5)  # older than the racy-signature window (controlplane/source/poller.py)
        daemon = c.daemon_process(workdir / "repo", workdir / "state", 1.0, policy="auto", extra=["--keep-triton"])
        log = daemon.log_path
        log.unlink(missing_ok=True)  # the harness appends: a READY line of an earlier run must not count
        started = time.monotonic()
        daemon.start(wait=False)
        try:
            while "ready: control socket" not in log.read_text(errors="replace"):
                if daemon.proc.poll() is not None or time.monotonic() - started > args.start_timeout:
                    raise SystemExit(f"daemon not READY: {daemon.log_tail()}")
                time.sleep(0.2)
            report["start"] = {"fresh": fresh, "ready_s": round(time.monotonic() - started, 2)}
            console.print(f"[dim]{args.models} models {'deployed' if fresh else 'adopted'}: READY after "
                          f"{report['start']['ready_s']} s[/dim]")
            time.sleep(args.settle_after)
            edits = []
            for i in range(args.edits):
                name = f"edit{int(time.time() * 1000) % 10**9}x{i}"
                edits.append(_edit(workdir, log, name, args.edit_timeout))
                console.print(f"[dim]{name}: {edits[-1]}[/dim]")
                time.sleep(2.0)
        finally:
            daemon.stop(kill_triton=not args.workdir)  # a kept --workdir keeps its tritonserver for the next run
    report["models"] = args.models
    report["edits"] = edits
    report["medians"] = {part: c.median([e[part] for e in edits]) for part in (*PARTS, "total_s")}
    report["machine"]["load_average_end"] = c.load_average()
    report["rows"] = [r.to_json() for r in rows(report)]
    return report


def rows(report: dict[str, Any]) -> list[c.Row]:
    m, n = report["medians"], report["models"]
    labels = {"daemon_before_s": "daemon, before the load request", "triton_before_load_s": "Triton, before its load",
              "triton_load_s": "Triton's own load", "triton_after_load_s": "Triton, after its load",
              "daemon_after_s": "daemon, after the load", "total_s": "rename -> deploy ok"}
    return [c.Row(f"{n:,} models: one edit, {labels[part]}, median of {len(report['edits'])}",
                  "tritonctl" if part.startswith("daemon") or part == "total_s" else "Triton",
                  f"{1000 * m[part]:.0f} ms", value=m[part]) for part in (*PARTS, "total_s")]


def render(report: dict[str, Any], console: Any) -> None:
    c.render_rows("One edit while N models serve: the daemon's part and Triton's", rows(report), console,
                  c.machine_line(report["machine"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="50 models, 2 edits")
    parser.add_argument("--models", type=int, default=1000)
    parser.add_argument("--edits", type=int, default=5)
    parser.add_argument("--workdir", help="keep (or reuse) the repository and state here")
    parser.add_argument("--start-timeout", type=float, default=1800.0)
    parser.add_argument("--edit-timeout", type=float, default=60.0)
    parser.add_argument("--settle-after", type=float, default=15.0, help="seconds between READY and the first edit")
    return c.bench_main(NAME, parser, argv, run, render=render, check=False, exit_code=lambda *_: 0)


if __name__ == "__main__":
    sys.exit(main())
