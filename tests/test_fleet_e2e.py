"""The fleet end to end: one PostgreSQL, four `tritonctl daemon --fleet` processes on loopback, each
with its own launched tritonserver and state directory, one source repository and one shared store.

In order (one fleet for the module, the tests build on each other):
- an edit in the source repository ends up served on all four hosts, canary first;
- a broken version stops at the canary, never reaches the other hosts, the canary is back on the good
  version, and request loops against all four hosts see 0 failures throughout;
- `tritonctl load --digest` on any host rolls out to all four, printing each host's step live;
- (slow) a failure in a later wave rolls back the canary and the wave's other host too;
- the leader is killed and another daemon leads in under 10 s (and the fleet still rolls out);
- a host SIGKILLed during a rollout is skipped within 2 s (its PostgreSQL session ended), keeps
  serving, and converges to the fleet's version after it restarts and adopts its tritonserver.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as grpcclient

from tests import browser
from tests.harness import DaemonProcess, infer_gen, request_loop, wait_for, write_gen_model
from tests.pg import PostgresServer

HOSTS = ["h1", "h2", "h3", "h4"]
MODEL = "fleetmodel"
WEB_HOST = "h1"  # serves the web view (its Fleet page is checked in a browser while h3 is held)


class Fleet:
    def __init__(self, base: Path, url: str) -> None:
        self.base = base
        self.url = url
        self.repo = base / "repo"
        self.repo.mkdir()
        self.shared = base / "shared"
        self.daemons: dict[str, DaemonProcess] = {}
        self.clients: dict[str, grpcclient.InferenceServerClient] = {}

    def daemon(self, host: str) -> DaemonProcess:
        if host not in self.daemons:
            self.daemons[host] = DaemonProcess(
                self.repo, self.base / f"state-{host}", settle_s=0.2,
                extra_args=["--fleet", "--db-url", self.url, "--host", host, "--shared-store", str(self.shared),
                            "--wave-size", "2", *(["--web-address", "127.0.0.1:0"] if host == WEB_HOST else [])])
        return self.daemons[host]

    def start(self, host: str, wait: bool = True) -> DaemonProcess:
        proc = self.daemon(host).start(wait=wait)
        if wait:
            self.connect(host)
        return proc

    def connect(self, host: str) -> None:
        old = self.clients.pop(host, None)
        if old is not None:
            old.close()
        self.clients[host] = grpcclient.InferenceServerClient(self.daemons[host].triton_url())

    def gen(self, host: str) -> float | None:
        try:
            return infer_gen(self.clients[host], MODEL)
        except Exception:  # noqa: BLE001 - not loaded (yet)
            return None

    def wait_gen(self, gen: int, hosts: list[str], timeout_s: float = 60.0) -> None:
        wait_for(lambda: all(self.gen(h) == gen for h in hosts), timeout_s, 0.1,
                 f"generation {gen} on {hosts} (now {[self.gen(h) for h in hosts]})")

    def settled(self, timeout_s: float = 20.0) -> dict[str, Any]:
        """Wait until the model's rollout is over and every host reports the fleet's target; its row."""
        def row() -> Any:
            rows = [m for m in self.cli_json("status", "--fleet")["models"] if m["model"] == MODEL]
            if not rows or sorted(rows[0]["hosts"]) != HOSTS or self.cli_json("rollouts", "--open"):
                return None
            return rows[0] if all(not cell["drift"] for cell in rows[0]["hosts"].values()) else None

        return dict(wait_for(row, timeout_s, 0.2, "the fleet settled on one digest"))

    def cli_json(self, *args: str) -> Any:
        """The CLI in-process (click's CliRunner: the same code path without an interpreter start-up)."""
        from click.testing import CliRunner

        from cli.main import cli

        result = CliRunner().invoke(cli, [*args, "--db-url", self.url, "--json"])
        if result.exit_code != 0:
            raise AssertionError(f"{' '.join(args)} exited {result.exit_code}: {result.output}")
        return json.loads(result.stdout)

    def leader(self) -> str | None:
        for row in self.cli_json("hosts"):
            if row["leader"]:
                return str(row["host"])
        return None

    def stop_all(self) -> None:
        for client in self.clients.values():
            client.close()
        for proc in self.daemons.values():  # all at once: each waits for its own tritonserver
            if proc.proc is not None and proc.proc.poll() is None:
                proc.proc.send_signal(signal.SIGTERM)
        for proc in self.daemons.values():
            proc.stop()


@contextmanager
def running_fleet(base: Path, url: str, hosts: list[str],
                  configure: Callable[[Fleet], None] | None = None) -> Iterator[Fleet]:
    """The hosts' daemons started together (each launching its tritonserver), ready and connected; all
    stopped on leaving (the fleet e2e files' fixtures). `configure(fleet)` runs first: models to write,
    each host's extra arguments and environment (`fleet.daemon(host)`)."""
    fl = Fleet(base, url)
    try:
        if configure is not None:
            configure(fl)
        for host in hosts:
            fl.start(host, wait=False)
        for host in hosts:
            fl.daemons[host].wait_ready()
            fl.connect(host)
        yield fl
    finally:
        fl.stop_all()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, postgres: PostgresServer) -> Iterator[Fleet]:
    with running_fleet(tmp_path_factory.mktemp("fleet"), postgres.new_database("fleet"), HOSTS) as fl:
        yield fl


