"""The control API client the CLI uses: the standard library's http.client over the Unix socket (or TCP).

One method per verb, each one HTTP call; core errors re-raised by class name (controlplane/api/protocol.py)
so the CLI exits as if the core had raised them. It imports nothing but the standard library and
`controlplane.errors` / `controlplane.api.protocol`: a `tritonctl status` process pays for no HTTP
framework, no gRPC, no protobuf (tests/test_layers.py checks the modules a real process loaded).
"""

from __future__ import annotations

import http.client
import json
import os
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from controlplane import errors
from controlplane.api.protocol import (
    ACTOR_HEADER,
    API_PREFIX,
    ProgressMessage,
    error_from_document,
)
from controlplane.base import jsontext
from controlplane.names import validate_model_name

ProgressFn = Callable[[ProgressMessage], None]
UNARY_TIMEOUT_S = 30.0


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTP over a Unix socket: the host name only fills the Host header."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.unix_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def _current_user() -> str:
    """Who the caller says they are on TCP (on the socket the daemon asks the kernel instead)."""
    for name in ("LOGNAME", "USER", "LNAME", "USERNAME"):
        if os.environ.get(name):
            return os.environ[name]
    return f"uid:{os.getuid()}"


def _model(name: str) -> str:
    """/models/NAME, the name checked as the daemon checks it (a '/' would be a different route)."""
    validate_model_name(name)
    return f"/models/{quote(name, safe='')}"


def _query(params: dict[str, Any]) -> str:
    """`?k=v&...` of the parameters given (None: left out), or nothing."""
    given = {key: value for key, value in params.items() if value is not None}
    return f"?{urlencode(given)}" if given else ""


