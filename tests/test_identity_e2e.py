"""Who did it, proven (issue 56), against a real daemon (launched tritonserver, TCP listener, OIDC keys made
here): the audit's actor is the authenticated identity for a CLI action over the socket, a personal token's
action over TCP and an OIDC bearer's; a forged `x-tritonctl-actor` shows only as `claimed`; expired and
revoked tokens are refused at once; and a table test calls every route of the served OpenAPI document with
a viewer, a deployer, an admin, an expired token, a revoked token and no token: each answer is what the
route's declared role says (never a 500).
"""

from __future__ import annotations

import http.client
import json
import os
import pwd
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests import jsonschemas
from tests.harness import DaemonProcess, wait_for, write_gen_model
from tests.identity_keys import AUDIENCE, ISSUER, Keys

SHARED = "0123456789abcdef0123456789abcdef"
ROLES = ("viewer", "deployer", "admin")


@dataclass
class Guarded:
    daemon: DaemonProcess
    address: str
    keys: Keys
    tokens: dict[str, str]  # viewer, deployer, admin, expired, revoked -> the token
    base: Path
    web: str  # the web view's HOST:PORT (it asks for a login on loopback too: web_require_token)


def call(address: str, method: str, path: str, bearer: str | None = None, body: Any = None,
         headers: dict[str, str] | None = None, read: bool = True) -> tuple[int, Any]:
    host, port = address.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    sent = dict(headers or {})
    if bearer is not None:
        sent["Authorization"] = f"Bearer {bearer}"
    data = None
    if body is not None:
        data, sent["Content-Type"] = json.dumps(body).encode(), "application/json"
    conn.request(method, path, body=data, headers=sent)
    answer = conn.getresponse()
    raw = answer.read() if read else b""
    conn.close()
    try:
        return answer.status, json.loads(raw.splitlines()[-1]) if raw else None
    except ValueError:
        return answer.status, raw


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Guarded]:
    from controlplane.triton.launcher import free_port

    base = tmp_path_factory.mktemp("identity")
    repo = base / "repo"
    repo.mkdir()
    write_gen_model(repo, "m", 1)
    keys = Keys()
    (base / "jwks.json").write_text(json.dumps(keys.jwks()))
    (base / "token").write_text(SHARED + "\n")
    (base / "token").chmod(0o600)
    address, web = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    daemon = DaemonProcess(repo, base / "state", extra_args=["--listen", address, "--token-file", str(base / "token"),
                                                             "--web-address", web, "--web-require-token"],
                           env={"TRITONCTL_OIDC_ISSUER": ISSUER, "TRITONCTL_OIDC_AUDIENCE": AUDIENCE,
                                "TRITONCTL_OIDC_JWKS": str(base / "jwks.json"),
                                "TRITONCTL_OIDC_ROLES": "ml-deployers=deployer,ml-readers=viewer"}).start()
    try:
        wait_for(lambda: daemon.model_status("m").get("state") == "serving", 60, 0.2, "m serving")
        tokens = {}
        for name, role, expires in (("viewer", "viewer", None), ("deployer", "deployer", None),
                                    ("admin", "admin", None), ("expired", "admin", "1s"), ("revoked", "admin", None)):
            made = daemon.json("token", "create", f"e2e-{name}", "--role", role,
                               *(("--expires", expires) if expires else ()))
            tokens[name] = made["token"]
        assert daemon.json("token", "revoke", "e2e-revoked")["state"] == "revoked"
        time.sleep(1.1)  # e2e-expired is past its second
        yield Guarded(daemon, address, keys, tokens, base, web)
    finally:
        assert daemon.stop() == 0, daemon.log_tail()


def newest(daemon: DaemonProcess, action: str) -> dict[str, Any]:
    return daemon.audit("--model", "m", "--action", action, "--limit", "1")[0]


