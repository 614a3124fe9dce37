"""One bound for every duration and count, from every source (issues 57 item 2 and 58 item 6).

A `bake_s` of 10^15 s was taken by the API and a model's `tritonctl.bake_s` of 10^20 s by validation; each
made every later read of the model's bake answer 500 (`year 31690765 is out of range`), across restarts
through `bakes.json`. Here, without a daemon: each source refuses a value past its bound, declared once in
controlplane/base/bounds.py, and names what it refuses; the OpenAPI document declares the same bounds; a
record read back out of range is dropped with one warning. tests/test_bounds_e2e.py does the same through a
real daemon and its tritonserver.
"""

from __future__ import annotations

import json
import logging
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from controlplane.bake.figures import Bake, Limits, Tally
from controlplane.bake.warn import LoadTimes
from controlplane.base import bounds
from controlplane.errors import ConfigError
from controlplane.memory.footprint import declared
from controlplane.settings import config
from controlplane.settings.config import PARSERS, Settings, load_settings
from controlplane.validation.modelconfig import validate_model_dir
from tests.corpus_gen import write_model

DOCS = Path(__file__).resolve().parent.parent / "docs"
FILE_ONLY = {"webhook"}


def _numeric_settings() -> list[tuple[str, Any]]:
    """Every setting whose value is a number (a duration, a count, a size, a port, a ratio): (key, default)."""
    found = []
    for f in fields(Settings):
        default = f.default
        if f.type in ("float", "int", "float | None", "int | None") or isinstance(default, int | float) \
                and not isinstance(default, bool):
            found.append((f.name, default))
    return found


NUMERIC = _numeric_settings()


def test_every_numeric_setting_is_known() -> None:
    """The list below covers what Settings declares: a new number gets a bound or this test fails."""
    names = {name for name, _ in NUMERIC}
    assert {"bake_s", "settle_s", "idle_unload_s", "wave_size", "max_model_bytes", "memory_budget_mb",
            "triton_load_threads", "bake_min_requests"} <= names
    assert all(name in PARSERS for name in names)


@pytest.mark.parametrize(("key", "default"), NUMERIC, ids=[k for k, _ in NUMERIC])
@pytest.mark.parametrize("source", ["file", "environment", "flag"])
def test_every_number_a_setting_takes_is_bounded_from_every_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   key: str, default: Any, source: str) -> None:
    """10^20 (a number of digits, what a model parameter carried) and 1e300 are refused with a one-line error
    naming the key and its source, from the config file, TRITONCTL_* and a flag alike."""
    monkeypatch.setattr(config, "DEFAULT_CONFIG_FILE", tmp_path / "absent.toml")
    for huge in ("100000000000000000000", "1e300"):
        if source == "file":
            path = tmp_path / "tritonctl.toml"
            path.write_text(f"{key} = {huge}\n")
            call: dict[str, Any] = {"env": {}, "config_file": path}
            where = f"{path}: {key}: "
        elif source == "environment":
            call, where = {"env": {f"TRITONCTL_{key.upper()}": huge}}, f"environment TRITONCTL_{key.upper()}: {key}: "
        else:
            call, where = {"flags": {key: huge}, "env": {}}, f"flag: {key}: "
        with pytest.raises(ConfigError) as info:
            load_settings(**call)
        message = str(info.value)
        assert message.startswith(where) and "\n" not in message, message


@pytest.mark.parametrize("key", [k for k, _ in NUMERIC if k.endswith("_s")])
def test_every_duration_setting_takes_a_week_and_no_more(key: str) -> None:
    """The one bound of durations, whatever the setting: a week is taken, a second more is not."""
    assert getattr(load_settings({key: str(bounds.MAX_DURATION_S)}, env={}), key) == bounds.MAX_DURATION_S
    with pytest.raises(ConfigError, match=rf"flag: {key}: .*at most 604800 seconds \(7d\)"):
        load_settings({key: str(bounds.MAX_DURATION_S + 1)}, env={})


def test_a_models_own_parameters_are_bounded_and_named(tmp_path: Path) -> None:
    """Offline validation refuses a `tritonctl.*` parameter out of range, naming it as Triton names a field
    (`parameters["tritonctl.bake_s"]`): the value of issue 58 (10^20 s), a footprint of 1e400 MB. A key
    tritonctl does not read (a typo) is a warning; `tritonctl.digest`, tritonctl's own stamp, passes."""
    cases = {
        "tritonctl.bake_s": ("100000000000000000000", "must be at most 604800 seconds (7d)"),
        "tritonctl.footprint_mb": ("1e400", "expected a finite number"),
        "tritonctl.gpu_footprint_mb": ("2e9", "must be at most 1073741824 MB (1 PiB)"),
        "tritonctl.bake_max_latency_ratio": ("1e300", "must be at most 1000000"),
    }
    for key, (value, reason) in cases.items():
        extra = f'parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}'
        result = validate_model_dir(write_model(tmp_path / key.replace(".", "_"), extra=extra))
        [error] = result.errors
        assert error.field == f'parameters["{key}"]', error
        assert error.message == f'"{value}": {reason}', error
    extra = ('parameters { key: "tritonctl.bake" value { string_value: "5m" } }\n'
             'parameters { key: "tritonctl.digest" value { string_value: "abc" } }\n'
             'parameters { key: "tritonctl.bake_s" value { string_value: "7d" } }\n'
             'parameters { key: "tritonctl.footprint_mb" value { string_value: "512" } }')
    result = validate_model_dir(write_model(tmp_path / "typo", extra=extra))
    assert result.ok, result.errors
    [warning] = result.warnings
    assert warning.field == 'parameters["tritonctl.bake"]' and "tritonctl.bake_s" in warning.message


