"""The gateway process's command line: every address explicit, nothing read from tritonctl's settings.

    python -m controlplane.gateway --grpc-address 127.0.0.1:8001 --http-address 127.0.0.1:8000 \\
        --triton-grpc 127.0.0.1:18001 --triton-http 127.0.0.1:18000 \\
        --control-socket STATE/gateway/gateway.sock --routes-file STATE/gateway/routes.json

A port of 0 takes a free one; `hello` on the control socket (and the start line in the log) says
which. A bad argument or an unreadable routes file exits 2 with one line on stderr.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from controlplane.errors import TritonctlError
from controlplane.gateway.parking import DEFAULT_LOAD_WAIT_S, MAX_BYTES, PER_MODEL
from controlplane.gateway.server import DEFAULT_MAX_MESSAGE, GatewayOptions, serve


def address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def parse(argv: list[str]) -> GatewayOptions:
    parser = argparse.ArgumentParser(prog="python -m controlplane.gateway",
                                     description="tritonctl's gateway in front of tritonserver (docs/gateway.md)")
    parser.add_argument("--grpc-address", type=address, help="client-facing gRPC listener, HOST:PORT")
    parser.add_argument("--http-address", type=address, help="client-facing HTTP/REST listener, HOST:PORT")
    parser.add_argument("--metrics-address", type=address, help="Prometheus /metrics listener, HOST:PORT")
    parser.add_argument("--triton-grpc", type=address, required=True, help="tritonserver's gRPC port, HOST:PORT")
    parser.add_argument("--triton-http", type=address, help="tritonserver's HTTP port, HOST:PORT")
    parser.add_argument("--triton-metrics", type=address, help="tritonserver's metrics port, HOST:PORT")
    parser.add_argument("--control-socket", type=Path, help="the daemon's control channel (a Unix socket, 0600)")
    parser.add_argument("--routes-file", type=Path, help="routes read at start and written by every update")
    parser.add_argument("--upstream-connections", type=int, default=4,
                        help="HTTP/2 connections to tritonserver shared by all gRPC clients (default 4)")
    parser.add_argument("--http-connections", type=int, default=64,
                        help="keep-alive HTTP connections to tritonserver at most (default 64)")
    parser.add_argument("--max-message-bytes", type=int, default=DEFAULT_MAX_MESSAGE,
                        help=f"largest gRPC message or buffered answer (default {DEFAULT_MAX_MESSAGE})")
    parser.add_argument("--drain-s", type=float, default=30.0, help="SIGTERM: how long calls in flight may finish")
    parser.add_argument("--load-wait-s", type=float, default=DEFAULT_LOAD_WAIT_S,
                        help="how long a request for a model that is not loaded waits for its load (default "
                             f"{DEFAULT_LOAD_WAIT_S:g}; the daemon sets gateway_load_wait_s on the control socket)")
    parser.add_argument("--waiting-per-model", type=int, default=PER_MODEL,
                        help=f"requests that may wait for one model's load (default {PER_MODEL})")
    parser.add_argument("--waiting-bytes", type=int, default=MAX_BYTES,
                        help=f"request bytes all waiting requests may hold together (default {MAX_BYTES})")
    args = parser.parse_args(argv)
    if args.grpc_address is None and args.http_address is None:
        parser.error("give --grpc-address, --http-address or both")
    if args.http_address is not None and args.triton_http is None:
        parser.error("--http-address needs --triton-http")
    for name in ("upstream_connections", "http_connections", "max_message_bytes", "waiting_per_model",
                 "waiting_bytes"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if not 0 <= args.load_wait_s < float("inf"):
        parser.error("--load-wait-s must be 0 or more seconds")
    return GatewayOptions(grpc_address=args.grpc_address, http_address=args.http_address,
                          metrics_address=args.metrics_address, triton_grpc=args.triton_grpc,
                          triton_http=args.triton_http, triton_metrics=args.triton_metrics,
                          control_socket=args.control_socket, routes_file=args.routes_file,
                          upstream_connections=args.upstream_connections, http_connections=args.http_connections,
                          max_message=args.max_message_bytes, drain_s=args.drain_s, load_wait_s=args.load_wait_s,
                          waiting_per_model=args.waiting_per_model, waiting_bytes=args.waiting_bytes)


def main(argv: list[str] | None = None) -> int:
    options = parse(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    import uvloop

    try:
        return int(uvloop.run(serve(options)))
    except TritonctlError as exc:  # the routes file
        print(f"gateway: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a listener's address taken or not ours
        print(f"gateway: cannot listen: {exc.strerror or exc}", file=sys.stderr)
        return 2