def steps_of(fleet: Fleet, digest: str) -> list[dict[str, Any]]:
    rollouts = [r for r in fleet.cli_json("rollouts") if r["digest"] == digest]
    return rollouts[0]["steps"] if rollouts else []


def test_an_edit_is_served_on_every_host_canary_first(fleet: Fleet) -> None:
    write_gen_model(fleet.repo, MODEL, 1)
    fleet.wait_gen(1, HOSTS, 90)
    write_gen_model(fleet.repo, MODEL, 2)
    started = time.monotonic()
    fleet.wait_gen(2, HOSTS, 60)
    elapsed = time.monotonic() - started
    digest = fleet.settled()["target"]
    steps = steps_of(fleet, digest)
    canary = [s for s in steps if s["wave"] == 0]
    assert [s["host"] for s in canary] == ["h1"] and all(s["state"] == "ok" for s in steps)
    first_other = min(s["started_at"] for s in steps if s["wave"] > 0)
    assert canary[0]["finished_at"] <= first_other, "the other hosts start only after the canary is verified"
    print(f"rollout of an edit to 4 hosts: {elapsed:.1f}s")


def test_a_broken_version_stops_at_the_canary_with_no_failed_requests(fleet: Fleet) -> None:
    good = fleet.settled()["target"]
    with ExitStack() as stack:
        loops = {h: stack.enter_context(request_loop(fleet.daemons[h].triton_url(), MODEL, threads=1)) for h in HOSTS}
        write_gen_model(fleet.repo, MODEL, 3, init="raise RuntimeError('weights missing')")

        def rolled_back() -> Any:
            return [r for r in fleet.cli_json("rollouts") if r["state"] == "rolled_back"]

        [rollout] = wait_for(rolled_back, 60, 0.3, "the rollout rolled back")
        time.sleep(1.0)
    for host, stats in loops.items():
        assert stats["failed"] == 0, (host, stats["errors"])
        assert stats["ok"] > 0 and set(stats["gens"]) == {2.0}, (host, stats["gens"])
    deploys = [s for s in rollout["steps"] if s["action"] == "deploy"]
    assert [(s["host"], s["state"]) for s in deploys if s["wave"] == 0] == [("h1", "failed")]
    assert all(s["state"] == "skipped" for s in deploys if s["wave"] > 0)
    assert "weights missing" in rollout["error"]
    for host in HOSTS:
        assert fleet.gen(host) == 2.0
    versions = fleet.cli_json("versions", MODEL)
    bad = [v for v in versions if v["quarantined"]]
    assert len(bad) == 1 and bad[0]["digest"] == rollout["digest"]
    assert fleet.cli_json("status", "--fleet")["models"][0]["target"] == good
    # The fix rolls out normally.
    write_gen_model(fleet.repo, MODEL, 4)
    fleet.wait_gen(4, HOSTS, 60)


