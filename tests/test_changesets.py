"""Change sets against the real tritonserver: an ensemble `pipe` over python steps `a` → `b`, all three
edited at once so the intermediate tensor is renamed, deploys as one set with 0 failed requests on
`pipe` (a request every 20 ms); a broken step leaves the old pipeline answering, 0 failed, the set
recorded rolled back and only the broken step quarantined. Then the example repository's
`sentiment_pipeline` with its tokenizer → classifier tensor renamed the same way."""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from controlplane.store.registry import Registry
from tests.harness import (
    DaemonProcess,
    copy_example,
    python_config,
    python_model,
    served_name,
    triton_client,
    upstream_client,
    wait_for,
)

PIPE = """name: "pipe"
platform: "ensemble"
max_batch_size: 8
input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "y" data_type: TYPE_FP32 dims: [ 1 ] } ]
ensemble_scheduling { step [
  { model_name: "a" model_version: -1 input_map { key: "x" value: "x" } output_map { key: "TENSOR" value: "m" } },
  { model_name: "b" model_version: -1 input_map { key: "TENSOR" value: "m" } output_map { key: "y" value: "y" } }
] }
"""


def write_pipe(repo: Path, tensor: str, gen: int, *, broken_b: bool = False) -> None:
    """a: x → TENSOR = x + 1; b: TENSOR → y = TENSOR * gen; pipe: x → y. One edit of all three."""
    for name, src, dst, expr in (("a", "x", tensor, "x + 1"), ("b", tensor, "y", f"x * {gen}")):
        (repo / name / "1").mkdir(parents=True, exist_ok=True)
        (repo / name / "config.pbtxt").write_text(python_config(name, src, dst))
        init = "raise RuntimeError('broken step')" if broken_b and name == "b" else "pass"
        (repo / name / "1" / "model.py").write_text(
            python_model(f"({expr}).astype(np.float32)", src=src, dst=dst, init=init))
    (repo / "pipe" / "1").mkdir(parents=True, exist_ok=True)
    (repo / "pipe" / "config.pbtxt").write_text(PIPE.replace("TENSOR", tensor))


@contextmanager
def request_every(url: str, call: Any, period_s: float = 0.02) -> Iterator[dict[str, Any]]:
    """One client calling `call(client)` every `period_s`; counts failures and keeps each answer."""
    stats: dict[str, Any] = {"ok": 0, "failed": 0, "errors": [], "answers": []}
    stop = threading.Event()

    def worker() -> None:
        client = grpcclient.InferenceServerClient(url)
        try:
            while not stop.is_set():
                began = time.monotonic()
                try:
                    stats["answers"].append(call(client))
                    stats["ok"] += 1
                except Exception as exc:  # noqa: BLE001 - counted and reported by the test
                    stats["failed"] += 1
                    if len(stats["errors"]) < 5:
                        stats["errors"].append(str(exc)[:300])
                stop.wait(max(0.0, period_s - (time.monotonic() - began)))
        finally:
            client.close()

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    try:
        yield stats
    finally:
        stop.set()
        thread.join(15)


def pipe_answer(client: grpcclient.InferenceServerClient) -> float:
    x = grpcclient.InferInput("x", [1, 1], "FP32")
    x.set_data_from_numpy(np.array([[1.0]], dtype=np.float32))
    return float(client.infer("pipe", [x], client_timeout=10).as_numpy("y")[0][0])


def changesets(daemon: DaemonProcess, since: int = 0) -> list[dict[str, Any]]:
    """The change sets deployed or rolled back since audit event `since` (not the ones skipped after)."""
    events = daemon.audit("--action", "changeset", "--limit", "50")
    return sorted([e for e in events if e["id"] > since and e["outcome"] != "skipped"], key=lambda e: e["id"])


def pipe_state(daemon: DaemonProcess) -> tuple[float, int]:
    """What `pipe` answers now, and the newest audit event's id (what a test's events come after)."""
    with triton_client(daemon) as client:
        return pipe_answer(client), last_event_id(daemon)


