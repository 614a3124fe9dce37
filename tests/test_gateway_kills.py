"""The daemon SIGKILLed at random moments of a switch through its gateway (issue 54 item 3): clients lose no
request, and the restarted daemon adopts the running gateway and finishes or undoes the switch.

One daemon (`--launch-triton`: its gateway in front of its tritonserver), a probe model whose answers say which
code, weights and config made them (tests/gateway_traffic.py), gRPC and HTTP clients through the gateway every
few milliseconds for the whole run, and the gateway's route table read over its control socket throughout.
Each round writes the next generation, waits for the deploy to reach a phase (from the daemon's own step lines:
publish, the load, the smoke test, the switch of the gateway, the drain after it) or a uniformly random moment,
waits a random few milliseconds more and SIGKILLs the daemon (its gateway and tritonserver run in sessions of
their own and go on serving, as after a crash), then starts it again. After each restart:

- the same gateway process serves (the daemon's log says it adopted that pid: never a second one, never a
  restart of it);
- the interrupted deploy is finished (the route had flipped: rolled forward) or undone (rolled back), then the
  source's newest generation deploys; the registry, the gateway's route and what answers through the gateway
  agree, and only the routed private name of the model is left loaded (the others drained and unloaded);

and over the whole run: 0 failed requests, 0 mixed answers, and no answer older than the route the gateway had
when the request began (an answer may be one flip newer: the watch reads the table a few ms apart).
"""

from __future__ import annotations

import random
import re
import time
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as grpcclient

from tests.gateway_traffic import (
    RouteWatch,
    Sample,
    Traffic,
    control,
    gateway_record,
    gateway_urls,
    probe_answer,
    write_probe,
)
from tests.harness import DaemonProcess, wait_for

MODEL = "probe"
LONG_LOAD_S = 4.0  # initialize() sleeps this long in some rounds: a kill lands inside the load
# Where a kill lands: the step line (controlplane/deploy/steps.py's progress, logged at DEBUG) after which it
# waits a random delay up to the second figure; "any": a uniform moment after the edit is written.
PHASES: dict[str, tuple[re.Pattern[str] | None, float]] = {
    "any": (None, 3.0),
    "publish": (re.compile(rf"tritonctl\.deploy: {MODEL} publish start"), 0.02),
    "load": (re.compile(rf"tritonctl\.deploy: {MODEL} load start"), 2.0),
    "smoke": (re.compile(rf"tritonctl\.deploy: {MODEL} smoke start"), 0.02),
    "switch": (re.compile(rf"tritonctl\.deploy: {MODEL} commit start \w+ switching the gateway"), 0.03),
    "drain": (re.compile(rf"tritonctl\.deploy: {MODEL} commit ok"), 1.5),
}
DEFAULT_PLAN = ["switch", "load", "any", "switch", "publish", "drain", "smoke", "switch", "any", "load"]


