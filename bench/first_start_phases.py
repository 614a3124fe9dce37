"""The phases of a first start through Triton's own start-up (issue 39), from the daemon's log, and
optionally the shares of a py-spy profile (`py-spy record -f raw`) of the same kind of start.

    python bench/first_start_phases.py DAEMON.log [PROFILE.txt] --log-tree TREE --out bench/results/X.json
    python bench/first_start_phases.py DAEMON.log --log-commit 1b765bc7b3599b8a135889e965637d59a176fcae

`git_commit` is the commit of the daemon that wrote the log, not of the tree that parses it (issue 57): given as
`--log-commit`, or read from `--log-tree` (the checkout that daemon ran from, `-dirty` when it had changes);
one of them is required. The parsing tree's commit and machine are kept apart, under `parsed_by`.

Phases (seconds, from the log lines the daemon writes): the initial scan's capture, validation and
records; staging every deploy (deployment row, published tree) until the launch; Triton's start-up
loading them (launch to live); ending the deploys (verify, smoke, commit) after it.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as c  # noqa: E402

MARKS = {
    "scan": r"initial scan: (\d+) models",
    "recorded": r"start-up scan: \d+ models recorded in batches",
    "launch": r"launching tritonserver with the",
    "live": r"launched tritonserver pid",
    "ended": r"start-up: \d+ models deployed through tritonserver's start-up",
}
# py-spy frames whose samples each phase counts, and the callees they are split by
# (the first frame of a phase's list found in a stack counts: its pool's threads start from their own frames;
# before the deploys were staged and ended a wave at a time, controlplane/deploy/staged.py, each one ran in
# Deployer.stage / Deployer.finish_staged)
PROFILE = {"stage": ("stage_many", "stage_many.<locals>.publish", "Deployer.stage"),
           "finish": ("finish_many", "finish_many.<locals>.take", "_failed_of", "Deployer.finish_staged")}


def phases(log: str) -> dict[str, Any]:
    times: dict[str, datetime] = {}
    for line in log.splitlines():
        for mark, pattern in MARKS.items():
            if re.search(pattern, line):
                times[mark] = datetime.fromisoformat(line.split(" ", 1)[0].replace("Z", "+00:00"))
    def span(a: str, b: str) -> float:
        return round((times[b] - times[a]).total_seconds(), 2)
    models = re.search(MARKS["scan"], log)
    return {"models": int(models.group(1)) if models else None,
            "capture_validate_record_s": span("scan", "recorded"), "stage_s": span("recorded", "launch"),
            "triton_start_up_s": span("launch", "live"), "end_deploys_s": span("live", "ended"),
            "total_s": span("scan", "ended")}


# what a sample under a phase is spent on: the first of these frames in its stack
KINDS = (("ServingRepository.publish", "publish"), ("ServingRepository.prune", "prune"),
         ("TritonClient.ready_versions", "ready_versions_rpc"),
         ("TritonClient.served_digest", "served_digest_rpc"), ("Outcomes.publish", "outcome_subscribers"),
         ("Registry.", "registry"), ("JournaledRegistry.", "registry"), ("Batches.", "registry"))


def shares(profile: str) -> dict[str, dict[str, float]]:
    """Per phase, the share (%) of its samples in each kind of work (`KINDS`, else other)."""
    out: dict[str, dict[str, float]] = {}
    for phase, frames in PROFILE.items():
        counts: collections.Counter[str] = collections.Counter()
        for line in profile.splitlines():
            stack, _, n = line.rpartition(" ")
            names = [f.split(" (")[0] for f in stack.split(";")]
            frame = next((f for f in frames if f in names), None)
            if frame is None:
                continue
            below = names[names.index(frame) + 1:]
            kind = next((k for name in below for prefix, k in KINDS if name.startswith(prefix)), "other")
            counts[kind] += int(n)
        total = sum(counts.values()) or 1
        out[phase] = {k: round(100 * v / total, 1) for k, v in counts.most_common()}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("log", type=Path)
    parser.add_argument("profile", type=Path, nargs="?")
    parser.add_argument("--out", type=Path, default=c.RESULTS / "first_start_phases.json")
    parser.add_argument("--note", default="", help="where the log and the profile come from")
    parser.add_argument("--log-commit", help="the commit of the daemon that wrote the log")
    parser.add_argument("--log-tree", type=Path, help="the checkout the daemon that wrote the log ran from")
    args = parser.parse_args(argv)
    if bool(args.log_commit) == bool(args.log_tree):
        parser.error("which commit's daemon wrote the log? give --log-commit COMMIT or --log-tree TREE (one)")
    commit = args.log_commit or c.git_commit(args.log_tree)
    if commit == "unknown":
        parser.error(f"--log-tree {args.log_tree}: not a git checkout")
    report: dict[str, Any] = {"benchmark": "first_start_phases", "git_commit": commit,
                              "log": {"path": str(args.log), "git_commit": commit},
                              "parsed_by": {"git_commit": c.git_commit(), "machine": c.machine_info()},
                              "phases": phases(args.log.read_text(errors="replace"))}
    report["note"] = args.note
    if args.profile is not None:
        report["profile_shares_pct"] = shares(args.profile.read_text(errors="replace"))
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["phases"]), f"-> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
