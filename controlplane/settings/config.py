"""Daemon settings: flag > TRITONCTL_* environment > TOML config file > defaults, validated once.

Each setting is declared once in `FIELDS` with its type, default, unit and doc; docs/configuration.md's
configuration table is the same list. Unknown keys and bad values are one-line `ConfigError`s that
name the key and where it came from.
"""

from __future__ import annotations

import ipaddress
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from controlplane.base import bounds
from controlplane.base.defaults import DEFAULT_STATE_DIR, SOCKET_NAME
from controlplane.errors import ConfigError
from controlplane.settings.access import ACCESS_PARSERS, RoleMap, check_access
from controlplane.settings.canarysteps import AT_ONCE, header_name, parse_steps
from controlplane.settings.webhooks import WebhookTarget as WebhookTarget  # the [[webhook]] tables
from controlplane.settings.webhooks import private_file_problem as private_file_problem
from controlplane.settings.webhooks import webhook_tables
from controlplane.text import duration_s

DEFAULT_CONFIG_FILE = Path("/etc/tritonctl/tritonctl.toml")
ENV_PREFIX = "TRITONCTL_"
POLICIES = ("auto", "manual", "ondemand")
LOG_FORMATS = ("plain", "json")
LOG_LEVELS = ("debug", "info", "warning", "error")
WATCH_MODES = ("auto", "inotify", "poll")
EXPOSED_KEY_CHOICES = ("warn", "refuse")  # launch_triton_exposed_key
DEFAULT_MAX_MODEL_BYTES = 20 * 1024**3  # max_model_bytes: 20 GiB
BAKE_INCONCLUSIVE = ("keep", "rollback")  # what an inconclusive bake does (docs/bake.md)
# TRITONCTL_* variables that are not daemon settings: the config file's path, the CLI client's
# daemon address, the test-only fault point. A shell set up for the CLI can still start the daemon.
NOT_SETTINGS_ENV = ("TRITONCTL_CONFIG", "TRITONCTL_ADDRESS", "TRITONCTL_CA_FILE", "TRITONCTL_FAULT")
# The test suite's own switches (TRITONCTL_TEST_NO_SKIP, set by `python -m tests.tiers` for every
# process it starts, TRITONCTL_TEST_NO_MOUNT, TRITONCTL_TEST_DROP_EVENTS): never daemon settings, so a
# daemon a test starts under them is not refused.
TEST_ENV_PREFIX = "TRITONCTL_TEST_"
# What SIGHUP may change without a restart (everything else needs one).
RELOADABLE = ("policy", "settle_s", "gateway_drain_s", "gateway_load_wait_s", "log_level", "reconcile_interval_s",
              "canary_hosts", "canary_count", "wave_size", "liveness_s", "converge_s", "wave_bake_s", "webhook",
              "webhook_retry_max_s", "bake_s", "bake_max_failure_ratio", "bake_max_latency_ratio",
              "bake_min_requests", "bake_inconclusive", "bake_warn_load_ratio", "canary_steps",
              "canary_sticky_header", "wave_steps", "shadow_s", "shadow_fraction", "shadow_rtol", "shadow_atol",
              "shadow_keep_inputs", "shadow_min_agreement")
# The mode's defaults (docs/bake.md "Safe defaults"): where a gateway carries the traffic
# (`Settings.routes_traffic`) a new digest takes a tenth of the requests for a minute before all of them;
# without one, a deploy switches at once and does not bake (what tritonctl did before the gateway).
GATEWAY_CANARY_STEPS: tuple[int | str, ...] = (10, 100)
GATEWAY_BAKE_S = 60.0
MODE_DEFAULT = -1.0  # `bake_s` not given: the mode's default, resolved when the Settings are made