def wait_for_line(log: Path, offset: int, pattern: re.Pattern[str], timeout_s: float) -> bool:
    """Whether a line after byte `offset` of `log` matches `pattern` within the timeout (polled every few ms)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with open(log, "rb") as handle:
            handle.seek(offset)
            if pattern.search(handle.read().decode(errors="replace")):
                return True
        time.sleep(0.002)
    return False


def converged(daemon: DaemonProcess, gen: int) -> str | None:
    """The digest serving generation `gen` when the registry (no open deployment, serving, synced), the gateway's
    route and the answer through the gateway agree, and only the routed private name is left; else None."""
    try:
        row = daemon.model_status(MODEL)
        route = control(daemon.state_dir).routes().routes.get(MODEL)
    except Exception:  # noqa: BLE001 - the restarted daemon is not answering yet
        return None
    if row.get("state") != "serving" or row.get("sync") != "synced" or route is None:
        return None
    target = route.serving()
    if target is None or target.digest != row.get("digest") or len(route.targets) != 1:
        return None
    names = {p.name for p in (daemon.state_dir / "serving").iterdir() if p.name.startswith(f"{MODEL}__")}
    if names != {target.name}:
        return None
    grpc, _ = gateway_urls(daemon.state_dir)
    client = grpcclient.InferenceServerClient(grpc)
    try:
        answer = probe_answer(client, MODEL)
        digest = client.get_model_config(MODEL, as_json=True)["config"]["parameters"]["tritonctl.digest"]
    except Exception:  # noqa: BLE001 - not yet
        return None
    finally:
        client.close()
    return target.digest if answer[:3] == (gen, gen, gen) and digest["string_value"] == target.digest else None


def older_than_the_route(samples: list[Sample], watch: RouteWatch, gen_of: dict[str, int]) -> list[str]:
    """Answers of a generation other than the route's when the request began, or the next route's (the watch
    reads the table a few ms apart: an answer may be one flip ahead of what it saw, never behind)."""
    changes = [(at, routes[MODEL][0][0] if routes.get(MODEL) else None) for at, routes in watch.changes]
    found = []
    for s in samples:
        if s.answer is None:
            continue
        i = max((k for k, (at, _) in enumerate(changes) if at <= s.began), default=None)
        if i is None:
            continue
        allowed = {gen_of.get(d or "") for _, d in changes[i:i + 2]}
        if None in allowed:
            continue  # a digest the run does not know the generation of (none: every one converged)
        if s.answer[0] not in allowed:
            found.append(f"{s.protocol} answered gen {s.answer[0]}, routed to {sorted(allowed)} when it began")
    return found


def kill_rounds(tmp_path: Path, plan: list[str], seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    repo = tmp_path / "repo"
    repo.mkdir()
    write_probe(repo, MODEL, 1)
    daemon = DaemonProcess(repo, tmp_path / "state", env={"TRITONCTL_GATEWAY_DRAIN_S": "1"})
    killed_at: dict[str, int] = {}
    outcomes = {"rolled forward": 0, "rolled back": 0}
    gen_of: dict[str, int] = {}
    restarts: list[float] = []
    try:
        daemon.start()
        gen_of[str(wait_for(lambda: converged(daemon, 1), 90, 0.2, "generation 1 serving"))] = 1
        gateway_pid = int(gateway_record(daemon.state_dir)["pid"])
        grpc, http = gateway_urls(daemon.state_dir)
        with RouteWatch(daemon.state_dir, (MODEL,)) as watch, Traffic(grpc, http, MODEL, period_s=0.005) as traffic:
            wait_for(lambda: traffic.answered() > 20, 60, 0.05, "clients answered")
            for round_, phase in enumerate(plan):
                gen = round_ + 2
                offset = daemon.log_path.stat().st_size
                write_probe(repo, MODEL, gen, init_s=LONG_LOAD_S if phase in ("any", "load") else 0.0)
                pattern, delay = PHASES[phase]
                if pattern is None:
                    time.sleep(rng.uniform(0.15, delay))
                elif not wait_for_line(daemon.log_path, offset, pattern, 60):
                    raise AssertionError(f"round {round_}: the deploy never reached {phase}: {daemon.log_tail()}")
                else:
                    time.sleep(rng.uniform(0.0, delay))
                daemon.kill()
                killed_at[phase] = killed_at.get(phase, 0) + 1
                offset = daemon.log_path.stat().st_size
                started = time.monotonic()
                daemon.start()
                restarts.append(round(time.monotonic() - started, 1))
                digest = wait_for(lambda g=gen: converged(daemon, g), 120, 0.2, f"generation {gen} serving, agreed")
                gen_of[str(digest)] = gen
                log = daemon.log_path.read_bytes()[offset:].decode(errors="replace")
                assert f"adopted the running gateway pid {gateway_pid}" in log, log[-3000:]
                assert int(gateway_record(daemon.state_dir)["pid"]) == gateway_pid
                outcomes["rolled forward"] += log.count("recovered interrupted deploy: rolled forward")
                outcomes["rolled back"] += log.count("recovered interrupted deploy: rolled back")
            time.sleep(0.5)
        samples = traffic.samples
    finally:
        daemon.stop()
    failed = [s for s in samples if s.error is not None]
    mixed = [s for s in samples if s.answer is not None and not s.answer[0] == s.answer[1] == s.answer[2]]
    result = {"kills": len(plan), "killed_at": killed_at, "requests": len(samples), "failed": len(failed),
              "errors": sorted({s.error or "" for s in failed})[:5], "mixed": len(mixed),
              "behind_the_route": older_than_the_route(samples, watch, gen_of)[:5], "restart_s": restarts,
              **outcomes, "protocols": sorted({s.protocol for s in samples})}
    print("gateway kills:", result)
    return result


def check(result: dict[str, Any]) -> None:
    assert result["failed"] == 0 and result["mixed"] == 0 and not result["behind_the_route"], result
    assert result["protocols"] == ["grpc", "http"] and result["requests"] > 100, result
    # kills after the flip were rolled forward, kills before it rolled back: both happened
    assert result["rolled forward"] >= 1 and result["rolled back"] >= 1, result


def test_sigkills_at_random_moments_of_a_switch_lose_no_request(tmp_path: Path) -> None:
    """Ten kills: three aimed at the gateway's switch, the others at publish, the load, the smoke test, the
    drain after a switch and random moments."""
    check(kill_rounds(tmp_path, DEFAULT_PLAN, seed=5454))


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_thirty_sigkills_at_random_moments_of_a_switch(tmp_path: Path) -> None:
    rng = random.Random(5455)
    plan = [rng.choice(list(PHASES)) for _ in range(30)]
    result = kill_rounds(tmp_path, plan, seed=5455)
    check(result)
    assert set(result["killed_at"]) >= {"switch", "load"}, result
