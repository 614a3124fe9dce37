"""Who a control API caller is, proven (issue 56): personal tokens (hashing, expiry, revocation, the per-host
cache), OIDC JWTs (every refusal the issue names), the socket's roles from the kernel's word about a peer,
and on PostgreSQL a revocation reaching a second host within `liveness_s`.

The registries are real (SQLite files; the session's PostgreSQL server for the fleet test); the JWTs are
minted here with keys made here (tests/identity_keys.py): no identity provider is needed.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from concurrent import futures
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from controlplane import errors
from controlplane.api.access import SocketRoles, actor_of
from controlplane.api.oidc import MIN_REFETCH_S, Jwks, OidcVerifier, short_actor
from controlplane.api.server import ApiServer
from controlplane.api.tokens import Identity, TokenBook, hash_secret, secret_matches
from controlplane.settings.config import Settings
from controlplane.store import migrate
from controlplane.store.registry import Registry
from controlplane.triton.launcher import free_port
from controlplane.vocab import Role
from tests.identity_keys import AUDIENCE, ISSUER, Keys
from tests.test_cli_daemon_commands import StandInPlane


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    reg = Registry(f"sqlite:///{tmp_path / 'registry.db'}")
    migrate.upgrade(reg)
    yield reg
    reg.close()


@pytest.fixture(scope="module")
def keys() -> Keys:
    return Keys()


# --- personal tokens --------------------------------------------------------------------------------------


def test_a_token_is_kept_only_as_a_slow_hash_and_checked_in_constant_time(registry: Registry) -> None:
    book = TokenBook(registry)
    record, token = book.create("alice", "deployer", "uid:0(root)", None)
    assert token.startswith("tct_") and record.name == "alice" and record.creator == "uid:0(root)"
    with registry.session() as session:
        stored = [tuple(row) for row in session.execute(__import__("sqlalchemy").text("SELECT * FROM tokens"))]
    assert token not in repr(stored) and token.rsplit("_", 1)[1] not in repr(stored)  # never the secret
    assert book.identify(token) == Identity("token:alice", Role.DEPLOYER, "token")
    wrong = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
    with pytest.raises(errors.PermissionDeniedError, match="wrong token"):
        book.identify(wrong)
    with pytest.raises(errors.PermissionDeniedError, match="unknown token"):
        book.identify("tct_0123456789abcdef_" + "A" * 43)
    assert secret_matches("s", hash_secret("s")) and not secret_matches("t", hash_secret("s"))
    events = registry.query_audit(__import__("controlplane.store.records", fromlist=["AuditQuery"]).AuditQuery())
    assert [(e.actor, e.action, e.message) for e in events] == [
        ("uid:0(root)", "token", "created token 'alice', role deployer, never expires")]


def test_names_roles_and_expiry_are_checked_and_a_name_is_never_reused(registry: Registry) -> None:
    book = TokenBook(registry)
    for name in ("default", "../x", "", "a" * 59):
        with pytest.raises(errors.UsageError):
            book.create(name, "viewer", "uid:0(root)", None)
    with pytest.raises(errors.UsageError, match="role 'root'"):
        book.create("bob", "root", "uid:0(root)", None)
    with pytest.raises(errors.UsageError, match="expires"):
        book.create("bob", "viewer", "uid:0(root)", 0)
    book.create("bob", "viewer", "uid:0(root)", None)
    book.revoke("bob", "uid:0(root)")
    with pytest.raises(errors.ConflictError, match="exists"):
        book.create("bob", "admin", "uid:0(root)", None)


def test_expired_and_revoked_tokens_are_refused_at_once_on_the_host_that_cached_them(registry: Registry) -> None:
    now = [registry.clock()]
    book = TokenBook(registry, ttl_s=3600, now=lambda: now[0])  # a long cache: only expiry and revoke refuse
    _, short = book.create("short", "viewer", "uid:0(root)", 60)
    _, carol = book.create("carol", "admin", "uid:0(root)", None)
    assert book.identify(short).name == "token:short" and book.identify(carol).role is Role.ADMIN
    now[0] += timedelta(seconds=61)
    with pytest.raises(errors.PermissionDeniedError, match="token 'short' expired at"):
        book.identify(short)
    book.revoke("carol", "uid:0(root)")
    with pytest.raises(errors.PermissionDeniedError, match="token 'carol' was revoked"):
        book.identify(carol)


def test_another_hosts_revocation_is_seen_after_the_cache_time(registry: Registry) -> None:
    clock = [0.0]
    here = TokenBook(registry, ttl_s=5.0, clock=lambda: clock[0])
    there = TokenBook(registry, ttl_s=5.0)  # another host over the same registry
    _, token = there.create("dave", "viewer", "uid:0(root)", None)
    assert here.identify(token).name == "token:dave"
    there.revoke("dave", "uid:0(root)")
    clock[0] += 4.9
    assert here.identify(token).name == "token:dave"  # still within its cache time
    clock[0] += 0.2
    with pytest.raises(errors.PermissionDeniedError, match="revoked"):
        here.identify(token)


# --- OIDC ----------------------------------------------------------------------------------------------------


@pytest.fixture
def verifier(tmp_path: Path, keys: Keys) -> OidcVerifier:
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps(keys.jwks()))
    return OidcVerifier(ISSUER, AUDIENCE, Jwks(str(path)), "groups",
                        (("ml-deployers", "deployer"), ("ml-admins", "admin"), ("ml", "viewer")))


def test_a_valid_jwt_is_its_email_with_the_highest_role_of_its_groups(verifier: OidcVerifier, keys: Keys) -> None:
    assert verifier.identify(keys.token()) == Identity("oidc:alice@example.com", Role.DEPLOYER, "oidc")
    assert verifier.identify(keys.token("ES256", groups=["ml", "ml-admins"])).role is Role.ADMIN
    assert verifier.identify(keys.token(email=None)).name == "oidc:u-1234"  # no email: the subject
    assert verifier.identify(keys.token(email_verified=False)).name == "oidc:u-1234"
    assert verifier.identify(keys.token(groups=["others"])).role is None  # authenticated, no role
    long = short_actor("x" * 100 + "@example.com")
    assert len(long) == 64 and long != short_actor("x" * 100 + "@example.org")


@pytest.mark.parametrize(("case", "claims", "alg", "reason"), [
    ("wrong issuer", {"iss": "https://evil.test"}, "RS256", "Invalid issuer"),
    ("wrong audience", {"aud": "someone-else"}, "RS256", "Audience doesn't match"),
    ("expired", {"exp": -120}, "RS256", "Signature has expired"),  # times: seconds from when the test runs
    ("not yet valid", {"nbf": 120}, "RS256", "not yet valid"),
    ("no expiry", {"exp": None}, "RS256", "exp"),
    ("alg none", {}, "none", "algorithm 'none' is refused"),
    ("HS256 keyed with the public key", {}, "HS256", "algorithm 'HS256' is refused"),
])
def test_the_jwt_refusals(verifier: OidcVerifier, keys: Keys, case: str, claims: dict[str, Any], alg: str,
                          reason: str) -> None:
    # a time is taken as the test runs, not as the module is collected (a long suite gets there minutes later)
    claims = {k: int(time.time()) + v if k in ("exp", "nbf") and v is not None else v for k, v in claims.items()}
    with pytest.raises(errors.PermissionDeniedError, match=reason):
        verifier.identify(keys.token(alg, **claims))


def test_a_small_clock_skew_is_forgiven(verifier: OidcVerifier, keys: Keys) -> None:
    assert verifier.identify(keys.token(exp=int(time.time()) - 10)).name == "oidc:alice@example.com"


def test_an_unknown_key_id_fetches_the_keys_again_and_is_refused_if_still_unknown(tmp_path: Path, keys: Keys) -> None:
    path = tmp_path / "jwks.json"
    path.write_text(json.dumps(keys.jwks()))
    clock = [0.0]
    jwks = Jwks(str(path), clock=lambda: clock[0])
    verifier = OidcVerifier(ISSUER, AUDIENCE, jwks)
    assert verifier.identify(keys.token(groups=["viewer"])).role is Role.VIEWER
    assert jwks.fetches == 1
    rotated = Keys()  # the provider rotates: a new key under a new kid
    document = keys.jwks()
    document["keys"].append({**rotated.jwks()["keys"][0], "kid": "rsa-2"})
    path.write_text(json.dumps(document))
    clock[0] += MIN_REFETCH_S
    assert verifier.identify(rotated.token(kid="rsa-2")).name == "oidc:alice@example.com"  # fetched again
    assert jwks.fetches == 2
    with pytest.raises(errors.PermissionDeniedError, match="unknown key id 'rsa-9'"):
        verifier.identify(rotated.token(kid="rsa-9"))  # too soon for another fetch: refused, none made
    assert jwks.fetches == 2
    clock[0] += MIN_REFETCH_S
    with pytest.raises(errors.PermissionDeniedError, match="unknown key id 'rsa-9'"):
        verifier.identify(rotated.token(kid="rsa-9"))  # fetched again, still unknown: refused
    assert jwks.fetches == 3
    with pytest.raises(errors.PermissionDeniedError, match="RS256 with a EC key"):
        verifier.identify(keys.token("RS256", kid="ec-1"))


def test_the_keys_from_an_https_url_bounded_and_https_only(tmp_path: Path, keys: Keys,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A loopback HTTPS server with a certificate made here serves the JWKS (trusted through SSL_CERT_FILE)."""
    import ssl
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from controlplane.api.oidc import MAX_JWKS_BYTES, fetch_jwks

    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is not installed")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    subprocess.run([openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True, timeout=60)
    bodies = {"/jwks": json.dumps(keys.jwks()).encode(), "/huge": b"{" + b" " * (MAX_JWKS_BYTES + 10) + b"}"}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            if self.path == "/plain":
                self.send_response(302)
                self.send_header("Location", "http://127.0.0.1:1/jwks")
                self.end_headers()
                return
            body = bodies[self.path]
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    base = f"https://127.0.0.1:{server.server_address[1]}"
    try:
        verifier = OidcVerifier(ISSUER, AUDIENCE, Jwks(f"{base}/jwks"), roles=(("ml-deployers", "deployer"),))
        assert verifier.identify(keys.token()).role is Role.DEPLOYER
        with pytest.raises(ValueError, match="over"):
            fetch_jwks(f"{base}/huge")
        with pytest.raises(errors.PermissionDeniedError, match="not https"):
            fetch_jwks(f"{base}/plain")
    finally:
        server.shutdown()


