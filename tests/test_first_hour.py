"""The first hour of a new user (issue 47), each item as a user meets it: `tritonctl` as a process against
a real daemon and its launched tritonserver. Pipes closed after one line; `status` in a 60-column pty;
a missing repository that leaves no state directory and starts no tritonserver; the row of a model whose
capture is refused, in `status` and the web view; log lines with their times and levels; the messages of
`diff` and `pin`; `validate` over a repository's entries.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import shutil
import struct
import subprocess
import termios
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane.triton.launcher import free_port
from tests.harness import TRITONCTL, DaemonProcess, wait_for
from tests.test_restart import tritonservers_on

pytestmark = pytest.mark.triton  # `tritonctl daemon` as a process, a launched tritonserver

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "model_repository"
TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARNING|ERROR|CRITICAL) tritonctl\.")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("TRITONCTL_") and k not in ("COLUMNS", "LINES")}


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """linear serving; `leaky` (a file that is a symlink out of the repository: every capture refused);
    `bad` (an unknown backend: invalid content). At the default log level, as a user runs it."""
    base = tmp_path_factory.mktemp("first-hour")
    repo = base / "repo"
    repo.mkdir()
    shutil.copytree(EXAMPLES / "linear", repo / "linear")
    leaky = shutil.copytree(EXAMPLES / "linear", repo / "leaky")
    (leaky / "config.pbtxt").write_text((leaky / "config.pbtxt").read_text().replace('"linear"', '"leaky"'))
    secret = base / "outside.txt"
    secret.write_text("not the model's\n")
    (leaky / "1" / "extra.txt").symlink_to(secret)
    (repo / "bad").mkdir()
    (repo / "bad" / "config.pbtxt").write_text('name: "bad"\nbackend: "nope"\n')
    web = free_port()
    proc = DaemonProcess(repo, base / "state", env={"TRITONCTL_LOG_LEVEL": "info"},
                         extra_args=["--web-address", f"127.0.0.1:{web}"]).start()
    proc.web_port = web  # type: ignore[attr-defined]
    try:
        wait_for(lambda: proc.model_status("linear").get("state") == "serving", 90, 0.2, "linear serving")
        wait_for(lambda: {m["model"] for m in proc.status()["models"]} >= {"linear", "leaky", "bad"}, 30, 0.2,
                 "every model has a row")
        yield proc
    finally:
        proc.stop()


def tritonctl(daemon: DaemonProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([TRITONCTL, *args, "--state-dir", str(daemon.state_dir)], capture_output=True, text=True,
                          timeout=60, env=clean_env())


# -- item 5: arguments before side effects ----------------------------------------------------------------


@pytest.mark.parametrize("launch", [[], ["--launch-triton", "--triton-grpc-port", "0", "--triton-http-port", "0",
                                         "--triton-metrics-port", "0"]], ids=["no-triton", "launch-triton"])
def test_a_missing_repository_is_one_line_before_anything_exists(tmp_path: Path, launch: list[str]) -> None:
    state = tmp_path / "D"
    result = subprocess.run([TRITONCTL, "daemon", "--repository", "/nonexistent", "--state-dir", str(state), *launch],
                            capture_output=True, text=True, timeout=60, env=clean_env())
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    assert result.stderr.splitlines() == ["error: repository /nonexistent: no such directory"]
    assert not state.exists()
    assert tritonservers_on(state / "serving") == []


def test_no_tritonserver_named_before_the_state_directory_exists(tmp_path: Path) -> None:
    (tmp_path / "repo").mkdir()
    state = tmp_path / "D"
    result = subprocess.run([TRITONCTL, "daemon", "--repository", str(tmp_path / "repo"), "--state-dir", str(state)],
                            capture_output=True, text=True, timeout=60, env=clean_env())
    assert result.returncode == 2
    assert result.stderr.splitlines() == ["error: no tritonserver: give --triton-url HOST:PORT or --launch-triton"]
    assert not state.exists()


# -- item 2: logs -----------------------------------------------------------------------------------------


def test_log_lines_carry_their_time_and_a_deploy_is_one_info_line(daemon: DaemonProcess) -> None:
    lines = daemon.log_path.read_text().splitlines()
    assert lines and all(TIMESTAMP.match(line) for line in lines), [x for x in lines if not TIMESTAMP.match(x)][:3]
    deploys = [line for line in lines if " INFO tritonctl.daemon: linear deploy ok digest " in line]
    assert len(deploys) == 1 and re.search(r" in \d+ ms: serving ", deploys[0]), deploys
    assert not [line for line in lines if " tritonctl.deploy: linear " in line], "the steps are DEBUG"
    assert any(" WARNING tritonctl." in line and ": bad snapshot " in line and " invalid: " in line for line in lines)
    assert any(" WARNING tritonctl." in line and ": leaky: capture refused: " in line for line in lines)


# -- item 7: a model whose every capture is refused has a row ----------------------------------------------


def test_a_refused_model_has_a_status_row_and_shows_in_the_web_view(daemon: DaemonProcess) -> None:
    rows = {m["model"]: m for m in json.loads(tritonctl(daemon, "status", "--json").stdout)["models"]}
    leaky = rows["leaky"]
    assert leaky["sync"] == "invalid"
    assert leaky["sync_reason"] == "capture refused: symlink 1/extra.txt points outside the model directory"
    plain = tritonctl(daemon, "status").stdout
    assert re.search(r"^leaky\s+new\s+invalid\b", plain, re.M), plain
    page = urllib.request.urlopen(f"http://127.0.0.1:{daemon.web_port}/ui/", timeout=10).read().decode()  # type: ignore[attr-defined]
    assert "leaky" in page and "invalid" in page


# -- item 3: tables ------------------------------------------------------------------------------------------


def test_status_in_a_60_column_pty_fits_and_splits_no_word(daemon: DaemonProcess) -> None:
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 60, 0, 0))
    proc = subprocess.Popen([TRITONCTL, "status", "--state-dir", str(daemon.state_dir)], stdout=follower,
                            stderr=follower, stdin=follower, env={**clean_env(), "TERM": "xterm"})
    os.close(follower)
    out = b""
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # EIO: the process closed its end
            break
        if not chunk:
            break
        out += chunk
    assert proc.wait(30) == 0
    os.close(leader)
    lines = [ANSI.sub("", line).rstrip() for line in out.decode().replace("\r", "").splitlines()]
    table = lines[1:]  # below the title (the triton URLs)
    assert table[0].split()[:3] == ["MODEL", "STATE", "SYNC"], lines
    assert all(len(line) <= 60 for line in table), lines
    rows = {line.split()[0]: line.split() for line in table[1:] if line and not line.startswith("watch:")}
    assert rows["linear"][1:3] == ["serving", "synced"] and rows["leaky"][1:3] == ["new", "invalid"], lines


def test_wide_keeps_every_column_and_times_are_whole_seconds(daemon: DaemonProcess) -> None:
    wide = tritonctl(daemon, "status", "-o", "wide").stdout.splitlines()
    assert wide[1].split()[:6] == ["MODEL", "STATE", "SYNC", "DIGEST", "VERSIONS", "AGE"]
    assert "SYNC REASON" in wide[1] and "LAST ERROR" in wide[1]
    # the refusal whole, the last text before CONFIG (the config Triton completed: none, `-`)
    leaky = next(line for line in wide if line.startswith("leaky"))
    assert re.search(r"capture refused: symlink 1/extra\.txt points outside the model directory +-$", leaky), leaky
    assert wide[1].split()[-1] == "CONFIG", wide[1]
    at = tritonctl(daemon, "audit", "--at", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 5)))
    assert at.returncode == 0, at.stderr
    linear = next(line for line in at.stdout.splitlines() if line.startswith("linear"))
    assert re.search(r"\d\d:\d\d:\d\dZ$", linear) and "." not in linear.split()[-1], linear


# -- item 4: a reader that closes the pipe ---------------------------------------------------------------------


def read_one_line_then_close(args: list[str], then: list[str] | None = None, daemon: DaemonProcess | None = None
                             ) -> tuple[int, str]:
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_env())
    assert proc.stdout is not None and proc.stderr is not None
    if then:
        time.sleep(1.0)  # following
        assert daemon is not None
        tritonctl(daemon, *then)
    first = proc.stdout.readline()
    proc.stdout.close()  # `| head -1`
    if then:
        assert daemon is not None
        tritonctl(daemon, "unpin", "linear")  # another event: the next write meets the closed pipe
    code = proc.wait(30)
    assert first, "one line came"
    return code, proc.stderr.read().decode()


@pytest.mark.parametrize("command", ["status --watch --interval 0.2", "audit --follow"])
def test_closing_the_pipe_after_one_line_ends_quietly(daemon: DaemonProcess, command: str) -> None:
    args = [TRITONCTL, *command.split(), "--state-dir", str(daemon.state_dir)]
    then = ["pin", "linear"] if "follow" in command else None
    code, stderr = read_one_line_then_close(args, then, daemon)
    assert code in (0, -13), (code, stderr)  # 0, or SIGPIPE as `git log | head` ends
    assert stderr == "", stderr


# -- items 6 and 8: messages --------------------------------------------------------------------------------


def test_diff_names_a_ref_that_is_neither_and_pin_says_pinned(daemon: DaemonProcess) -> None:
    digest = daemon.model_status("linear")["digest"][:12]
    wrong = tritonctl(daemon, "diff", "linear", digest, "zzz")
    assert wrong.returncode == 2
    assert wrong.stderr.startswith("error: 'zzz' is neither a digest nor a tag of 'linear'"), wrong.stderr
    pinned = tritonctl(daemon, "pin", "linear")
    assert pinned.stdout.splitlines() == [f"linear pinned at {digest}"]
    assert tritonctl(daemon, "unpin", "linear").stdout.splitlines() == ["linear unpinned"]


def test_validate_over_a_repositorys_entries_says_nothing_of_its_plain_files() -> None:
    result = subprocess.run(["bash", "-c", f"{TRITONCTL} validate examples/model_repository/*"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120, env=clean_env())
    assert result.returncode == 0, result.stdout + result.stderr
    assert "README.md" not in result.stdout + result.stderr
