"""The gateway's side of its control channel: a Unix socket (0600), one JSON line in, one JSON line out.

See control.py for the protocol (parking.py for `wanted`, `note` and `refuse`). An `update` is validated
whole (routes.py), written durably to the routes file in a worker thread (so the fsync never stalls the
data path), and only then swapped in; updates are applied one at a time in the order they arrived. A
malformed line is answered with `{"ok": false, "error": ...}`; a client that sends more than `MAX_LINE`
bytes without a newline is disconnected.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path
from typing import Any

from controlplane.errors import TritonctlError
from controlplane.gateway.routes import RouteTable, route_to_json, routes_from_json, write_table

log = logging.getLogger("tritonctl.gateway")
MAX_LINE = 16 << 20
MAX_POLL_S = 30.0  # the longest `wanted` poll


class ControlServer:
    def __init__(self, gw: Any, path: Path) -> None:
        self.gw = gw
        self.path = path
        self.server: asyncio.AbstractServer | None = None
        self.lock = asyncio.Lock()

    async def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        old = os.umask(0o177)  # the socket is created 0600: only the daemon's user may steer the data path
        try:
            self.server = await asyncio.start_unix_server(self._client, str(self.path), limit=MAX_LINE)
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        try:
            self.path.unlink()
        except OSError:
            pass

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    line = await reader.readline()
                except (asyncio.LimitOverrunError, ValueError):
                    break
                if not line:
                    break
                answer = await self.handle(line)
                writer.write((json.dumps(answer, separators=(",", ":")) + "\n").encode())
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def handle(self, line: bytes) -> dict[str, Any]:
        try:
            request = json.loads(line)
            if not isinstance(request, dict):
                raise ValueError("a request is a JSON object")
        except ValueError as exc:
            return {"ok": False, "error": f"not a JSON object: {exc}"}
        op = request.get("op")
        try:
            if op == "hello":
                return {"ok": True, **self.gw.hello()}
            if op == "routes":
                table = self.gw.routes
                return {"ok": True, "version": table.version,
                        "routes": {name: route_to_json(route) for name, route in sorted(table.routes.items())}}
            if op == "figures":
                return {"ok": True, "figures": self.gw.figures.to_json()}
            if op == "inflight":
                names = request.get("names", [])
                if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                    return {"ok": False, "error": "inflight: names must be a list of strings"}
                return {"ok": True, "inflight": self.gw.figures.inflight(names)}
            if op == "update":
                return await self._update(request)
            if op == "last":
                return {"ok": True, "last": self.gw.figures.last_use()}
            if op in ("wanted", "note", "refuse"):
                return await self._loads(op, request)
        except TritonctlError as exc:
            return {"ok": False, "error": str(exc)}
        return {"ok": False, "error": f"unknown op {op!r} (hello, update, routes, figures, inflight, last, wanted, "
                                     "note, refuse)"}

    async def _loads(self, op: str, request: dict[str, Any]) -> dict[str, Any]:
        """The daemon's side of requests that load models (parking.py): what is wanted, how its load goes."""
        parking = self.gw.parking
        if op == "wanted":
            after, wait_s, load_wait_s = request.get("after", 0), request.get("wait_s", 0), request.get("load_wait_s")
            if isinstance(after, bool) or not isinstance(after, int) or after < 0:
                return {"ok": False, "error": "wanted.after: must be a non-negative integer"}
            if isinstance(wait_s, bool) or not isinstance(wait_s, (int, float)) or not 0 <= wait_s <= MAX_POLL_S:
                return {"ok": False, "error": f"wanted.wait_s: must be a number of seconds from 0 to {MAX_POLL_S:g}"}
            if load_wait_s is not None:
                if isinstance(load_wait_s, bool) or not isinstance(load_wait_s, (int, float)) or \
                        not 0 <= load_wait_s < float("inf"):
                    return {"ok": False, "error": "wanted.load_wait_s: must be 0 or more seconds"}
                parking.load_wait_s = float(load_wait_s)
            return {"ok": True, **await parking.wanted(after, float(wait_s))}
        model, text = request.get("model"), request.get("reason" if op == "refuse" else "text")
        if not isinstance(model, str) or not model:
            return {"ok": False, "error": f"{op}.model: must be a model name"}
        if not isinstance(text, str):
            return {"ok": False, "error": f"{op}.{'reason' if op == 'refuse' else 'text'}: must be a string"}
        if op == "note":
            return {"ok": True, "waiting": parking.note(model, text)}
        return {"ok": True, "answered": parking.refuse(model, text)}

    async def _update(self, request: dict[str, Any]) -> dict[str, Any]:
        set_routes = routes_from_json(request.get("set") or {}, "update.set")
        delete = request.get("delete") or []
        if not isinstance(delete, list) or not all(isinstance(n, str) for n in delete):
            return {"ok": False, "error": "update.delete: must be a list of model names"}
        version = request.get("version")
        if version is not None and (isinstance(version, bool) or not isinstance(version, int) or version < 0):
            return {"ok": False, "error": "update.version: must be a non-negative integer"}
        async with self.lock:
            table: RouteTable = self.gw.routes.updated(set_routes, delete, version)
            routes_file = self.gw.options.routes_file
            if routes_file is not None:
                try:
                    await asyncio.get_running_loop().run_in_executor(None, write_table, routes_file, table)
                except OSError as exc:
                    return {"ok": False, "error": f"{routes_file}: cannot write the routes file: {exc.strerror or exc}"}
            self.gw.install(table)
        log.info("gateway: routes version %d (%d set, %d deleted)", table.version, len(set_routes), len(delete))
        return {"ok": True, "version": table.version}
