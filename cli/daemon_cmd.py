"""`tritonctl daemon`: parse flags into settings and run the daemon (the core does the rest)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from controlplane.settings.config import LOG_FORMATS, LOG_LEVELS, POLICIES, load_settings


@click.command()
@click.option("--repository", help="Source repository to watch: a directory, s3://BUCKET/PREFIX, or an MLflow "
              "registry mlflow+http://HOST:PORT.")
@click.option("--state-dir", type=click.Path(path_type=Path, file_okay=False),
              help="State directory [default: /var/lib/tritonctl].")
@click.option("--db-url", help="SQLAlchemy URL of the registry [default: sqlite:///<state-dir>/registry.db].")
@click.option("--triton-url", help="gRPC HOST:PORT of an external tritonserver (explicit mode, on <state>/serving).")
@click.option("--launch-triton", is_flag=True, default=None, help="Start and supervise the embedded tritonserver.")
@click.option("--keep-triton", is_flag=True, default=None,
              help="On SIGTERM leave the launched tritonserver serving; the next start adopts it.")
@click.option("--tritonserver", type=click.Path(path_type=Path, dir_okay=False),
              help="tritonserver binary for --launch-triton.")
@click.option("--triton-grpc-port", type=int, help="--launch-triton: gRPC inference port [default: 8001; 0: free].")
@click.option("--triton-http-port", type=int, help="--launch-triton: HTTP inference port [default: 8000; 0: free].")
@click.option("--triton-metrics-port", type=int, help="--launch-triton: metrics port [default: 8002; 0: free].")
@click.option("--gateway/--no-gateway", "gateway", default=None,
              help="Answer inference through tritonctl's gateway, which switches versions without Triton reloading "
              "a model in place [default: on with --launch-triton] (docs/gateway.md).")
@click.option("--gateway-http-address", help="Gateway HTTP/REST inference HOST:PORT (an external tritonserver; "
              "with --launch-triton it takes --triton-http-port).")
@click.option("--gateway-grpc-address", help="Gateway gRPC inference HOST:PORT (an external tritonserver; with "
              "--launch-triton it takes --triton-grpc-port).")
@click.option("--gateway-drain", "gateway_drain_s", metavar="DURATION",
              help="After a switch the old version answers requests sent before it this long [default: 5s].")
@click.option("--settle", "settle_s", type=float, help="Settle window in seconds [default: 1.0, min 0.05].")
@click.option("--policy", type=click.Choice(POLICIES),
              help="Global deploy policy [default: auto]; ondemand: loaded by `ensure`.")
@click.option("--commit-marker", help="File name writers create last to mark a model complete.")
@click.option("--poll-interval", "poll_interval_s", type=float,
              help="Seconds between listings of an s3:// or mlflow+http:// repository [default: 2.0].")
@click.option("--socket", type=click.Path(path_type=Path), help="Control socket [default: <state-dir>/tritonctl.sock].")
@click.option("--socket-group", help="The group that owns the control socket (mode 0660) [default: the daemon's own].")
@click.option("--listen", help="Also listen on TCP HOST:PORT (requires --token-file).")
@click.option("--token-file", type=click.Path(path_type=Path, dir_okay=False),
              help="Token for --listen (a file only its owner and group can read).")
@click.option("--tls-cert", type=click.Path(path_type=Path, dir_okay=False),
              help="--listen serves HTTPS with this certificate (PEM; with --tls-key).")
@click.option("--tls-key", type=click.Path(path_type=Path, dir_okay=False), help="The private key of --tls-cert.")
@click.option("--allow-insecure-http", is_flag=True, default=None,
              help="Let --listen serve plain HTTP on a non-loopback address (refused without TLS otherwise), and an "
              "mlflow+http:// repository on one be read with MLflow credentials.")
@click.option("--web-address", help="Serve the read-only web view at http(s)://HOST:PORT/ui/ (off by default; "
              "a non-loopback address needs --token-file, and TLS or --allow-insecure-http).")
@click.option("--web-require-token", is_flag=True, default=None,
              help="Ask for the token on a loopback --web-address too.")
@click.option("--web-host-names", help="Comma-separated Host names the web view answers to besides its address's "
              "own (the name a browser uses for a non-loopback view); any other Host gets 421.")
@click.option("--metrics-port", type=int, help="Serve Prometheus metrics on this port (off by default).")
@click.option("--log-level", type=click.Choice(LOG_LEVELS), help="[default: info]")
@click.option("--log-format", type=click.Choice(LOG_FORMATS), help="[default: plain]")
@click.option("--host", help="This host's name in the registry (fleet use).")
@click.option("--fleet", is_flag=True, default=None,
              help="Join a fleet: --db-url is a PostgreSQL registry shared by every host (docs/fleet.md).")
@click.option("--shared-store",
              help="Fleet: snapshot content every host reads and the leader writes: a directory or s3://BUCKET/PREFIX.")
@click.option("--canary-hosts", help="Fleet: comma-separated hosts that take a new digest first.")
@click.option("--canary-count", type=int, help="Fleet: without --canary-hosts, the first N hosts by name [1].")
@click.option("--wave-size", type=int, help="Fleet: hosts per wave after the canaries [2].")
@click.option("--memory-budget-mb", type=float,
              help="Host memory (MB) the loaded models may hold; beyond it idle models are evicted [off].")
@click.option("--gpu-memory-budget-mb", type=float, help="GPU memory (MB) per GPU the loaded models may hold [off].")
@click.option("--bake", "bake_s", metavar="DURATION",
              help="Bake every new digest this long on Triton's figures; roll back by itself (docs/bake.md) [off].")
@click.option("--config", "config_file", type=click.Path(path_type=Path, dir_okay=False),
              help="TOML config file [default: /etc/tritonctl/tritonctl.toml if present]. Env: TRITONCTL_CONFIG.")
def daemon(config_file: Path | None, **flags: Any) -> None:
    """Run the control plane: watch, snapshot, record, deploy, reconcile.

    Settings come from flags, then TRITONCTL_* environment variables, then the config file.

    \b
    Examples:
      tritonctl daemon --repository examples/model_repository --state-dir .state --launch-triton
      tritonctl daemon --config /etc/tritonctl/tritonctl.toml --triton-url 127.0.0.1:8001
    """
    import gc

    from controlplane.runtime.allocator import cap_arenas
    from controlplane.runtime.process import harden

    cap_arenas()  # before any thread: its peak RSS (controlplane/runtime/allocator.py)
    harden()  # umask 027, the soft file limit raised to the hard one (controlplane/runtime/process.py)
    # The daemon's imports (about 70,000 objects the collector tracks: classes, functions, dicts) are
    # made with the collector off, then moved to its permanent generation, which later collections do
    # not traverse: a restart at 10,000 models reached READY in 2.08 s instead of 2.36 s (medians of 5
    # in turns, idle machine: bench/results/restart_ab.json; issue 26).
    gc.disable()
    from controlplane.daemon import Daemon  # deferred: the other commands need not import it
    from controlplane.runtime import logs

    gc.freeze()
    gc.enable()

    settings = load_settings(flags, config_file=config_file)
    fleet = None
    if settings.fleet:
        from controlplane.fleet.settings import from_settings

        fleet = from_settings(settings)
    logs.configure(settings.log_level, settings.log_format)
    runner = Daemon(settings, reload_settings=lambda: load_settings(flags, config_file=config_file), fleet=fleet)
    runner.install_signal_handlers()
    sys.exit(runner.run())


COMMANDS = [daemon]
