"""Settings: flag > TRITONCTL_* environment > TOML file > defaults; unknown keys and bad values are
one-line errors that name the key; the example config and docs/configuration.md cover every key."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path

import pytest
from click.testing import CliRunner

from controlplane.errors import ConfigError
from controlplane.settings import config
from controlplane.settings.config import PARSERS, RELOADABLE, Settings, load_settings, read_config_file

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "systemd" / "tritonctl.toml"
CONFIG_FILE_ONLY = {"webhook"}  # `[[webhook]]` tables: no environment variable or flag form


@pytest.fixture(autouse=True)
def no_default_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A /etc/tritonctl/tritonctl.toml on this machine must not leak into these tests."""
    monkeypatch.setattr(config, "DEFAULT_CONFIG_FILE", tmp_path / "absent" / "tritonctl.toml")
    yield


def write(tmp_path: Path, text: str, name: str = "tritonctl.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def one_line_error(fn: object, *args: object, **kwargs: object) -> str:
    with pytest.raises(ConfigError) as info:
        fn(*args, **kwargs)  # type: ignore[operator]
    message = str(info.value)
    assert "\n" not in message, message
    return message


def test_defaults() -> None:
    settings = load_settings({}, env={})
    assert settings == Settings()
    assert settings.policy == "auto" and settings.settle_s == 1.0 and settings.metrics_port is None
    assert settings.registry_url == "sqlite:////var/lib/tritonctl/registry.db"
    assert settings.socket_path == Path("/var/lib/tritonctl/tritonctl.sock")


def test_precedence_flag_over_env_over_file_over_default(tmp_path: Path) -> None:
    path = write(tmp_path, 'policy = "manual"\nsettle_s = 3.0\nlog_level = "warning"\nload_timeout_s = 50\n')
    env = {"TRITONCTL_SETTLE_S": "2.5", "TRITONCTL_LOG_LEVEL": "error"}
    settings = load_settings({"log_level": "debug", "policy": None}, env=env, config_file=path)
    assert settings.log_level == "debug"  # flag
    assert settings.settle_s == 2.5  # environment over file
    assert settings.policy == "manual"  # file (an unset flag is None and does not count)
    assert settings.load_timeout_s == 50.0  # file
    assert settings.shutdown_timeout_s == 30.0  # default


def test_tritonctl_config_names_the_file_and_config_flag_wins(tmp_path: Path) -> None:
    from_env = write(tmp_path, 'policy = "manual"\n', "env.toml")
    from_flag = write(tmp_path, 'settle_s = 4.0\n', "flag.toml")
    assert load_settings({}, env={"TRITONCTL_CONFIG": str(from_env)}).policy == "manual"
    settings = load_settings({}, env={"TRITONCTL_CONFIG": str(from_env)}, config_file=from_flag)
    assert (settings.policy, settings.settle_s) == ("auto", 4.0)


def test_default_file_is_read_when_present(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config, "DEFAULT_CONFIG_FILE", write(tmp_path, 'reconcile_interval_s = 5\n'))
    assert load_settings({}, env={}).reconcile_interval_s == 5.0


def test_missing_named_file_is_an_error(tmp_path: Path) -> None:
    message = one_line_error(load_settings, {}, env={"TRITONCTL_CONFIG": str(tmp_path / "nope.toml")})
    assert message == f"{tmp_path / 'nope.toml'}: config file not found"


def test_unknown_key_in_file(tmp_path: Path) -> None:
    path = write(tmp_path, 'polcy = "manual"\n')
    assert one_line_error(load_settings, {}, env={}, config_file=path) == f"{path}: polcy: unknown key"


def test_tables_are_unknown_keys(tmp_path: Path) -> None:
    path = write(tmp_path, '[triton]\nurl = "127.0.0.1:8001"\n')
    assert one_line_error(read_config_file, path) == f"{path}: triton: unknown key"


def test_unknown_environment_variable() -> None:
    message = one_line_error(load_settings, {}, env={"TRITONCTL_POLCY": "manual"})
    assert message == "environment: TRITONCTL_POLCY: unknown setting"


def test_client_only_environment_is_ignored() -> None:
    """A shell set up for the CLI (TRITONCTL_ADDRESS) can still start the daemon."""
    env = {"TRITONCTL_ADDRESS": "10.0.0.1:7001", "TRITONCTL_CONFIG": "", "TRITONCTL_FAULT": "", "OTHER": "x"}
    assert load_settings({}, env=env) == Settings()


@pytest.mark.parametrize(
    ("line", "key", "reason"),
    [
        ('settle_s = "fast"', "settle_s", "expected a number"),
        ("settle_s = 0.01", "settle_s", "must be at least 0.05"),
        ("settle_s = nan", "settle_s", "expected a finite number"),
        ("settle_s = true", "settle_s", "expected a number"),
        ("metrics_port = 70000", "metrics_port", "expected a port number 1-65535"),
        ("metrics_port = 9.5", "metrics_port", "expected a port number 1-65535"),
        ('metrics_port = "http"', "metrics_port", "expected a port number 1-65535"),
        ('launch_triton = "maybe"', "launch_triton", "expected true or false"),
        ('policy = "sometimes"', "policy", "expected one of auto, manual, ondemand"),
        ('log_format = "xml"', "log_format", "expected one of plain, json"),
        ('log_level = "trace"', "log_level", "expected one of debug, info, warning, error"),
        ('listen = "7001"', "listen", "expected HOST:PORT"),
        ('repository = ""', "repository", "expected a path"),
        ("triton_key = 1234", "triton_key", "expected a string"),
        ("shutdown_timeout_s = 0", "shutdown_timeout_s", "must be at least 1.0"),
        ('bake_s = "soon"', "bake_s", "expected seconds or a duration like 30s, 5m"),
        ("bake_s = -1", "bake_s", "expected seconds or a duration like 30s, 5m"),
        ("bake_max_failure_ratio = 1.5", "bake_max_failure_ratio", "expected a ratio from 0 to 1"),
        ("bake_max_latency_ratio = 0.5", "bake_max_latency_ratio", "must be at least 1.0"),
        ("bake_min_requests = -3", "bake_min_requests", "expected a whole number from 0 to 1000000"),
        ('bake_inconclusive = "maybe"', "bake_inconclusive", "expected one of keep, rollback"),
    ],
)
def test_bad_file_value_names_the_key(tmp_path: Path, line: str, key: str, reason: str) -> None:
    path = write(tmp_path, line + "\n")
    message = one_line_error(load_settings, {}, env={}, config_file=path)
    assert message.startswith(f"{path}: {key}: invalid value "), message
    assert message.endswith(f"({reason})"), message


def test_bad_environment_value_names_the_variable_and_key() -> None:
    message = one_line_error(load_settings, {}, env={"TRITONCTL_METRICS_PORT": "abc"})
    assert message == "environment TRITONCTL_METRICS_PORT: metrics_port: invalid value 'abc' " \
                      "(expected a port number 1-65535)"


def test_bad_flag_value_names_the_key() -> None:
    message = one_line_error(load_settings, {"settle_s": -1.0}, env={})
    assert message == "flag: settle_s: invalid value -1.0 (must be at least 0.05)"


def test_bake_settings_from_the_flag_the_environment_and_the_file(tmp_path: Path) -> None:
    """`--bake 5m` (a duration), TRITONCTL_BAKE_S in seconds, the file's keys; off by default."""
    assert (Settings().bake_s, Settings().bake_max_latency_ratio, Settings().bake_inconclusive) == (0.0, None, "keep")
    assert load_settings({"bake_s": "5m"}, env={}).bake_s == 300.0
    assert load_settings({}, env={"TRITONCTL_BAKE_S": "90"}).bake_s == 90.0
    path = write(tmp_path, 'bake_s = "1h"\nbake_max_failure_ratio = 0.05\nbake_inconclusive = "rollback"\n')
    settings = load_settings({}, env={}, config_file=path)
    assert (settings.bake_s, settings.bake_max_failure_ratio, settings.bake_inconclusive) == (3600.0, 0.05, "rollback")
    assert Settings().bake_warn_load_ratio == 2.0
    assert load_settings({}, env={"TRITONCTL_BAKE_WARN_LOAD_RATIO": "3"}).bake_warn_load_ratio == 3.0
    assert one_line_error(load_settings, {}, env={"TRITONCTL_BAKE_WARN_LOAD_RATIO": "0.5"}) == \
        "environment TRITONCTL_BAKE_WARN_LOAD_RATIO: bake_warn_load_ratio: invalid value '0.5' (must be at least 1.0)"
    assert load_settings({}, env={"TRITONCTL_WAVE_BAKE_S": "2m"}).wave_bake_s == 120.0  # a fleet's later waves


def test_invalid_toml_is_one_line(tmp_path: Path) -> None:
    path = write(tmp_path, "policy = \n")
    message = one_line_error(read_config_file, path)
    assert message.startswith(f"{path}: not valid TOML: ")


def test_conflicting_settings(tmp_path: Path) -> None:
    path = write(tmp_path, 'triton_url = "127.0.0.1:8001"\n')
    message = one_line_error(load_settings, {"launch_triton": True}, env={}, config_file=path)
    assert message.startswith("triton_url: ")
    # a TCP listener needs no shared token any more (personal tokens, OIDC); OIDC takes its three keys together
    assert load_settings({"listen": "127.0.0.1:7001"}, env={}).token_file is None
    assert one_line_error(load_settings, {"oidc_issuer": "https://id.example"}, env={}).startswith(
        "oidc_audience: OIDC needs oidc_issuer, oidc_audience and oidc_jwks together")


def test_role_maps_from_the_file_the_environment_and_a_bad_role(tmp_path: Path) -> None:
    path = write(tmp_path, 'socket_roles = { "tritonctl-admin" = "admin", "tritonctl" = "Deployer" }\n')
    assert read_config_file(path)["socket_roles"] == (("tritonctl-admin", "admin"), ("tritonctl", "deployer"))
    settings = load_settings(env={"TRITONCTL_OIDC_ROLES": "ml-admins=admin, ml=viewer"})
    assert settings.oidc_roles == (("ml-admins", "admin"), ("ml", "viewer"))
    message = one_line_error(read_config_file, write(tmp_path, 'socket_roles = { "ops" = "root" }\n'))
    assert message.endswith("socket_roles: invalid value {'ops': 'root'} (ops: expected a role (viewer, deployer, "
                            "admin), got 'root')"), message
    message = one_line_error(load_settings, env={"TRITONCTL_OIDC_JWKS": "http://id.example/jwks"})
    assert "oidc_jwks" in message and "https://" in message


def test_reloaded_takes_only_reloadable_settings() -> None:
    running = Settings(policy="auto", settle_s=1.0, load_timeout_s=120.0, state_dir=Path("/a"))
    new = Settings(policy="manual", settle_s=0.5, log_level="debug", reconcile_interval_s=3.0,
                   load_timeout_s=10.0, state_dir=Path("/b"))
    merged = running.reloaded(new)
    assert (merged.policy, merged.settle_s, merged.log_level, merged.reconcile_interval_s) == \
           ("manual", 0.5, "debug", 3.0)
    assert (merged.load_timeout_s, merged.state_dir) == (120.0, Path("/a"))
    assert set(RELOADABLE) == {"policy", "settle_s", "log_level", "reconcile_interval_s",
                               "canary_hosts", "canary_count", "wave_size", "liveness_s", "converge_s",
                               "wave_bake_s", "webhook", "webhook_retry_max_s", "bake_s", "bake_max_failure_ratio",
                               "bake_max_latency_ratio", "bake_min_requests", "bake_inconclusive",
                               "bake_warn_load_ratio", "gateway_drain_s", "gateway_load_wait_s", "canary_steps",
                               "canary_sticky_header", "wave_steps", "shadow_s", "shadow_fraction", "shadow_rtol",
                               "shadow_atol", "shadow_keep_inputs", "shadow_min_agreement"}


def test_example_config_has_every_key_and_parses(tmp_path: Path) -> None:
    text = EXAMPLE.read_text()
    settings, _, tables = text.partition("# [[webhook]]\n")  # the webhook table's keys are its own
    keys = set(re.findall(r"^#? ?([a-z_]+) = ", settings, re.MULTILINE)) | ({"webhook"} if tables else set())
    assert keys == set(PARSERS), f"missing: {set(PARSERS) - keys}, unknown: {keys - set(PARSERS)}"
    as_shipped = read_config_file(EXAMPLE)
    assert as_shipped["state_dir"] == Path("/var/lib/tritonctl")
    # Every commented-out example value is valid too (the webhook's secret file made where it can be).
    secret = write(tmp_path, "a-webhook-secret-of-some-length", "webhook.secret")
    secret.chmod(0o600)
    uncommented = re.sub(r"^# (\[\[webhook\]\]$|[a-z_]+ = )", r"\1", text, flags=re.MULTILINE)
    uncommented = uncommented.replace("/etc/tritonctl/webhook.secret", str(secret))
    assert set(read_config_file(write(tmp_path, uncommented))) == set(PARSERS)


def test_the_configuration_reference_documents_every_key() -> None:
    document = (ROOT / "docs" / "configuration.md").read_text()
    match = re.search(r"^# Configuration\n(.*?)(?=^## |\Z)", document, re.MULTILINE | re.DOTALL)
    assert match, "docs/configuration.md has no '# Configuration' section"
    section = match.group(1)
    for f in fields(Settings):
        assert f"`{f.name}`" in section, f"docs/configuration.md does not document {f.name}"
        if f.name in CONFIG_FILE_ONLY:
            continue
        assert f"`TRITONCTL_{f.name.upper()}`" in section, f"docs/configuration.md: no TRITONCTL_{f.name.upper()}"


def test_daemon_command_reports_a_bad_config_in_one_line(tmp_path: Path) -> None:
    from cli.main import cli

    path = write(tmp_path, 'settle_s = "soon"\n')
    result = CliRunner().invoke(cli, ["daemon", "--config", str(path)], env={"TRITONCTL_CONFIG": None})
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        f"error: {path}: settle_s: invalid value 'soon' (expected a number)"
    ]