@dataclass(frozen=True)
class Settings:
    """Everything the daemon needs, with units in the names."""

    repository: Path | None = None  # source repository people edit (watched)
    repository_url: str | None = None  # `repository` given as s3://BUCKET/PREFIX or mlflow+http://HOST:PORT
    mlflow_alias: str = "champion"  # an mlflow+http:// repository serves the version this alias names
    state_dir: Path = DEFAULT_STATE_DIR
    db_url: str | None = None  # default: sqlite:///<state_dir>/registry.db
    triton_url: str | None = None  # an external tritonserver (gRPC host:port)
    launch_triton: bool = False  # start and supervise the embedded tritonserver
    tritonserver: Path | None = None  # explicit binary for --launch-triton
    # other local users can read the launched tritonserver's command line (its key): warn, or refuse to start
    launch_triton_exposed_key: str = "warn"
    triton_key: str | None = None  # restricted-protocol key of an external server
    triton_log_path: Path | None = None  # an external server's log file: Triton's reasons for failed loads
    triton_metrics_url: str | None = None  # an external server's metrics endpoint: its GPU count
    # The launched tritonserver's ports (Triton's own defaults; 0 = a free port chosen at start).
    triton_grpc_port: int = 8001
    triton_http_port: int = 8000
    triton_metrics_port: int = 8002
    # The gateway (docs/gateway.md): it answers inference and switches versions by its route table. On by
    # default with --launch-triton (it takes the triton_*_port ports; tritonserver moves to loopback ports of
    # its own); with an external tritonserver, on when an address below is given. `gateway = false`
    # (--no-gateway): Triton reloads a serving model in place, as before.
    gateway: bool = True
    gateway_http_address: str | None = None  # HOST:PORT clients send HTTP/REST inference to (external Triton)
    gateway_grpc_address: str | None = None  # HOST:PORT clients send gRPC inference to (external Triton)
    triton_http_url: str | None = None  # an external tritonserver's HTTP HOST:PORT, for the gateway's HTTP side
    # a gateway something else runs (its own container or unit): its control socket; the daemon routes through
    # it and never starts, restarts or stops it (docs/kubernetes.md)
    gateway_control_socket: Path | None = None
    gateway_drain_s: float = 5.0  # after a switch, the old digest answers the requests sent before it this long
    gateway_load_wait_s: float = 60.0  # a request for a model not loaded waits this long for its load (onrequest.py)
    settle_s: float = 1.0
    policy: str = "auto"
    commit_marker: str | None = None
    socket: Path | None = None  # default: <state_dir>/tritonctl.sock
    socket_group: str | None = None  # the group that owns the control socket (default: the daemon's own)
    listen: str | None = None  # optional TCP listener host:port (personal tokens, OIDC, token_file's)
    token_file: Path | None = None  # the shared token: a token named `default`, role admin
    # who may do what (controlplane/settings/access.py): Unix groups on the socket; OIDC bearers on TCP
    socket_roles: RoleMap = ()  # () : the socket's group deployer; root and the daemon's user admin
    oidc_issuer: str | None = None
    oidc_audience: str | None = None
    oidc_jwks: str | None = None  # a JWKS file or https:// URL
    oidc_role_claim: str = "groups"
    oidc_roles: RoleMap = ()  # claim value -> role; (): a value that is a role's name is that role
    tls_cert: Path | None = None  # TLS on the TCP listener: certificate (PEM) ...
    tls_key: Path | None = None  # ... and its private key
    allow_insecure_http: bool = False  # plain HTTP beyond loopback: a listener, or MLflow credentials sent to one
    web_address: str | None = None  # the read-only web view at /ui/ on HOST:PORT (off when unset)
    web_require_token: bool = False  # ask for the token on a loopback web address too (it always does elsewhere)
    web_host_names: str | None = None  # comma-separated Host names the web view answers to beyond its address's
    metrics_port: int | None = None
    log_level: str = "info"
    log_format: str = "plain"
    reconcile_interval_s: float = 10.0
    startup_parallelism: int = 0  # start-up models at once (members first, then ensembles); 0: triton_load_threads
    # Triton's model-load thread count: a launched tritonserver gets --model-load-thread-count of it; for
    # an external one, set it to that server's own (Triton's default: 4)
    triton_load_threads: int = 4
    # the launched tritonserver completes python models' configs (their auto_complete_config); False: it runs
    # with --disable-auto-complete-config (each python load about 1.2 s faster; docs/validation.md)
    triton_auto_complete: bool = True
    ready_waits_for_deploys: bool = True  # READY=1 after the initial deploys (False: after the scan)
    load_timeout_s: float = 120.0
    shutdown_timeout_s: float = 30.0
    db_busy_timeout_s: float = 10.0  # how long a registry write waits for another writer's lock
    host: str = ""
    # a model entry that is a symlink is followed only into the repository or one of these directories
    allowed_link_roots: tuple[Path, ...] = ()
    max_model_bytes: int = DEFAULT_MAX_MODEL_BYTES  # a model's files together above this are refused
    watch: str = "auto"  # how the repository is watched: auto (by filesystem type), inotify, poll
    poll_interval_s: float = 2.0  # poll mode, symlinked models, s3:// listings: this often
    rescan_interval_s: float = 30.0  # inotify mode: every model's stat signature, the safety net
    keep_triton: bool = False  # SIGTERM leaves a launched tritonserver serving; the next start adopts it
    # a freshly launched tritonserver loads the models the registry serves in its own start-up
    # (--load-model), not one load request each after it (controlplane/startup/preload.py)
    launch_loads_serving: bool = True
    # Fleet (docs/fleet.md): with `fleet`, `db_url` is the PostgreSQL registry every host shares.
    fleet: bool = False
    shared_store: Path | str | None = None  # fleet content every host reads, the leader writes: a directory or s3://
    canary_hosts: str | None = None  # comma-separated; default: the first `canary_count` hosts by name
    canary_count: int = 1
    wave_size: int = 2
    liveness_s: float = 10.0  # a host silent this long is dead (one whose session ended is dead at once)
    heartbeat_s: float = 1.0
    converge_s: float = 2.0  # how often a host converges to the fleet's target
    wave_bake_s: float = 0.0  # each wave after the canaries bakes this long before the next (0: no bake)
    # Signed webhooks (docs/operations.md): `[[webhook]]` tables of the config file only.
    webhook: tuple[WebhookTarget, ...] = ()
    webhook_retry_max_s: float = 300.0  # the longest wait between retries of a failing delivery
    # Memory budget (controlplane/memory/budget.py): None, the default, is no budget (every model loads).
    memory_budget_mb: float | None = None  # host memory the loaded models may hold, in MB
    gpu_memory_budget_mb: float | None = None  # GPU memory per GPU the loaded models may hold, in MB
    protected_tags: str = "stable"  # comma-separated: a serving digest with one of these tags is never evicted
    idle_unload_s: float = 300.0  # policy ondemand: unloaded after this long with no inference and no lease
    # Bake (docs/bake.md, controlplane/bake/baker.py): a new digest serves this long on Triton's figures before its
    # deploy is done; 0, the default, is no bake.
    bake_s: float = MODE_DEFAULT  # the mode's: GATEWAY_BAKE_S where a gateway carries the traffic, else 0 (off)
    bake_max_failure_ratio: float = 0.01  # failed requests over all requests to the new digest
    bake_max_latency_ratio: float | None = None  # its mean latency over the previous digest's (None: off)
    bake_min_requests: int = 20  # fewer by the end: inconclusive
    bake_inconclusive: str = "keep"  # an inconclusive bake keeps the version, or "rollback"
    # a baked digest whose load took more than this times the previous digest's, or whose footprint grew
    # more than this, gets one warning line in the audit and a mark in `versions` (controlplane/bake/warn.py)
    bake_warn_load_ratio: float = 2.0
    # Canary steps (docs/bake.md): through a gateway, a new digest takes these percents of the requests in
    # turn, each step baking `bake_s` on the gateway's figures ("pause": until `tritonctl promote`). Empty: the
    # mode's, GATEWAY_CANARY_STEPS where a gateway carries the traffic, else AT_ONCE (the only one without).
    canary_steps: tuple[int | str, ...] = ()
    canary_sticky_header: str | None = None  # a request header whose value's hash keeps a client on one version
    wave_steps: tuple[int | str, ...] = AT_ONCE  # a fleet's waves after the canary wave (which takes canary_steps)
    # Shadow (docs/bake.md "Shadow"): through a gateway, before a canary's first step, a copy of live requests goes
    # to the new digest for `shadow_s` (0: no shadow) and the gateway compares each pair of answers
    shadow_s: float = 0.0
    shadow_fraction: float = 1.0  # of the requests copied (up to the gateway's rate limit, docs/gateway.md)
    shadow_rtol: float = 1e-5  # floating outputs agree within atol + rtol * |the serving version's|
    shadow_atol: float = 1e-8
    shadow_keep_inputs: bool = False  # the first disagreements keep the request's inputs (else none are kept)
    shadow_min_agreement: float = 1.0  # pairs that agree over all pairs, at least

    def __post_init__(self) -> None:
        """The mode's defaults (`bake_s`, `canary_steps` not given): safe where a gateway carries the traffic."""
        if self.bake_s == MODE_DEFAULT:
            object.__setattr__(self, "bake_s", GATEWAY_BAKE_S if self.routes_traffic else 0.0)
        if not self.canary_steps:
            object.__setattr__(self, "canary_steps", GATEWAY_CANARY_STEPS if self.routes_traffic else AT_ONCE)

    @property
    def registry_url(self) -> str:
        return self.db_url or f"sqlite:///{self.state_dir / 'registry.db'}"

    @property
    def socket_path(self) -> Path:
        return self.socket or self.state_dir / SOCKET_NAME

    @property
    def routes_traffic(self) -> bool:
        """Whether a gateway carries the inference traffic: on with --launch-triton unless `gateway = false`;
        with an external tritonserver when a gateway address or a gateway's control socket is given."""
        if not self.gateway:
            return False
        return self.launch_triton or bool(self.gateway_http_address or self.gateway_grpc_address
                                          or self.gateway_control_socket)

    @property
    def load_parallelism(self) -> int:
        """How many models go to Triton at once (start-up, restores): `startup_parallelism`, or (0)
        Triton's own model-load thread count, `triton_load_threads`."""
        return self.startup_parallelism or self.triton_load_threads

    def reloaded(self, new: Settings) -> Settings:
        """This settings object with only the SIGHUP-reloadable fields taken from `new`."""
        return replace(self, **{name: getattr(new, name) for name in RELOADABLE})