def test_audit_answers_per_host(fleet: Fleet) -> None:
    target = fleet.settled()["target"]
    at = fleet.cli_json("audit", "--at", "0s")
    served = {(m["model"], m["host"]): m["digest"] for m in at["models"]}
    assert {host: served.get((MODEL, host)) for host in HOSTS} == dict.fromkeys(HOSTS, target)
    events = fleet.cli_json("audit", "--model", MODEL, "--limit", "500")
    assert {e["host"] for e in events if e["action"] == "deploy"} == set(HOSTS)
    # The human-readable views render too.
    d = fleet.daemons["h1"]
    hosts = d.cli("hosts", "--db-url", fleet.url).stdout
    assert all(h in hosts for h in HOSTS) and "yes" in hosts
    matrix = d.cli("status", "--fleet", "--db-url", fleet.url).stdout
    assert MODEL in matrix and all(h in matrix for h in HOSTS)
    assert "canary" in d.cli("rollouts", "--db-url", fleet.url, "--limit", "1").stdout
    table = d.cli("audit", "--db-url", fleet.url, "--at", "0s").stdout
    assert "Host" in table and "h4" in table


def test_hosts_and_rollouts_are_api_resources_on_every_host(fleet: Fleet) -> None:
    from controlplane.api.client import ControlClient

    for host in ("h1", "h3"):
        client = ControlClient(socket=fleet.daemons[host].state_dir / "tritonctl.sock")
        hosts = client.call("GET", "/hosts")
        assert {(h["host"], h["leader"]) for h in hosts} == {(h["host"], h["leader"]) for h in fleet.cli_json("hosts")}
        assert [r["id"] for r in client.call("GET", "/rollouts?limit=5")] == [
            r["id"] for r in fleet.cli_json("rollouts", "--limit", "5")]


def test_load_on_any_host_rolls_out_to_the_fleet_with_live_progress(fleet: Fleet) -> None:
    versions = fleet.cli_json("versions", MODEL)
    current = next(v["digest"] for v in versions if v["active"])
    older = [v["digest"] for v in versions if not v["active"] and not v["quarantined"]][0]
    out = fleet.daemons["h3"].cli("load", MODEL, "--digest", older[:12]).stdout
    lines = out.splitlines()
    canary = next(i for i, line in enumerate(lines) if "canary h1" in line and "ok" in line)
    waves = [i for i, line in enumerate(lines) if "wave " in line and " ok " in line]
    assert len(waves) == 3 and min(waves) > canary, out
    assert all(fleet.gen(h) is not None for h in HOSTS)
    assert len({fleet.gen(h) for h in HOSTS}) == 1
    assert fleet.cli_json("status", "--fleet")["models"][0]["target"] == older
    fleet.daemons["h2"].cli("load", MODEL, "--digest", current[:12])
    fleet.wait_gen(4, HOSTS, 30)


def test_fleet_verbs_act_on_every_host_and_a_host_local_action_is_held(fleet: Fleet) -> None:
    """`rollback` through any host rolls the fleet back (canary, waves, 0 failed requests, audited with
    actor and host); `rollback --host h3` acts on h3 alone, which the fleet then shows held and does
    not converge back, until `unpin --host h3`."""
    current = fleet.settled()["target"]
    with ExitStack() as stack:
        loops = {h: stack.enter_context(request_loop(fleet.daemons[h].triton_url(), MODEL, threads=1)) for h in HOSTS}
        out = fleet.daemons["h2"].cli("rollback", MODEL).stdout
        previous = fleet.settled()["target"]
        assert previous != current
        gens = {fleet.gen(h) for h in HOSTS}
        assert len(gens) == 1 and gens != {4.0}, gens
        lines = out.splitlines()
        canary = next(i for i, line in enumerate(lines) if "canary h1" in line and "ok" in line)
        assert [i for i, line in enumerate(lines) if "wave " in line and " ok " in line][0] > canary, out
        # One host alone, back to the current version: held, not converged back.
        fleet.daemons["h3"].cli("rollback", MODEL, "--to", current[:12], "--host", "h3")
        assert fleet.gen("h3") == 4.0
        held_since = time.monotonic()
        if browser.available() is None:  # the web view's Fleet page shows it (chromium: .ci/install-test-deps)
            fleet_page_shows_held_host(fleet, "h3", current, previous)
        time.sleep(max(0.0, 5.0 - (time.monotonic() - held_since)))  # more than two converge periods
        assert fleet.gen("h3") == 4.0 and {fleet.gen(h) for h in HOSTS if h != "h3"} == gens
        cell = fleet.cli_json("status", "--fleet")["models"][0]["hosts"]["h3"]
        assert cell["state"] == "held" and cell["held"] and cell["digest"] == current
        assert "held" in fleet.daemons["h1"].cli("status", "--fleet", "--db-url", fleet.url).stdout
        refused = fleet.daemons["h3"].cli("pin", MODEL, "--host", "h1", check=False)
        assert refused.returncode == 2 and "this daemon is host 'h3'" in refused.stderr
        # Released, it converges to the fleet's target.
        fleet.daemons["h3"].cli("unpin", MODEL, "--host", "h3")
        fleet.wait_gen(next(iter(gens)), HOSTS, 30)  # type: ignore[arg-type]
    for host, stats in loops.items():
        assert stats["failed"] == 0, (host, stats["errors"])
    events = fleet.cli_json("audit", "--model", MODEL, "--limit", "500")
    assert any(e["action"] == "rollback" and e["host"] == "h2" and e["actor"] for e in events)
    assert any(e["action"] == "hold" and e["host"] == "h3" for e in events)
    fleet.daemons["h1"].cli("load", MODEL, "--digest", current[:12])
    fleet.wait_gen(4, HOSTS, 30)
    fleet.settled()


