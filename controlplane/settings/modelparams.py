"""A model's own `tritonctl.*` parameters in its config.pbtxt: which there are, and each one's parser.

`parameters { key: "tritonctl.bake_s" value { string_value: "5m" } }`: a model's bake and canary steps
(docs/bake.md), parsed as the daemon's settings are (settings/config.py `PARSERS`, so with the same bounds,
controlplane/base/bounds.py); its declared footprint (controlplane/memory/footprint.py); the models it
calls by BLS (`tritonctl.bls_callees`, validation/bls.py). Every `tritonctl.*` key a model may set is here;
validation (validation/fields.py) refuses a bad one naming it and warns of a key tritonctl does not read.
`tritonctl.digest` is tritonctl's own stamp, written into every published config.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from controlplane.base import bounds
from controlplane.errors import UsageError
from controlplane.names import validate_model_name
from controlplane.settings.config import PARSERS, number_from

BAKE_PARAMETERS = ("bake_s", "bake_max_failure_ratio", "bake_max_latency_ratio", "canary_steps")
FOOTPRINT_PARAMETERS = ("footprint_mb", "gpu_footprint_mb")
PARAMETER_PREFIX = "tritonctl."
STAMPED_PARAMETERS = ("digest",)


def _model_names(value: Any) -> tuple[str, ...]:
    """`tritonctl.bls_callees` (validation/bls.py): the models a model calls by BLS, comma-separated names."""
    names = tuple(name.strip() for name in str(value).split(",") if name.strip())
    if not names:
        raise ValueError("expected model names separated by commas")
    try:
        return tuple(validate_model_name(name) for name in names)
    except UsageError as exc:
        raise ValueError(str(exc)) from None


MODEL_PARAMETERS: dict[str, Callable[[Any], Any]] = {
    **{key: PARSERS[key] for key in BAKE_PARAMETERS},
    **{key: number_from(0.0, bounds.MAX_MEGABYTES, " MB (1 PiB)") for key in FOOTPRINT_PARAMETERS},
    "bls_callees": _model_names,
}


def parameter_text(value: Any) -> Any:
    """A parameter's value as a parsed config holds it (key → {"string_value": text}) or as text."""
    return value.get("string_value", "") if isinstance(value, Mapping) else value


def model_parameter(parameters: Mapping[str, Any], key: str) -> Any:
    """The model's own `tritonctl.<key>` parsed (None when unset); ValueError names the parameter."""
    value = parameters.get(PARAMETER_PREFIX + key)
    if value is None:
        return None
    text = parameter_text(value)
    try:
        return MODEL_PARAMETERS[key](text)
    except (ValueError, TypeError) as exc:
        raise ValueError(f'parameters["{PARAMETER_PREFIX}{key}"]: "{text}": {exc}') from None


def bake_parameters(parameters: Mapping[str, Any]) -> dict[str, Any]:
    """The bake settings a model's config parameters set (key → parsed value), from `parameters` as a parsed
    config holds them (key → {"string_value": text}, or key → text). ValueError names the parameter."""
    found = {key: model_parameter(parameters, key) for key in BAKE_PARAMETERS}
    return {key: value for key, value in found.items() if value is not None}
