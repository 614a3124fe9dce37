"""The web view's pure parts: the timeline drawn from the audit, the config fields a diff changes, the login gate."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from controlplane.api.tokens import Identity
from controlplane.api.web import gate
from controlplane.api.web.pages import prose
from controlplane.api.web.timeline import LANE_REM, MARK_GAP_PCT, STRIP_REM, build_timeline, config_field_changes
from controlplane.errors import PermissionDeniedError
from controlplane.vocab import Role

NOW = datetime(2026, 1, 1, 12, 10, tzinfo=timezone.utc)


def event(i: int, minute: int, action: str, digest: str | None, outcome: str = "ok",
          message: str = "") -> dict[str, Any]:
    return {"id": i, "time": f"2026-01-01T12:{minute:02d}:00Z", "actor": "alice", "action": action, "model": "m",
            "digest": digest, "outcome": outcome, "duration_ms": 5, "message": message, "host": ""}


def version(digest: str, minute: int) -> dict[str, Any]:
    return {"digest": digest, "first_seen": f"2026-01-01T12:{minute:02d}:00Z"}


def test_a_digest_serves_until_the_next_deploy_and_a_failed_deploy_is_a_rollback_mark() -> None:
    events = [event(1, 0, "deploy", "aaa"), event(2, 5, "deploy", "bbb", "rolled_back", "weights missing"),
              event(3, 6, "tag", "aaa"), event(4, 8, "deploy", "ccc")]
    line = build_timeline([version("ccc", 7), version("bbb", 4), version("aaa", 0)], events, NOW)
    bands = {band.digest: band for band in line.bands}
    assert bands["aaa"].segments == [(0.0, 80.0)]  # 12:00 to 12:08 of 12:00-12:10
    assert bands["ccc"].segments == [(80.0, 20.0)] and bands["ccc"].serving_now
    assert bands["bbb"].segments == [] and not bands["bbb"].serving_now
    (mark,) = bands["bbb"].marks
    assert (mark.kind, mark.letter, mark.left) == ("rollback", "R", 50.0)
    assert "weights missing" in mark.title and "by alice" in mark.title
    assert [m.kind for m in bands["aaa"].marks] == ["deploy", "tag"]


def test_a_bake_is_a_mark_on_its_digest_and_a_failed_bakes_rollback_serves_the_previous_again() -> None:
    """docs/bake.md: the bake's end is audited `bake` on the baked digest; its rollback is `rollback`
    `rolled_back` by tritonctl:bake naming the digest that serves again."""
    events = [event(1, 0, "deploy", "aaa"), event(2, 4, "deploy", "bbb"),
              event(3, 5, "bake", "bbb", "failed", "failure ratio 0.21 > 0.01 over 312 requests (66 failed)"),
              {**event(4, 5, "rollback", "aaa", "rolled_back"), "actor": "tritonctl:bake"}]
    line = build_timeline([version("bbb", 3), version("aaa", 0)], events, NOW)
    bands = {band.digest: band for band in line.bands}
    assert bands["bbb"].segments == [(40.0, 10.0)] and not bands["bbb"].serving_now
    assert bands["aaa"].segments == [(0.0, 40.0), (50.0, 50.0)] and bands["aaa"].serving_now
    (bake,) = [m for m in bands["bbb"].marks if m.kind == "bake"]
    assert bake.letter == "B" and "failure ratio 0.21" in bake.title
    assert [m.kind for m in bands["aaa"].marks] == ["deploy", "rollback"]


def test_a_canary_step_is_a_share_of_both_bands_until_the_next_step() -> None:
    """docs/bake.md "Canary steps": the new digest's band carries each step below 100 % with its weight, the
    band of the digest that served before it the rest of the requests, until the next step."""
    events = [event(1, 0, "deploy", "aaa"), event(2, 4, "deploy", "bbb"),
              {**event(3, 4, "canary", "bbb", "ok", "step 1/2: 10% of the requests for 60 s"),
               "actor": "tritonctl:bake"},
              {**event(4, 6, "canary", "bbb", "ok", "step 2/2: 100% of the requests for 60 s"),
               "actor": "tritonctl:bake"},
              {**event(5, 7, "canary", "bbb", "ok", "done at 100% (step 2/2): passed"), "actor": "tritonctl:bake"}]
    line = build_timeline([version("bbb", 3), version("aaa", 0)], events, NOW)
    bands = {band.digest: band for band in line.bands}
    assert bands["bbb"].canary == [(40.0, 20.0, 10)] and bands["aaa"].canary == [(40.0, 20.0, 90)]
    assert [m.letter for m in bands["bbb"].marks if m.kind == "canary"] == ["W", "W", "W"]
    # a canary still at its step now: to the timeline's end
    line = build_timeline([version("bbb", 3), version("aaa", 0)], events[:3], NOW)
    assert {band.digest: band for band in line.bands}["bbb"].canary == [(40.0, 60.0, 10)]


def test_an_unload_ends_the_band_and_a_skip_is_a_quarantine_mark() -> None:
    events = [event(1, 0, "deploy", "aaa"), event(2, 5, "unload", "aaa"), event(3, 6, "skip", "bbb", "invalid")]
    line = build_timeline([version("aaa", 0), version("bbb", 6)], events, NOW)
    bands = {band.digest: band for band in line.bands}
    assert bands["aaa"].segments == [(0.0, 50.0)] and not bands["aaa"].serving_now
    assert [m.kind for m in bands["bbb"].marks] == ["quarantine"]


def test_marks_close_in_time_go_down_a_lane_and_never_cover_the_band() -> None:
    """Issue 57: a deploy and a pin a moment apart drew their D and P on top of each other, and a digest that
    served under a second had marks but no band (the marks hid its strip). Marks closer than MARK_GAP_PCT
    take the next lane; every lane is below the served strip."""
    events = [event(1, 0, "deploy", "aaa"), event(2, 0, "pin", "aaa"), event(3, 0, "tag", "aaa"),
              {**event(4, 5, "deploy", "bbb"), "time": "2026-01-01T12:05:00.100Z"},
              {**event(5, 5, "rollback", "aaa", "rolled_back"), "time": "2026-01-01T12:05:00.900Z",
               "actor": "tritonctl:bake"}]
    line = build_timeline([version("bbb", 4), version("aaa", 0)], events, NOW)
    bands = {band.digest: band for band in line.bands}
    assert [(m.letter, m.lane) for m in bands["aaa"].marks] == [("D", 0), ("P", 1), ("T", 2), ("R", 0)]
    assert bands["aaa"].height == round(STRIP_REM + 3 * LANE_REM, 2)
    assert all(m.top >= STRIP_REM for band in bands.values() for m in band.marks)  # below the strip
    (segment,) = bands["bbb"].segments  # served 0.8 s of ten minutes: a strip of its own all the same
    assert 50.0 <= segment[0] < 50.1 and 0 < segment[1] < 0.5
    for band in bands.values():
        for a in band.marks:
            for b in band.marks:
                assert a is b or a.lane != b.lane or abs(a.left - b.left) >= MARK_GAP_PCT


def test_a_quarantined_digest_has_a_q_mark_where_it_was_quarantined() -> None:
    """The legend lists Q: a digest quarantined by a deploy that rolled back has one (beside the R), at the
    deploy, titled with the quarantine's reason; a bake's rollback quarantines nothing."""
    events = [event(1, 0, "deploy", "aaa"), event(2, 5, "deploy", "bbb", "rolled_back", "weights missing")]
    versions = [{**version("bbb", 4), "quarantined": True, "quarantine_reason": "initialize raised"},
                version("aaa", 0)]
    bands = {band.digest: band for band in build_timeline(versions, events, NOW).bands}
    assert sorted(m.letter for m in bands["bbb"].marks) == ["Q", "R"]
    (q,) = [m for m in bands["bbb"].marks if m.letter == "Q"]
    assert q.left == 50.0 and "initialize raised" in q.title
    assert len({m.lane for m in bands["bbb"].marks}) == 2  # one moment: two lanes


def test_reasons_show_their_quoted_commands_as_code_not_backticks() -> None:
    shown = prose("policy manual; `tritonctl load m` deploys <b>")
    assert "`" not in shown and "<code>tritonctl load m</code>" in shown and "&lt;b&gt;" in shown


def test_changed_config_fields_are_paired_by_name() -> None:
    diff = ("--- a/config.pbtxt\n+++ b/config.pbtxt\n@@ -1,3 +1,4 @@\n name: \"m\"\n-max_batch_size: 4\n"
            "+max_batch_size: 8\n+  max_queue_delay_microseconds: 100\n")
    assert [(c.field, c.a, c.b) for c in config_field_changes(diff)] == [
        ("max_batch_size", "4", "8"), ("max_queue_delay_microseconds", "", "100")]
    assert config_field_changes(None) == []


def test_the_gate_opens_with_a_live_session_cookie_or_the_bearer_token_only() -> None:
    token = "s3cret-token-0123456789"
    sessions = gate.Sessions()
    revoked: set[str] = set()

    def login(credential: str) -> Identity:  # the Authenticator's part the gate uses
        if credential != token or credential in revoked:
            raise PermissionDeniedError("missing or wrong token")
        return Identity("token:default", Role.ADMIN, "token")

    def scope(path: str = "/ui/", **headers: str) -> dict[str, Any]:
        return {"path": path, "headers": [(k.encode(), v.encode()) for k, v in headers.items()]}

    assert gate.allowed(scope(), None, sessions)  # a loopback view without login
    assert not gate.allowed(scope(), login, sessions)
    assert gate.allowed(scope("/ui/login"), login, sessions)
    assert gate.allowed(scope("/ui/static/web.css"), login, sessions)
    first, second = sessions.open(token), sessions.open(token)
    assert first != second and token not in first and len(first) >= 40  # random, not derived from the token
    assert gate.allowed(scope(cookie=f"a=b; tritonctl_web={first}"), login, sessions)
    assert not gate.allowed(scope(cookie=f"tritonctl_web={'0' * 43}"), login, sessions)
    assert not gate.allowed(scope(cookie=f"tritonctl_web={token}"), login, sessions)  # the cookie is not the token
    sessions.end(first)  # logout: the same cookie opens nothing from now on
    assert not gate.allowed(scope(cookie=f"tritonctl_web={first}"), login, sessions)
    assert gate.allowed(scope(cookie=f"tritonctl_web={second}"), login, sessions)
    assert gate.allowed(scope(authorization=f"Bearer {token}"), login, sessions)
    assert not gate.allowed(scope(authorization="Bearer nope"), login, sessions)
    revoked.add(token)  # the token revoked: its session ends at the next request
    assert not gate.allowed(scope(cookie=f"tritonctl_web={second}"), login, sessions)
    assert not sessions.valid(second)
    header = gate.cookie_header(second, secure=True)
    assert "HttpOnly" in header and "SameSite=Strict" in header and "Secure" in header
    assert "Max-Age" not in header and token not in header  # gone with the browser; expired by the server


def test_a_session_expires_after_its_lifetime() -> None:
    now = [1000.0]
    sessions = gate.Sessions(lifetime_s=60, clock=lambda: now[0])
    session = sessions.open("credential")
    now[0] += 59
    assert sessions.valid(session)
    now[0] += 1
    assert not sessions.valid(session)


def test_wrong_tokens_make_a_client_wait_longer_each_time() -> None:
    now = [0.0]
    throttle = gate.LoginThrottle(clock=lambda: now[0])
    for _ in range(gate.FREE_FAILURES):
        assert throttle.wait_s("10.0.0.1") == 0
        throttle.failed("10.0.0.1")
    assert throttle.wait_s("10.0.0.1") == 1.0 and throttle.wait_s("10.0.0.2") == 0  # per client
    throttle.failed("10.0.0.1")
    assert throttle.wait_s("10.0.0.1") == 2.0
    for _ in range(20):
        throttle.failed("10.0.0.1")
    assert throttle.wait_s("10.0.0.1") == gate.MAX_WAIT_S
    now[0] += gate.FAILURES_FORGOTTEN_S + 1
    assert throttle.wait_s("10.0.0.1") == 0
    throttle.failed("10.0.0.3")
    throttle.succeeded("10.0.0.3")
    assert throttle.wait_s("10.0.0.3") == 0


def test_the_view_answers_only_to_the_host_names_of_its_address() -> None:
    def ok(bound: str, host: str, configured: str | None = None) -> bool:
        check = gate.HostCheck(None, bound, configured)  # type: ignore[arg-type]
        return gate.host_allowed({"headers": [(b"host", host.encode())]}, check.names, check.any_ip)

    for host in ("localhost", "localhost:8080", "127.0.0.1:8080", "127.0.0.1", "[::1]:8080", "[::1]", "LocalHost."):
        assert ok("127.0.0.1", host) and ok("::1", host), host
    for host in ("attacker.example", "attacker.example:8080", "127.0.0.2:8080", "localhost.attacker.example",
                 "10.1.2.3:8080", ""):
        assert not ok("127.0.0.1", host), host
    assert ok("10.1.2.3", "10.1.2.3:8080") and not ok("10.1.2.3", "localhost:8080")
    assert not ok("10.1.2.3", "view.example.com") and ok("10.1.2.3", "view.example.com:443", "view.example.com")
    assert ok("0.0.0.0", "10.9.8.7:80") and ok("0.0.0.0", "localhost") and not ok("0.0.0.0", "attacker.example")
    assert not gate.host_allowed({"headers": []}, frozenset({"localhost"}), False)  # no Host: refused
    two = {"headers": [(b"host", b"localhost"), (b"host", b"attacker.example")]}
    assert not gate.host_allowed(two, frozenset({"localhost"}), False)


def test_a_non_loopback_web_address_needs_the_token_and_tls_or_the_insecure_switch(tmp_path: Any) -> None:
    """The listener's rules, checked before anything binds (a non-loopback address cannot be bound here)."""
    import os
    from dataclasses import replace

    import pytest

    from controlplane import errors
    from controlplane.api.server import ApiServer
    from controlplane.settings.config import Settings

    token = tmp_path / "token"
    token.write_text("a-token-of-some-length")
    os.chmod(token, 0o600)
    server = object.__new__(ApiServer)  # only the settings: the checks run before the app or a socket
    server.settings, server.tokens, server._authenticator = Settings(state_dir=tmp_path), None, None  # no registry
    with pytest.raises(errors.ConfigError, match=r"^web_address: 192\.0\.2\.1:8080 needs a login: personal tokens"):
        server._start_web("192.0.2.1:8080")
    server.settings, server._authenticator = replace(server.settings, token_file=token), None
    with pytest.raises(errors.ConfigError, match=r"^web_address: 192\.0\.2\.1:8080 is not a loopback address: "
                                                 r"give tls_cert and tls_key"):
        server._start_web("192.0.2.1:8080")
    server.settings, server._authenticator = replace(server.settings, web_require_token=True, token_file=None), None
    with pytest.raises(errors.ConfigError, match="needs a login"):  # loopback, but a login is asked for
        server._start_web("127.0.0.1:8080")