def fleet_page_shows_held_host(fleet: Fleet, held: str, held_digest: str, target: str) -> None:
    """/ui/fleet on WEB_HOST in headless chromium: `held` is held on `held_digest`, every other host serves
    the fleet's `target`; the newest rollout (the fleet's rollback) shows its canary wave first; no console
    error. Screenshot: results/web/test_fleet_page_held.png (docs/web.md)."""
    import re

    log = fleet.daemons[WEB_HOST].log_path
    url = wait_for(lambda: re.search(r"web view: (http://127\.0\.0\.1:\d+)/ui/", log.read_text()), 10,
                   what="the web view's address").group(1)
    chrome = browser.start(fleet.base / "chromium-profile")
    try:
        def words() -> dict[str, str]:
            chrome.get(f"{url}/ui/fleet")
            return dict(chrome.execute_script(
                "return Object.fromEntries([...document.querySelectorAll(arguments[0])]"
                ".map(td => [td.dataset.host, td.dataset.word]))", f'#matrix tr[data-model="{MODEL}"] td[data-host]'))

        expected = {h: "held" if h == held else "target" for h in HOSTS}
        wait_for(lambda: words() == expected, 10, 0.3, f"the Fleet page showing {held} held")
        cell = browser.text(chrome, f'#matrix tr[data-model="{MODEL}"] td[data-host="{held}"] code')
        assert cell == held_digest[:12]
        assert target[:12] in browser.text(chrome, f'#matrix tr[data-model="{MODEL}"] td:nth-of-type(1)')
        assert browser.text(chrome, "nav a[href='/ui/fleet']") == "Fleet"
        assert chrome.execute_script(
            "return [...document.querySelectorAll('#hosts tbody tr')].map(r => r.dataset.host)") == HOSTS
        waves = chrome.execute_script("return [...document.querySelectorAll('#rollouts tbody tr:first-child li')]"
                                      ".map(li => li.textContent.replace(/\\s+/g, ' ').trim())")
        assert waves[0] == "canary: h1 ok", waves
        assert all(f"{h} ok" in " ".join(waves) for h in HOSTS if h != held), waves
        browser.screenshot(chrome, "test_fleet_page_held")
        assert browser.console_errors(chrome) == []
    finally:
        chrome.quit()