def last_event_id(daemon: DaemonProcess) -> int:
    events = daemon.audit("--limit", "1")
    return int(events[0]["id"]) if events else 0


@pytest.fixture(scope="module")
def pipe_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    base = tmp_path_factory.mktemp("changesets")
    repo = base / "repo"
    repo.mkdir()
    write_pipe(repo, "t1", 10)
    proc = DaemonProcess(repo, base / "state", settle_s=0.3).start()
    try:
        wait_for(lambda: proc.model_status("pipe").get("state") == "serving", 90, 0.3, "pipe serving")
        yield proc
    finally:
        assert proc.stop() == 0, proc.log_tail()


def assert_serving_root_holds_only_what_serves(daemon: DaemonProcess) -> None:
    """The serving root (what tritonserver's repository shows) holds one tree per model, the name Triton
    serves it under (its own; with a gateway, its route's private name), once the replaced digests have
    drained: no staged step name and no replaced digest is left behind."""
    def left() -> list[str]:
        return sorted(p.name for p in (daemon.state_dir / "serving").iterdir() if not p.name.startswith("."))

    def expected() -> list[str]:
        return sorted(str(served_name(daemon.state_dir, m)) for m in ("a", "b", "pipe"))

    wait_for(lambda: left() == expected(), 30, 0.2, "the serving root holding a, b and pipe's served trees only")


def until_the_set_is_over(daemon: DaemonProcess, since: int, stats: dict[str, Any], timeout_s: float = 120.0) -> Any:
    """Inside a request loop: wait for the set's `changeset` audit event (written once the whole set is
    over: public steps deployed, the ensemble pointed back, private names dropped), then for one more
    answer, so that the loop provably ran through the set's tail. The event."""
    [event] = wait_for(lambda: changesets(daemon, since), timeout_s, 0.1, "the change set's audit event")
    answered = stats["ok"] + stats["failed"]
    wait_for(lambda: stats["ok"] + stats["failed"] > answered, 30, 0.02, "a request after the set ended")
    return event


def coordinated_edit(daemon: DaemonProcess, tensor: str, gen: int) -> dict[str, Any]:
    """Rename the intermediate tensor across a, b and pipe in one edit under a request loop on pipe that
    runs until the set is over."""
    since = last_event_id(daemon)
    started = time.monotonic()
    with request_every(daemon.triton_url(), pipe_answer) as stats:
        time.sleep(0.3)
        write_pipe(daemon.repository, tensor, gen)
        wait_for(lambda: stats["answers"] and stats["answers"][-1] == 2.0 * gen, 120, 0.1, f"pipe answers {2 * gen}")
        switched = time.monotonic() - started
        event = until_the_set_is_over(daemon, since, stats)
    assert stats["ok"] > 0, stats
    return {"stats": stats, "event": event, "switch_s": switched}


def test_renamed_tensor_deploys_as_one_set_with_zero_failed_requests(pipe_daemon: DaemonProcess) -> None:
    client = grpcclient.InferenceServerClient(pipe_daemon.triton_url())
    try:
        assert pipe_answer(client) == 20.0
    finally:
        client.close()
    result = coordinated_edit(pipe_daemon, "t2", 30)
    stats, event = result["stats"], result["event"]
    assert stats["failed"] == 0, stats["errors"]
    assert stats["answers"][-1] == 60.0 and 20.0 in stats["answers"]  # old answers, then the new pipeline's
    assert set(stats["answers"]) <= {20.0, 60.0}
    assert event["outcome"] == "deployed", event
    detail = json.loads(event["message"])
    members = {m["model"]: m for m in detail["members"]}
    assert set(members) == {"a", "b", "pipe"} and all(m["changed"] for m in members.values())
    for name in ("a", "b", "pipe"):
        row = pipe_daemon.model_status(name)
        assert row["state"] == "serving" and row["digest"].startswith(members[name]["digest"][:12]), row
    names = {row["model"] for row in pipe_daemon.status()["models"]}
    assert names == {"a", "b", "pipe"}  # no private step name shows as a model
    assert_serving_root_holds_only_what_serves(pipe_daemon)


