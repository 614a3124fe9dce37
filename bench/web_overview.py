"""The web view's overview at 10,000 models (issue 28, item 6): the first page within 1 s.

A real `tritonctl daemon --launch-triton --policy manual --web-address 127.0.0.1:0` over the scale
benchmark's repository (bench/scale.py: one python model `base` and N-1 tiny ensembles over it). Its
registry is filled beforehand by direct inserts, as a first start would have recorded it: every model
with its content (a snapshot row), the stat signature the start-up scan compares (so the daemon's start
reads no file of an unchanged model: controlplane/startup/scan.py) and one audit record. A share of the
models is given a different story so that every sync value shows: about 2 % invalid content, 1 %
unloaded by an operator (held), 1 % removed from the source, 1 % tagged. Nothing is loaded into Triton
(policy manual): the first start's 10,000 captures and loads are what bench/scale.py measures; here the
subject is the page.

Then, over HTTP on the view's listener (a new connection each request, as a browser tab opening a
link): GET /ui/ (the overview's first page), a name search (`?q=`), a filter by sync with a later
page, the live part (`?fragment=1`, what an open page fetches on each event) and `/ui/stamp` (what an
open page asks every 5 s); beside them `status --json` through the API socket (the CLI's own
request, in-process). Medians and p95 of R rounds, taken in turns so load hits every request alike.
Target: GET /ui/ median <= 1 s at 10,000 models.

    python bench/web_overview.py                 # 10,000 models, 15 rounds
    python bench/web_overview.py --quick         # 1,000 models, 5 rounds
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import re
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as c  # noqa: E402
import scale  # noqa: E402

NAME = "web_overview"
TARGET_S = 1.0
GATE_MODELS = 10_000


def fill_registry(state: Path, repo: Path, count: int) -> dict[str, int]:
    """The registry a first start over `repo` would leave (see the module docstring); how many of each kind."""
    from sqlalchemy import insert

    from controlplane.source.poller import recordable_signature
    from controlplane.store import migrate, schema
    from controlplane.store.registry import Registry

    state.mkdir(parents=True, exist_ok=True)
    registry = Registry(f"sqlite:///{state / 'registry.db'}")
    migrate.upgrade(registry)
    now = datetime.now(timezone.utc).replace(tzinfo=None)
    names = sorted(p.name for p in repo.iterdir() if p.is_dir())
    models, snapshots, signatures, audit, tags = [], [], [], [], []
    kinds = {"recorded": 0, "invalid": 0, "unloaded": 0, "removed": 0, "tagged": 0}
    for i, name in enumerate(names + [f"gone{j:05d}" for j in range(count // 100)]):
        digest = hashlib.sha256(name.encode()).hexdigest()
        seen = now - timedelta(minutes=len(names) - i)
        removed = name.startswith("gone")
        unloaded = not removed and i % 100 == 7
        invalid = not removed and i % 50 == 3
        models.append({"name": name, "policy": None, "pinned": False, "active_digest": None,
                       "state": "unloaded" if unloaded else "new", "last_error": None, "created_at": seen,
                       "updated_at": seen, "active_since": None, "removed_at": now if removed else None})
        problems = [{"severity": "error", "path": "config.pbtxt", "message": "input 'x': dims must be positive"}]
        snapshots.append({"model": name, "digest": digest, "manifest": "[]", "config": None, "versions": "[1]",
                          "served_versions": "[1]", "valid": not invalid, "problems": json.dumps(problems if invalid
                                                                                                  else []),
                          "total_bytes": 420, "first_seen": seen, "last_seen": seen, "quarantined": False,
                          "quarantine_reason": None, "collected": False})
        if not removed:
            signature, trusted = recordable_signature(repo, name)
            signatures.append({"model": name, "signature": signature, "digest": digest,
                               "steps": None if name == "base" else json.dumps(["base"]), "trusted": trusted,
                               "recorded_at": seen})
        audit.append({"time": seen, "actor": "tritonctl", "action": "record", "model": name, "digest": digest,
                      "outcome": "invalid" if invalid else "ok", "duration_ms": 12, "host": "",
                      "message": "recorded the source's content (policy manual)"})
        if i % 100 == 11:
            tags.append({"model": name, "name": "prod", "digest": digest, "moved_by": "alice", "moved_at": seen})
        key = "removed" if removed else "unloaded" if unloaded else "invalid" if invalid else "recorded"
        kinds[key] += 1
    kinds["tagged"] = len(tags)
    with registry.engine.begin() as conn:
        for table, rows in ((schema.Model, models), (schema.Snapshot, snapshots),
                            (schema.SourceSignature, signatures), (schema.AuditEvent, audit), (schema.Tag, tags)):
            for start in range(0, len(rows), 2000):
                conn.execute(insert(table), rows[start:start + 2000])
    registry.close()
    return kinds


def http_get(port: int, path: str) -> tuple[float, int, int]:
    """(seconds to the last byte, status, body bytes) of one GET on a new connection."""
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", path)
        reply = conn.getresponse()
        body = reply.read()
        return time.perf_counter() - started, reply.status, len(body)
    finally:
        conn.close()


def run(args: argparse.Namespace, console: Any) -> dict[str, Any]:
    from controlplane.api.client import ControlClient

    machine = c.machine_info()
    report = c.base_report(NAME, args.argv, args.quick, machine)
    timings: dict[str, list[float]] = {}
    cpu_s: dict[str, list[float]] = {}
    sizes: dict[str, int] = {}
    with c.workspace("web", keep=False) as work:
        repo, state = work / "repo", work / "state"
        t0 = time.monotonic()
        scale.make_repository(repo, args.models)
        time.sleep(1.1)  # signatures of entries older than a second are trusted (controlplane/source/poller.py)
        kinds = fill_registry(state, repo, args.models)
        built_s = time.monotonic() - t0
        console.print(f"[dim]repository and registry of {args.models} models built in {built_s:.1f} s: {kinds}[/dim]")
        daemon = c.daemon_process(repo, state, 0.2, policy="manual", extra=["--web-address", "127.0.0.1:0"])
        t1 = time.monotonic()
        daemon.start(wait=False)
        try:
            daemon.wait_ready(timeout_s=600)
            ready_s = time.monotonic() - t1
            found = c.wait_until(lambda: re.search(r"web view: http://127\.0\.0\.1:(\d+)/ui/",
                                                    daemon.log_path.read_text()), 30)
            if not found:
                raise SystemExit(f"no `web view:` line: {daemon.log_tail()}")
            port = int(found.group(1))
            client = ControlClient(socket=state / "tritonctl.sock")
            syncs: dict[str, int] = {}
            for row in client.status()["models"]:
                syncs[row["sync"]] = syncs.get(row["sync"], 0) + 1
            console.print(f"[dim]daemon ready in {ready_s:.1f} s; sync of the models: {syncs}[/dim]")
            held = max(1, syncs.get("held", 0) // 200)  # a page in the middle of the filtered list
            requests = {"overview": ("GET /ui/ (first page)", "/ui/"),
                        "search": ("GET /ui/?q=m0999 (name search)", "/ui/?q=m0999"),
                        "filter": (f"GET /ui/?sync=held&page={held} (sync filter)", f"/ui/?sync=held&page={held}"),
                        "fragment": ("GET /ui/?fragment=1 (live part)", "/ui/?fragment=1"),
                        "stamp": ("GET /ui/stamp (every 5 s)", "/ui/stamp")}
            labels = {key: label for key, (label, _) in requests.items()}
            labels["status_json"] = "status --json (API socket, every model)"
            pid = daemon.proc.pid
            for key, (_, path) in requests.items():  # warm-up, and each page answers 200
                _, code, size = http_get(port, path)
                if code != 200:
                    raise SystemExit(f"{path} answered {code}")
                sizes[key] = size
            for _ in range(args.rounds):
                for key, (_, path) in requests.items():
                    cpu = c.cpu_seconds(pid)
                    timings.setdefault(key, []).append(http_get(port, path)[0])
                    cpu_s.setdefault(key, []).append(c.cpu_seconds(pid) - cpu)
                cpu, started = c.cpu_seconds(pid), time.perf_counter()
                client.status()
                timings.setdefault("status_json", []).append(time.perf_counter() - started)
                cpu_s.setdefault("status_json", []).append(c.cpu_seconds(pid) - cpu)
            shown = len(re.findall(r'<tr data-model="', _body(port, "/ui/")))
            total = re.search(r"<caption>(\d+) models", _body(port, "/ui/"))
        finally:
            daemon.stop()
    rows = []
    gate = args.models >= GATE_MODELS
    for key, values in timings.items():
        med, p95 = c.median(values), c.pct(values, 95)
        target = f"<= {TARGET_S:g} s" if key == "overview" and gate else "-"
        met = (med <= TARGET_S) if key == "overview" and gate else None
        rows.append(c.Row(f"{labels[key]}, median", "tritonctl", c.fmt_ms(med), target, met,
                          f"p95 {c.fmt_ms(p95)}, daemon CPU {c.fmt_ms(c.median(cpu_s[key]))}"
                          + (f", {sizes[key] // 1024} KiB" if key in sizes else ""), round(med, 4)))
    c.render_rows(f"Web view overview at {args.models} models ({args.rounds} rounds)", rows, console,
                  c.machine_line(report["machine"]))
    report.update({
        "settings": {"models": args.models, "rounds": args.rounds, "target_s": TARGET_S, "policy": "manual"},
        "registry": kinds, "sync": syncs, "build_s": round(built_s, 1), "daemon_ready_s": round(ready_s, 1),
        "rows_on_first_page": shown, "models_in_caption": int(total.group(1)) if total else None,
        "timings_s": {key: {"label": labels[key], "median": round(c.median(v), 4), "p95": round(c.pct(v, 95), 4),
                            "min": round(min(v), 4), "max": round(max(v), 4),
                            "daemon_cpu_median": round(c.median(cpu_s[key]), 4), "bytes": sizes.get(key)}
                      for key, v in timings.items()},
        "rows": [r.to_json() for r in rows],
    })
    return report


def _body(port: int, path: str) -> str:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", path)
        return conn.getresponse().read().decode()
    finally:
        conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", type=int, default=GATE_MODELS)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="1,000 models, 5 rounds")

    def prepare(args: argparse.Namespace) -> None:
        if args.quick:
            args.models, args.rounds = 1000, 5

    return c.bench_main(NAME, parser, argv, run, prepare=prepare, check=False, exit_code=lambda args, report: 0)


if __name__ == "__main__":
    sys.exit(main())