def test_the_test_suites_switches_are_not_settings() -> None:
    """`python -m tests.tiers` sets TRITONCTL_TEST_NO_SKIP=1 for every process it starts: a daemon a test
    starts under it (or TRITONCTL_TEST_NO_MOUNT, TRITONCTL_TEST_DROP_EVENTS) must not refuse to run."""
    env = {"TRITONCTL_TEST_NO_SKIP": "1", "TRITONCTL_TEST_NO_MOUNT": "1", "TRITONCTL_TEST_DROP_EVENTS": "1"}
    assert load_settings({}, env=env) == Settings()


def test_the_security_keys_from_the_file_and_the_environment(tmp_path: Path) -> None:
    """Issue 43's keys: link roots as a TOML list or a ':'-separated variable, the size cap in bytes
    (20 GiB by default), what to do with an exposed Triton key (warn by default)."""
    defaults = load_settings({}, env={})
    assert (defaults.allowed_link_roots, defaults.max_model_bytes, defaults.launch_triton_exposed_key) == \
           ((), 20 * 1024**3, "warn")
    path = write(tmp_path, 'allowed_link_roots = ["/srv/releases", "/srv/more"]\nmax_model_bytes = 1000\n'
                           'launch_triton_exposed_key = "refuse"\n')
    settings = load_settings({}, env={}, config_file=path)
    assert settings.allowed_link_roots == (Path("/srv/releases"), Path("/srv/more"))
    assert (settings.max_model_bytes, settings.launch_triton_exposed_key) == (1000, "refuse")
    env = load_settings({}, env={"TRITONCTL_ALLOWED_LINK_ROOTS": "/a:/b", "TRITONCTL_MAX_MODEL_BYTES": "5"})
    assert (env.allowed_link_roots, env.max_model_bytes) == ((Path("/a"), Path("/b")), 5)
    assert "launch_triton_exposed_key: invalid value 'ignore' (expected one of warn, refuse)" in one_line_error(
        load_settings, {}, env={"TRITONCTL_LAUNCH_TRITON_EXPOSED_KEY": "ignore"})
    assert "max_model_bytes: invalid value 0" in one_line_error(
        load_settings, {}, env={}, config_file=write(tmp_path, "max_model_bytes = 0\n", "zero.toml"))
    assert "allowed_link_roots: invalid value 3" in one_line_error(
        load_settings, {}, env={}, config_file=write(tmp_path, "allowed_link_roots = 3\n", "three.toml"))