def test_broken_step_leaves_the_old_pipeline_serving(pipe_daemon: DaemonProcess) -> None:
    before, since = pipe_state(pipe_daemon)
    with request_every(pipe_daemon.triton_url(), pipe_answer) as stats:
        time.sleep(0.3)
        write_pipe(pipe_daemon.repository, "t9", 90, broken_b=True)
        event = until_the_set_is_over(pipe_daemon, since, stats)
    assert stats["failed"] == 0 and stats["ok"] > 0, stats["errors"]
    assert set(stats["answers"]) == {before}  # the old pipeline answered throughout
    assert event["outcome"] == "rolled_back", event
    members = {m["model"]: m for m in json.loads(event["message"])["members"]}
    registry = Registry(f"sqlite:///{pipe_daemon.state_dir / 'registry.db'}")
    try:
        quarantined = {name for name, m in members.items()
                       if registry.get_snapshot(name, m["digest"]).quarantined}
    finally:
        registry.close()
    assert quarantined == {"b"}  # only the step that failed by its own fault
    for name in ("a", "b", "pipe"):
        assert pipe_daemon.model_status(name)["state"] == "serving"
    assert_serving_root_holds_only_what_serves(pipe_daemon)  # the set's staged names are gone
    write_pipe(pipe_daemon.repository, "t2", 30)  # back to what serves, for the next test
    wait_for(lambda: not pipe_daemon.model_status("b").get("sync") == "pending", 30, 0.2, "settled")


def test_load_of_several_models_is_one_change_set(pipe_daemon: DaemonProcess) -> None:
    for name in ("a", "b", "pipe"):
        pipe_daemon.json("policy", name, "manual")
    try:
        before, since = pipe_state(pipe_daemon)
        with request_every(pipe_daemon.triton_url(), pipe_answer) as stats:
            write_pipe(pipe_daemon.repository, "t5", 50)
            # settled and recorded, not deployed: the daemon's own word (status: held by the manual policy)
            for name in ("a", "b", "pipe"):
                wait_for(lambda n=name: (r := pipe_daemon.model_status(n)).get("sync") == "held"
                         and r["sync_reason"].startswith("policy manual") and r["source_digest"] != r["digest"],
                         30, 0.1, f"{name}'s new content recorded and held by the manual policy")
            assert not changesets(pipe_daemon, since) and stats["answers"][-1] == before
            result = pipe_daemon.run("load", "a", "b", "pipe", "--json")
            answered = stats["ok"]
            wait_for(lambda: stats["ok"] > answered, 30, 0.02, "an answer after the load")
        assert result.exit_code == 0, result.output
        outcome = json.loads(result.stdout)
        assert outcome["outcome"] == "ok" and outcome["action"] == "changeset", outcome
        assert stats["failed"] == 0, stats["errors"]
        assert stats["answers"][-1] == 100.0
        [event] = changesets(pipe_daemon, since)
        assert event["actor"] != "watcher" and event["outcome"] == "deployed"
        assert {m["model"] for m in json.loads(event["message"])["members"]} == {"a", "b", "pipe"}
    finally:
        for name in ("a", "b", "pipe"):
            pipe_daemon.json("policy", name, "inherit")


def test_repository_hold_releases_everything_as_one_set(pipe_daemon: DaemonProcess) -> None:
    hold = pipe_daemon.repository / ".tritonctl-hold"
    hold.touch()
    try:
        since = last_event_id(pipe_daemon)
        with request_every(pipe_daemon.triton_url(), pipe_answer) as stats:
            before = stats["answers"][-1] if stats["answers"] else None
            write_pipe(pipe_daemon.repository, "t6", 70)
            wait_for(lambda: "hold" in str(pipe_daemon.model_status("pipe").get("sync_reason")), 20, 0.2,
                     "pipe pending on the repository hold")
            assert not changesets(pipe_daemon, since)
            hold.unlink()
            event = until_the_set_is_over(pipe_daemon, since, stats, 60)
        assert event["outcome"] == "deployed", event
        assert {m["model"] for m in json.loads(event["message"])["members"]} == {"a", "b", "pipe"}
        assert stats["failed"] == 0 and stats["ok"] > 0, stats["errors"]
        assert before in (None, 100.0) and stats["answers"][-1] == 140.0
    finally:
        hold.unlink(missing_ok=True)