def _path(value: Any) -> Path:
    if not isinstance(value, (str, os.PathLike)) or not str(value):
        raise ValueError("expected a path")
    return Path(value).expanduser()


def _paths(value: Any) -> tuple[Path, ...]:
    """A list of paths (TOML), or one string of them separated by ':' (a variable or a flag)."""
    items = value.split(os.pathsep) if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)):
        raise ValueError("expected a list of directories")
    return tuple(_path(item) for item in items if item != "")


def _repository(value: Any) -> Path | str:
    """A local directory, an s3://BUCKET/PREFIX URL or an MLflow registry's mlflow+http://HOST:PORT
    (load_settings moves a URL to `repository_url`)."""
    if isinstance(value, str) and value.startswith("mlflow+"):
        from controlplane.remote.mlflowrest import tracking_url

        try:
            tracking_url(value)
        except ConfigError:
            raise ValueError("expected mlflow+http://HOST:PORT or mlflow+https://HOST:PORT") from None
        return value.rstrip("/")
    if isinstance(value, str) and value.startswith("s3://"):
        from controlplane.remote.objectstore import S3Location

        try:
            return S3Location.parse(value).url
        except ConfigError:
            raise ValueError("expected s3://BUCKET/PREFIX") from None
    return _path(value)


def _s3_url(value: Any) -> str:
    if not (isinstance(value, str) and value.startswith(("s3://", "mlflow+"))):
        raise ValueError("expected s3://BUCKET/PREFIX or mlflow+http://HOST:PORT")
    return str(_repository(value))