def test_the_audit_names_the_authenticated_identity_and_a_forged_actor_only_as_claimed(guarded: Guarded) -> None:
    daemon, address = guarded.daemon, guarded.address
    me = f"uid:{os.getuid()}({pwd.getpwuid(os.getuid()).pw_name})"
    # the CLI over the socket: the peer's uid, as the kernel says
    assert daemon.run("pin", "m").exit_code == 0
    event = newest(daemon, "pin")
    assert (event["actor"], event["claimed"]) == (me, None)
    # a personal token over TCP, through the CLI
    token_file = guarded.base / "deployer.token"
    token_file.write_text(guarded.tokens["deployer"])
    token_file.chmod(0o600)
    result = daemon.run("unpin", "m", "--address", address, "--token-file", str(token_file))
    assert result.exit_code == 0, result.output
    assert newest(daemon, "unpin")["actor"] == "token:e2e-deployer"
    # an OIDC bearer
    status, _ = call(address, "PUT", "/v1/models/m/pin", guarded.keys.token())
    assert status == 200
    assert newest(daemon, "pin")["actor"] == "oidc:alice@example.com"
    # a forged x-tritonctl-actor: only a claim beside the identity
    status, _ = call(address, "DELETE", "/v1/models/m/pin", guarded.tokens["deployer"],
                     headers={"x-tritonctl-actor": "admin-mallory"})
    assert status == 200
    event = newest(daemon, "unpin")
    assert (event["actor"], event["claimed"]) == ("token:e2e-deployer", "admin-mallory")
    jsonschemas.assert_valid("audit", [event])
    # audit --actor filters by the identity, never by the claim; the plain output says "claimed"
    assert {e["actor"] for e in daemon.json("audit", "--actor", "token:e2e-deployer")} == {"token:e2e-deployer"}
    assert daemon.json("audit", "--actor", "admin-mallory") == []
    plain = daemon.run("audit", "--model", "m", "--action", "unpin", "--limit", "1")
    assert "(claimed admin-mallory)" in plain.output
    # the event stream (and so the webhooks, the same document) carries the claim
    status, _ = call(address, "GET", "/v1/events?after=0", guarded.tokens["viewer"], read=False)
    assert status == 200
    # creating and revoking tokens is audited with the creator
    made = [e for e in daemon.audit("--action", "token") if "e2e-revoked" in e["message"]]
    assert [e["actor"] for e in made] == [me, me]


def test_expired_and_revoked_tokens_and_strangers_are_refused(guarded: Guarded) -> None:
    address = guarded.address
    for which, reason in (("expired", "expired at"), ("revoked", "was revoked")):
        status, document = call(address, "GET", "/v1/models", guarded.tokens[which])
        assert status == 401 and reason in document["error"]["message"], (which, document)
    status, document = call(address, "GET", "/v1/models", guarded.keys.token(groups=["others"]))  # no role
    assert status == 403 and document["error"]["message"] == (
        "oidc:alice@example.com has no role; this needs role viewer")
    status, document = call(address, "POST", "/v1/gc", guarded.tokens["deployer"], {"keep": 5})
    assert status == 403 and document["error"] == {
        "class": "ForbiddenError", "message": "token:e2e-deployer has role deployer; this needs role admin",
        "exit_code": 5}
    token_file = guarded.base / "viewer.token"
    token_file.write_text(guarded.tokens["viewer"])
    token_file.chmod(0o600)
    result = guarded.daemon.run("gc", "--address", address, "--token-file", str(token_file))
    assert result.exit_code == 5 and "needs role admin" in result.output
    # revoked while in use: refused at the next request (its cache on this host is emptied)
    made = guarded.daemon.json("token", "create", "e2e-brief", "--role", "viewer")
    assert call(address, "GET", "/v1/models", made["token"])[0] == 200
    guarded.daemon.json("token", "revoke", "e2e-brief")
    assert call(address, "GET", "/v1/models", made["token"])[0] == 401


PATH_VALUES = {"model": "m", "name": "stable", "lease": "0" * 32, "delivery_id": "ff"}
BODIES: dict[tuple[str, str], Any] = {
    ("post", "/v1/models/{model}/load"): {}, ("post", "/v1/changesets"): {"models": ["m"]},
    ("put", "/v1/models/{model}/policy"): {"policy": "auto"}, ("post", "/v1/gc"): {"keep": 10},
    ("post", "/v1/tokens"): {"name": "table-made", "role": "viewer"}, ("put", "/v1/models/{model}/tags/{name}"): {},
    ("post", "/v1/models/{model}/lease"): {"for_s": 5},
}