def test_a_restore_that_keeps_failing_backs_off_and_status_says_why(pipe_daemon: DaemonProcess) -> None:
    """Step `a` unloaded behind the daemon's back and its stored code broken: reconcile (every 1 s here)
    restores it steps first, fails, and backs off (5 s, 10 s, ...) instead of retrying every round;
    `status` says which restore failed, why and when it is tried again. Fixed, it serves again."""
    registry = Registry(f"sqlite:///{pipe_daemon.state_dir / 'registry.db'}")
    try:
        digest = registry.get_model("a").active_digest
    finally:
        registry.close()
    assert digest
    code = pipe_daemon.state_dir / "store" / "trees" / digest / "1" / "model.py"  # a hard link to the object
    original, mode = code.read_text(), code.stat().st_mode
    since = last_event_id(pipe_daemon)
    code.chmod(0o644)
    try:
        code.write_text(original + "\nraise RuntimeError('broken on restore')\n")
        with upstream_client(pipe_daemon) as client:  # tritonserver's own port: the gateway refuses unloads
            key = json.loads((pipe_daemon.state_dir / "triton" / "server.json").read_text())["restricted_key"]
            client.unload_model(served_name(pipe_daemon.state_dir, "a") or "a",
                                headers={"triton-grpc-protocol-tritonctl-key": key})
        row = wait_for(lambda: (r := pipe_daemon.model_status("a")).get("next_retry_s") is not None and r, 30, 0.2,
                       "a's failed restore in status")
        assert row["sync"] == "pending", row
        assert row["sync_reason"].startswith(f"last restore of {digest[:12]} failed (") and \
            "broken on restore" in row["sync_reason"] and "next retry in" in row["sync_reason"], row
        time.sleep(7.0)  # seven reconcile rounds
        attempts = [e for e in pipe_daemon.audit("--action", "restore", "--model", "a", "--limit", "50")
                    if e["id"] > since]
        assert 1 <= len(attempts) <= 2 and all(e["outcome"] == "failed" for e in attempts), attempts
    finally:
        code.write_text(original)
        code.chmod(mode)
    fixed = last_event_id(pipe_daemon)  # fixed: the operator's load serves it at once, ending the backoff
    result = pipe_daemon.run("load", "a", "--force", "--json")
    assert result.exit_code == 0, result.output
    wait_for(lambda: pipe_daemon.model_status("a").get("sync") == "synced"
             and pipe_daemon.model_status("pipe").get("sync") == "synced", 40, 0.3, "a and pipe serving")
    after = [e for e in pipe_daemon.audit("--model", "a", "--limit", "50") if e["id"] > fixed]
    deploys = [e for e in after if e["action"] == "deploy"]
    assert [e["outcome"] for e in deploys] == ["ok"], after  # the load
    # and no backoff step after it (one already under way when the load came in may end first: a
    # fresh-clone run under load saw the retry due at 15 s restore the fixed code 0.1 s before the load)
    assert not [e for e in after if e["action"] == "restore" and e["id"] > deploys[0]["id"]], after
    assert pipe_daemon.model_status("a").get("next_retry_s") is None
    client = grpcclient.InferenceServerClient(pipe_daemon.triton_url())
    try:
        pipe_answer(client)
    finally:
        client.close()


def write_solo(repo: Path, gen: int) -> None:
    """`solo`: x → y = x * gen, connected to nothing."""
    (repo / "solo" / "1").mkdir(parents=True, exist_ok=True)
    (repo / "solo" / "config.pbtxt").write_text(python_config("solo", "x", "y"))
    (repo / "solo" / "1" / "model.py").write_text(python_model(f"(x * {gen}).astype(np.float32)", src="x", dst="y"))


