"""What a launched tritonserver inherits, and how the daemon opens its token file (issue 58, item 7).

Before: a launched tritonserver got the daemon's whole environment, so `MLFLOW_TRACKING_TOKEN` (and any
AWS key, any TRITONCTL_* setting) was in every python model's `os.environ`; and the token file was opened
before its type and mode were checked (a FIFO there blocked the start for good) and its owner was never
checked. Now tritonserver and its python stubs get only what they need (the model here still imports numpy
and serves), and the token file is opened without following a link and without blocking, then checked on
the open file: a regular file, owned by the daemon's user or root, not open to others.
"""

from __future__ import annotations

import os
import subprocess
import threading
from pathlib import Path

import pytest

from controlplane.api.protocol import read_token
from controlplane.errors import ConfigError
from controlplane.triton.launcher import free_port
from tests.harness import TRITONCTL, DaemonProcess, python_stubs, wait_for, write_gen_model

SECRETS = {"MLFLOW_TRACKING_TOKEN": "mlflow-secret-token", "AWS_SECRET_ACCESS_KEY": "aws-secret-key",
           "MLFLOW_TRACKING_PASSWORD": "a-password"}
TOKEN = "0123456789abcdef0123456789abcdef"


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode(errors="replace").split("=", 1) for item in raw if b"=" in item)


@pytest.mark.triton
def test_a_launched_tritonserver_and_its_models_get_no_secret_of_the_daemon(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_gen_model(repo, "m", 1)
    daemon = DaemonProcess(repo, tmp_path / "state", env=SECRETS)
    daemon.start()
    try:
        wait_for(lambda: daemon.model_status("m").get("state") == "serving", 60, what="m serving (numpy imported)")
        server = daemon.triton_pid()
        assert server is not None
        stubs = python_stubs(server)
        assert stubs, "no python stub runs the model"
        assert daemon.proc is not None
        assert set(SECRETS) <= set(environ(daemon.proc.pid)), "the daemon itself was not given the secrets"
        for pid in (server, *stubs):
            env = environ(pid)
            leaked = sorted(k for k in env if k in SECRETS or k.startswith(("TRITONCTL_", "AWS_", "MLFLOW_")))
            assert leaked == [], f"pid {pid} inherited {leaked}"
            assert env["PATH"].split(os.pathsep)[0] == str(Path(TRITONCTL).parent)  # the stub's python3
    finally:
        assert daemon.stop() == 0, daemon.log_tail()


def private_token(tmp_path: Path, mode: int = 0o600) -> Path:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(mode)
    return path


def test_a_fifo_token_file_is_refused_at_once(tmp_path: Path) -> None:
    fifo = tmp_path / "token"
    os.mkfifo(fifo, 0o600)
    outcome: list[BaseException | str] = []

    def read() -> None:
        try:
            outcome.append(read_token(fifo, private=True))
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(5)
    if reader.is_alive():  # unblock it: open the fifo's other end
        with open(fifo, "w"):
            pass
        pytest.fail("reading a FIFO token file blocked")
    assert isinstance(outcome[0], ConfigError), outcome
    assert str(outcome[0]) == f"token_file {fifo}: is a FIFO, not a regular file"


def test_a_token_file_that_is_a_link_or_a_directory_is_refused(tmp_path: Path) -> None:
    target = private_token(tmp_path)
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(ConfigError, match=rf"^token_file {link}: is a symbolic link; give the file itself$"):
        read_token(link, private=True)
    with pytest.raises(ConfigError, match=rf"^token_file {tmp_path}: is a directory, not a regular file$"):
        read_token(tmp_path, private=True)
    assert read_token(link) == TOKEN  # a client's own token file may be a link


def test_a_token_file_of_another_owner_or_open_to_others_is_refused(tmp_path: Path) -> None:
    assert read_token(private_token(tmp_path), private=True) == TOKEN
    loose = private_token(tmp_path, 0o644)
    with pytest.raises(ConfigError, match=r"has mode 0644: others \(or its group\) may read or change it"):
        read_token(loose, private=True)
    if os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    other = private_token(tmp_path)
    os.chown(other, 65534, -1)  # nobody
    with pytest.raises(ConfigError, match=rf"^token_file {other}: owned by uid 65534 \(nobody\), not by the "
                                          r"daemon's user \(\w+\) or root; chown"):
        read_token(other, private=True)


@pytest.mark.triton
def test_the_daemon_refuses_a_fifo_token_file_in_one_line_and_creates_nothing(tmp_path: Path) -> None:
    fifo = tmp_path / "token"
    os.mkfifo(fifo, 0o600)
    repo = tmp_path / "repo"
    repo.mkdir()
    result = subprocess.run([TRITONCTL, "daemon", "--repository", str(repo), "--state-dir", str(tmp_path / "state"),
                             "--triton-url", "127.0.0.1:1", "--listen", f"127.0.0.1:{free_port()}", "--token-file",
                             str(fifo)],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == f"error: token_file {fifo}: is a FIFO, not a regular file"
    assert not (tmp_path / "state").exists()