@pytest.mark.slow
def test_a_failure_in_a_later_wave_rolls_back_every_host_that_took_it(fleet: Fleet) -> None:
    """Canary h1 and h2 take the new version, h3 (same wave as h2) fails: h1 and h2 go back to the
    previous version, h4 never sees it, and no request fails anywhere.

    It starts from generation 4 serving everywhere: what the tests before it leave in the full suite
    (then this write changes nothing), and what `pytest -m slow` (this test alone on a new fleet) rolls
    out first."""
    write_gen_model(fleet.repo, MODEL, 4)
    fleet.wait_gen(4, HOSTS, 90)
    before = fleet.settled(60)["target"]
    only_h3 = "import os\n        if 'state-h3' in args['model_repository']:\n            raise RuntimeError('h3 disk')"
    with ExitStack() as stack:
        loops = {h: stack.enter_context(request_loop(fleet.daemons[h].triton_url(), MODEL, threads=1)) for h in HOSTS}
        write_gen_model(fleet.repo, MODEL, 40, init=only_h3)
        [rollout] = wait_for(lambda: [r for r in fleet.cli_json("rollouts", "--limit", "1")
                                      if r["state"] == "rolled_back"], 60, 0.3, "rolled back")
        time.sleep(0.5)
    steps = {(s["host"], s["action"]): s["state"] for s in rollout["steps"]}
    assert steps == {("h1", "deploy"): "ok", ("h2", "deploy"): "ok", ("h3", "deploy"): "failed",
                     ("h4", "deploy"): "skipped", ("h1", "rollback"): "ok", ("h2", "rollback"): "ok"}
    assert "h3 disk" in rollout["error"]
    for host, stats in loops.items():
        assert stats["failed"] == 0, (host, stats["errors"])
    assert 40.0 not in loops["h4"]["gens"] and 40.0 not in loops["h3"]["gens"]
    assert 40.0 in loops["h1"]["gens"]  # the canary did serve it, until the fleet rolled back
    fleet.wait_gen(4, HOSTS, 10)
    assert fleet.settled()["target"] == before


def test_the_leader_killed_another_leads_within_10s(fleet: Fleet) -> None:
    """SIGKILL the leader under a request loop: its tritonserver keeps serving (0 failed requests),
    another daemon leads, and the restarted daemon adopts the running tritonserver and converges."""
    leader = wait_for(fleet.leader, 10, 0.2, "a leader")
    victim = fleet.daemons[leader]
    url, pid = victim.triton_url(), victim.triton_pid()
    with request_loop(url, MODEL) as stats:
        started = time.monotonic()
        victim.kill()  # SIGKILL: no goodbye, PostgreSQL drops its session
        new = wait_for(lambda: (n := fleet.leader()) not in (None, leader) and n, 10, 0.1, "a new leader")
        assert time.monotonic() - started < 10
        print(f"new leader {new} after {time.monotonic() - started:.1f}s")
        others = [h for h in HOSTS if h != leader]
        write_gen_model(fleet.repo, MODEL, 5)
        fleet.wait_gen(5, others, 60)
        # The old leader's host comes back, adopts its still-serving tritonserver and converges.
        fleet.start(leader)
        fleet.wait_gen(5, HOSTS, 60)
    assert stats["failed"] == 0 and stats["ok"] > 0, stats
    assert victim.triton_url() == url and victim.triton_pid() == pid, "the running tritonserver was adopted"


def test_a_host_killed_during_a_rollout_is_skipped_within_2s_and_converges_after_restart(fleet: Fleet) -> None:
    """SIGKILL the daemon of the last wave once the rollout is under way: PostgreSQL ends its session,
    the leader skips its step within 2 s (not after the 10 s heartbeat window); its tritonserver keeps
    serving, and on restart the daemon adopts it and converges to the fleet's version."""
    from controlplane.store.fleet import FleetStore
    from controlplane.store.registry import Registry

    victim = fleet.daemons["h4"]  # in the last wave
    pid = victim.triton_pid()
    write_gen_model(fleet.repo, MODEL, 6)
    registry = Registry(fleet.url)
    store = FleetStore(registry)
    try:
        [rollout] = wait_for(lambda: store.rollouts(), 20, 0.05, "the rollout under way")
        victim.kill()
        killed = time.monotonic()

        def victim_step() -> str:
            return next(s.state for s in store.rollout(rollout.id).steps if s.host == "h4")

        wait_for(lambda: victim_step() == "skipped", 5, 0.05, "h4's step skipped")
        skipped_after = time.monotonic() - killed
        print(f"killed host skipped after {skipped_after:.2f}s")
        assert skipped_after < 2.0
    finally:
        registry.close()
    others = [h for h in HOSTS if h != "h4"]
    fleet.wait_gen(6, others, 60)
    assert fleet.gen("h4") is not None, "the killed daemon's tritonserver still serves"
    fleet.start("h4")
    fleet.wait_gen(6, HOSTS, 60)
    assert victim.triton_pid() == pid, "one tritonserver for h4: the adopted one"
    fleet.settled()