def test_a_status_page_holds_the_rows_full_status_would_show_there(tmp_path: Any, triton: Any) -> None:
    """ControlPlane.status_page (the overview): cut in SQL, yet each page's rows are the same as the
    full `status` filtered and cut; past the last page is the last page; a sync filter is applied to every
    model's status. A real tritonserver (the session's) answers the repository index."""
    from dataclasses import asdict

    from controlplane.control_plane import ControlPlane
    from controlplane.deploy.publish import ServingRepository
    from controlplane.parts import build_parts
    from controlplane.settings.config import Settings
    from controlplane.snapshot import ContentStore
    from controlplane.store import migrate
    from controlplane.store.registry import Registry
    from controlplane.triton.client import TritonClient

    state = tmp_path / "state"
    state.mkdir()
    registry = Registry(f"sqlite:///{state / 'registry.db'}")
    migrate.upgrade(registry)
    for i in range(230):
        registry.ensure_model(f"m{i:03d}")
        if i % 10 == 0:
            registry.update_model(f"m{i:03d}", state="unloaded")
        if i % 3 == 0:
            registry.record_snapshot(f"m{i:03d}", f"{i:064x}", "{}", config=None, versions=[1], served_versions=[1],
                                     valid=i % 2 == 0, problems=[], total_bytes=1)
    triton_client = TritonClient(triton.grpc_url)
    settings = Settings(state_dir=state, policy="manual")
    serving = ServingRepository(state / "serving", state / "published")
    plane = ControlPlane(build_parts(settings, registry, ContentStore(state / "store"), serving, triton_client))
    try:
        every = plane.status().models

        def rows(result: Any) -> list[dict[str, Any]]:
            return [asdict(row) for row in result.status.models]

        second = plane.status_page(page=2, size=100)
        assert (second.total, second.page, second.pages) == (230, 2, 3)
        assert rows(second) == [asdict(r) for r in every[100:200]]
        assert second.status.triton_reachable and second.states == ["new", "unloaded"]
        last = plane.status_page(page=9, size=100)
        assert last.page == 3 and rows(last) == [asdict(r) for r in every[200:]]
        named = plane.status_page(name="M1", state="unloaded", size=100)
        assert [r["model"] for r in rows(named)] == [f"m1{i}0" for i in range(10)] and named.total == 10
        for sync in ("pending", "invalid", "held"):
            wanted = [asdict(r) for r in every if r.sync == sync and "2" in r.model]
            page = plane.status_page(sync=sync, name="2", size=100)
            assert wanted and rows(page) == wanted[:100] and page.total == len(wanted)
    finally:
        triton_client.close()
        registry.close()