_ALIAS_RE = re.compile(r"[A-Za-z0-9_-]{1,255}")


def _mlflow_alias(value: Any) -> str:
    """An MLflow alias (letters, digits, `_`, `-`), as MLflow itself accepts one."""
    text = str(value).strip()
    if not _ALIAS_RE.fullmatch(text) or re.fullmatch(r"[vV]\d+|latest", text):
        raise ValueError("expected an MLflow alias: letters, digits, '_' or '-' (not 'latest' nor v<number>)")
    return text


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true or false")


def _positive_float(minimum: float, maximum: float, unit: str = "") -> Callable[[Any], float]:
    """A finite number from `minimum` to `maximum` (each maximum is declared in controlplane/base/bounds.py)."""
    def parse(value: Any) -> float:
        if isinstance(value, bool):
            raise ValueError("expected a number")
        try:
            number = float(value)
        except (TypeError, ValueError, OverflowError):
            raise ValueError("expected a number") from None
        if number != number or number in (float("inf"), float("-inf")):
            raise ValueError("expected a finite number")
        if number < minimum:
            raise ValueError(f"must be at least {minimum}")
        if number > maximum:
            raise ValueError(f"must be at most {maximum:.0f}{unit}")
        return number

    return parse


number_from = _positive_float  # settings/modelparams.py: a model parameter's number, as a setting's
_WEEK = f" seconds ({bounds.MAX_DURATION_TEXT})"


