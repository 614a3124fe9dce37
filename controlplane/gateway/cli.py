"""The gateway process's command line: explicit addresses, nothing read from tritonctl's settings."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from controlplane.gateway.server import GatewayOptions, serve


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def parse(argv: list[str]) -> GatewayOptions:
    parser = argparse.ArgumentParser(prog="python -m controlplane.gateway")
    parser.add_argument("--grpc-address", type=_address)
    parser.add_argument("--http-address", type=_address)
    parser.add_argument("--triton-grpc", type=_address, required=True)
    parser.add_argument("--triton-http", type=_address)
    parser.add_argument("--routes-file", type=Path)
    parser.add_argument("--upstream-connections", type=int, default=4)
    args = parser.parse_args(argv)
    return GatewayOptions(grpc_address=args.grpc_address, http_address=args.http_address,
                          triton_grpc=args.triton_grpc, triton_http=args.triton_http, routes_file=args.routes_file,
                          upstream_connections=args.upstream_connections)


def main(argv: list[str] | None = None) -> int:
    options = parse(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    import uvloop

    def ready(gw: object) -> None:
        print(f"gateway: grpc ports {gw.bound_ports()}", flush=True)  # type: ignore[attr-defined]

    return uvloop.run(serve(options, ready))