def test_web_host_names_take_a_list_or_commas_and_refuse_a_port_in_one_line(tmp_path: Any) -> None:
    import pytest

    from controlplane import errors
    from controlplane.settings.config import load_settings

    config = tmp_path / "tritonctl.toml"
    config.write_text('web_host_names = ["View.Example.com.", "[2001:db8::1]"]\n')
    assert load_settings({}, config_file=config, env={}).web_host_names == "view.example.com,2001:db8::1"
    assert load_settings({"web_host_names": "a.example, b.example"}, env={}).web_host_names == "a.example,b.example"
    with pytest.raises(errors.ConfigError, match=r"web_host_names: .*without ports"):
        load_settings({"web_host_names": "view.example.com:8080"}, env={})


def test_a_shadow_is_a_share_of_none_on_the_new_band_until_its_end_then_its_steps() -> None:
    """docs/bake.md "Shadow": from its begin line to its end the new digest got copies only (0 %), the previous
    digest every request; then the first canary step splits them."""
    events = [event(1, 0, "deploy", "aaa"), event(2, 4, "deploy", "bbb"),
              {**event(3, 4, "shadow", "bbb", "ok", "shadow of bbb: a copy of 1 of the live requests for 60 s"),
               "actor": "tritonctl:bake"},
              {**event(4, 6, "shadow", "bbb", "ok", "passed: agreement 1.00 over 40 pairs"), "actor": "tritonctl:bake"},
              {**event(5, 6, "canary", "bbb", "ok", "step 1/2: 10% of the requests for 60 s"),
               "actor": "tritonctl:bake"}]
    line = build_timeline([version("bbb", 3), version("aaa", 0)], events, NOW)
    bands = {band.digest: band for band in line.bands}
    assert bands["bbb"].canary == [(40.0, 20.0, 0), (60.0, 40.0, 10)]
    assert bands["aaa"].canary == [(40.0, 20.0, 100), (60.0, 40.0, 90)]
    assert [m.letter for m in bands["bbb"].marks if m.kind == "shadow"] == ["S", "S"]


