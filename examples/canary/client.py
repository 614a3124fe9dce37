"""A client for the README's canary example: ~50 requests/s to `linear` over HTTP/REST (KServe v2), each a
row of three uniform random numbers, counting what failed (docs/bake.md, "Canary steps").

    python3 examples/canary/client.py --seconds 90 &

Standard library only. Every 10 s one line `linear: 512 requests, 3 failed`; at the end the same line, or
with --json one JSON object: requests, failed, and the seconds (since the client started) of the first
and last failure.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import urllib.error
import urllib.request


def infer(url: str, model: str, row: list[float], timeout_s: float) -> bool:
    body = json.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 3], "data": row}]}).encode()
    request = urllib.request.Request(f"{url}/v2/models/{model}/infer", body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            return bool(json.loads(answer.read()).get("outputs"))
    except (urllib.error.URLError, OSError, ValueError):
        return False


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the gateway's HTTP address")
    parser.add_argument("--model", default="linear")
    parser.add_argument("--rate", type=float, default=50.0, help="requests per second")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to send")
    parser.add_argument("--json", action="store_true", help="print one JSON object at the end")
    args = parser.parse_args(argv)
    rng = random.Random()
    started = time.monotonic()
    requests = failed = 0
    failures: list[float] = []
    next_line = started + 10
    while (now := time.monotonic()) - started < args.seconds:
        ok = infer(args.url, args.model, [rng.random() for _ in range(3)], 10.0)
        requests += 1
        if not ok:
            failed += 1
            failures.append(round(time.monotonic() - started, 3))
        if now >= next_line and not args.json:
            print(f"{args.model}: {requests} requests, {failed} failed", flush=True)
            next_line += 10
        time.sleep(max(0.0, started + requests / args.rate - time.monotonic()))
    if args.json:
        print(json.dumps({"requests": requests, "failed": failed, "first_failure_s": failures[0] if failures else None,
                          "last_failure_s": failures[-1] if failures else None}))
    else:
        print(f"{args.model}: {requests} requests, {failed} failed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
