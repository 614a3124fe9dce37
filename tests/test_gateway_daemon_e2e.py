"""Switches through the daemon-managed gateway with clients sending throughout (issue 54, "Done when").

One real daemon (`--launch-triton`: the gateway in front of its tritonserver, every digest loaded under its
private name) over a repository the tests edit; gRPC and HTTP clients (tritonclient) ask through the
gateway's ports every few milliseconds while a switch happens (tests/gateway_traffic.py): a deploy, a
rollback (to a digest already unloaded, and to one still draining), a change set (an ensemble and its steps
edited together) and a model whose `version_policy` serves versions 1 and 2, asked for each by number. For
each: 0 failed requests, 0 mixed answers (every answer whole, from the old or the new digest, of the version
asked for), and no answer from the old digest to a request that began once the gateway's route table had
flipped (read over its control socket, a few ms apart). The switch waits out the drain, so the old digest's
unload happens under the clients too.

Then python_backend's example clients through the same gateway (add_sub, the decoupled square model over a
gRPC stream, BLS: a model calling another by name inside tritonserver), and the gateway itself SIGKILLed: the
daemon's supervision starts it again with its routes, and the test measures what the clients lost meanwhile
(docs/gateway.md "The gateway dies").

The daemon switches at once (tests/harness.py SWITCH_AT_ONCE_ENV: canary steps [100], no bake): what is
proved here is the switch itself; canary steps through the gateway are tests/test_canary_e2e.py's.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests import gateway_harness as rig
from tests.gateway_traffic import (
    RouteWatch,
    Sample,
    Traffic,
    control,
    decoupled_square,
    gateway_urls,
    kill_gateway,
    probe_verdict,
    routed_digest,
    write_probe,
)
from tests.harness import DaemonProcess, python_config, python_model, wait_for

DRAIN_S = 2.0  # gateway_drain_s: the old digest answers what was sent before the flip this long, then unloads


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    base = tmp_path_factory.mktemp("gwdaemon")
    repo = base / "repo"
    repo.mkdir()
    proc = DaemonProcess(repo, base / "state", env={"TRITONCTL_GATEWAY_DRAIN_S": str(DRAIN_S)})
    proc.start()
    try:
        yield proc
    finally:
        assert proc.stop() == 0, proc.log_tail()


def serving(daemon: DaemonProcess, model: str, other_than: str | None = None) -> str | None:
    """The digest `model` serves, synced with its source (None: not yet, or still `other_than`)."""
    row = daemon.model_status(model)
    if row.get("state") == "serving" and row.get("sync") == "synced" and row.get("digest") != other_than:
        return str(row["digest"])
    return None


def private_names(daemon: DaemonProcess, model: str) -> set[str]:
    """The private names of `model` published in serving/ (one per digest loaded in tritonserver)."""
    return {p.name for p in (daemon.state_dir / "serving").iterdir() if p.name.startswith(f"{model}__")}


def drained(daemon: DaemonProcess, model: str, digest: str) -> bool:
    """`model` is routed to `digest` and its private name is the only one of `model` left: the old one
    drained and was unloaded (an ensemble's private name is bound to its steps', not its digest's alone)."""
    route = control(daemon.state_dir).routes().routes.get(model)
    target = route.serving() if route is not None else None
    return target is not None and target.digest == digest and private_names(daemon, model) == {target.name}


def until_switched(daemon: DaemonProcess, watch: RouteWatch, model: str, old: str | None,
                   timeout_s: float = 120.0) -> tuple[str, float]:
    """Wait for `model`'s new digest to serve (registry, routes) and the old one to be unloaded; the new
    digest and when the route watch first saw every request routed to it."""
    new = str(wait_for(lambda: serving(daemon, model, old), timeout_s, 0.2, f"{model}: a new digest serving"))
    seen = wait_for(lambda: watch.seen(model, new), 30, 0.05, f"{model}: the gateway routed to {new[:12]}")
    wait_for(lambda: drained(daemon, model, new), 60 + DRAIN_S, 0.2, f"{model}: the old digest unloaded")
    return new, float(seen)


def assert_clean(samples: list[Sample], old: int, new: int, seen: float, what: str) -> None:
    verdict = probe_verdict(samples, old, new, seen)
    assert verdict.ok(), f"{what}: {verdict}"
    assert verdict.old > 0 and verdict.new > 0, f"{what}: the clients did not span the switch: {verdict}"
    for protocol in ("grpc", "http"):
        assert any(s.protocol == protocol and s.began > seen for s in samples), f"{what}: no {protocol} after"


def clients(daemon: DaemonProcess, model: str, **kw: Any) -> Traffic:
    grpc, http = gateway_urls(daemon.state_dir)
    return Traffic(grpc, http, model, **kw)


def warmed(traffic: Traffic, at_least: int = 20) -> None:
    wait_for(lambda: traffic.answered() >= at_least, 60, 0.05, f"{traffic.model}: clients answered")


# -- a switch, and rollbacks ------------------------------------------------------------------------


def test_a_switch_under_grpc_and_http_clients(daemon: DaemonProcess) -> None:
    write_probe(daemon.repository, "probe", 1)
    d1 = str(wait_for(lambda: serving(daemon, "probe"), 90, 0.2, "probe gen 1 serving"))
    assert drained(daemon, "probe", d1) and not (daemon.state_dir / "serving" / "probe").exists()
    with RouteWatch(daemon.state_dir, ("probe",)) as watch, clients(daemon, "probe") as traffic:
        warmed(traffic)
        write_probe(daemon.repository, "probe", 2)
        d2, seen = until_switched(daemon, watch, "probe", d1)
        time.sleep(0.5)
    samples = traffic.samples
    assert_clean(samples, 1, 2, seen, "deploy")
    assert routed_digest(daemon.state_dir, "probe") == d2
    deploy = daemon.audit("--model", "probe", "--action", "deploy", "--limit", "1")[0]
    assert deploy["outcome"] == "ok" and deploy["digest"] == d2 and "in one switch" not in deploy["message"]


def test_rollbacks_reload_an_unloaded_digest_and_flip_back_to_a_draining_one(daemon: DaemonProcess) -> None:
    """`rollback` to the digest before (unloaded after its drain: brought up again under its private name,
    then one flip), then at once `rollback --to` the digest just left (still loaded: a flip alone)."""
    d2 = str(wait_for(lambda: serving(daemon, "probe"), 90, 0.2, "probe serving"))
    d1 = next(v["digest"] for v in daemon.json("versions", "probe") if v["digest"] != d2)
    with RouteWatch(daemon.state_dir, ("probe",)) as watch, clients(daemon, "probe") as traffic:
        warmed(traffic)
        began = time.monotonic()
        daemon.cli("rollback", "probe")
        seen_back = wait_for(lambda: watch.seen("probe", d1, began), 30, 0.05, "routed back to gen 1")
        assert routed_digest(daemon.state_dir, "probe") == d1
        wait_for(lambda: traffic.answered(seen_back) > 20, 30, 0.05, "clients answered by gen 1")
        again = time.monotonic()
        daemon.cli("rollback", "probe", "--to", d2[:12])
        flip_s = time.monotonic() - again
        seen_again = wait_for(lambda: watch.seen("probe", d2, again), 30, 0.05, "routed to gen 2 again")
        wait_for(lambda: drained(daemon, "probe", d2), 60 + DRAIN_S, 0.2, "gen 1 unloaded again")
        time.sleep(0.5)
    samples = traffic.samples
    assert_clean([s for s in samples if s.ended < again], 2, 1, seen_back, "rollback to an unloaded digest")
    assert_clean([s for s in samples if s.began > seen_back], 1, 2, seen_again, "rollback to a draining digest")
    rollbacks = daemon.audit("--model", "probe", "--action", "rollback", "--limit", "2")
    assert [r["digest"] for r in rollbacks] == [d2, d1] and all(r["outcome"] == "ok" for r in rollbacks)
    # the second rollback found gen 2's private name still loaded: a flip, no load (tritonserver's log)
    assert loads(daemon, f"probe__{d2[:8]}") == 1 and loads(daemon, f"probe__{d1[:8]}") == 2
    print(f"rollback to a draining digest: {flip_s:.2f} s for the CLI")


def loads(daemon: DaemonProcess, name: str) -> int:
    """How many times the launched tritonserver loaded `name` (its log)."""
    text = (daemon.state_dir / "triton" / "tritonserver.log").read_text(errors="replace")
    return text.count(f"successfully loaded '{name}'")


# -- a change set ------------------------------------------------------------------------------------

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


def write_pipe(repo: Path, gen: int) -> None:
    """a: x → t<gen> = x + gen; b: t<gen> → y = t<gen> × gen; pipe maps t<gen>. One edit of all three renames
    the tensor between the steps, so the ensemble of one edit cannot run over a step of another, and an
    answer of a's one edit with b's other (old × new, for x = 0) is neither old² nor new²."""
    tensor = f"t{gen}"
    for name, src, dst, expr in (("a", "x", tensor, f"x + {gen}"), ("b", tensor, "y", f"x * {gen}")):
        (repo / name / "1").mkdir(parents=True, exist_ok=True)
        (repo / name / "config.pbtxt").write_text(python_config(name, src, dst))
        (repo / name / "1" / "model.py").write_text(python_model(f"({expr}).astype(np.float32)", src=src, dst=dst))
    (repo / "pipe" / "1").mkdir(parents=True, exist_ok=True)
    (repo / "pipe" / "config.pbtxt").write_text(PIPE.replace("TENSOR", tensor))


def pipe_value(gen: int) -> int:
    """What pipe answers to x = 0 (the clients' input): a gives gen, b gen × gen."""
    return gen * gen


def test_a_change_set_switches_the_ensemble_and_its_steps_in_one_flip(daemon: DaemonProcess) -> None:
    repo = daemon.repository
    write_pipe(repo, 2)
    p1 = str(wait_for(lambda: serving(daemon, "pipe"), 120, 0.2, "pipe gen 1 serving"))
    with RouteWatch(daemon.state_dir, ("a", "b", "pipe")) as watch, clients(daemon, "pipe", output="y") as traffic:
        warmed(traffic)
        hold = repo / ".tritonctl-hold"
        hold.write_text("")
        write_pipe(repo, 3)
        time.sleep(1.0)  # past the settle window: held, one set once the hold goes
        hold.unlink()
        p2, seen = until_switched(daemon, watch, "pipe", p1)
        for step in ("a", "b"):
            wait_for(lambda s=step: drained(daemon, s, str(serving(daemon, s))), 60, 0.2, f"{step}: drained")
        time.sleep(0.5)
    samples = traffic.samples
    failed = [s for s in samples if s.error is not None]
    answers = [s for s in samples if s.answer is not None]
    assert not failed, failed[:3]
    assert {s.answer[0] for s in answers if s.answer} == {pipe_value(2), pipe_value(3)}, "only whole pipelines"
    assert not [s for s in answers if s.answer and s.answer[0] == pipe_value(2) and s.began > seen]
    # one route update moved all three: no read of the route table saw one of them flipped without the others
    first = watch.changes[0][1]
    flips = {m: next(at for at, routes in watch.changes if routes[m][0][0] != first[m][0][0])
             for m in ("a", "b", "pipe")}
    assert len(set(flips.values())) == 1, flips
    event = daemon.audit("--action", "changeset", "--limit", "1")[0]
    assert event["outcome"] == "deployed" and "one switch of the gateway" in event["message"], event
    assert p2 != p1


# -- a version policy --------------------------------------------------------------------------------

POLICY = "version_policy: { specific { versions: [1, 2] } }\n"


def test_a_version_policy_model_answers_each_version_asked_for(daemon: DaemonProcess) -> None:
    """`/v2/models/M/versions/2/infer` (and gRPC's model_version) reach version 2 of the serving digest,
    through a switch of every version at once; version 3 exists in the source and is not served."""
    lanes = (("grpc", "1"), ("grpc", "2"), ("http", "1"), ("http", "2"), ("http", ""))
    write_probe(daemon.repository, "versioned", 1, versions=(1, 2, 3), policy=POLICY, smoke=False)
    v1 = str(wait_for(lambda: serving(daemon, "versioned"), 90, 0.2, "versioned gen 1 serving"))
    assert [v["version"] for v in daemon.model_status("versioned")["versions"]] == ["1", "2"]
    with RouteWatch(daemon.state_dir, ("versioned",)) as watch, \
            clients(daemon, "versioned", lanes=lanes) as traffic:
        warmed(traffic, 40)
        write_probe(daemon.repository, "versioned", 2, versions=(1, 2, 3), policy=POLICY, smoke=False)
        _, seen = until_switched(daemon, watch, "versioned", v1)
        time.sleep(0.5)
    samples = traffic.samples
    assert_clean(samples, 1, 2, seen, "version policy")
    for protocol, version in lanes:
        lane = [s for s in samples if (s.protocol, s.version) == (protocol, version)]
        assert lane and {s.answer[3] for s in lane if s.answer} == {int(version or 2)}, (protocol, version)
    grpc, http = gateway_urls(daemon.state_dir)
    x = httpclient.InferInput("x", [1, 1], "FP32")
    x.set_data_from_numpy(np.zeros((1, 1), dtype=np.float32))
    with httpclient.InferenceServerClient(http) as client:
        with pytest.raises(InferenceServerException) as raised:
            client.infer("versioned", [x], model_version="3")
        assert "versioned" in raised.value.message() and "__" not in raised.value.message()


# -- python_backend's examples -------------------------------------------------------------------------


def write_example(repo: Path, name: str, config: str, code: str) -> None:
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    (repo / name / "config.pbtxt").write_text(config)
    (repo / name / "1" / "model.py").write_text(code)


@pytest.fixture(scope="module")
def examples(daemon: DaemonProcess) -> DaemonProcess:
    """python_backend's add_sub, square_int32 (decoupled) and, once add_sub serves, bls_sync (calls add_sub by
    name inside tritonserver), as tests/gateway_harness.py writes them, deployed by the daemon."""
    repo = daemon.repository
    write_example(repo, "add_sub", rig.config("add_sub", *rig.ADD_SUB_IO), rig.ADD_SUB)
    write_example(repo, "square_int32", rig.config("square_int32", [("IN", "TYPE_INT32", "1")],
                                                   [("OUT", "TYPE_INT32", "1")], decoupled=True), rig.REPEAT)
    for name in ("add_sub", "square_int32"):
        wait_for(lambda n=name: serving(daemon, n), 120, 0.3, f"{name} serving")
    write_bls(repo, "bls_sync")
    wait_for(lambda: serving(daemon, "bls_sync"), 120, 0.3, "bls_sync serving")
    return daemon


def write_bls(repo: Path, name: str) -> None:
    bls_inputs = [*rig.ADD_SUB_IO[0], ("MODEL_NAME", "TYPE_STRING", "1")]
    write_example(repo, name, rig.config(name, bls_inputs, rig.ADD_SUB_IO[1]), rig.BLS)


def add_sub_inputs(a: np.ndarray, b: np.ndarray) -> list[Any]:
    inputs = [httpclient.InferInput("INPUT0", [4], "FP32"), httpclient.InferInput("INPUT1", [4], "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


OUTPUTS = ("OUTPUT0", "OUTPUT1")


def test_add_sub_client_through_the_daemons_gateway(examples: DaemonProcess) -> None:
    """python_backend's add_sub client.py: INPUT0 + INPUT1 and INPUT0 - INPUT1, answered as `add_sub`."""
    _, http = gateway_urls(examples.state_dir)
    a, b = np.random.rand(4).astype(np.float32), np.random.rand(4).astype(np.float32)
    with httpclient.InferenceServerClient(http) as client:
        answer = client.infer("add_sub", add_sub_inputs(a, b), request_id="1",
                              outputs=[httpclient.InferRequestedOutput(o) for o in OUTPUTS])
    assert answer.get_response()["model_name"] == "add_sub" and answer.get_response()["id"] == "1"
    assert np.allclose(answer.as_numpy("OUTPUT0"), a + b) and np.allclose(answer.as_numpy("OUTPUT1"), a - b)


def test_decoupled_square_client_through_the_daemons_gateway(examples: DaemonProcess) -> None:
    """python_backend's decoupled square_int32 client: n answers per request over one gRPC stream."""
    grpc, _ = gateway_urls(examples.state_dir)
    by_id = decoupled_square(grpc)
    assert by_id == {"0": [4] * 4, "1": [2] * 2, "3": [1]}


def bls_answer(daemon: DaemonProcess, caller: str, callee: str) -> Any:
    """python_backend's bls_sync client: `caller` asked to call `callee` by name inside tritonserver; the answer
    must be add_sub's (INPUT0 + INPUT1, INPUT0 - INPUT1)."""
    _, http = gateway_urls(daemon.state_dir)
    a, b = np.random.rand(4).astype(np.float32), np.random.rand(4).astype(np.float32)
    name = httpclient.InferInput("MODEL_NAME", [1], "BYTES")
    name.set_data_from_numpy(np.array([callee], dtype=np.object_))
    with httpclient.InferenceServerClient(http) as client:
        answer = client.infer(caller, [*add_sub_inputs(a, b), name], request_id="1",
                              outputs=[httpclient.InferRequestedOutput(o) for o in OUTPUTS])
    assert np.allclose(answer.as_numpy("OUTPUT0"), a + b) and np.allclose(answer.as_numpy("OUTPUT1"), a - b)
    return answer


def test_bls_client_through_the_daemons_gateway(examples: DaemonProcess) -> None:
    """A model calling `add_sub` by a name from the request, as in the example, so the daemon serves every model
    under its own name too (docs/gateway.md "BLS models"); add_sub's own clients still reach it."""
    assert bls_answer(examples, "bls_sync", "add_sub").get_response()["model_name"] == "bls_sync"
    test_add_sub_client_through_the_daemons_gateway(examples)


def test_a_model_added_after_a_bls_caller_is_callable_by_it(examples: DaemonProcess) -> None:
    """A caller whose callee names are computed at run time may call any model, one added later too: it is
    served under its own name from its first deploy (deploy/aliases.py `in_place`)."""
    write_example(examples.repository, "add_sub_later", rig.config("add_sub_later", *rig.ADD_SUB_IO), rig.ADD_SUB)
    wait_for(lambda: serving(examples, "add_sub_later"), 120, 0.3, "add_sub_later serving")
    deadline = time.monotonic() + 20  # the daemon may set it right a little later: that would do
    while True:
        try:
            bls_answer(examples, "bls_sync", "add_sub_later")
            return
        except InferenceServerException:
            if time.monotonic() > deadline:
                raise
            time.sleep(1.0)


# -- the gateway SIGKILLed ---------------------------------------------------------------------------

KILL_PERIOD_S = 0.02  # each client asks every 20 ms: a client's failed requests ≈ its outage / 20 ms


def test_a_killed_gateway_is_started_again_with_its_routes(daemon: DaemonProcess) -> None:
    """SIGKILL the gateway under gRPC and HTTP clients (a request every 20 ms each): the daemon's supervision
    (every second) starts it again on the same ports with its routes file; the clients' failures are bounded
    by that outage, each is a connection refused / UNAVAILABLE, and none fails once it is back."""
    write_probe(daemon.repository, "steady", 1)
    wait_for(lambda: serving(daemon, "steady"), 90, 0.2, "steady serving")
    seen = kill_gateway(daemon.state_dir, "steady", KILL_PERIOD_S)
    print(f"gateway SIGKILLed: {seen}")
    assert seen["restart_s"] is not None and seen["restart_s"] < 10.0, "supervision runs every second"
    assert seen["same_ports"] and seen["pid_after"] != seen["pid_before"], seen
    assert seen["answers"] == [(1, 1, 1, 1)], "its routes: the same digest answers"
    assert seen["failed_before_the_kill"] == 0 and seen["failed_not_refused"] == [], seen
    for protocol in ("grpc", "http"):  # every failure is in the outage, and none once answered again
        assert seen["failed"][protocol] <= seen["outage_s"][protocol] / KILL_PERIOD_S + 5, (protocol, seen)
    assert sum(seen["failed"].values()) > 0, "the kill was seen by the clients (the test can fail)"