@pytest.mark.timeout(300)
def test_repository_commit_marker_deploys_everything_since_the_last_one_as_one_set(tmp_path: Path) -> None:
    """`--commit-marker DONE` with `DONE` at the repository root: models newer than it wait (status says
    so), and touching it deploys them, unconnected `solo` included, as one set, 0 failed on `pipe`."""
    repo = tmp_path / "repo"
    repo.mkdir()
    write_pipe(repo, "t1", 10)
    write_solo(repo, 1)
    (repo / "DONE").touch()
    proc = DaemonProcess(repo, tmp_path / "state", ["--commit-marker", "DONE"], settle_s=0.3).start()
    try:
        wait_for(lambda: all(proc.model_status(m).get("state") == "serving" for m in ("pipe", "solo")), 90, 0.3,
                 "pipe and solo serving")
        since = last_event_id(proc)
        with request_every(proc.triton_url(), pipe_answer) as stats:
            time.sleep(0.3)
            write_pipe(repo, "t2", 30)
            write_solo(repo, 2)
            for name in ("pipe", "solo"):  # no model-level DONE is needed, the root one is awaited
                wait_for(lambda n=name: "commit marker DONE at the repository root" in
                         str(proc.model_status(n).get("sync_reason")), 20, 0.2, f"{name} awaiting the root marker")
            # the daemon's own word that both wait: nothing deployed
            assert not changesets(proc, since) and stats["answers"][-1] == 20.0
            (repo / "DONE").touch()
            event = until_the_set_is_over(proc, since, stats, 60)
            wait_for(lambda: stats["answers"][-1] == 60.0, 30, 0.1, "pipe answers 60")
        assert event["outcome"] == "deployed", event
        assert {m["model"] for m in json.loads(event["message"])["members"]} == {"a", "b", "pipe", "solo"}
        assert stats["failed"] == 0 and stats["ok"] > 0, stats["errors"]
        assert set(stats["answers"]) <= {20.0, 60.0}
        assert proc.model_status("solo")["state"] == "serving"
        assert proc.model_status("solo").get("sync") != "pending"
    finally:
        assert proc.stop() == 0, proc.log_tail()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ensemble_failing_its_own_smoke_is_the_only_one_quarantined(pipe_daemon: DaemonProcess) -> None:
    """Over verified private steps, the new ensemble's own smoke.json fails: its fault alone."""
    before, since = pipe_state(pipe_daemon)
    wrong = {"requests": [{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [1]}],
                           "outputs": [{"name": "y", "data": [[-1]]}]}]}
    with request_every(pipe_daemon.triton_url(), pipe_answer) as stats:
        time.sleep(0.3)
        write_pipe(pipe_daemon.repository, "t8", 80)
        (pipe_daemon.repository / "pipe" / "smoke.json").write_text(json.dumps(wrong))
        event = until_the_set_is_over(pipe_daemon, since, stats)
    (pipe_daemon.repository / "pipe" / "smoke.json").unlink()  # then the set without it deploys
    wait_for(lambda: len(changesets(pipe_daemon, since)) == 2, 120, 0.2, "the set without the bad smoke.json")
    assert stats["failed"] == 0 and stats["ok"] > 0, stats["errors"]
    # smoke runs once the new pipeline is READY (as for one model): it may answer until the rollback
    assert set(stats["answers"]) <= {before, 160.0} and stats["answers"][-1] == before
    assert event["outcome"] == "rolled_back" and "smoke" in event["message"], event
    members = {m["model"]: m for m in json.loads(event["message"])["members"]}
    registry = Registry(f"sqlite:///{pipe_daemon.state_dir / 'registry.db'}")
    try:
        quarantined = {name for name, m in members.items() if registry.get_snapshot(name, m["digest"]).quarantined}
    finally:
        registry.close()
    assert quarantined == {"pipe"}


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_repeated_coordinated_edits_never_fail_a_request(pipe_daemon: DaemonProcess) -> None:
    runs = []
    for i, gen in enumerate((40, 50, 60, 70, 80)):
        result = coordinated_edit(pipe_daemon, f"r{i}", gen)
        runs.append((result["stats"]["failed"], result["stats"]["ok"], round(result["switch_s"], 2)))
        assert result["event"]["outcome"] == "deployed", result["event"]
    print("runs (failed, ok, seconds to the new pipeline):", runs)
    assert all(failed == 0 for failed, _, _ in runs), runs


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("gateway", [True, False], ids=["gateway", "no-gateway"])
def test_daemon_killed_mid_set_rolls_the_whole_set_forward(tmp_path: Path, gateway: bool) -> None:
    """The daemon dies (TRITONCTL_FAULT=after_load) while the set's members load: its tritonserver (and its
    gateway) keep answering, and the restarted daemon finishes the set; 0 failed requests throughout.
    Without a gateway the members load under private step names, the ensemble serving through them, and
    the restart deploys the public steps and points the ensemble back at them; with one, every member
    loads under its digest's private name and the set is one route switch, which the restart makes."""
    repo = tmp_path / "repo"
    repo.mkdir()
    write_pipe(repo, "t1", 10)
    state = tmp_path / "state"
    mode = [] if gateway else ["--no-gateway"]
    first = DaemonProcess(repo, state, settle_s=0.3, env={"TRITONCTL_FAULT": "after_load"}, extra_args=mode)
    plain = DaemonProcess(repo, state, settle_s=0.3, extra_args=mode)
    try:
        plain.start()
        wait_for(lambda: plain.model_status("pipe").get("state") == "serving", 90, 0.3, "pipe serving")
        url = plain.triton_url()
        before = {m: served_name(state, m) for m in ("a", "b", "pipe")}
        plain.proc.send_signal(9)  # type: ignore[union-attr] - its tritonserver keeps serving (adopted next)
        plain.proc.wait()  # type: ignore[union-attr]
        first.start()
        with request_every(url, pipe_answer) as stats:
            time.sleep(0.3)
            write_pipe(repo, "t2", 30)
            wait_for(lambda: first.proc is not None and first.proc.poll() is not None, 60, 0.1, "the fault's exit")
            assert first.proc is not None and first.proc.returncode == 97, first.log_tail()
            # killed mid set: a member's new content loaded under a name no route or ensemble serves yet
            assert {p.name for p in (state / "serving").iterdir() if "__" in p.name} - set(before.values())
            assert {m: served_name(state, m) for m in ("a", "b", "pipe")} == before  # still the old pipeline
            plain.start()
            wait_for(lambda: stats["answers"] and stats["answers"][-1] == 60.0, 60, 0.1, "the new pipeline")
            assert_serving_root_holds_only_what_serves(plain)
            answered = stats["ok"]
            wait_for(lambda: stats["ok"] > answered, 30, 0.02, "an answer after the set was finished")
        assert stats["failed"] == 0 and stats["ok"] > 0, stats["errors"]
        assert set(stats["answers"]) <= {20.0, 60.0}, stats["answers"]  # the old pipeline's, or the new one's
        for name in ("a", "b", "pipe"):
            assert plain.model_status(name)["state"] == "serving", plain.model_status(name)
        if not gateway:
            client = grpcclient.InferenceServerClient(url)
            try:
                steps = client.get_model_config("pipe", as_json=True)["config"]["ensemble_scheduling"]["step"]
                assert [s["model_name"] for s in steps] == ["a", "b"]
            finally:
                client.close()
    finally:
        first.stop()
        plain.stop()


