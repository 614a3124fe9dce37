"""A webhook receiver for the tests: a real HTTP server on loopback that checks every signature the way
docs/operations.md tells receivers to, and records every delivery it gets.

`mode` says how it answers: "ok" (204), "500" (an error with a body), "slow" (records the delivery,
then waits `slow_s` before answering 200: a daemon can be killed mid-delivery); `down()` closes its
socket (connections are refused) and `up()` listens on the same port again.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Received:
    delivery: str
    event: str
    signature_ok: bool
    document: dict[str, Any]
    answered: int


class Receiver:
    def __init__(self, secret: str, port: int = 0) -> None:
        self.secret = secret.encode()
        self.mode = "ok"
        self.slow_s = 3.0
        self.received: list[Received] = []
        self.attempts_while_down = 0
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self.port = port
        self.up()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def up(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                given = self.headers.get("X-Tritonctl-Signature-256", "")
                stamp = given.partition("t=")[2].partition(",")[0]
                signed = f"{stamp}.{self.headers.get('X-Tritonctl-Delivery', '')}.".encode() + body
                expected = f"t={stamp},sha256=" + hmac.new(receiver.secret, signed, hashlib.sha256).hexdigest()
                fresh = stamp.isdigit() and abs(time.time() - int(stamp)) <= 300
                mode = receiver.mode
                status = {"ok": 204, "500": 500, "slow": 200}[mode]
                with receiver._lock:
                    receiver.received.append(Received(self.headers.get("X-Tritonctl-Delivery", ""),
                                                      self.headers.get("X-Tritonctl-Event", ""),
                                                      fresh and hmac.compare_digest(expected, given),
                                                      json.loads(body), status))
                if mode == "slow":
                    time.sleep(receiver.slow_s)
                if status == 500:
                    payload = b"receiver is broken today"
                    self.send_response(500)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def down(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def close(self) -> None:
        self.down()

    def deliveries(self) -> list[Received]:
        with self._lock:
            return list(self.received)

    def accepted(self) -> list[Received]:
        """Deliveries it answered 2xx (a "slow" one counts: its answer may never have reached the sender)."""
        return [r for r in self.deliveries() if r.answered < 300]