def test_the_model_page_shows_the_shadows_figures_and_first_disagreements() -> None:
    from controlplane.api.web.pages import make_templates

    shadow = {"state": "rolled_back", "seconds_left": None, "copied": 21, "pairs": 20, "agreed": 19, "disagreed": 1,
              "agreement": 0.95, "min_agreement": 1.0, "errors": {"shadow": 0, "serving": 0}, "latency_ratio": 1.1,
              "reason": "shadow agreement 0.95 < 1 over 20 pairs (1 disagreed)",
              "disagreements": [{"kind": "value", "output": "gen", "index": 3, "serving": 1.0, "shadow": 2.0,
                                 "inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 1], "data": [0.93],
                                             "truncated": False}]},
                                {"kind": "error", "serving": "OK", "shadow": "INTERNAL: boom"}]}
    row = {"model": "m", "state": "serving", "sync": "synced", "sync_reason": "", "digest": "b" * 64, "since": None,
           "policy": "auto", "pinned": False, "last_error": None, "shadow": shadow}
    html = make_templates().env.get_template("_model_live.html").render(
        row=row, versions=[], events=[], timeline=build_timeline([], [], NOW), now=NOW.isoformat())
    assert "Shadow <span class=\"badge\">rolled_back</span>" in html and "agreement 0.95, at least 1.0" in html
    assert "<td>gen</td><td>3</td>" in html and "<code>x</code> FP32 [1, 1]: 0.93" in html
    assert "INTERNAL: boom" in html and "not kept (shadow_keep_inputs)" in html
    row["shadow"] = None
    assert "Shadow" not in make_templates().env.get_template("_model_live.html").render(
        row=row, versions=[], events=[], timeline=build_timeline([], [], NOW), now=NOW.isoformat())