# -- the example repository's sentiment_pipeline ------------------------------------------------------


def sentiment_answer(client: grpcclient.InferenceServerClient) -> tuple[str, ...]:
    text = grpcclient.InferInput("text", [3, 1], "BYTES")
    text.set_data_from_numpy(np.array([["我爱你".encode()], ["天气不好".encode()], ["景色很不错".encode()]],
                                      dtype=object))
    out = client.infer("sentiment_pipeline", [text], client_timeout=10).as_numpy("prob")
    return tuple(v[0].decode() if isinstance(v[0], bytes) else str(v[0]) for v in out)


def rename_sentiment_tensor(repo: Path, old: str, new: str, *, break_classifier: bool = False) -> None:
    """The tokenizer's output, the classifier's input and the ensemble's mapping renamed in one edit."""
    for name in ("sentiment_tokenizer", "sentiment_classifier", "sentiment_pipeline"):
        for file in ("config.pbtxt", "smoke.json"):
            path = repo / name / file
            path.write_text(path.read_text().replace(f'"{old}"', f'"{new}"'))
    for name in ("sentiment_tokenizer", "sentiment_classifier"):
        model = repo / name / "1" / "model.py"
        text = model.read_text().replace(f'"{old}"', f'"{new}"')
        if break_classifier and name == "sentiment_classifier":
            text = text.replace("def initialize(self, args):", "def initialize(self, args):\n"
                                "        raise RuntimeError('broken classifier')\n", 1)
        model.write_text(text)


