"""Audit query benchmark: how fast `tritonctl audit` answers on a registry with a long history.

Builds a SQLite registry with the project's own migrations, fills it with N audit events (default
1,000,000) over M models (100) and D days (30) plus a serving log (20,000 changes), then times, with
many repetitions, the questions an operator asks:

  1. one model's events in a time window, newest 100     (`queries.audit`)        target: median <= 20 ms
  2. what each of the 100 models served at a time T      (`queries.serving_at`)   target: median <= 20 ms

each through the sqlite3 reader the CLI uses on a SQLite registry (controlplane/store/sqlite_reader.py)
and through the SQLAlchemy registry the daemon (and PostgreSQL) uses; the query plans of both are
recorded (tests/test_query_plans.py asserts they use their indexes without a temporary b-tree)
  3. the same two through the CLI, in-process (CliRunner): parse, open the registry, query, render JSON

and a few informational variants (a wider window, a filter the indexes do not cover). Prints a table
and writes JSON with medians, p95s, the SQL plans SQLite chose and the machine it ran on.

    python bench/audit_query.py                  # full: 1,000,000 events
    python bench/audit_query.py --quick          # CI smoke: 100,000 events
    python bench/audit_query.py --db /tmp/a.db   # keep the built registry and reuse it next time
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))
if str(ROOT / "bench") not in sys.path:  # bench/common.py
    sys.path.insert(0, str(ROOT / "bench"))

import common  # noqa: E402
import sqlalchemy as sa  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from controlplane.store import migrate, schema, sqlite_reader  # noqa: E402
from controlplane.store.records import AuditQuery, iso  # noqa: E402
from controlplane.store.registry import Registry  # noqa: E402
from controlplane.store.sqlite_reader import SqliteReader  # noqa: E402
from controlplane.views import queries  # noqa: E402

NAME = "audit_query"
BATCH = 20_000

ACTIONS = [("snapshot", 50), ("deploy", 25), ("policy", 5), ("rollback", 3), ("pin", 2), ("unpin", 1),
           ("unload", 2), ("restore", 2), ("remove", 1)]
OUTCOMES = [("ok", 85), ("failed", 5), ("noop", 4), ("rolled_back", 3), ("invalid", 3)]
ACTORS = [("watcher", 60), ("tritonctl", 10), ("alice", 10), ("bob", 8), ("ci-deploy", 12)]
MESSAGES = ["recorded", "deployed in 1.2 s; versions 1, 2 READY", "version 2 UNAVAILABLE: failed to load; restored",
            "policy manual", "pinned", "unloaded", "restored after Triton restart", "invalid: config.pbtxt: dims"]


@dataclass(frozen=True)
class Dataset:
    events: int
    models: int
    days: int
    serving_changes: int
    seed: int


@dataclass
class Measurement:
    name: str
    what: str
    target_ms: float | None  # None: informational, no target
    times_ms: list[float]
    rows: int  # rows returned by the last repetition
    cpu_ms: list[float] = field(default_factory=list)  # this process's CPU time per call (load-independent)

    @property
    def median_ms(self) -> float:
        return statistics.median(self.times_ms)

    @property
    def p95_ms(self) -> float:
        ordered = sorted(self.times_ms)
        return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]

    @property
    def met(self) -> bool | None:
        return None if self.target_ms is None else self.median_ms <= self.target_ms

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name, "what": self.what, "target_median_ms": self.target_ms,
            "median_ms": round(self.median_ms, 3), "p95_ms": round(self.p95_ms, 3),
            "min_ms": round(min(self.times_ms), 3), "max_ms": round(max(self.times_ms), 3),
            "repetitions": len(self.times_ms), "rows_returned": self.rows, "met": self.met,
            "cpu_median_ms": round(statistics.median(self.cpu_ms), 3) if self.cpu_ms else None,
        }


# --- building the registry ------------------------------------------------------------------------------


def _weighted(rng: random.Random, table: list[tuple[str, int]], k: int) -> list[str]:
    return rng.choices([v for v, _ in table], weights=[w for _, w in table], k=k)


def model_names(count: int) -> list[str]:
    return [f"model_{i:03d}" for i in range(count)]


def build(registry: Registry, data: Dataset, end: datetime, log: Callable[[str], None]) -> float:
    """Fill a migrated, empty registry; return seconds taken. Events are appended in time order, as the
    daemon appends them (ids grow with time)."""
    started = time.perf_counter()
    rng = random.Random(data.seed)
    names = model_names(data.models)
    span_s = data.days * 86400.0
    start = end - timedelta(seconds=span_s)
    digests = {name: [f"{rng.getrandbits(256):064x}" for _ in range(8)] for name in names}
    tables = schema.Base.metadata.tables
    audit, serving = tables["audit_events"], tables["serving_log"]
    with registry.engine.begin() as conn:
        conn.execute(sa.insert(tables["models"]), [
            {"name": n, "pinned": False, "active_digest": digests[n][0], "state": "serving", "created_at": start,
             "updated_at": end, "active_since": start} for n in names])
        conn.execute(sa.insert(tables["snapshots"]), [
            {"model": n, "digest": d, "manifest": "{}", "versions": "[1]", "served_versions": "[1]", "valid": True,
             "problems": "[]", "total_bytes": 1024, "first_seen": start, "last_seen": end, "quarantined": False,
             "collected": False} for n in names for d in digests[n]])

        offsets = sorted(rng.random() * span_s for _ in range(data.events))
        done = 0
        while done < data.events:
            chunk = offsets[done:done + BATCH]
            k = len(chunk)
            models = rng.choices(names, k=k)
            actions = _weighted(rng, ACTIONS, k)
            outcomes = _weighted(rng, OUTCOMES, k)
            actors = _weighted(rng, ACTORS, k)
            rows = []
            for i, offset in enumerate(chunk):
                system_wide = actions[i] == "remove" and i % 7 == 0  # a few events name no model (gc, reload)
                rows.append({
                    "time": start + timedelta(seconds=offset),
                    "actor": actors[i], "action": "gc" if system_wide else actions[i],
                    "model": None if system_wide else models[i],
                    "digest": None if system_wide else digests[models[i]][i % 8],
                    "outcome": outcomes[i], "duration_ms": (i * 37) % 5000,
                    "message": MESSAGES[i % len(MESSAGES)], "host": "",
                })
            conn.execute(sa.insert(audit), rows)
            done += k
            if done % 200_000 < BATCH:
                log(f"  {done:,} audit events")

        changes = sorted(rng.random() * span_s for _ in range(data.serving_changes))
        served = rng.choices(names, k=len(changes))
        conn.execute(sa.insert(serving), [
            {"time": start + timedelta(seconds=offset), "model": model,
             "digest": None if rng.random() < 0.02 else rng.choice(digests[model]),  # 2%: unloads
             "versions": "[1, 2]", "host": ""} for offset, model in zip(changes, served, strict=True)])
    # No ANALYZE: the daemon never runs it, so the planner works here without statistics, as it does there.
    with registry.engine.connect() as conn:
        conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")  # measure the database, not a long WAL
    return time.perf_counter() - started


def count_rows(registry: Registry, table: str) -> int:
    with registry.engine.connect() as conn:
        return int(conn.exec_driver_sql(f"SELECT count(*) FROM {table}").scalar() or 0)


def time_range(registry: Registry) -> tuple[datetime, datetime]:
    with registry.engine.connect() as conn:
        low, high = conn.execute(sa.select(sa.func.min(schema.AuditEvent.time),
                                           sa.func.max(schema.AuditEvent.time))).one()
    return low, high


# --- measuring -------------------------------------------------------------------------------------------


def measure(name: str, what: str, target_ms: float | None, repetitions: int, warmup: int,
            call: Callable[[int], int]) -> Measurement:
    for i in range(warmup):
        call(-1 - i)
    times: list[float] = []
    cpu: list[float] = []
    rows = 0
    for i in range(repetitions):
        c0 = time.process_time()
        t0 = time.perf_counter()
        rows = call(i)
        times.append((time.perf_counter() - t0) * 1000.0)
        cpu.append((time.process_time() - c0) * 1000.0)
    return Measurement(name, what, target_ms, times, rows, cpu)


def query_plans(registry: Registry, calls: dict[str, Callable[[], object]]) -> dict[str, list[str]]:
    """EXPLAIN QUERY PLAN of the SQL each call actually sends (captured from the engine)."""
    plans: dict[str, list[str]] = {}
    for name, call in calls.items():
        seen: list[tuple[str, Any]] = []

        def capture(conn: Any, cursor: Any, stmt: str, params: Any, context: Any, executemany: bool) -> None:
            if stmt.lstrip().upper().startswith("SELECT"):
                seen.append((stmt, params))  # noqa: B023 - used before the next iteration rebinds it

        sa.event.listen(registry.engine, "before_cursor_execute", capture)
        try:
            call()
        finally:
            sa.event.remove(registry.engine, "before_cursor_execute", capture)
        lines: list[str] = []
        distinct: dict[str, Any] = {}
        for stmt, params in seen:
            distinct.setdefault(stmt, params)
        raw = registry.engine.raw_connection()
        try:
            for stmt, params in distinct.items():
                rows = raw.cursor().execute(f"EXPLAIN QUERY PLAN {stmt}", params).fetchall()
                lines.append(" ".join(stmt.split())[:160] + (" ..." if len(stmt) > 160 else ""))
                lines.extend(f"    {row[-1]}" for row in rows)
        finally:
            raw.close()
        plans[name] = lines
    return plans


def machine_info() -> dict[str, Any]:
    """bench/common.py's machine record (commit, uname, load, Python, tritonserver) plus the databases'."""
    return {**common.machine_info(), "sqlite": sqlite3.sqlite_version, "sqlalchemy": sa.__version__}


def run(args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
    data = Dataset(args.events, args.models, args.days, args.serving_changes, args.seed)
    machine = machine_info()  # before this run adds its own load
    tmp = None
    if args.db:
        db_path = Path(args.db).resolve()
        db_path.parent.mkdir(parents=True, exist_ok=True)
    else:
        tmp = tempfile.TemporaryDirectory(prefix="tritonctl-bench-")
        db_path = Path(tmp.name) / "registry.db"
    url = f"sqlite:///{db_path}"
    try:
        registry = Registry(url)
        before, _ = migrate.upgrade(registry)
        build_s = None
        existing = count_rows(registry, "audit_events")
        if existing == 0:
            log(f"building {data.events:,} audit events, {data.serving_changes:,} serving changes, "
                f"{data.models} models over {data.days} days in {db_path}")
            build_s = build(registry, data, datetime.now(timezone.utc).replace(tzinfo=None), log)
            log(f"built in {build_s:.1f} s")
        elif existing != data.events:
            raise SystemExit(f"{db_path} holds {existing:,} events, not {data.events:,}: remove it or pass --events")
        else:
            log(f"reusing {db_path} ({existing:,} events)")
            migrate.upgrade(registry)  # a newer migration (an index) applies to a kept database too
        low, high = time_range(registry)
        span = (high - low).total_seconds()
        names = model_names(data.models)
        rng = random.Random(data.seed + 1)
        reps = args.repetitions

        def window(hours: float) -> tuple[str, str]:
            start = low + timedelta(seconds=rng.random() * max(0.0, span - hours * 3600))
            return iso(start) or "", iso(start + timedelta(hours=hours)) or ""

        def moment() -> str:
            return iso(low + timedelta(seconds=rng.random() * span)) or ""

        reader = SqliteReader(db_path)

        def audit_window(hours: float, source: Any = registry) -> Callable[[int], int]:
            def call(_: int) -> int:
                since, until = window(hours)
                return len(queries.audit(source, model=rng.choice(names), since=since, until=until, limit=100))
            return call

        def at_all(_: int) -> int:
            return len(queries.serving_at(registry, moment()).models)

        def at_all_reader(_: int) -> int:
            return len(queries.serving_at(reader, moment()).models)

        def rolled_back_7d(_: int) -> int:
            since, until = window(24 * 7)
            return len(queries.audit(registry, outcome="rolled_back", since=since, until=until, limit=100))

        def actor_no_match(_: int) -> int:
            since, until = window(24)
            return len(queries.audit(registry, actor="nobody", since=since, until=until, limit=100))

        results = [
            measure("audit: model + 24 h window (CLI reader)", "queries.audit(model=M, since, until, limit=100), "
                    "sqlite3", 20.0, reps, 5, audit_window(24, reader)),
            measure("audit --at T: every model (CLI reader)", f"queries.serving_at(T), {data.models} models, "
                    "sqlite3", 20.0, max(20, reps // 4), 3, at_all_reader),
            measure("audit: model + 24 h window (registry)", "as above through SQLAlchemy (daemon, PostgreSQL)",
                    20.0, reps, 5, audit_window(24)),
            measure("audit --at T: every model (registry)", "as above through SQLAlchemy (daemon, PostgreSQL)",
                    20.0, max(20, reps // 4), 3, at_all),
            measure("audit: model + 7 d window", "as 1, a week: more matches than the limit", None,
                    reps, 5, audit_window(24 * 7)),
            measure("audit: --outcome rolled_back, 7 d", "no model: the (time) index, then a filter", None,
                    max(20, reps // 4), 3, rolled_back_7d),
            measure("audit: --actor (no match), 24 h", "worst case: every event of the day is read", None,
                    max(20, reps // 4), 3, actor_no_match),
        ]

        from click.testing import CliRunner

        from cli.main import cli

        runner = CliRunner()

        def cli_call(argv: Callable[[], list[str]]) -> Callable[[int], int]:
            def call(_: int) -> int:
                result = runner.invoke(cli, [*argv(), "--json", "--db-url", url, "--state-dir", str(db_path.parent)])
                if result.exit_code != 0:
                    raise RuntimeError(f"CLI failed ({result.exit_code}): {result.output}")
                data = json.loads(result.output)
                return len(data["models"] if isinstance(data, dict) else data)
            return call

        def cli_audit() -> list[str]:
            since, until = window(24)
            return ["audit", "--model", rng.choice(names), "--since", since, "--until", until, "--limit", "100"]

        cli_reps = max(10, reps // 5)
        results += [
            measure("CLI: tritonctl audit --model --since --until", "in-process CliRunner, --json", None,
                    cli_reps, 3, cli_call(cli_audit)),
            measure("CLI: tritonctl audit --at T", "in-process CliRunner, --json", None,
                    cli_reps, 3, cli_call(lambda: ["audit", "--at", moment()])),
        ]

        def process_call(_: int) -> int:
            command = [sys.executable, "-m", "cli.main", *cli_audit(), "--json", "--db-url", url,
                       "--state-dir", str(db_path.parent)]
            proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)})
            if proc.returncode != 0:
                raise RuntimeError(f"CLI failed ({proc.returncode}): {proc.stderr}")
            return len(json.loads(proc.stdout))

        results.append(measure("CLI process: tritonctl audit --model ...", "a new Python process: start-up, "
                               "imports, query, JSON", None, 2 if args.quick else 10, 0 if args.quick else 1,
                               process_call))
        results[-1].cpu_ms = []  # a child process's CPU is not this process's: bench/cli_latency.py has it

        since, until = window(24)
        plans = query_plans(registry, {
            "audit: model + window": lambda: queries.audit(registry, model=names[0], since=since, until=until),
            "audit --at T (one model's seek)": lambda: queries.serving_at(registry, until, [names[0]]),
            "audit --at T (model list)": lambda: registry.serving_at(high),
            "audit: --outcome, no model": lambda: queries.audit(registry, outcome="rolled_back", since=since),
        })
        for name, (sql, params) in {
            "CLI reader: audit model + window": sqlite_reader.audit_statement(
                AuditQuery(model=names[0], since=queries.parse_time(since), until=queries.parse_time(until))),
            "CLI reader: audit --at T": sqlite_reader.serving_at_statement(high, None),
        }.items():
            rows = reader._conn.execute(f"EXPLAIN QUERY PLAN {sql}", params).fetchall()
            plans[name] = [" ".join(sql.split())[:160]] + [f"    {row[-1]}" for row in rows]
        reader.close()
        db_bytes = sum(p.stat().st_size for p in (db_path, db_path.with_name(db_path.name + "-wal")) if p.exists())
        registry.close()
    finally:
        if tmp is not None:
            tmp.cleanup()
    return {
        "benchmark": "audit_query",
        "command": " ".join(["python bench/audit_query.py", *args.argv]),
        "when": iso(datetime.now(timezone.utc).replace(tzinfo=None)),
        "machine": machine,
        "dataset": {**asdict(data), "db_bytes": db_bytes, "build_s": None if build_s is None else round(build_s, 1),
                    "schema_revision": migrate.head_revision(), "migrated_from": before},
        "results": [m.to_json() for m in results],
        "query_plans": plans,
    }


def render(report: dict[str, Any], console: Console) -> None:
    d = report["dataset"]
    m = report["machine"]
    table = Table(title=f"audit queries: {d['events']:,} events, {d['models']} models, {d['days']} days, "
                        f"{d['serving_changes']:,} serving changes", title_justify="left")
    for column in ("Measurement", "Target (median)", "Median", "p95", "CPU median", "n", "Result"):
        table.add_column(column, justify="right" if column in ("Median", "p95", "CPU median", "n") else "left")
    for r in report["results"]:
        target = "-" if r["target_median_ms"] is None else f"<= {r['target_median_ms']:g} ms"
        verdict = {True: "[green]met[/green]", False: "[bold red]MISSED[/bold red]", None: "info"}[r["met"]]
        cpu = "-" if r.get("cpu_median_ms") is None else f"{r['cpu_median_ms']:.2f} ms"
        table.add_row(r["name"], target, f"{r['median_ms']:.2f} ms", f"{r['p95_ms']:.2f} ms", cpu,
                      str(r["repetitions"]), verdict)
    console.print(table)
    console.print(f"{m['cpu_model']}, {m['nproc']} CPUs available; Python {m['python']}, SQLite {m['sqlite']}, "
                  f"SQLAlchemy {m['sqlalchemy']}; load average {m['load_average_1m']}; "
                  f"registry {d['db_bytes'] / 1e6:.1f} MB")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="CI smoke: 100,000 events, fewer repetitions")
    parser.add_argument("--events", type=int, help="audit events (default 1,000,000; 100,000 with --quick)")
    parser.add_argument("--models", type=int, default=100)
    parser.add_argument("--days", type=int, default=30)
    parser.add_argument("--serving-changes", type=int, help="serving log rows (default 20,000; 2,000 with --quick)")
    parser.add_argument("--repetitions", type=int, help="timed runs of each main query (default 200; 40 quick)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--db", help="build the registry here and keep it (reused when it exists)")

    def prepare(args: argparse.Namespace) -> None:
        args.events = args.events or (100_000 if args.quick else 1_000_000)
        args.serving_changes = args.serving_changes or (2_000 if args.quick else 20_000)
        args.repetitions = args.repetitions or (40 if args.quick else 200)

    def missed(args: argparse.Namespace, report: dict[str, Any]) -> int:
        return 1 if args.check and any(r["met"] is False for r in report["results"]) else 0

    # common is imported before the timings either way: run()'s first step is machine_info()
    return common.bench_main(NAME, parser, argv, lambda args, console: run(args, lambda text: console.print(
        text, style="dim")), prepare=prepare, render=render, exit_code=missed)


if __name__ == "__main__":
    sys.exit(main())