def test_a_declared_footprint_out_of_range_declares_nothing() -> None:
    """A config recorded before validation bounded it: its footprint is not used (never an infinite one)."""
    assert declared({"parameters": {"tritonctl.footprint_mb": {"string_value": "1e400"}}}) is None
    assert declared({"parameters": {"tritonctl.footprint_mb": {"string_value": "100"}}}).memory_mb == 100.0  # type: ignore[union-attr]


def test_the_openapi_document_declares_the_bounds() -> None:
    """The served document (its golden copy) says each bound, so a client and schemathesis see it: a deploy's
    `bake_s`, a lease's seconds, a listing's `limit`, gc's `keep`."""
    document = json.loads((DOCS / "openapi.json").read_text())
    schemas = document["components"]["schemas"]
    bake = schemas["LoadBody"]["properties"]["bake_s"]
    number = next(s for s in bake["anyOf"] if s.get("type") == "number")
    assert (number["minimum"], number["maximum"]) == (0, bounds.MAX_DURATION_S)
    lease = next(s for name, s in schemas.items() if name.startswith("Lease") and "for_s" in s.get("properties", {}))
    assert lease["properties"]["for_s"]["maximum"] == bounds.MAX_DURATION_S
    assert schemas["GcBody"]["properties"]["keep"]["maximum"] == bounds.MAX_COUNT
    audit = document["paths"]["/v1/audit"]["get"]["parameters"]
    limit = next(p for p in audit if p["name"] == "limit")
    assert limit["schema"]["maximum"] == bounds.MAX_LIMIT


@pytest.mark.parametrize(("args", "expected"), [
    (["load", "linear", "--bake", "8d"], "--bake: '8d': expected 0 to 604800 seconds (at most 7d)"),
    (["load", "linear", "--bake", "100000000000000000000"], "--bake: '100000000000000000000': expected 0 to"),
    (["ensure", "linear", "--for", "8d"], "expected more than 0 and at most 604800 s"),
    (["status", "--watch", "--interval", "1e300"], "--interval"),
    (["audit", "--limit", "100001"], "--limit"),
    (["gc", "--keep", "10000000"], "--keep"),
])
def test_the_clis_own_flags_are_bounded_before_anything_is_asked(tmp_path: Path, args: list[str],
                                                                 expected: str) -> None:
    """Refused in one line, exit 2, before the CLI asks the daemon (there is none here)."""
    from cli.main import cli

    result = CliRunner().invoke(cli, [*args, "--state-dir", str(tmp_path / "none")])
    assert result.exit_code == 2, result.output
    assert expected in result.output, result.output


def _record(**changes: Any) -> dict[str, Any]:
    bake = Bake("linear", "a" * 64, "b" * 64, Limits(300.0, 0.01, None, 20, "keep"), 1_700_000_000.0, Tally(5, 1, 4, 8))
    return {**bake.to_record(), **changes}


@pytest.mark.parametrize(("changes", "why"), [
    ({"limits": {"bake_s": 1e15, "max_failure_ratio": 0.01, "max_latency_ratio": None, "min_requests": 20,
                 "inconclusive": "keep"}}, "seconds"),
    ({"started": 1e15}, "expected 0 to"),
    ({"started": float("inf")}, "finite"),
    ({"tally": [1e400, 0, 0, 0]}, "whole number"),
    ({"ended": -5}, "expected 0 to"),
    ({"p99_ms": float("nan")}, "finite"),
    ({"state": "forever"}, "state"),
])
def test_a_bake_record_out_of_range_is_refused(changes: dict[str, Any], why: str) -> None:
    with pytest.raises(ValueError, match=why):
        Bake.from_record(_record(**changes))
    assert Bake.from_record(_record()).to_json()["until"]  # the good one reads back and prints


def test_load_times_out_of_range_are_dropped_with_one_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "loads.json"
    path.write_text(json.dumps({"m": {"a" * 64: 1.5, "b" * 64: 1e300, "c" * 64: -1}, "n": {"d" * 64: 2.0}}))
    with caplog.at_level(logging.WARNING, "tritonctl.bake"):
        times = LoadTimes(path)
    assert (times.of("m", "a" * 64), times.of("m", "b" * 64), times.of("n", "d" * 64)) == (1.5, None, 2.0)
    [line] = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "2 load time(s) out of range dropped" in line.getMessage()