# --- the socket ----------------------------------------------------------------------------------------------


def test_socket_roles_from_the_peers_groups(tmp_path: Path) -> None:
    roles = SocketRoles((), socket_gid=4242, own_uid=999)
    assert roles.identity(0, (0,)).role is Role.ADMIN  # root
    assert roles.identity(999, ()).role is Role.ADMIN  # the daemon's own user
    assert roles.identity(65534, (65534, 4242)).role is Role.DEPLOYER  # in the socket's group
    assert roles.identity(65534, (65534,)).role is None
    assert roles.identity(65534, ()).name.startswith("uid:65534")
    mapped = SocketRoles((("4243", "admin"), ("4242", "viewer")), socket_gid=4242, own_uid=999)
    assert mapped.identity(1234, (4242,)).role is Role.VIEWER and mapped.identity(1234, (4242, 4243)).role is Role.ADMIN
    with pytest.raises(errors.ConfigError, match="socket_roles: group 'no-such-group-here' is unknown"):
        SocketRoles((("no-such-group-here", "admin"),), socket_gid=0)


@pytest.mark.skipif(os.getuid() != 0, reason="connecting as another user needs root (CI runs as root)")
def test_the_socket_identity_is_the_kernels_word_about_another_user() -> None:
    """A process of user `nobody` (uid 65534), its groups set here, calls the real listener: a member of the
    socket's group is `deployer` (pin answers), without that group it has no role (403, even for status)."""
    python = shutil.which("python3", path="/usr/bin:/bin")  # one `nobody` may run (the venv's may be root's)
    if python is None:
        pytest.skip("no system python3 for another user")
    base = Path(tempfile.mkdtemp(prefix="tctl-id-"))
    base.chmod(0o755)
    server = ApiServer(StandInPlane(), futures.ThreadPoolExecutor(2),  # type: ignore[arg-type]
                       Settings(state_dir=base / "state", socket=base / "ctl.sock"))
    server.start()
    gid = (base / "ctl.sock").stat().st_gid
    script = ("import socket,sys\ns=socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])\n"
              "s.sendall(('PUT /v1/models/linear/pin HTTP/1.1\\r\\nHost: x\\r\\nx-tritonctl-actor: root\\r\\n'"
              "'Content-Length: 0\\r\\nConnection: close\\r\\n\\r\\n').encode())\n"
              "print(s.recv(65536).decode().split('\\r\\n')[0])")

    def call_as_nobody(groups: list[int]) -> str:
        def drop() -> None:
            os.setgroups(groups)
            os.setgid(65534)
            os.setuid(65534)
        out = subprocess.run([python, "-I", "-c", script, str(base / "ctl.sock")], capture_output=True,
                             text=True, timeout=30, preexec_fn=drop, cwd="/")
        return out.stdout.strip() or out.stderr

    try:
        assert call_as_nobody([gid]).endswith("200 OK")
        _, model, pinned, actor = server.plane.calls[-1]  # type: ignore[attr-defined]
        assert actor.startswith("uid:65534") and actor.claimed == "root"  # it said root: only a claim
        (base / "ctl.sock").chmod(0o666)  # reachable without the group: the role still comes from the groups
        assert call_as_nobody([]).endswith("403 Forbidden")
    finally:
        server.stop(0.1)
        shutil.rmtree(base, ignore_errors=True)


