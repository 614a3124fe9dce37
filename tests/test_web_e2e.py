"""The web view in a real headless chromium against a real daemon and its launched tritonserver.

One daemon (repository: the `linear` example and a generation model `gen`) serves the view on a
non-loopback `--web-address` (this machine's outgoing interface, or 0.0.0.0 where it has none) in plain
HTTP, which `--allow-insecure-http` must allow (without it the daemon refuses: tests/test_web_view.py);
the browser reaches it there and logs in once through the form, with the daemon's token.
Each test reads the browser's console (no errors) and saves a screenshot under results/web/. Live: an
edit in the source is seen as pending then synced, and a broken edit's rollback mark appears on the
timeline, on a page that was never reloaded (a marker set in the page survives).
"""

from __future__ import annotations

import os
import re
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import pytest

from tests import browser
from tests.harness import DaemonProcess, copy_example, wait_for, write_gen_model

pytestmark = pytest.mark.skipif(browser.available() is not None, reason=str(browser.available()))

TOKEN = "web-view-test-token-0123456789"
NEVER_RELOADED = "window.__neverReloaded = true;"
STILL_THERE = "return window.__neverReloaded === true;"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    base = tmp_path_factory.mktemp("web")
    repo = base / "repo"
    repo.mkdir()
    copy_example("linear", repo)
    write_gen_model(repo, "gen", 1)
    token_file = base / "token"
    token_file.write_text(TOKEN)
    os.chmod(token_file, 0o600)
    # settle 1.5 s: an edit stays `pending` long enough to be seen on the page for sure
    proc = DaemonProcess(repo, base / "state", settle_s=1.5, extra_args=[
        "--web-address", f"{non_loopback_address() or '0.0.0.0'}:0", "--allow-insecure-http",
        "--token-file", str(token_file)]).start()
    yield proc
    assert proc.stop() == 0, proc.log_tail()


def non_loopback_address() -> str | None:
    """This machine's address on its outgoing interface (no packet is sent); None when it has none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: only picks the interface
            address = str(probe.getsockname()[0])
        except OSError:
            return None
    return None if address.startswith("127.") else address


@pytest.fixture(scope="module")
def base_url(daemon: DaemonProcess) -> str:
    found = wait_for(lambda: re.search(r"web view: http://([0-9.]+):(\d+)/ui/ \(log in with a token\)",
                                       daemon.log_path.read_text()), 10, what="the daemon's `web view:` log line")
    host = found.group(1)
    assert not host.startswith("127."), host
    return f"http://{'127.0.0.1' if host == '0.0.0.0' else host}:{found.group(2)}"


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory, base_url: str) -> Iterator[Any]:
    from selenium.webdriver.common.by import By

    chrome = browser.start(tmp_path_factory.mktemp("chromium-profile"))
    try:
        chrome.get(f"{base_url}/ui/")
        chrome.find_element(By.ID, "token").send_keys(TOKEN)
        chrome.find_element(By.CSS_SELECTOR, "form[action='/ui/login'] button").click()
        wait_for(lambda: browser.text(chrome, "#models caption"), 10, what="the overview after logging in")
        yield chrome
    finally:
        chrome.quit()


@pytest.fixture
def page(driver: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    """The logged-in browser; afterwards its screenshot is saved and its console must hold no error."""
    browser.console_errors(driver)
    yield driver
    browser.screenshot(driver, request.node.name)
    assert browser.console_errors(driver) == []


def following_events(driver: Any) -> None:
    """Wait until the page's EventSource on /ui/v1/events is open (the page marks #live data-via)."""
    wait_for(lambda: driver.execute_script("return document.querySelector('#live[data-via=events]') !== null"),
             10, what="the page following /ui/v1/events")


def sync_of(driver: Any, model: str) -> str:
    return browser.text(driver, f'#models tr[data-model="{model}"] td.sync')


def test_overview_lists_models_serving_and_synced(page: Any, base_url: str, daemon: DaemonProcess) -> None:
    page.get(f"{base_url}/ui/")
    for model in ("linear", "gen"):
        wait_for(lambda m=model: sync_of(page, m) == "synced", 30, what=f"{model} synced")
        assert browser.text(page, f'#models tr[data-model="{model}"] td.state') == "serving"
        digest = daemon.model_status(model)["digest"]
        assert digest and digest[:12] in browser.text(page, f'#models tr[data-model="{model}"] code')
    assert "reachable" in browser.text(page, "#triton")
    assert browser.text(page, "#watch-mode") in ("inotify", "poll")
    # not in a fleet: no Fleet page (tests/test_fleet_e2e.py checks it on a fleet), and no link to one
    assert browser.text(page, "nav a[href='/ui/fleet']") == ""
    assert answer(f"{base_url}/ui/fleet", {"authorization": f"Bearer {TOKEN}"}) == 404
    # a filter is a query parameter: the link can be shared, and it narrows the table
    page.get(f"{base_url}/ui/?q=lin&sync=synced")
    rows = page.execute_script("return [...document.querySelectorAll('#models tbody tr')].map(r => r.dataset.model)")
    assert rows == ["linear"]
    # times are shown in the browser's zone with UTC in the title
    page.get(f"{base_url}/ui/models/gen")
    title = page.execute_script("return document.querySelector('#versions time').title")
    assert title.endswith("(UTC)")
    page.get(f"{base_url}/ui/")