@pytest.fixture(scope="module")
def sentiment_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    base = tmp_path_factory.mktemp("sentiment-set")
    repo = base / "repo"
    repo.mkdir()
    for name in ("sentiment_tokenizer", "sentiment_classifier", "sentiment_pipeline"):
        copy_example(name, repo)
    proc = DaemonProcess(repo, base / "state", settle_s=0.3).start()
    try:
        wait_for(lambda: proc.model_status("sentiment_pipeline").get("state") == "serving", 120, 0.3,
                 "sentiment_pipeline serving")
        yield proc
    finally:
        assert proc.stop() == 0, proc.log_tail()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sentiment_pipeline_tensor_rename_and_broken_step(sentiment_daemon: DaemonProcess) -> None:
    repo = sentiment_daemon.repository
    url = sentiment_daemon.triton_url()
    client = grpcclient.InferenceServerClient(url)
    try:
        expected = sentiment_answer(client)
    finally:
        client.close()
    assert expected == ("正向", "负面", "正向")
    tokenizer = (repo / "sentiment_tokenizer" / "1" / "model.py").read_text()
    assert '"tokens"' in tokenizer

    since = last_event_id(sentiment_daemon)
    with request_every(url, sentiment_answer) as stats:
        time.sleep(0.3)
        rename_sentiment_tensor(repo, "tokens", "words")
        event = until_the_set_is_over(sentiment_daemon, since, stats, 180)
    assert stats["failed"] == 0 and stats["ok"] > 0, stats["errors"]
    assert event["outcome"] == "deployed", event
    assert set(stats["answers"]) == {expected}
    triton = grpcclient.InferenceServerClient(url)
    try:
        config = triton.get_model_config("sentiment_pipeline", as_json=True)["config"]
        assert config["ensemble_scheduling"]["step"][0]["output_map"] == {"words": "words"}
        assert config["ensemble_scheduling"]["step"][1]["model_name"] == "sentiment_classifier"
    finally:
        triton.close()

    since = last_event_id(sentiment_daemon)
    with request_every(url, sentiment_answer) as stats:
        time.sleep(0.3)
        rename_sentiment_tensor(repo, "words", "pieces", break_classifier=True)
        event = until_the_set_is_over(sentiment_daemon, since, stats, 180)
    assert stats["failed"] == 0 and stats["ok"] > 0, stats["errors"]
    assert event["outcome"] == "rolled_back", event
    assert set(stats["answers"]) == {expected}
    shutil.rmtree(repo / "sentiment_pipeline" / "1" / "__pycache__", ignore_errors=True)


# -- without a server: names, config rewrites, ordering ---------------------------------------------------


def test_private_step_names_are_reserved_and_never_user_models() -> None:
    from controlplane.deploy.plans import private_name
    from controlplane.errors import UsageError
    from controlplane.names import is_private_name, validate_model_name

    name = private_name("a", "3f2a9c1b" + "0" * 56)
    assert name == "a__3f2a9c1b" and is_private_name(name)
    with pytest.raises(UsageError, match="reserves"):
        validate_model_name(name)
    for ok in ("a", "a__b", "bert__large", "x__3f2a9c1", "x__3F2A9C1B"):
        assert validate_model_name(ok) == ok and not is_private_name(ok)