def _seconds(minimum: float) -> Callable[[Any], float]:
    """A duration in seconds: a number from `minimum` to a week (bounds.MAX_DURATION_S)."""
    return _positive_float(minimum, bounds.MAX_DURATION_S, _WEEK)


def _duration(value: Any) -> float:
    """Seconds: a number, or a duration like 90s, 5m, 1h; 0 or more, at most a week (bounds.MAX_DURATION_S)."""
    if isinstance(value, bool):
        raise ValueError("expected seconds or a duration like 30s, 5m")
    try:
        seconds = float(value) if isinstance(value, (int, float)) else duration_s(str(value))
    except OverflowError:  # an int beyond a float
        seconds = float("inf")
    if seconds is None or seconds != seconds or seconds < 0:
        raise ValueError("expected seconds or a duration like 30s, 5m")
    if seconds > bounds.MAX_DURATION_S:
        raise ValueError(f"must be at most {bounds.MAX_DURATION_S:.0f}{_WEEK}")
    return seconds


def _ratio(value: Any) -> float:
    number = _positive_float(0.0, float("inf"))(value)
    if number > 1.0:
        raise ValueError("expected a ratio from 0 to 1")
    return number


def _fraction(value: Any) -> float:
    number = _ratio(value)
    if number <= 0:
        raise ValueError("expected a fraction above 0, up to 1")
    return number


def _whole_number(expected: str, minimum: int = 0, maximum: int | None = None) -> Callable[[Any], int]:
    """A whole number from `minimum` to `maximum` (an int or its digits); `expected` names the range."""

    def parse(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).strip().isdigit():
            raise ValueError(f"expected {expected}")
        number = int(value)
        if number < minimum or (maximum is not None and number > maximum):
            raise ValueError(f"expected {expected}")
        return number

    return parse


_count = _whole_number(f"a whole number from 1 to {bounds.MAX_COUNT}", minimum=1, maximum=bounds.MAX_COUNT)
_whole_count = _whole_number(f"a whole number from 0 to {bounds.MAX_COUNT}", maximum=bounds.MAX_COUNT)
_threads = _whole_number(f"a whole number from 1 to {bounds.MAX_THREADS}", minimum=1, maximum=bounds.MAX_THREADS)
_threads_or_zero = _whole_number(f"a whole number from 0 to {bounds.MAX_THREADS}", maximum=bounds.MAX_THREADS)
_bytes = _whole_number(f"a whole number of bytes from 1 to {bounds.MAX_BYTES} (1 PiB)", minimum=1,
                       maximum=bounds.MAX_BYTES)
_megabytes = _positive_float(1.0, bounds.MAX_MEGABYTES, " MB (1 PiB)")
_port = _whole_number("a port number 1-65535", minimum=1, maximum=65535)
_port_or_zero = _whole_number("a port number 0-65535 (0: a free port)", maximum=65535)


def _choice(options: tuple[str, ...]) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        text = str(value).strip().lower()
        if text not in options:
            raise ValueError(f"expected one of {', '.join(options)}")
        return text

    return parse


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("expected a string")
    return value


