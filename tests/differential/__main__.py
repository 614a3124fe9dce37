"""`python -m tests.differential --report`: run every case, print the confusion matrix and each
disagreement with its reason; exit 1 when a disagreement is not accepted (tests.differential.verdicts)."""

from __future__ import annotations

import argparse
import sys
import time

from tests.differential.cases import all_cases
from tests.differential.runner import WORKERS, crashes, run_with_own_server
from tests.differential.verdicts import describe, report, sample, unexpected


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.differential")
    parser.add_argument("--report", action="store_true", help="print the confusion matrix")
    parser.add_argument("--sample", action="store_true", help="only the default suite's sample")
    parser.add_argument("-k", default="", help="only cases whose name contains this")
    parser.add_argument("-v", action="store_true", help="every case's verdicts")
    parser.add_argument("--workers", type=int, default=WORKERS, help=f"loads in flight at once (default {WORKERS})")
    args = parser.parse_args(argv)
    cases = sample() if args.sample else all_cases()
    cases = [c for c in cases if args.k in c.name]
    started = time.monotonic()
    outcomes = run_with_own_server(cases, args.workers)
    if args.v:
        for o in outcomes:
            print(describe(o))
    print(report(outcomes))
    print(f"({time.monotonic() - started:.0f} s, {args.workers} loads at a time)")
    for crash in crashes:
        print("server restarted:", crash)
    bad = unexpected(outcomes)
    for line in bad:
        print("UNEXPECTED", line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