def test_configs_rewritten_for_the_staged_switch() -> None:
    from controlplane.deploy.plans import point_steps, rename_config
    from controlplane.validation.modelconfig import parse_config_text

    step = parse_config_text(rename_config(python_config("a", "x", "t2"), "a__3f2a9c1b"), "config.pbtxt")
    assert step.name == "a__3f2a9c1b" and step.output[0].name == "t2"  # only the model's own name changes
    pipe = parse_config_text(point_steps(PIPE.replace("TENSOR", "t2"), {"a": "a__3f2a9c1b"}), "config.pbtxt")
    assert [s.model_name for s in pipe.ensemble_scheduling.step] == ["a__3f2a9c1b", "b"]
    assert pipe.name == "pipe" and dict(pipe.ensemble_scheduling.step[0].output_map) == {"t2": "m"}


def test_reconcile_order_puts_steps_before_ensembles() -> None:
    from types import SimpleNamespace

    from controlplane.deploy.servingensembles import ServingEnsembles

    configs = {
        "outer": {"platform": "ensemble", "ensemble_scheduling": {"step": [{"model_name": "pipe"},
                                                                           {"model_name": "c"}]}},
        "pipe": {"platform": "ensemble", "ensemble_scheduling": {"step": [{"model_name": "a"},
                                                                          {"model_name": "b"}]}},
        "a": {"backend": "python"}, "b": {"backend": "python"}, "c": {"backend": "python"},
    }
    registry = SimpleNamespace(
        list_models=lambda states: [SimpleNamespace(name=n, active_digest="d" * 64) for n in configs],
        snapshot_content=lambda name, digest: (configs[name], []),
    )
    serving = SimpleNamespace(current=lambda name: None)  # no published tree: every config is looked up
    graph = SimpleNamespace(entry=lambda name: None)  # no recorded source content: the serving configs decide
    ensembles = ServingEnsembles(registry, graph, serving)  # type: ignore[arg-type]
    ordered = ensembles.steps_first(["outer", "pipe", "a", "c", "b"])
    assert ordered.index("pipe") > max(ordered.index("a"), ordered.index("b"))
    assert ordered.index("outer") > max(ordered.index("pipe"), ordered.index("c"))
    assert sorted(ordered) == ["a", "b", "c", "outer", "pipe"]


def test_fleet_hosts_run_a_change_sets_steps_as_one_batch_steps_first() -> None:
    """A fleet host's claimed steps (controlplane/fleet/sets.py): the ones connected through an ensemble
    are one batch in dependency order; a lone step runs before, a lone ensemble after."""
    from types import SimpleNamespace

    from controlplane.fleet import sets
    from controlplane.store.records import Step

    configs = {
        "pipe": {"platform": "ensemble", "ensemble_scheduling": {"step": [{"model_name": "a"},
                                                                          {"model_name": "b"}]}},
        "solo_ens": {"platform": "ensemble", "ensemble_scheduling": {"step": [{"model_name": "x"}]}},
        "a": {"backend": "python"}, "b": {"backend": "python"}, "c": {"backend": "python"},
    }
    registry = SimpleNamespace(get_snapshot=lambda name, digest: SimpleNamespace(config=configs[name]))

    def step(i: int, model: str) -> Step:
        return Step(i, i, "h1", 0, "deploy", "d" * 64, "running", "", model)

    claimed = [step(1, "solo_ens"), step(2, "pipe"), step(3, "b"), step(4, "c"), step(5, "a")]
    batches = [[s.model for s in b] for b in sets.batches(claimed, registry)]  # type: ignore[arg-type]
    assert batches[0] == ["c"] and batches[-1] == ["solo_ens"]
    [pipeline] = [b for b in batches if len(b) > 1]
    assert sorted(pipeline) == ["a", "b", "pipe"] and pipeline[-1] == "pipe"
    assert sets.steps_first(registry, [("pipe", "d"), ("a", "d"), ("b", "d")])[-1] == "pipe"  # type: ignore[arg-type]
    mine = sets.members(registry, [("a", "d")])  # type: ignore[arg-type]
    assert sets.related(registry, mine, [("pipe", "d"), ("c", "d")]) == ["pipe"]  # type: ignore[arg-type]