def _host_port(value: Any, check_port: Callable[[Any], int]) -> str:
    text = _text(value)
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ValueError("expected HOST:PORT")
    check_port(port)
    return text


def _listen(value: Any) -> str:
    return _host_port(value, _port)


def _web_address(value: Any) -> str:
    """HOST:PORT; port 0 takes a free port (the daemon logs the address it got)."""
    return _host_port(value, _port_or_zero)


_HOST_NAME = re.compile(r"^(?=.{1,253}$)[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*$")


def _host_names(value: Any) -> str:
    """DNS names or IP literals (a list, or a comma-separated string), without ports: `view.example.com`."""
    names = value if isinstance(value, list) else _text(value).split(",")
    cleaned = []
    for name in names:
        if not isinstance(name, str):
            raise ValueError("expected host names")
        text = name.strip().lower().rstrip(".")
        if not text:
            continue
        if text.startswith("[") and text.endswith("]"):
            text = text[1:-1]
        try:
            ipaddress.ip_address(text)
        except ValueError:
            if not _HOST_NAME.match(text):
                raise ValueError("expected host names without ports, e.g. view.example.com") from None
        cleaned.append(text)
    if not cleaned:
        raise ValueError("expected at least one host name")
    return ",".join(cleaned)


PARSERS: dict[str, Callable[[Any], Any]] = {
    "repository": _repository,
    "repository_url": _s3_url,
    "mlflow_alias": _mlflow_alias,
    "state_dir": _path,
    "db_url": _text,
    "triton_url": _text,
    "launch_triton": _bool,
    "tritonserver": _path,
    "triton_key": _text,
    "launch_triton_exposed_key": _choice(EXPOSED_KEY_CHOICES),
    "triton_log_path": _path,
    "triton_metrics_url": _text,
    "triton_grpc_port": _port_or_zero,
    "triton_http_port": _port_or_zero,
    "triton_metrics_port": _port_or_zero,
    "gateway": _bool,
    "gateway_http_address": _web_address,
    "gateway_grpc_address": _web_address,
    "triton_http_url": _web_address,
    "gateway_control_socket": _path,
    "gateway_drain_s": _duration,
    "gateway_load_wait_s": _duration,
    "settle_s": _seconds(0.05),
    "policy": _choice(POLICIES),
    "commit_marker": _text,
    "socket": _path,
    "socket_group": _text,
    "listen": _listen,
    "token_file": _path,
    "tls_cert": _path,
    "tls_key": _path,
    "allow_insecure_http": _bool,
    "web_address": _web_address,
    "web_require_token": _bool,
    "web_host_names": _host_names,
    "metrics_port": _port,
    "log_level": _choice(LOG_LEVELS),
    "log_format": _choice(LOG_FORMATS),
    "reconcile_interval_s": _seconds(0.5),
    "startup_parallelism": _threads_or_zero,
    "triton_load_threads": _threads,
    "triton_auto_complete": _bool,
    "ready_waits_for_deploys": _bool,
    "load_timeout_s": _seconds(1.0),
    "shutdown_timeout_s": _seconds(1.0),
    "db_busy_timeout_s": _seconds(0.1),
    "host": _text,
    "allowed_link_roots": _paths,
    "max_model_bytes": _bytes,
    "watch": _choice(WATCH_MODES),
    "poll_interval_s": _seconds(0.05),
    "rescan_interval_s": _seconds(0.5),
    "keep_triton": _bool,
    "launch_loads_serving": _bool,
    "fleet": _bool,
    "shared_store": _repository,  # a directory or s3://BUCKET/PREFIX
    "canary_hosts": _text,
    "canary_count": _count,
    "wave_size": _count,
    "liveness_s": _seconds(0.5),
    "heartbeat_s": _seconds(0.1),
    "converge_s": _seconds(0.1),
    "wave_bake_s": _duration,
    "webhook": webhook_tables,
    "webhook_retry_max_s": _seconds(0.1),
    "memory_budget_mb": _megabytes,
    "gpu_memory_budget_mb": _megabytes,
    "protected_tags": _text,
    "idle_unload_s": _seconds(1.0),
    "bake_s": _duration,
    "bake_max_failure_ratio": _ratio,
    "bake_max_latency_ratio": _positive_float(1.0, bounds.MAX_RATIO),
    "bake_min_requests": _whole_count,
    "bake_inconclusive": _choice(BAKE_INCONCLUSIVE),
    "bake_warn_load_ratio": _positive_float(1.0, bounds.MAX_RATIO),
    "canary_steps": parse_steps,
    "canary_sticky_header": header_name,
    "wave_steps": parse_steps,
    "shadow_s": _duration,
    "shadow_fraction": _fraction,
    "shadow_rtol": _positive_float(0.0, bounds.MAX_RATIO),
    "shadow_atol": _positive_float(0.0, bounds.MAX_RATIO),
    "shadow_keep_inputs": _bool,
    "shadow_min_agreement": _ratio,
    **ACCESS_PARSERS,
}
assert set(PARSERS) == {f.name for f in fields(Settings)}