class ControlClient:
    """Talks to a daemon on a Unix socket path or, with a token, on HOST:PORT (https://HOST:PORT: TLS)."""

    def __init__(self, socket: Path | None = None, address: str | None = None, token: str | None = None,
                 timeout_s: float = 600.0, ca_file: Path | None = None) -> None:
        if address and not token:
            raise errors.UsageError("--address needs --token-file (the TCP listener requires a token)")
        self._socket = socket
        self._address = address
        self._ca_file = ca_file
        self.timeout_s = timeout_s
        self._headers = {ACTOR_HEADER: _current_user(), "Accept": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"

    def close(self) -> None:
        """Nothing to release: every call opens and closes its own connection."""

    # -- transport ------------------------------------------------------------------------------------

    def _connection(self, timeout_s: float) -> http.client.HTTPConnection:
        if not self._address:
            assert self._socket is not None
            return UnixHTTPConnection(str(self._socket), timeout_s)
        address = self._address
        if address.startswith("https://"):
            import ssl

            context = ssl.create_default_context(cafile=str(self._ca_file) if self._ca_file else None)
            return http.client.HTTPSConnection(address.removeprefix("https://").rstrip("/"), timeout=timeout_s,
                                               context=context)
        return http.client.HTTPConnection(address.removeprefix("http://").rstrip("/"), timeout=timeout_s)

    def _unavailable(self, exc: OSError) -> errors.DaemonUnavailableError:
        if not self._address:
            return errors.DaemonUnavailableError(
                f"no daemon at {self._socket}; start one (`tritonctl daemon`) or set TRITONCTL_STATE_DIR / --state-dir")
        return errors.DaemonUnavailableError(f"no daemon at {self._address} ({exc.strerror or exc}); start one "
                                             "(`tritonctl daemon --listen`) or fix TRITONCTL_ADDRESS / --address")

    def request(self, method: str, path: str, body: dict[str, Any] | None = None,
                timeout_s: float = UNARY_TIMEOUT_S, headers: dict[str, str] | None = None,
                ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        """Send one request; the caller reads the response and closes the connection."""
        connection = self._connection(timeout_s)
        payload = json.dumps(body).encode() if body is not None else None
        all_headers = {**self._headers, **(headers or {})}
        if payload is not None:
            all_headers["Content-Type"] = "application/json"
        try:
            connection.request(method, API_PREFIX + path, body=payload, headers=all_headers)
            response = connection.getresponse()
        except (TimeoutError, ConnectionRefusedError, FileNotFoundError, ConnectionResetError) as exc:
            connection.close()
            raise self._unavailable(exc) from None
        except OSError as exc:
            connection.close()
            if exc.__class__.__name__ == "SSLCertVerificationError":
                raise errors.PermissionDeniedError(f"control API at {self._address}: {exc}") from None
            raise self._unavailable(exc) from None
        if response.status >= 400:
            raw = response.read()
            connection.close()
            try:
                document = json.loads(raw)
            except ValueError:
                document = None
            raise error_from_document(document, f"HTTP {response.status} {response.reason}")
        return connection, response

    def call(self, method: str, path: str, body: dict[str, Any] | None = None,
             timeout_s: float = UNARY_TIMEOUT_S) -> Any:
        """One request answered by one JSON document."""
        connection, response = self.request(method, path, body, timeout_s)
        try:
            return jsontext.loads(response.read())  # `status --json` of 10,000 models: 5 MB
        finally:
            connection.close()

    def stream(self, method: str, path: str, body: dict[str, Any] | None,
               on_progress: ProgressFn | None) -> dict[str, Any]:
        """One request answered by NDJSON steps, then the result (or an error)."""
        connection, response = self.request(method, path, body, self.timeout_s)
        try:
            for raw in response:
                line = json.loads(raw)
                if "progress" in line:
                    if on_progress:
                        on_progress(ProgressMessage.from_json(line["progress"]))
                elif "result" in line:
                    return dict(line["result"])
                elif "error" in line:
                    raise error_from_document(line, "the operation failed")
        except (OSError, http.client.HTTPException) as exc:
            raise errors.DaemonUnavailableError(f"control API: the stream broke: {exc}") from None
        finally:
            connection.close()
        raise errors.TritonctlError("control API: the stream ended without an outcome")

    def lines(self, path: str, headers: dict[str, str] | None = None, timeout_s: float | None = None
              ) -> Iterator[bytes]:
        """The raw lines of a long-lived response (the event stream), until the daemon closes it."""
        connection, response = self.request("GET", path, None, timeout_s or self.timeout_s, headers)
        try:
            yield from response
        finally:
            connection.close()

    # -- verbs ----------------------------------------------------------------------------------------

    def ping(self) -> dict[str, Any]:
        return dict(self.call("GET", "/ping", timeout_s=5.0))

    def load(self, model: str, digest: str = "", force: bool = False, wait: bool = True,
             on_progress: ProgressFn | None = None, host: str = "", tag: str = "",
             models: list[str] | None = None, bake_s: float | None = None,
             steps: list[int | str] | None = None, shadow_s: float | None = None) -> dict[str, Any]:
        if models and len(models) > 1:
            if digest or host or tag or bake_s is not None or steps is not None or shadow_s is not None:
                raise errors.UsageError("--digest, --tag, --host, --bake, --steps and --shadow take one MODEL, not a "
                                        "change set of several")
            return self.stream("POST", "/changesets", {"models": models, "force": force, "wait": wait}, on_progress)
        body: dict[str, Any] = {"digest": digest, "tag": tag, "force": force, "wait": wait, "host": host}
        if bake_s is not None:
            body["bake_s"] = bake_s
        if steps is not None:
            body["steps"] = steps
        if shadow_s is not None:
            body["shadow_s"] = shadow_s
        return self.stream("POST", f"{_model(model)}/load", body, on_progress)

    def promote(self, model: str) -> dict[str, Any]:
        """End MODEL's bake in progress as passed; answers the bake (status's `bake`)."""
        return dict(self.call("POST", f"{_model(model)}/promote", {}))

    def abort(self, model: str) -> dict[str, Any]:
        """End MODEL's canary (or bake) in progress as a crossed limit does; answers the bake."""
        return dict(self.call("POST", f"{_model(model)}/abort", {}))

    def rollback(self, model: str, to_digest: str = "", on_progress: ProgressFn | None = None, force: bool = False,
                 host: str = "", to_tag: str = "") -> dict[str, Any]:
        body = {"to": to_digest, "to_tag": to_tag, "force": force, "host": host}
        return self.stream("POST", f"{_model(model)}/rollback", body, on_progress)

    def unload(self, model: str, dependents: bool = False, on_progress: ProgressFn | None = None,
               force: bool = False, host: str = "") -> dict[str, Any]:
        body = {"dependents": dependents, "force": force, "host": host}
        return self.stream("POST", f"{_model(model)}/unload", body, on_progress)

    def status(self, models: list[str] | None = None) -> dict[str, Any]:
        query = f"?{urlencode([('model', m) for m in models])}" if models else ""
        return dict(self.call("GET", f"/models{query}"))

    def set_policy(self, model: str, policy: str, host: str = "") -> dict[str, Any]:
        return dict(self.call("PUT", f"{_model(model)}/policy", {"policy": policy, "host": host}))

    def ensure(self, model: str, for_s: float) -> dict[str, Any]:
        """Load MODEL (or find it loaded) and hold it with a lease; answers once it is READY."""
        return dict(self.call("POST", f"{_model(model)}/lease", {"for_s": for_s}, timeout_s=3600.0))

    def renew_lease(self, model: str, lease: str, for_s: float) -> dict[str, Any]:
        return dict(self.call("PUT", f"{_model(model)}/lease/{quote(lease, safe='')}", {"for_s": for_s}))

    def release_lease(self, model: str, lease: str) -> dict[str, Any]:
        return dict(self.call("DELETE", f"{_model(model)}/lease/{quote(lease, safe='')}"))

    def set_pin(self, model: str, pinned: bool, host: str = "") -> dict[str, Any]:
        path = f"{_model(model)}/pin"
        if pinned:
            return dict(self.call("PUT", path, {"host": host}))
        return dict(self.call("DELETE", path + (f"?{urlencode({'host': host})}" if host else "")))

    def gc(self, keep: int) -> dict[str, Any]:
        return dict(self.call("POST", "/gc", {"keep": keep}, timeout_s=600.0))

    def tag(self, model: str, name: str, digest: str = "", delete: bool = False,
            on_progress: ProgressFn | None = None) -> dict[str, Any]:
        path = f"{_model(model)}/tags/{quote(name, safe='')}"
        if delete:
            if digest:
                raise errors.UsageError("tag --delete takes no DIGEST")
            return self.stream("DELETE", path, None, on_progress)
        return self.stream("PUT", path, {"digest": digest}, on_progress)

    # -- reads: the registry's history and the fleet's views, as the daemon answers them ---------------

    def versions(self, model: str) -> list[dict[str, Any]]:
        return list(self.call("GET", f"{_model(model)}/versions"))

    def diff(self, model: str, ref_a: str, ref_b: str) -> dict[str, Any]:
        return dict(self.call("GET", f"{_model(model)}/diff?{urlencode({'a': ref_a, 'b': ref_b})}"))

    def audit(self, **filters: Any) -> list[dict[str, Any]]:
        """`filters`: model, action, outcome, actor, since, until, limit (None: not given)."""
        return list(self.call("GET", f"/audit{_query(filters)}"))

    def serving_at(self, at: str, model: str | None = None) -> dict[str, Any]:
        return dict(self.call("GET", f"/audit{_query({'at': at, 'model': model})}"))

    def tags(self, model: str | None = None, at: str | None = None) -> dict[str, Any]:
        return dict(self.call("GET", f"/tags{_query({'model': model, 'at': at})}"))

    def hosts(self) -> list[dict[str, Any]]:
        return list(self.call("GET", "/hosts"))

    def rollouts(self, only_open: bool = False, limit: int = 20) -> list[dict[str, Any]]:
        return list(self.call("GET", f"/rollouts{_query({'open': 'true' if only_open else None, 'limit': limit})}"))

    def fleet_matrix(self, models: list[str] | None = None) -> dict[str, Any]:
        query = urlencode([("fleet", "true"), *(("model", m) for m in models or [])])
        return dict(self.call("GET", f"/models?{query}"))

    def webhook_deliveries(self, state: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
        query = urlencode({"limit": limit, **({"state": state} if state else {})})
        return list(self.call("GET", f"/webhooks/deliveries?{query}"))

    def redeliver(self, delivery_id: str) -> dict[str, Any]:
        return dict(self.call("POST", f"/webhooks/deliveries/{quote(delivery_id, safe='')}/redeliver"))

    # -- personal tokens (role admin) ----------------------------------------------------------------------

    def create_token(self, name: str, role: str, expires_s: float | None) -> dict[str, Any]:
        return dict(self.call("POST", "/tokens", {"name": name, "role": role, "expires_s": expires_s}))

    def tokens(self) -> list[dict[str, Any]]:
        return list(self.call("GET", "/tokens"))

    def revoke_token(self, name: str) -> dict[str, Any]:
        return dict(self.call("DELETE", f"/tokens/{quote(name, safe='')}"))

    # -- the event stream ------------------------------------------------------------------------------

    def events(self, after: int | None = None, reconnect: bool = True) -> Iterator[Event]:
        """Follow /v1/events: each audit record (`kind` "audit", its id) and state change ("state"). With
        `reconnect`, a daemon that stops or restarts is waited for and the stream resumes after the last id
        seen (Last-Event-ID), so nothing is lost or repeated."""
        import time

        last = after
        while True:
            headers = {"Accept": "text/event-stream"}
            if last is not None:
                headers["Last-Event-ID"] = str(last)
            try:
                for event in parse_sse(self.lines("/events", headers, timeout_s=3600.0)):
                    if event.id is not None:
                        last = event.id
                    yield event
            except (errors.DaemonUnavailableError, OSError, http.client.HTTPException):
                if not reconnect:
                    raise
            if not reconnect:
                return
            time.sleep(0.5)


@dataclass(frozen=True)
class Event:
    """One server-sent event: `kind` audit or state, its JSON data, the audit id (None for state events)."""

    kind: str
    data: dict[str, Any]
    id: int | None = None


def parse_sse(lines: Iterator[bytes]) -> Iterator[Event]:
    """Server-sent events from raw lines (the `text/event-stream` format: fields, then a blank line)."""
    kind, event_id = "message", None
    data: list[str] = []
    for raw in lines:
        line = raw.decode("utf-8").rstrip("\r\n")
        if not line:
            if data:
                yield Event(kind, json.loads("\n".join(data)), event_id)
            kind, event_id, data = "message", None, []
        elif line.startswith(":"):
            continue
        else:
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "event":
                kind = value
            elif field == "data":
                data.append(value)
            elif field == "id" and value.isdigit():
                event_id = int(value)
