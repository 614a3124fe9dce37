"""SIGKILLs at random moments of change sets, under a request every 20 ms on the ensemble: 0 failed, 0 mixed.

tests/test_changesets.py's pipeline (`pipe` = a → b, the intermediate tensor renamed in every edit,
answering 2 × the edit's generation). Each round edits all three, waits until the daemon's log says
the set reached a chosen phase, waits a random few milliseconds more, SIGKILLs the daemon (its
launched tritonserver keeps serving, as after a crash) and restarts it. The phases, from the set's
own progress lines (`changeset <id>: <model> <step> <state>`, controlplane/intake/changeset.py):

- staging: the changed steps loading under their private names;
- the switch: the ensemble loading with its steps pointed at the private names;
- the public steps' deploys (the new pipeline answering through the private names meanwhile);
- the switch back: the ensemble loading again, pointed at the public steps.

After each restart the set must be finished or undone and then deployed: the pipeline answers the
new generation, no private name is left in `serving/`, and every member is `synced`. Throughout, no
request fails and no answer is anything but the previous or the new pipeline's (a "mixed" answer).

These phases are the in-place set's (`--no-gateway`): with a gateway a set's members load under their
digests' private names and the set is one route switch; its daemon killed mid set is
tests/test_changesets.py's test_daemon_killed_mid_set_rolls_the_whole_set_forward[gateway], and random
kills of a gateway's switch are tests/test_gateway_kills.py's.
"""

from __future__ import annotations

import random
import re
import time
from pathlib import Path
from typing import Any

import pytest

from tests.harness import DaemonProcess, wait_for
from tests.test_changesets import pipe_answer, request_every, write_pipe

# Where a kill lands: the progress line that starts the phase, and the longest random delay after it
# (a private python step loads in about a second here; an ensemble loads and verifies in a few ms).
PHASES = {
    "staging": (re.compile(r"changeset \w+: [ab] stage start"), 0.6),
    "switch": (re.compile(r"changeset \w+: pipe interim start"), 0.02),
    "public steps": (re.compile(r"changeset \w+: [ab] (publish|load) start"), 0.4),
    "switch back": (re.compile(r"changeset \w+: pipe switch start"), 0.02),
}
# The phase a kill interrupted, from the set's last progress line before it.
INTERRUPTED = (("staging", re.compile(r"[ab] stage ")), ("switch", re.compile(r"pipe interim ")),
               ("public steps", re.compile(r"[ab] (validate|publish|load|verify|smoke|commit) ")),
               ("switch back", re.compile(r"pipe switch ")))
PHASE_ORDER = list(PHASES)


def wait_for_line(log: Path, offset: int, pattern: re.Pattern[str], timeout_s: float) -> str | None:
    """The first line after byte `offset` of `log` matching `pattern`, polled every few ms (None: none came)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with open(log, "rb") as handle:
            handle.seek(offset)
            text = handle.read().decode(errors="replace")
        for line in text.splitlines():
            if pattern.search(line):
                return line
        time.sleep(0.003)
    return None


def last_progress(log: Path, offset: int) -> tuple[str, str]:
    """The phase the kill interrupted and the set's last progress line before it."""
    with open(log, "rb") as handle:
        handle.seek(offset)
        lines = [ln for ln in handle.read().decode(errors="replace").splitlines() if "changeset " in ln]
    line = lines[-1].split("changeset ", 1)[1] if lines else "(no progress yet)"
    return next((phase for phase, pattern in INTERRUPTED if pattern.search(line)), "?"), line


def converged(daemon: DaemonProcess, stats: dict[str, Any], gen: int) -> bool:
    if not stats["answers"] or stats["answers"][-1] != 2.0 * gen:
        return False
    if [p for p in (daemon.state_dir / "serving").iterdir() if "__" in p.name]:
        return False
    try:
        rows = {r["model"]: r for r in daemon.status()["models"]}
    except AssertionError:  # the restarted daemon's control socket is not up yet
        return False
    return all(rows.get(m, {}).get("sync") == "synced" for m in ("a", "b", "pipe"))


def kill_rounds(tmp_path: Path, rounds: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    repo = tmp_path / "repo"
    repo.mkdir()
    write_pipe(repo, "t1", 10)
    daemon = DaemonProcess(repo, tmp_path / "state", settle_s=0.3, extra_args=["--no-gateway"])
    hits: dict[str, list[str]] = {phase: [] for phase in PHASES}
    rounds_seen: list[dict[str, Any]] = []
    mixed: list[tuple[int, float]] = []
    restarts: list[float] = []
    try:
        daemon.start()
        url = daemon.triton_url()
        wait_for(lambda: daemon.model_status("pipe").get("sync") == "synced", 90, 0.2, "pipe serving generation 10")
        with request_every(url, pipe_answer) as stats:
            wait_for(lambda: stats["answers"] and stats["answers"][-1] == 20.0, 30, 0.1, "pipe answering 20")
            previous = 10
            for round_ in range(rounds):
                gen = 11 + round_
                phase = PHASE_ORDER[round_ % len(PHASE_ORDER)]
                pattern, delay_s = PHASES[phase]
                seen, failed = len(stats["answers"]), stats["failed"]
                offset = daemon.log_path.stat().st_size
                write_pipe(repo, f"k{gen}", gen)
                line = wait_for_line(daemon.log_path, offset, pattern, 60)
                assert line is not None, f"round {round_}: the set never reached {phase}: {daemon.log_tail()}"
                time.sleep(rng.uniform(0.0, delay_s))
                daemon.kill()
                interrupted, line = last_progress(daemon.log_path, offset)
                hits.setdefault(interrupted, []).append(line)
                started = time.monotonic()
                daemon.start()
                restarts.append(round(time.monotonic() - started, 1))
                assert daemon.triton_url() == url, "the restarted daemon adopted its tritonserver"
                wait_for(lambda g=gen: converged(daemon, stats, g), 180, 0.2,
                         f"round {round_} ({phase}): generation {gen} serving, the set finished")
                allowed = {2.0 * previous, 2.0 * gen}
                mixed += [(round_, a) for a in stats["answers"][seen:] if a not in allowed]
                rounds_seen.append({"round": round_, "aimed": phase, "killed": interrupted, "line": line,
                                    "failed": stats["failed"] - failed})
                previous = gen
            answered = stats["ok"]
            wait_for(lambda: stats["ok"] > answered, 30, 0.02, "an answer after the last round")
        result = {"rounds": rounds, "ok": stats["ok"], "failed": stats["failed"], "errors": stats["errors"],
                  "mixed": len(mixed), "mixed_answers": mixed[:5], "restart_s": restarts, "killed_at": hits,
                  "rounds_failed": [r for r in rounds_seen if r["failed"]]}
        print("change-set kills:", result)
        return result
    finally:
        daemon.stop()


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_random_sigkills_during_change_sets_never_fail_or_mix(tmp_path: Path) -> None:
    """Twelve kills, three aimed at each phase of a set (staging, switch, public steps, switch back); each
    phase interrupted at least once."""
    result = kill_rounds(tmp_path, rounds=12, seed=2525)
    assert result["failed"] == 0 and result["mixed"] == 0, result
    assert result["ok"] > 0, result
    assert all(result["killed_at"].get(phase) for phase in PHASES), result["killed_at"]