def _parse(key: str, value: Any, source: str) -> Any:
    try:
        return PARSERS[key](value)
    except (ValueError, TypeError) as exc:
        if key == "webhook":  # the tables' own messages name the table and field
            raise ConfigError(f"{source}: webhook: {exc}") from None
        raise ConfigError(f"{source}: {key}: invalid value {value!r} ({exc})") from None


def read_config_file(path: Path) -> dict[str, Any]:
    # Imported here: every CLI command imports this module, only the daemon reads a config file.
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib

    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key not in PARSERS:
            raise ConfigError(f"{path}: {key}: unknown key")
        values[key] = _parse(key, value, str(path))
    return values


def read_environment(env: Mapping[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name, value in env.items():
        if not name.startswith(ENV_PREFIX) or name in NOT_SETTINGS_ENV or name.startswith(TEST_ENV_PREFIX):
            continue
        key = name[len(ENV_PREFIX) :].lower()
        if key not in PARSERS:
            raise ConfigError(f"environment: {name}: unknown setting")
        values[key] = _parse(key, value, f"environment {name}")
    return values


def load_settings(
    flags: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    config_file: Path | None = None,
) -> Settings:
    """Merge the sources; a missing default config file is fine, a missing named one is an error."""
    env = os.environ if env is None else env
    file_values: dict[str, Any] = {}
    named = config_file or (Path(env["TRITONCTL_CONFIG"]) if env.get("TRITONCTL_CONFIG") else None)
    if named is not None:
        file_values = read_config_file(named)
    elif DEFAULT_CONFIG_FILE.exists():
        file_values = read_config_file(DEFAULT_CONFIG_FILE)
    merged: dict[str, Any] = {}
    merged.update(file_values)
    merged.update(read_environment(env))
    for key, value in (flags or {}).items():
        if value is None:
            continue
        if key not in PARSERS:
            raise ConfigError(f"flag: {key}: unknown setting")
        merged[key] = _parse(key, value, "flag")
    if isinstance(merged.get("repository"), str):  # s3://...: the same setting, typed apart from a Path
        merged["repository_url"] = merged.pop("repository")
    settings = Settings(**merged)
    if settings.repository is not None and settings.repository_url:
        raise ConfigError("repository: give either a directory or an s3:// URL or mlflow+http:// URL (repository_url), "
                          "not both")
    if settings.repository_url and settings.repository_url.startswith("mlflow+"):
        from controlplane.remote.mlflowrest import insecure_refusal, require_extra

        require_extra()  # one line naming the extra (exit 2), before anything starts
        refusal = insecure_refusal(settings.repository_url, env, settings.allow_insecure_http)
        if refusal is not None:  # its credentials would go in clear to another host
            raise refusal
    check_access(settings)
    if bool(settings.tls_cert) != bool(settings.tls_key):
        raise ConfigError("tls_cert and tls_key: give both (TLS on the TCP listener) or neither")
    if settings.triton_url and settings.launch_triton:
        raise ConfigError("triton_url: give either --triton-url or --launch-triton, not both")
    return settings