def test_a_declared_actor_is_a_claim_unless_it_names_the_caller() -> None:
    identity = Identity("uid:1000(alice)", Role.DEPLOYER, "socket")

    def actor(declared: str | None) -> Any:
        headers = {"x-tritonctl-actor": declared} if declared is not None else {}
        return actor_of(SimpleNamespace(scope={"tritonctl.identity": identity}, headers=headers))

    assert [(str(a), a.claimed) for a in map(actor, (None, "alice", "uid:1000", "uid:1000(alice)", "bob"))] == [
        ("uid:1000(alice)", None), ("uid:1000(alice)", None), ("uid:1000(alice)", None),
        ("uid:1000(alice)", None), ("uid:1000(alice)", "bob")]


# --- a fleet: tokens in the shared registry, revoked on one host, refused on another --------------------------


def _get(port: int, token: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/v1/models", headers={"Authorization": f"Bearer {token}"})
    status = conn.getresponse().status
    conn.close()
    return status


def test_a_token_works_on_every_host_and_its_revocation_reaches_them_within_liveness_s(pg_url: str) -> None:
    shared = Registry(pg_url, host="h1")
    migrate.upgrade(shared)
    liveness_s = 2.0
    servers = []
    try:
        for host in ("h1", "h2"):
            plane = StandInPlane()
            plane.fleet = SimpleNamespace(registry=Registry(pg_url, host=host))  # type: ignore[attr-defined]
            state = Path(tempfile.mkdtemp(prefix=f"tctl-{host}-"))
            server = ApiServer(plane, futures.ThreadPoolExecutor(2),  # type: ignore[arg-type]
                               Settings(state_dir=state, listen=f"127.0.0.1:{free_port()}", liveness_s=liveness_s))
            server.start()
            servers.append(server)
        ports = [int(s.settings.listen.rsplit(":", 1)[1]) for s in servers]  # type: ignore[union-attr]
        assert servers[0].tokens is not None and servers[1].tokens is not None
        _, token = servers[0].tokens.create("erin", "viewer", "uid:0(root)", None)  # created on h1
        assert [_get(port, token) for port in ports] == [200, 200]  # works on h2 too: the shared registry
        servers[0].tokens.revoke("erin", "uid:0(root)")
        revoked_at = time.monotonic()
        assert _get(ports[0], token) == 401  # at once where it was revoked
        while _get(ports[1], token) != 401:
            assert time.monotonic() - revoked_at < liveness_s, "h2 still accepts a token revoked on h1"
            time.sleep(0.05)
    finally:
        for server in servers:
            server.stop(0.1)
        shared.close()


def test_guessing_tokens_is_slowed_down_but_a_known_token_is_not_held_up(registry: Registry) -> None:
    plane = StandInPlane()
    plane.registry = registry  # type: ignore[attr-defined]
    state = Path(tempfile.mkdtemp(prefix="tctl-guess-"))
    port = free_port()
    server = ApiServer(plane, futures.ThreadPoolExecutor(2),  # type: ignore[arg-type]
                       Settings(state_dir=state, listen=f"127.0.0.1:{port}"))
    server.start()
    try:
        assert server.tokens is not None
        _, token = server.tokens.create("frank", "viewer", "uid:0(root)", None)
        assert _get(port, token) == 200
        guesses = [_get(port, "tct_0123456789abcdef_" + "G" * 43) for _ in range(8)]
        assert guesses[:5] == [401] * 5 and 429 in guesses[5:], guesses
        assert _get(port, token) == 200  # checked a moment ago: costs nothing, not held up
    finally:
        server.stop(0.1)
