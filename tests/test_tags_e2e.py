"""Tags end to end (issue 18) against the real daemon and its launched tritonserver: a model tracking `stable`
serves each digest the tag is moved to; a move to content that fails to load is rolled back with 0 failed
requests and the tag stays on what serves; `tags --at T` and `audit --at T` answer for a moment between two
moves; a pinned tracking model is held until unpin; bad names, invalid and collected content are refused
with exit 2; load --tag, rollback --to-tag, diff by tags, versions and status show tags."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import tritonclient.grpc as grpcclient

from tests.harness import DaemonProcess, answers, request_loop, wait_for, write_gen_model

MODEL = "tagged"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    base = tmp_path_factory.mktemp("tags")
    repo = base / "repo"
    repo.mkdir()
    write_gen_model(repo, MODEL, 1)
    proc = DaemonProcess(repo, base / "state").start()
    yield proc
    assert proc.stop() == 0, proc.log_tail()


def _serving(daemon: DaemonProcess, client: grpcclient.InferenceServerClient, gen: int) -> None:
    wait_for(lambda: answers(client, MODEL, gen), 30, 0.05, f"{MODEL} serving generation {gen}")


def _record(daemon: DaemonProcess, gen: int, count: int, **kwargs: str) -> str:
    """Write generation `gen` into the source and wait until it is recorded; its digest."""
    write_gen_model(daemon.repository, MODEL, gen, **kwargs)
    rows = wait_for(lambda: v if len(v := daemon.json("versions", MODEL)) >= count else None, 20,
                    what=f"snapshot {count}")
    return str(rows[0]["digest"])


def _tags(daemon: DaemonProcess, *args: str) -> dict[str, str]:
    return {t["name"]: t["digest"] for t in daemon.json("tags", MODEL, *args)["tags"]}


def test_tracking_stable_serves_each_move_and_a_failed_move_stays(daemon: DaemonProcess) -> None:
    client = grpcclient.InferenceServerClient(daemon.triton_url())
    try:
        _serving(daemon, client, 1)
        g1 = daemon.model_status(MODEL)["digest"]
        daemon.cli("policy", MODEL, "manual")
        g2 = _record(daemon, 2, 2)
        bad = _record(daemon, 3, 3, init="raise RuntimeError('weights missing')")
        g4 = _record(daemon, 4, 4)
        assert answers(client, MODEL, 1)  # manual: recorded, not deployed

        moved = daemon.json("tag", MODEL, "stable")  # default: what serves now
        assert moved["outcome"] == "ok" and moved["digest"] == g1 and moved["deployed"] is False
        assert daemon.json("policy", MODEL, "track:stable")["policy"] == "track:stable"
        row = daemon.model_status(MODEL)
        assert (row["policy"], row["sync"], row["tags"]) == ("track:stable", "synced", ["stable"])

        moved = daemon.json("tag", MODEL, "stable", g2[:10])
        assert moved["outcome"] == "ok" and moved["deployed"] and moved["old_digest"] == g1
        assert answers(client, MODEL, 2)
        assert daemon.model_status(MODEL)["sync"] == "synced"
        time.sleep(1.1)
        between = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        time.sleep(1.1)

        with request_loop(daemon.triton_url(), MODEL) as stats:
            failed = daemon.cli("tag", MODEL, "stable", bad[:10], check=False)
            time.sleep(0.3)
        assert failed.returncode == 1, failed.stderr
        assert stats["failed"] == 0, stats["errors"]
        assert stats["ok"] > 0 and 3.0 not in stats["gens"]
        assert answers(client, MODEL, 2)
        assert _tags(daemon) == {"stable": g2}  # back on the digest that still serves
        events = daemon.audit("--model", MODEL, "--action", "tag")
        assert events[0]["outcome"] == "failed" and events[0]["digest"] == bad
        assert "weights missing" in events[0]["message"]

        assert daemon.json("tag", MODEL, "stable", g4[:10])["outcome"] == "ok"
        _serving(daemon, client, 4)
        assert [e["outcome"] for e in daemon.audit("--model", MODEL, "--action", "tag")] == ["ok", "failed", "ok",
                                                                                          "ok"]

        # History: what each tag pointed to, and what served with which tags, between the moves.
        assert _tags(daemon, "--at", between) == {"stable": g2}
        served = daemon.json("audit", "--at", between, "--model", MODEL)["models"]
        assert [(m["digest"], m["tags"]) for m in served] == [(g2, ["stable"])]

        # Pinned: the tag moves, the model is held on what serves; unpin deploys the tag's digest.
        daemon.cli("pin", MODEL)
        assert daemon.json("tag", MODEL, "stable", g2[:10])["deployed"] is False
        row = daemon.model_status(MODEL)
        assert (row["sync"], row["digest"], row["tags"]) == ("held", g4, []) and answers(client, MODEL, 4)
        daemon.cli("unpin", MODEL)
        _serving(daemon, client, 2)
        wait_for(lambda: daemon.model_status(MODEL)["sync"] == "synced", 10, what="synced on the tag again")
    finally:
        client.close()


def test_tags_everywhere_a_digest_is_accepted(daemon: DaemonProcess) -> None:
    stable = _tags(daemon)["stable"]
    versions = daemon.json("versions", MODEL)
    g1 = versions[-1]["digest"]
    assert daemon.json("tag", MODEL, "canary", g1[:10])["outcome"] == "ok"
    assert {v["digest"]: v["tags"] for v in versions if v["digest"] != stable}.get(g1) == []
    assert {v["digest"]: v["tags"] for v in daemon.json("versions", MODEL)}[g1] == ["canary"]
    diff = daemon.json("diff", MODEL, "stable", "canary")
    assert (diff["a"], diff["b"]) == (stable, g1)

    daemon.cli("policy", MODEL, "manual")  # tracking ends
    assert daemon.json("load", MODEL, "--tag", "canary")["digest"] == g1
    assert daemon.json("rollback", MODEL, "--to-tag", "stable")["digest"] == stable
    assert daemon.run("load", MODEL, "--tag", "nope").exit_code == 2

    # Bad names, invalid and collected content: one line, exit 2.
    for name in ("Stable", "3f2a9c1b", "a" * 64, "with space"):
        result = daemon.cli("tag", MODEL, name, check=False)
        assert result.returncode == 2 and result.stderr.count("\n") == 1, (name, result.stderr)
    (daemon.repository / MODEL / "config.pbtxt").write_text("name: 'tagged'\nbackend: 'python'\nbogus_field: 1\n")
    invalid = str(wait_for(lambda: (v := daemon.json("versions", MODEL))[0]["valid"] is False and v, 20,
                           what="invalid snapshot")[0]["digest"])
    assert "invalid" in daemon.cli("tag", MODEL, "broken", invalid[:10], check=False).stderr
    assert daemon.cli("tag", MODEL, "broken", invalid[:10], check=False).returncode == 2
    gc = daemon.json("gc", "--keep", "0")
    assert gc["snapshots_removed"] >= 2
    after = daemon.json("versions", MODEL)
    kept = {v["digest"]: v["collected"] for v in after}
    assert kept[g1] is False and kept[stable] is False  # tagged content is never collected
    collected = next(v["digest"] for v in after if v["collected"] and v["valid"])
    result = daemon.cli("tag", MODEL, "old", collected[:10], check=False)
    assert result.returncode == 2 and "collected" in result.stderr
    assert daemon.json("tag", MODEL, "canary", "--delete")["outcome"] == "ok"
    assert _tags(daemon) == {"stable": stable}
