"""Untrusted text reaches no terminal, log or table with its escape codes (controlplane/text.py).

End to end, as the attacker would: a model whose `initialize` raises with an OSC window-title sequence,
a BEL and a colour code in its message, and a webhook receiver whose answer is rich markup (`[/x]`) with
the same codes. A real daemon with its launched tritonserver records Triton's reason; `status -o wide`,
`audit` and `webhooks` run under a pseudo-terminal (where colour is on, as for an operator) must show the
sequences escaped (`\\x1b]0;pwned`) and never send them; the daemon's log neither. `--json` keeps the raw
text (JSON escapes it). The pure cases of `clean` are below.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import struct
import subprocess
import termios
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from controlplane.text import clean, clean_document
from tests.harness import TRITONCTL, DaemonProcess, wait_for, write_gen_model

EVIL = "\x1b]0;pwned\x07\x1b[31m"
SHOWN = "\\x1b]0;pwned\\x07\\x1b[31m"
ANSWER = f"[/x] [bold]receiver[/bold] {EVIL}"


def test_clean_shows_control_characters_and_bidi_controls_escaped() -> None:
    assert clean("plain text, é, 模型") == "plain text, é, 模型"
    assert clean(f"boom{EVIL}red") == f"boom{SHOWN}red"
    assert clean("8-bit CSI \x9b31m, NUL \x00, DEL \x7f, CR \r") == "8-bit CSI \\x9b31m, NUL \\x00, DEL \\x7f, CR \\x0d"
    assert clean("admin\u202etxt.exe \u2066x\u2069") == "admin\\u202etxt.exe \\u2066x\\u2069"
    assert clean("line 1\n\tline 2") == "line 1\n\tline 2"  # a diff keeps its lines and tabs
    assert clean("line 1\nline 2", one_line=True) == "line 1\\x0aline 2"  # a log line cannot forge another
    document = {"models": [{"model": "m", "last_error": EVIL, "versions": [1], "pinned": False}], "n": None}
    assert clean_document(document) == {"models": [{"model": "m", "last_error": SHOWN, "versions": [1],
                                                    "pinned": False}], "n": None}


def test_file_names_diff_text_and_answers_show_escaped_in_the_renderers(capsys: pytest.CaptureFixture[str]) -> None:
    """The renderers alone (the end-to-end runs below go through them): a file name and a diff line with
    escape codes, a receiver's answer in rich markup."""
    from cli import render, render_admin

    render.diff({"model": "m", "a": "a" * 64, "b": "b" * 64, "added": [{"path": f"1/{EVIL}x.py", "size": 1}],
                 "removed": [], "changed": [{"path": "1/model.py", "size_a": 1, "size_b": 2,
                                             "diff": f"--- a\n+++ b\n-x\n+print('{EVIL}')\n\tindented\n"}]},
                as_json=False)
    shown = capsys.readouterr().out
    assert "\x1b" not in shown and "\x07" not in shown
    assert f"added    1/{SHOWN}x.py" in shown and f"+print('{SHOWN}')\n\tindented" in shown
    render_admin.webhook_deliveries([{"id": "d" * 32, "state": "failed", "event_id": 7, "action": "deploy",
                                      "model": "m", "attempts": 3, "status_code": 500, "answer": ANSWER,
                                      "next_attempt_at": None, "url": "http://127.0.0.1:9/"}], as_json=False)
    table = capsys.readouterr().out
    assert "[/x] [bold]receiver[/bold]" in table and SHOWN in table and "\x1b" not in table


class _Receiver(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        body = ANSWER.encode()
        self.send_response(500)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    base = tmp_path_factory.mktemp("untrusted")
    receiver = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    secret = base / "hook.secret"
    secret.write_text("untrusted-text-webhook-secret")
    secret.chmod(0o600)
    config = base / "tritonctl.toml"
    config.write_text(f'webhook_retry_max_s = 1.0\n\n[[webhook]]\nurl = "http://127.0.0.1:{receiver.server_port}/"\n'
                      f'events = ["*"]\nsecret_file = "{secret}"\n')
    repo = base / "repo"
    repo.mkdir()
    proc = DaemonProcess(repo, base / "state", extra_args=["--config", str(config)]).start()
    try:
        # the exception's message, as Python source: the model file is plain text, the raised message is
        # not. Written once the daemon runs, so its load request's error (Triton's own text, escape codes
        # raw) is the message; a first start's load in Triton's start-up reads Triton's log, which escapes
        # them itself (tests/test_launch_preload.py covers that path).
        write_gen_model(repo, "evil", 1, init=f"raise RuntimeError({EVIL!r} + 'weights missing')")
        wait_for(lambda: [e for e in proc.audit("--model", "evil", "--action", "deploy")
                          if e["outcome"] != "ok" and "pwned" in (e.get("message") or "")], 60,
                 what="evil's failed deploy with its message")
        wait_for(lambda: any(ANSWER in (d.get("answer") or "") for d in proc.json("webhooks")), 30,
                 what="a delivery with the receiver's answer")
        yield proc
    finally:
        assert proc.stop() == 0, proc.log_tail()
        receiver.shutdown()


def on_a_terminal(daemon: DaemonProcess, *args: str) -> tuple[int, bytes]:
    """The installed CLI under a pseudo-terminal 400 columns wide (colour on, as for an operator): its
    exit code and every byte it wrote."""
    main, side = pty.openpty()
    fcntl.ioctl(side, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 400, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "COLUMNS", "TERM")} | {"TERM": "xterm"}
    proc = subprocess.Popen([TRITONCTL, *args, "--state-dir", str(daemon.state_dir)], stdin=side, stdout=side,
                            stderr=side, env=env, close_fds=True)
    os.close(side)
    out = bytearray()
    while True:
        ready, _, _ = select.select([main], [], [], 60)
        if not ready:
            proc.kill()
            raise AssertionError(f"tritonctl {' '.join(args)}: no output for 60 s: {bytes(out)!r}")
        try:
            chunk = os.read(main, 65536)
        except OSError:  # EIO: the CLI exited and closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(main)
    return proc.wait(30), bytes(out)


def assert_shown_escaped(output: bytes) -> None:
    assert b"\x1b]" not in output and b"\x07" not in output, output  # no OSC, no BEL reached the terminal
    assert SHOWN.encode() in output, output


@pytest.mark.triton
def test_a_models_escape_codes_show_escaped_in_status_and_audit(daemon: DaemonProcess) -> None:
    code, output = on_a_terminal(daemon, "status", "-o", "wide")
    assert code == 0, output
    assert_shown_escaped(output)
    code, output = on_a_terminal(daemon, "audit", "--model", "evil")
    assert code == 0, output
    assert_shown_escaped(output)
    # --json keeps the raw text: JSON escapes the control characters itself
    raw = daemon.cli("audit", "--model", "evil", "--json").stdout
    assert "\x1b" not in raw and any(EVIL in (e.get("message") or "") for e in json.loads(raw))
    log = daemon.log_path.read_bytes()
    assert b"\x1b]0;pwned" not in log and b"\x07" not in log


@pytest.mark.triton
def test_a_webhook_answer_in_rich_markup_renders_as_text(daemon: DaemonProcess) -> None:
    code, output = on_a_terminal(daemon, "webhooks")
    assert code == 0, output
    text = output.decode()
    assert "[/x] [bold]receiver[/bold]" in text.replace("\r\n", "\n").replace("\n", ""), text
    assert_shown_escaped(output)