def test_edit_shows_pending_then_synced_without_reload(page: Any, base_url: str, daemon: DaemonProcess) -> None:
    page.get(f"{base_url}/ui/")
    wait_for(lambda: sync_of(page, "gen") == "synced", 30, what="gen synced")
    before = daemon.model_status("gen")["digest"]
    following_events(page)
    page.execute_script(NEVER_RELOADED)
    write_gen_model(daemon.repository, "gen", 2)
    wait_for(lambda: sync_of(page, "gen") == "pending", 10, interval_s=0.05, what="gen pending on the page")
    wait_for(lambda: sync_of(page, "gen") == "synced", 60, interval_s=0.05, what="gen synced on the page")
    seen = datetime.now(timezone.utc)
    after = daemon.model_status("gen")["digest"]
    assert after != before
    # within a second of the deploy's audit record (the event the page follows)
    (deployed,) = [e for e in daemon.audit("--model", "gen", "--action", "deploy") if e["digest"] == after]
    lag_s = (seen - datetime.fromisoformat(deployed["time"].replace("Z", "+00:00"))).total_seconds()
    assert lag_s < 1.0, f"the page showed the deploy {lag_s:.2f} s after its audit record"
    assert after[:12] in browser.text(page, '#models tr[data-model="gen"] code')
    assert page.execute_script(STILL_THERE), "the page was reloaded"


def test_broken_edit_shows_rollback_mark_with_reason(page: Any, base_url: str, daemon: DaemonProcess) -> None:
    page.get(f"{base_url}/ui/models/gen")
    following_events(page)
    page.execute_script(NEVER_RELOADED)
    write_gen_model(daemon.repository, "gen", 3, init="raise RuntimeError('weights missing')")
    mark = '#timeline .mark[data-kind="rollback"]'
    wait_for(lambda: page.execute_script(f"return document.querySelector('{mark}') !== null"), 60,
             interval_s=0.1, what="a rollback mark on the timeline")
    title = page.execute_script(f"return document.querySelector('{mark}').title")
    assert "weights missing" in title  # Triton's reason, from the audit
    assert "by " in title  # the actor, on hover
    assert page.execute_script(STILL_THERE), "the page was reloaded"
    # the band of the digest that serves is still the good one
    serving = daemon.model_status("gen")["digest"]
    assert page.execute_script(
        f"return document.querySelector('#timeline tr[data-digest=\"{serving}\"] .badge').textContent") == "serving"
    browser.screenshot(page, "test_model_timeline_rollback")
    # the audit page finds the event by model and outcome, and says what served at a time
    moment = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    page.get(f"{base_url}/ui/audit?model=gen&outcome=rolled_back&at={moment}")
    assert "weights missing" in browser.text(page, "#audit tbody tr td.message")
    assert serving[:12] in browser.text(page, "#serving tbody tr code")


def test_diff_page_shows_changed_config_field(page: Any, base_url: str, daemon: DaemonProcess) -> None:

    config = daemon.repository / "linear" / "config.pbtxt"
    before = daemon.model_status("linear")["digest"]
    config.write_text(config.read_text().replace("max_queue_delay_microseconds: 20000",
                                                 "max_queue_delay_microseconds: 10000"))
    wait_for(lambda: daemon.model_status("linear")["digest"] != before, 60, what="the edit of linear deployed")
    page.get(f"{base_url}/ui/models/linear")
    following_events(page)
    page.execute_script("document.querySelector('#versions a[href*=diff]').click()")  # the link to share
    assert re.search(r"/ui/models/linear/diff\?a=[0-9a-f]{12}&b=[0-9a-f]{12}$", page.current_url)
    fields = page.execute_script("return [...document.querySelectorAll('#fields tbody tr')]"
                                 ".map(r => [...r.children].map(c => c.textContent.trim()))")
    assert ["max_queue_delay_microseconds", "20000", "10000"] in fields
    assert "config.pbtxt" in browser.text(page, "#files")


LAYOUT = """
return [...document.querySelectorAll('#timeline tbody tr')].map(function (row) {
  function box(e) { var r = e.getBoundingClientRect(); return [r.left, r.right, r.top, r.bottom]; }
  return {digest: row.dataset.digest || '', marks: [...row.querySelectorAll('.mark')].map(function (m) {
            return {letter: m.textContent.trim(), box: box(m)}; }),
          segs: [...row.querySelectorAll('.seg')].map(box)};
});
"""


def _apart(a: list[float], b: list[float]) -> bool:
    return a[1] <= b[0] or b[1] <= a[0] or a[3] <= b[2] or b[3] <= a[2]