def test_every_route_answers_each_role_as_it_declares(guarded: Guarded) -> None:
    """Every operation of the served document, with each credential: no token, expired or revoked: 401; a
    role below the declared one: 403; at or above it: anything but 401, 403 and 5xx (the route's own answer:
    200, or the model's state refusing, 404 for a fleet route here)."""
    address = guarded.address
    status, document = call(address, "GET", "/v1/openapi.json", guarded.tokens["viewer"])
    assert status == 200
    operations = [(method, path, op["x-tritonctl-role"]) for path, ops in document["paths"].items()
                  for method, op in ops.items()]
    assert len(operations) > 30
    seen: list[tuple[str, str, str, int]] = []
    for credential in ("none", "expired", "revoked", "viewer", "deployer", "admin"):
        for method, path, needed in operations:
            url = path
            for key, value in PATH_VALUES.items():
                url = url.replace("{" + key + "}", value)
            if path == "/v1/tokens/{name}":
                url = "/v1/tokens/e2e-revoked"
            if path == "/v1/events":
                url += "?after=0"
            bearer = None if credential == "none" else guarded.tokens[credential]
            status, answer = call(address, method.upper(), url, bearer, BODIES.get((method, path)),
                                  read=path != "/v1/events")
            seen.append((credential, method, path, status))
            where = f"{credential} {method.upper()} {url}: {status} {answer!r:.300}"
            if credential in ("none", "expired", "revoked"):
                assert status == 401, where
            elif ROLES.index(credential) < ROLES.index(needed):
                assert status == 403, where
                assert answer["error"]["message"].endswith(f"this needs role {needed}"), where
            else:
                assert status not in (401, 403) and status < 500, where
    # the viewer's reads did their work (not a refusal in disguise): every one answered 200 but the fleet's
    # routes (404 off a fleet) and a diff without its two digests (400)
    needs = {(method, path): role for method, path, role in operations}
    reads = {p: s for c, m, p, s in seen if c == "viewer" and m == "get" and needs[m, p] == "viewer"}
    assert {p: s for p, s in reads.items() if s != 200} == {
        "/v1/hosts": 404, "/v1/rollouts": 404, "/v1/models/{model}/diff": 400}, reads


def test_the_web_view_says_who_you_are_and_offers_only_what_your_role_may_do(guarded: Guarded) -> None:
    from urllib.parse import urlencode

    def page(path: str, bearer: str | None = None, cookie: str = "") -> tuple[int, str, dict[str, str]]:
        host, port = guarded.web.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        headers = {"Host": guarded.web, **({"Authorization": f"Bearer {bearer}"} if bearer else {}),
                   **({"Cookie": cookie} if cookie else {})}
        conn.request("GET", path, headers=headers)
        answer = conn.getresponse()
        out = answer.status, answer.read().decode(), dict(answer.getheaders())
        conn.close()
        return out

    status, html, _ = page("/ui/models/m", guarded.tokens["viewer"])
    assert status == 200 and "Signed in as <strong>token:e2e-viewer</strong>, role <strong>viewer</strong>" in html
    assert "Your role (viewer) reads" in html and "tritonctl load m" not in html
    status, html, _ = page("/ui/models/m", guarded.tokens["deployer"])
    assert "tritonctl load m" in html and "tritonctl rollback m" in html and "tritonctl policy" not in html
    status, html, _ = page("/ui/models/m", guarded.keys.token(groups=["ml-deployers"]))  # an OIDC bearer (a proxy's)
    assert status == 200 and "oidc:alice@example.com" in html and "tritonctl load m" in html
    _, html, _ = page("/ui/models/m", guarded.tokens["admin"])
    assert "tritonctl policy m manual" in html and "tritonctl gc --keep 10" in html
    assert page("/ui/models/m", guarded.tokens["revoked"])[0] == 303  # to the login form
    _, html, _ = page("/ui/audit?action=unpin", guarded.tokens["viewer"])
    assert "(claimed admin-mallory)" in html
    # a session opened with a token ends when the token is revoked
    made = guarded.daemon.json("token", "create", "e2e-web", "--role", "viewer")
    host, port = guarded.web.rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request("POST", "/ui/login", body=urlencode({"token": made["token"], "next": "/ui/"}),
                 headers={"Host": guarded.web, "Content-Type": "application/x-www-form-urlencoded"})
    answer = conn.getresponse()
    answer.read()
    assert answer.status == 303
    cookie = answer.getheader("set-cookie", "").split(";")[0]
    conn.close()
    assert page("/ui/", cookie=cookie)[0] == 200
    guarded.daemon.json("token", "revoke", "e2e-web")
    assert page("/ui/", cookie=cookie)[0] == 303
