"""The daemon's side of the gateway's control channel: a blocking client over the gateway's Unix socket.

The channel is one JSON object per line, request then answer (controlserver.py is the gateway's side):

    {"op": "hello"}                                   -> {"ok": true, "pid", "started", "version", "ports"}
    {"op": "update", "set": {MODEL: ROUTE}, "delete": [MODEL], "version": N}
                                                      -> {"ok": true, "version": N}
    {"op": "routes"}                                  -> {"ok": true, "version": N, "routes": {MODEL: ROUTE}}
    {"op": "figures"}                                 -> {"ok": true, "figures": {...}} (figures.py's shape)
    {"op": "inflight", "names": [PRIVATE]}            -> {"ok": true, "inflight": {PRIVATE: COUNT}}
    {"op": "last"}                                    -> {"ok": true, "last": {MODEL: EPOCH_S}}
    {"op": "wanted", "after": G, "wait_s": S, "load_wait_s": W}
                                                      -> {"ok": true, "generation": G2,
                                                          "wanted": {MODEL: {"since", "waiting", "waited_s"}}}
    {"op": "note", "model": MODEL, "text": TEXT}      -> {"ok": true, "waiting": BOOL}
    {"op": "refuse", "model": MODEL, "reason": TEXT}  -> {"ok": true, "answered": N}
    a refusal                                         -> {"ok": false, "error": "one line"}

`last` is each public model's last inference request, now for a model with a request in flight (what the
memory budget's LRU and the idle sweep read). `wanted` is a
long poll: it answers once a model becomes wanted after generation G (a request for a `loadable` route was
parked: controlplane/gateway/parking.py), or after S seconds, and sets how long parked requests wait (W,
`gateway_load_wait_s`). `note` says what a load is doing (named by a timeout), `refuse` answers every request
waiting for MODEL with UNAVAILABLE / 503 and the reason.

An `update` is written to the routes file (temporary file, fsync, rename) before it is answered, then
swapped in whole: a daemon that saw `ok` knows the gateway serves the new routes and will again after
a restart. Each call opens its own connection (no state to lose between calls); every failure is a
`GatewayError` with one line naming the socket. No asyncio here: the daemon imports this.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from controlplane.errors import GatewayError
from controlplane.gateway.routes import Route, RouteTable, route_to_json, table_from_json

MAX_ANSWER = 64 << 20


class GatewayControl:
    def __init__(self, socket_path: Path | str, timeout_s: float = 5.0) -> None:
        self.socket_path = Path(socket_path)
        self.timeout_s = timeout_s

    def call(self, request: dict[str, Any]) -> dict[str, Any]:
        """One request, one answer; GatewayError when the gateway cannot be reached or refuses."""
        data = (json.dumps(request, separators=(",", ":")) + "\n").encode()
        chunks: list[bytes] = []
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(self.timeout_s)
                sock.connect(str(self.socket_path))
                sock.sendall(data)
                size = 0
                while True:
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    chunks.append(chunk)
                    size += len(chunk)
                    if chunk.endswith(b"\n"):
                        break
                    if size > MAX_ANSWER:
                        raise GatewayError(f"gateway at {self.socket_path}: answer over {MAX_ANSWER} bytes")
        except FileNotFoundError:
            raise GatewayError(f"gateway control socket {self.socket_path} does not exist "
                               "(gateway not running)") from None
        except ConnectionRefusedError:
            raise GatewayError(f"gateway at {self.socket_path} refused the connection (gateway not running)") from None
        except TimeoutError:
            raise GatewayError(f"gateway at {self.socket_path} did not answer within {self.timeout_s:g}s") from None
        except OSError as exc:
            raise GatewayError(f"gateway at {self.socket_path}: {exc.strerror or exc}") from None
        try:
            answer = json.loads(b"".join(chunks))
        except ValueError:
            raise GatewayError(f"gateway at {self.socket_path} answered out of protocol (not one JSON line)") from None
        if not isinstance(answer, dict):
            raise GatewayError(f"gateway at {self.socket_path} answered out of protocol (not a JSON object)")
        if not answer.get("ok"):
            raise GatewayError(f"gateway at {self.socket_path} refused {request.get('op')}: "
                               f"{answer.get('error', 'no reason given')}")
        return answer

    def hello(self) -> dict[str, Any]:
        """pid, start time (`started`, seconds since the epoch), routes `version` and bound `ports`."""
        return self.call({"op": "hello"})

    def update(self, set: Mapping[str, Route] | None = None, delete: Iterable[str] = (),  # noqa: A002 - the issue's word
               version: int | None = None) -> int:
        """Set and delete routes in one swap; returns the routes version now served."""
        routes = {name: route_to_json(route) for name, route in (set or {}).items()}
        request: dict[str, Any] = {"op": "update", "set": routes, "delete": list(delete)}
        if version is not None:
            request["version"] = version
        return int(self.call(request)["version"])

    def routes(self) -> RouteTable:
        answer = self.call({"op": "routes"})
        return table_from_json({"version": answer.get("version", 0), "routes": answer.get("routes", {})},
                               f"gateway at {self.socket_path}")

    def figures(self) -> dict[str, Any]:
        return dict(self.call({"op": "figures"})["figures"])

    def inflight(self, names: Iterable[str]) -> dict[str, int]:
        return {str(k): int(v) for k, v in self.call({"op": "inflight", "names": list(names)})["inflight"].items()}

    def last(self) -> dict[str, float]:
        """Each public model's last inference request through the gateway (seconds since the epoch)."""
        return {str(k): float(v) for k, v in self.call({"op": "last"})["last"].items()}

    def wanted(self, after: int, wait_s: float, load_wait_s: float | None = None) -> tuple[int, dict[str, Any]]:
        """(generation, {model: {"since", "waiting", "waited_s"}}) once a model is wanted after `after`, or after
        `wait_s`; this client's timeout must outlast `wait_s`."""
        request: dict[str, Any] = {"op": "wanted", "after": after, "wait_s": wait_s}
        if load_wait_s is not None:
            request["load_wait_s"] = load_wait_s
        answer = self.call(request)
        wanted = answer.get("wanted")
        return int(answer.get("generation", 0)), dict(wanted) if isinstance(wanted, dict) else {}

    def note(self, model: str, text: str) -> bool:
        return bool(self.call({"op": "note", "model": model, "text": text}).get("waiting"))

    def refuse(self, model: str, reason: str) -> int:
        return int(self.call({"op": "refuse", "model": model, "reason": reason}).get("answered", 0))
