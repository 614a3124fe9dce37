"""A locked control plane: socket permissions, token-only TCP, a Triton that only the daemon can drive,
names from outside that cannot escape, symlinks that are never followed out of a model."""

from __future__ import annotations

import grp
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from tritonclient.utils import InferenceServerException

from cli.main import EXIT_FAILED, EXIT_USAGE, cli
from controlplane.errors import UsageError
from controlplane.names import resolve_inside, validate_model_name
from tests.harness import DaemonProcess, token_daemon, wait_for, write_gen_model

TOKEN = "0123456789abcdef0123456789abcdef"
# a group that is not this process's own: the socket is given to it (`socket_group`, issue 58 item 5)
SOCKET_GROUP = next(g.gr_name for g in grp.getgrall() if g.gr_gid != os.getgid())


@pytest.fixture(scope="module")
def locked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonProcess, str, Path]]:
    base = tmp_path_factory.mktemp("sec")
    repo = base / "repo"
    repo.mkdir()
    write_gen_model(repo, "guarded", 1)
    daemon, address, token_file = token_daemon(repo, base, TOKEN, extra_args=["--socket-group", SOCKET_GROUP])
    wait_for(lambda: daemon.model_status("guarded").get("state") == "serving", 30, what="guarded serving")
    yield daemon, address, token_file
    assert daemon.stop() == 0


def test_control_socket_is_owner_and_group_only(locked: tuple[DaemonProcess, str, Path]) -> None:
    daemon, _, _ = locked
    info = (daemon.state_dir / "tritonctl.sock").stat()
    assert stat.S_ISSOCK(info.st_mode)
    assert stat.S_IMODE(info.st_mode) == 0o660
    assert info.st_uid == os.getuid()
    assert info.st_gid == grp.getgrnam(SOCKET_GROUP).gr_gid, "the socket is not socket_group's"
    assert stat.S_IMODE(daemon.state_dir.stat().st_mode) & 0o007 == 0, "state dir must not be world-accessible"


def test_tcp_listener_requires_the_token(locked: tuple[DaemonProcess, str, Path], tmp_path: Path) -> None:
    _, address, token_file = locked
    runner = CliRunner()
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-token-but-long-enough")
    refused = runner.invoke(cli, ["status", "--address", address, "--token-file", str(wrong)])
    assert refused.exit_code == EXIT_FAILED
    assert "token" in refused.stderr
    no_token = runner.invoke(cli, ["status", "--address", address])
    assert no_token.exit_code == EXIT_USAGE and "token" in no_token.stderr
    ok = runner.invoke(cli, ["status", "--json", "--address", address, "--token-file", str(token_file)])
    assert ok.exit_code == 0, ok.output
    assert '"guarded"' in ok.stdout


def test_tcp_listener_refuses_a_raw_http_call_without_token(locked: tuple[DaemonProcess, str, Path]) -> None:
    import http.client
    import json

    daemon, address, _ = locked
    host, port = address.rsplit(":", 1)
    for headers in ({}, {"Authorization": "Bearer not-the-token-but-long-enough"}, {"Authorization": TOKEN}):
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        conn.request("POST", "/v1/models/guarded/unload", body=b"{}", headers=headers)
        answer = conn.getresponse()
        assert answer.status == 401, headers
        assert json.loads(answer.read())["error"]["class"] == "PermissionDeniedError"
        conn.close()
    assert daemon.model_status("guarded")["state"] == "serving"


def test_launched_triton_refuses_model_control_from_others(locked: tuple[DaemonProcess, str, Path]) -> None:
    daemon, _, _ = locked
    client = grpcclient.InferenceServerClient(daemon.triton_url())
    for call in (lambda: client.unload_model("guarded"), lambda: client.load_model("guarded"),
                 lambda: client.get_model_repository_index()):
        with pytest.raises(InferenceServerException, match="restricted"):
            call()
    assert client.is_model_ready("guarded"), "inference stays open; only model control is locked"


def test_symlink_out_of_a_model_is_never_followed(locked: tuple[DaemonProcess, str, Path], tmp_path: Path) -> None:
    daemon, _, _ = locked
    secret = tmp_path / "secret.txt"
    secret.write_text("do not copy me")
    write_gen_model(daemon.repository, "sneaky", 1)
    (daemon.repository / "sneaky" / "1" / "leak.txt").symlink_to(secret)
    events = wait_for(lambda: daemon.audit("--model", "sneaky", "--action", "snapshot", "--outcome", "failed"),
                      20, what="refused snapshot")
    assert "outside the model directory" in events[0]["message"]
    store = daemon.state_dir / "store" / "objects"
    assert not any(p.is_file() and p.read_bytes() == b"do not copy me" for p in store.rglob("*"))


@settings(max_examples=300, deadline=None)
@given(st.text(min_size=0, max_size=40))
def test_any_model_name_is_rejected_or_stays_inside(name: str) -> None:
    root = Path("/srv/repo")
    try:
        validate_model_name(name)
    except UsageError:
        return
    assert (root / name).resolve().parent == root.resolve()
    assert resolve_inside(root, name).is_relative_to(root)


def test_an_unknown_socket_group_stops_the_start_in_one_line(tmp_path: Path) -> None:
    from controlplane.errors import ConfigError
    from controlplane.settings.config import load_settings
    from controlplane.startup import preflight

    settings = load_settings({"repository": str(tmp_path), "state_dir": str(tmp_path / "state"),
                              "triton_url": "127.0.0.1:1", "socket_group": "no-such-group-here"}, env={})
    with pytest.raises(ConfigError, match="socket_group: no group named no-such-group-here"):
        preflight.check(settings)
    assert not (tmp_path / "state").exists()
