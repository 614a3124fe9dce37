"""Edit torture: slow, randomized writers against Triton's poll mode and tritonctl, side by side.

Writers edit a few models (default 3) over and over (default 200 edits in all; --quick 20). Each edit
moves a model to the next generation N by rewriting config.pbtxt (`parameters gen=N`, which the
model's initialize() reads from args["model_config"]) and 1/model.py (`GEN = N` as its last line) in a
random order, each file in place or through a temp file renamed over it, in 1-4 chunks with random
pauses SHORTER than tritonctl's settle window (and cut at line ends half the time: fragments that are
valid Python). Every response carries [config gen, code gen]; a probe client per model and system
checks both on every response.

The three systems watch three identical directories and get the identical edit stream at the same
moments (every chunk is written to each, then the pause): the same seed, the same noise.

  * Triton poll mode: `tritonserver --model-control-mode=poll --repository-poll-secs=1` on its dir.
  * tritonctl: `tritonctl daemon --launch-triton --policy auto --settle 1.0` watching another, its clients
    through its gateway (every digest under its own private name, a switch one route update: docs/gateway.md).
  * tritonctl --no-gateway: the same daemon with `--no-gateway` (Triton reloads the model's own name in place).

Both daemons switch at once (canary steps [100], no bake: tests/harness.py SWITCH_AT_ONCE_ENV): the torture
measures the switch itself, not a canary's bake (docs/bake.md).

Reported per system: mixed/partial states served (config gen != code gen in an answer, or an error
that shows half-written code: NameError / "does not implement execute" / a hang), failed requests,
failed loads (Triton's log), edits never served, and edit-to-served time. Targets for tritonctl, with and
without its gateway: 0 mixed or partial states, 0 failed requests.

    python bench/edit_torture.py            # 200 edits over 3 models (about 6 minutes)
    python bench/edit_torture.py --quick    # 20 edits (about 1 minute)
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as c  # noqa: E402

NAME = "edit_torture"
SYSTEMS = ("tritonctl", "tritonctl --no-gateway", "Triton poll")
DAEMONS = {"tritonctl": ("state", []), "tritonctl --no-gateway": ("state-no-gateway", ["--no-gateway"])}
TIMELINE_MODELS = 2  # models whose answers over time the results keep (the timeline plot)


@dataclass
class Edit:
    model: str
    gen: int
    files: tuple[c.FileWrite, c.FileWrite]
    between_s: float  # pause between the two files
    gap_s: float  # pause after the edit, before this model's next one
    closed_at: float = 0.0  # monotonic time of the last close()/rename
    writes: list[float] = field(default_factory=list)  # monotonic time of every chunk written / rename

    def describe(self) -> dict[str, Any]:
        return {"model": self.model, "gen": self.gen, "between_s": round(self.between_s, 3),
                "gap_s": round(self.gap_s, 3),
                "files": [{"file": f.rel, "mode": f.mode, "chunks": len(f.cuts) + 1,
                           "pauses_s": [round(p, 3) for p in f.pauses]} for f in self.files]}


def plan(models: list[str], edits: int, settle_s: float, seed: int) -> dict[str, list[Edit]]:
    """The edit script: deterministic for a seed; round-robin over the models."""
    rng = random.Random(seed)
    longest = 0.8 * settle_s  # every pause shorter than the settle window
    by_model: dict[str, list[Edit]] = {m: [] for m in models}
    for i in range(edits):
        model = models[i % len(models)]
        gen = len(by_model[model]) + 1
        files = c.pair_files(model, gen)
        writes = []
        for rel in rng.sample(sorted(files), 2):  # random order
            data = files[rel].encode()
            cuts = c.random_cuts(rng, data, rng.randint(1, 3))
            writes.append(c.FileWrite(rel, data, rng.choice(("inplace", "rename")), cuts,
                                      tuple(rng.uniform(0.05, longest) for _ in cuts)))
        by_model[model].append(Edit(model, gen, (writes[0], writes[1]), rng.uniform(0.05, longest),
                                    rng.uniform(settle_s + 0.5, settle_s + 2.0)))
    return by_model


def writer(edits: list[Edit], targets: list[Path], failures: list[str]) -> None:
    try:
        for edit in edits:
            c.write_mirrored(targets, edit.files[0], on_write=edit.writes.append)
            time.sleep(edit.between_s)
            edit.closed_at = c.write_mirrored(targets, edit.files[1], on_write=edit.writes.append)
            time.sleep(edit.gap_s)
    except Exception as exc:  # noqa: BLE001 - reported
        failures.append(f"writer {edits[0].model if edits else '?'}: {exc}")


@dataclass
class SystemResult:
    name: str
    requests: int = 0
    ok: int = 0
    mixed: int = 0  # answers with config gen != code gen
    mixed_states: int = 0  # distinct (model, config gen, code gen) mixed states those answers came from
    timeline: dict[str, list[list[Any]]] = field(default_factory=dict)  # model -> [[t, config, code]] changes
    mixed_pairs: list[tuple[str, int, int]] = field(default_factory=list)
    partial_errors: int = 0  # errors showing half-written code
    failed: int = 0
    error_kinds: dict[str, int] = field(default_factory=dict)
    error_examples: list[str] = field(default_factory=list)
    failed_loads: int = 0
    loads_ok: int = 0
    never_served: list[str] = field(default_factory=list)
    served_after_s: list[float] = field(default_factory=list)
    converged: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def mixed_or_partial(self) -> int:
        return self.mixed + self.partial_errors


def analyse(name: str, probes: dict[str, c.Probe], by_model: dict[str, list[Edit]], t0: float) -> SystemResult:
    result = SystemResult(name)
    kinds: Counter[str] = Counter()
    pairs: set[tuple[str, int, int]] = set()
    for i, (model, probe) in enumerate(probes.items()):
        samples = probe.stats.since(t0)
        first_seen: dict[int, float] = {}
        changes: list[list[Any]] = []  # the answer as it changed (errors: None, None), for the timeline plot
        for s in samples:
            state = [None, None] if s.error is not None else [s.config_gen, s.code_gen]
            if not changes or changes[-1][1:] != state:
                changes.append([round(s.t - t0, 3), *state])
            result.requests += 1
            if s.error is not None:
                result.failed += 1
                kind = c.classify_error(s.error)
                kinds[kind] += 1
                if kind == "partial":
                    result.partial_errors += 1
                if len(result.error_examples) < 8 and not any(s.error[:60] in e for e in result.error_examples):
                    result.error_examples.append(f"{model}: {s.error[:200]}")
                continue
            result.ok += 1
            assert s.config_gen is not None and s.code_gen is not None
            if s.config_gen != s.code_gen:
                result.mixed += 1
                pairs.add((model, s.config_gen, s.code_gen))
            else:
                first_seen.setdefault(s.config_gen, s.t)
        for edit in by_model[model]:
            seen = first_seen.get(edit.gen)
            if seen is None:
                result.never_served.append(f"{model}@{edit.gen}")
            elif edit.closed_at:
                result.served_after_s.append(max(0.0, seen - edit.closed_at))
        if i < TIMELINE_MODELS:
            result.timeline[model] = changes
    result.error_kinds = dict(kinds)
    result.mixed_states = len(pairs)
    result.mixed_pairs = sorted(pairs)[:20]
    return result


def _gen_of(text: str, pattern: str) -> int | None:
    import re

    match = re.search(pattern, text)
    return int(match.group(1)) if match else None


def recorded_snapshots(state: Path, models: list[str]) -> dict[str, Any]:
    """Every snapshot tritonctl recorded, read back from its registry and store: does each hold one
    edit whole (config gen == code gen, both files complete)? A mid-edit capture shows here even if it
    never served."""
    from controlplane.snapshot import ContentStore, Snapshot
    from controlplane.store.registry import Registry

    registry = Registry(f"sqlite:///{state / 'registry.db'}")
    store = ContentStore(state / "store")
    total, mixed = 0, []
    try:
        for model in models:
            for record in registry.list_snapshots(model):
                total += 1
                snap = Snapshot.from_manifest_json(model, record.manifest)
                files = {e.path: e.sha256 for e in snap.entries if e.kind == "file"}
                try:
                    config = store.object_path(files["config.pbtxt"]).read_text(errors="replace")
                    code = store.object_path(files["1/model.py"]).read_text(errors="replace")
                except (KeyError, OSError):
                    mixed.append(f"{model} {record.digest[:12]}: a file is missing")
                    continue
                cfg_gen = _gen_of(config, r'string_value: "(\d+)" \}')
                code_gen = _gen_of(code, r"\nGEN = (\d+)\n$")
                if cfg_gen is None or code_gen is None or cfg_gen != code_gen:
                    mixed.append(f"{model} {record.digest[:12]}: config gen {cfg_gen}, code gen {code_gen}, "
                                 f"{'valid' if record.valid else 'invalid'}")
    finally:
        registry.close()
    return {"snapshots_recorded_total": total, "snapshots_mid_edit": len(mixed), "mid_edit_examples": mixed[:20]}


def run(args: argparse.Namespace, console: Any) -> dict[str, Any]:
    machine = c.machine_info()
    models = [f"torture_{i}" for i in range(args.models)]
    by_model = plan(models, args.edits, args.settle, args.seed)
    with c.workspace(NAME, keep=args.keep) as base:
        repos = {"tritonctl": base / "watched-by-tritonctl", "tritonctl --no-gateway": base / "watched-no-gateway",
                 "Triton poll": base / "triton-poll-repo"}
        for repo in repos.values():
            repo.mkdir()
            for m in models:
                c.write_pair_model(repo, m, 0)
        console.print(f"[dim]{args.edits} edits over {len(models)} models; systems start in {base}[/dim]")
        poll = c.triton_server(repos["Triton poll"], base / "poll-work", mode="poll", poll_secs=args.poll_secs)
        daemons = {system: c.daemon_process(repos[system], base / state, args.settle,
                                            extra=["--log-format", "json", *flags])
                   for system, (state, flags) in DAEMONS.items()}
        probes: dict[str, dict[str, c.Probe]] = {}
        ctl_logs: dict[str, str] = {}
        try:
            poll.start(live_timeout_s=120)
            for daemon in daemons.values():
                daemon.start()
            urls = {**{system: c.inference_url(daemon) for system, daemon in daemons.items()},
                    "Triton poll": poll.grpc_url}
            for system, url in urls.items():
                for m in models:
                    if c.serves(url, m, 0, 60) is None:
                        raise SystemExit(f"{system}: {m} generation 0 not served within 60 s")
            for system, url in urls.items():
                probes[system] = {m: c.Probe(url, m, pause_s=args.probe_pause).start() for m in models}
            t0 = time.monotonic()
            failures: list[str] = []
            writers = [threading.Thread(target=writer, args=(by_model[m], [r / m for r in repos.values()], failures),
                                        name=f"writer-{m}") for m in models]
            for w in writers:
                w.start()
            for w in writers:
                w.join()
            write_s = time.monotonic() - t0
            console.print(f"[dim]edits written in {write_s:.0f} s; waiting for both systems to settle[/dim]")
            finals = {m: by_model[m][-1].gen if by_model[m] else 0 for m in models}
            converged = {}
            for system, url in urls.items():
                converged[system] = all(c.serves(url, m, g, args.converge_timeout) is not None
                                        for m, g in finals.items())
            time.sleep(0.5)
        finally:
            for per_model in probes.values():
                for p in per_model.values():
                    p.stop()
            for system, daemon in daemons.items():
                ctl_logs[system] = daemon.log_tail(2_000_000)
                daemon.stop()
            poll.stop()
        results = {system: analyse(system, probes[system], by_model, t0) for system in SYSTEMS}
        for system in SYSTEMS:
            results[system].converged = converged[system]
        logs = {"Triton poll": poll.log_path, **{system: base / state / "triton" / "tritonserver.log"
                                                 for system, (state, _) in DAEMONS.items()}}
        for system, log in logs.items():
            counts = c.triton_load_counts(log)
            results[system].failed_loads = counts["failed"]
            results[system].loads_ok = counts["loaded"]
            results[system].extra["polls_failed_unreadable_config"] = counts["poll_failed"]
        for system, (state, _) in DAEMONS.items():
            audit = c.audit_rows(base / state)
            results[system].extra |= recorded_snapshots(base / state, models)
            deploys = Counter(r["outcome"] for r in audit if r["action"] == "deploy")
            results[system].extra |= {
                "deploys_by_outcome": dict(deploys),
                "snapshots_refused_still_changing": ctl_logs[system].count("retrying after the settle window"),
                "snapshots_recorded": sum(1 for r in audit if r["action"] == "snapshot" and r["outcome"] == "ok"),
                "snapshots_invalid": sum(1 for r in audit if r["action"] == "snapshot" and r["outcome"] == "invalid"),
            }
    modes = Counter(f.mode for es in by_model.values() for e in es for f in e.files)
    # the pauses the writers actually made (a starved machine can stretch a planned pause)
    pauses = [b - a for es in by_model.values() for e in es for a, b in zip(e.writes, e.writes[1:], strict=False)]
    longest = max(pauses, default=0.0)
    report = c.base_report(NAME, args.argv, args.quick, machine)
    report.update({
        "settings": {"edits": args.edits, "models": len(models), "settle_s": args.settle,
                     "poll_secs": args.poll_secs, "seed": args.seed, "probe_pause_s": args.probe_pause,
                     "max_writer_pause_s": round(0.8 * args.settle, 3), "file_writes_by_mode": dict(modes)},
        "write_s": round(write_s, 1),
        "writer_pauses": {"count": len(pauses), "longest_s": round(longest, 3),
                          "at_or_above_settle": sum(1 for p in pauses if p >= args.settle),
                          "p99_s": round(c.pct(pauses, 99), 3) if pauses else None},
        "writer_failures": failures,
        "systems": {s: _result_json(r) for s, r in results.items()},
        "edit_plan_head": [e.describe() for e in by_model[models[0]][:5]],
        "edits_closed": {m: [[round(e.closed_at - t0, 3), e.gen] for e in by_model[m] if e.closed_at]
                         for m in models[:TIMELINE_MODELS]},
    })
    report["rows"] = [r.to_json() for r in rows(report)]
    return report


def _result_json(r: SystemResult) -> dict[str, Any]:
    return {
        "requests": r.requests, "ok": r.ok, "mixed_answers": r.mixed, "mixed_states_distinct": r.mixed_states,
        "partial_code_errors": r.partial_errors, "timeline": r.timeline,
        "mixed_or_partial": r.mixed_or_partial, "mixed_pairs_seen": r.mixed_pairs, "failed_requests": r.failed,
        "errors_by_kind": r.error_kinds, "error_examples": r.error_examples, "failed_loads": r.failed_loads,
        "successful_loads": r.loads_ok, "edits_never_served": len(r.never_served),
        "never_served": r.never_served[:40], "converged": r.converged,
        "edit_to_served_median_s": round(c.median(r.served_after_s), 3) if r.served_after_s else None,
        "edit_to_served_p90_s": round(c.pct(r.served_after_s, 90), 3) if r.served_after_s else None,
        **r.extra,
    }


def rows(report: dict[str, Any]) -> list[c.Row]:
    out: list[c.Row] = []
    edits = report["settings"]["edits"]
    for system in SYSTEMS:
        s = report["systems"][system]
        ctl = system in DAEMONS
        out.append(c.Row("mixed states served (distinct config/code pairs)", system,
                         str(s.get("mixed_states_distinct", "-")), "0" if ctl else "-",
                         (s.get("mixed_states_distinct") == 0) if ctl else None, value=s.get("mixed_states_distinct")))
        out.append(c.Row("mixed/partial answers served", system,
                         f"{s['mixed_or_partial']} ({s['mixed_answers']} mixed answers, "
                         f"{s['partial_code_errors']} partial-code errors)", "0" if ctl else "-",
                         (s["mixed_or_partial"] == 0) if ctl else None, value=s["mixed_or_partial"]))
    for system in DAEMONS:
        ctl_s = report["systems"].get(system, {})
        if "snapshots_mid_edit" in ctl_s:
            out.append(c.Row("snapshots recorded mid-edit (read back from the store)", system,
                             f"{ctl_s['snapshots_mid_edit']} of {ctl_s['snapshots_recorded_total']}", "0",
                             ctl_s["snapshots_mid_edit"] == 0, "; ".join(ctl_s.get("mid_edit_examples", [])[:2]),
                             value=ctl_s["snapshots_mid_edit"]))
    for system in SYSTEMS:
        s = report["systems"][system]
        ctl = system in DAEMONS
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(s["errors_by_kind"].items())) or "none"
        out.append(c.Row("failed requests", system, f"{s['failed_requests']} of {s['requests']}",
                         "0" if ctl else "-", (s["failed_requests"] == 0) if ctl else None, kinds,
                         value=s["failed_requests"]))
    for system in SYSTEMS:
        s = report["systems"][system]
        note = f"{s['successful_loads']} successful loads"
        if system == "Triton poll":
            note += f"; {s.get('polls_failed_unreadable_config', 0)} polls could not read a half-written config"
        if system in DAEMONS:
            d = s.get("deploys_by_outcome", {})
            note += (f"; deploys {', '.join(f'{k} {v}' for k, v in sorted(d.items()))}; "
                    f"{s.get('snapshots_refused_still_changing', 0)} captures refused as still changing")
        out.append(c.Row("failed loads (Triton log)", system, str(s["failed_loads"]), note=note,
                         value=s["failed_loads"]))
    for system in SYSTEMS:
        s = report["systems"][system]
        out.append(c.Row("edits never served", system, f"{s['edits_never_served']} of {edits}",
                         note="" if s["converged"] else "did NOT converge to the final generation",
                         value=s["edits_never_served"]))
    for system in SYSTEMS:
        s = report["systems"][system]
        med, p90 = s["edit_to_served_median_s"], s["edit_to_served_p90_s"]
        out.append(c.Row("last close -> served (median / p90)", system,
                         "-" if med is None else f"{med:.2f} s / {p90:.2f} s", value=med,
                         note="includes the 1 s settle window" if system in DAEMONS else "poll every 1 s"))
    wp = report.get("writer_pauses")
    if wp:
        out.append(c.Row("writer pauses as made (planned < settle)", "writers",
                         f"longest {wp['longest_s']:.2f} s, p99 {wp['p99_s']:.2f} s", value=wp["longest_s"],
                         note=f"{wp['at_or_above_settle']} of {wp['count']} pauses reached the settle window "
                              "(a starved machine stretches sleeps)"))
    return out


def render(report: dict[str, Any], console: Any) -> None:
    s = report["settings"]
    c.render_rows(f"edit torture: {s['edits']} edits over {s['models']} models, writer pauses < "
                  f"{s['max_writer_pause_s']} s, settle {s['settle_s']} s, Triton poll every {s['poll_secs']} s",
                  [c.Row(**{k: v for k, v in r.items()}) for r in report["rows"]], console,
                  c.machine_line(report["machine"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="20 edits (CI smoke)")
    parser.add_argument("--edits", type=int, help="edits in all (default 200; 20 with --quick)")
    parser.add_argument("--models", type=int, default=3)
    parser.add_argument("--settle", type=float, default=1.0, help="tritonctl's settle window (s)")
    parser.add_argument("--poll-secs", type=int, default=1, help="Triton's --repository-poll-secs")
    parser.add_argument("--probe-pause", type=float, default=0.01, help="think time of each probe (s)")
    parser.add_argument("--converge-timeout", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs) under /tmp")

    def prepare(args: argparse.Namespace) -> None:
        args.edits = args.edits or (20 if args.quick else 200)

    return c.bench_main(NAME, parser, argv, run, prepare=prepare, render=render, timed=True)


if __name__ == "__main__":
    sys.exit(main())