def test_the_timeline_draws_marks_and_bands_apart_and_reasons_without_backticks(
        page: Any, base_url: str, daemon: DaemonProcess) -> None:
    """Issue 57: D and P marks a moment apart overlapped, a quarantined digest had no Q mark though the legend
    lists Q, a digest that served a moment had marks but no visible band, and sync reasons showed literal
    backticks. Measured in the browser: every mark's box clear of every other mark's and of every band's."""
    write_gen_model(daemon.repository, "gen", 11, init="raise RuntimeError('no weights')")
    wait_for(lambda: any(v["quarantined"] for v in daemon.json("versions", "gen")), 60, 0.3, "gen 11 quarantined")
    quarantined = next(v["digest"] for v in daemon.json("versions", "gen") if v["quarantined"])
    seen_before = {v["digest"] for v in daemon.json("versions", "gen")}
    write_gen_model(daemon.repository, "gen", 12)

    def twelve() -> str | None:
        row = daemon.model_status("gen")
        return row["digest"] if row.get("state") == "serving" and row.get("digest") not in seen_before else None

    brief = wait_for(twelve, 60, 0.2, "gen 12 serving")
    daemon.cli("rollback", "gen")  # gen 12 served a moment
    daemon.cli("pin", "gen")  # a P a moment after the rollback's R
    try:
        write_gen_model(daemon.repository, "gen", 13)  # held by the pin: a reason that names a command
        page.get(f"{base_url}/ui/")
        wait_for(lambda: "unpin" in browser.text(page, '#models tr[data-model="gen"] td.reason'), 30, 0.2,
                 "gen held by its pin")
        reason = page.execute_script(
            "return document.querySelector('#models tr[data-model=\"gen\"] td.reason').innerHTML")
        assert "`" not in reason and "<code>tritonctl unpin gen</code>" in reason, reason
        page.get(f"{base_url}/ui/models/gen")
        rows = {row["digest"]: row for row in page.execute_script(LAYOUT)}
        assert "Q" in [m["letter"] for m in rows[quarantined]["marks"]], rows[quarantined]
        assert rows[brief]["segs"], rows[brief]  # gen 12 served a moment: its band is drawn
        for row in rows.values():
            marks = row["marks"]
            for i, a in enumerate(marks):
                assert all(_apart(a["box"], b["box"]) for b in marks[i + 1:]), (row["digest"], marks)
                assert all(_apart(a["box"], seg) for seg in row["segs"]), (row["digest"], a, row["segs"])
            assert all(seg[1] - seg[0] >= 4 for seg in row["segs"]), row
        browser.screenshot(page, "test_timeline_marks_apart")
    finally:
        daemon.cli("unpin", "gen")


def test_wrong_or_missing_token_is_refused(page: Any, base_url: str) -> None:
    from selenium.webdriver.common.by import By

    # without a cookie or a token, every page and the live endpoint are refused
    for path, code in (("/ui/", 303), ("/ui/models/gen", 303), ("/ui/stamp", 401), ("/ui/audit", 303),
                       ("/ui/v1/events", 401), ("/ui/?fragment=1", 401)):
        assert answer(f"{base_url}{path}") == code, path
    assert answer(f"{base_url}/ui/stamp", {"authorization": "Bearer not-the-token-at-all"}) == 401
    assert answer(f"{base_url}/ui/stamp", {"authorization": f"Bearer {TOKEN}"}) == 200
    assert answer(f"{base_url}/ui/stamp", {"cookie": "tritonctl_web=" + "0" * 64}) == 401
    # in the browser: a fresh session lands on the login form, a wrong token is refused, the right one opens
    page.delete_all_cookies()
    page.get(f"{base_url}/ui/models/gen")
    assert "/ui/login" in page.current_url
    page.find_element(By.ID, "token").send_keys("wrong-token-wrong-token")
    page.find_element(By.CSS_SELECTOR, "form[action='/ui/login'] button").click()
    wait_for(lambda: "Wrong token" in browser.text(page, "#login-error"), 10, what="the wrong token refused")
    assert browser.text(page, "#models") == ""
    browser.screenshot(page, "test_wrong_token_refused")
    browser.console_errors(page)  # the refusal's 401 is logged by the browser: expected here
    cookie_flags = login_cookie(base_url)
    assert "HttpOnly" in cookie_flags and "SameSite=Strict" in cookie_flags
    page.find_element(By.ID, "token").send_keys(TOKEN)
    page.find_element(By.CSS_SELECTOR, "form[action='/ui/login'] button").click()
    wait_for(lambda: "Model gen" in browser.text(page, "h1"), 10, what="the model page after logging in")


def answer(url: str, headers: dict[str, str] | None = None) -> int:
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any) -> None:
            return None

    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(urllib.request.Request(url, headers=headers or {}), timeout=10) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def login_cookie(base_url: str) -> str:
    data = f"token={TOKEN}&next=/ui/".encode()

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any) -> None:
            return None

    try:
        urllib.request.build_opener(NoRedirect).open(urllib.request.Request(f"{base_url}/ui/login", data=data),
                                                    timeout=10)
    except urllib.error.HTTPError as exc:
        assert exc.code == 303
        return str(exc.headers.get("set-cookie", ""))
    raise AssertionError("the login did not redirect")


