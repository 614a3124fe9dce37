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
    # exactly 0750 (issue 57: "no world bits" let 0770 pass): its group reads, nobody else
    assert oct(stat.S_IMODE(daemon.state_dir.stat().st_mode)) == oct(0o750)


@pytest.mark.parametrize(("mode", "refused"), [(0o600, False), (0o640, False), (0o604, True), (0o660, True),
                                               (0o620, True), (0o644, True)])
def test_the_token_file_others_may_read_or_its_group_change_is_refused(tmp_path: Path, mode: int,
                                                                       refused: bool) -> None:
    """The TCP listener's token file: others must not read it nor its group change it (whoever changes it
    changes who may deploy). A daemon given one that is is refused at once, exit 2, the file and its mode
    named, before its state directory exists; 0600 and 0640 pass that check."""
    import subprocess

    from controlplane.triton.launcher import free_port
    from tests.harness import TRITONCTL

    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(mode)
    (tmp_path / "repo").mkdir()
    state = tmp_path / "state"
    args = [TRITONCTL, "daemon", "--repository", str(tmp_path / "repo"), "--state-dir", str(state),
            "--triton-url", "127.0.0.1:1", "--listen", f"127.0.0.1:{free_port()}", "--token-file", str(token_file)]
    if not refused:
        args.append("--no-such-flag")  # the token check passes; click then refuses the flag, nothing starts
    done = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    if refused:
        assert done.stderr.strip() == (f"error: token_file {token_file} has mode {mode:04o}: others (or its group) "
                                       f"may read or change it; chmod 600 {token_file}"), done.stderr
        assert not state.exists()
    else:
        assert "token_file" not in done.stderr and "No such option" in done.stderr, done.stderr


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
    """The launched tritonserver's model repository, shared-memory, logging and trace protocols answer only
    with the daemon's key (in its 0600 `triton/server.json`), over gRPC and HTTP alike, asked of the
    tritonserver itself (behind the gateway, where there is one); inference, health, metadata and statistics
    stay open. Where clients send inference (the gateway, or that tritonserver) a load or unload is refused."""
    import http.client
    import json

    from controlplane.triton.launcher import RESTRICTED_HEADER, RESTRICTED_PROTOCOLS

    daemon, _, _ = locked
    record = daemon.state_dir / "triton" / "server.json"
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    server = json.loads(record.read_text())
    key = server["restricted_key"]
    client = grpcclient.InferenceServerClient(f"{server['host']}:{server['grpc_port']}")
    grpc_header = f"triton-grpc-protocol-{RESTRICTED_HEADER}"  # gRPC's form of the header (triton/client.py)
    keyed = {grpc_header: key}
    calls = {  # each protocol's read and write
        "model-repository": (lambda h: client.get_model_repository_index(headers=h),
                             lambda h: client.unload_model("no-such-model", headers=h)),
        "shared-memory": (lambda h: client.get_system_shared_memory_status(headers=h),
                          lambda h: client.unregister_system_shared_memory("no-such-region", headers=h)),
        "logging": (lambda h: client.get_log_settings(headers=h),
                    lambda h: client.update_log_settings({"log_verbose_level": 0}, headers=h)),
        "trace": (lambda h: client.get_trace_settings(headers=h),
                  lambda h: client.update_trace_settings(settings={"trace_rate": "1000"}, headers=h)),
    }
    assert set(calls) == set(RESTRICTED_PROTOCOLS)  # every protocol the launcher restricts
    for read, write in calls.values():
        for call in (read, write, lambda h: client.load_model("guarded", headers=h)):
            with pytest.raises(InferenceServerException, match="restricted"):
                call({})
            with pytest.raises(InferenceServerException, match="restricted"):
                call({grpc_header: "not-the-key"})
        read(keyed)  # the daemon's key opens it (nothing changed: only reads)
    host, port = server["host"], server["http_port"]
    for path in ("/v2/repository/index", "/v2/systemsharedmemory/status", "/v2/logging", "/v2/trace/setting"):
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        conn.request("POST" if path == "/v2/repository/index" else "GET", path)
        answer = conn.getresponse()
        assert answer.status == 403 and b"restricted" in answer.read().lower(), path
        conn.close()
    assert client.is_server_live() and client.get_server_metadata()  # health stays open
    public = grpcclient.InferenceServerClient(daemon.triton_url())  # where clients send inference
    for call in (lambda: public.unload_model("guarded"), lambda: public.load_model("guarded")):
        with pytest.raises(InferenceServerException):
            call()
    assert public.is_model_ready("guarded"), "inference stays open; only model control is locked"
    assert public.get_inference_statistics("guarded").model_stats
    assert public.get_model_metadata("guarded").name == "guarded"


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
