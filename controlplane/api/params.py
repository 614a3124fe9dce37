"""The control API's parameter types: each carries, in the OpenAPI document, the constraint the core enforces.

Why a module of its own: a request that the document calls valid must not be refused for its shape, and one
it calls invalid must be (schemathesis checks both, tests/test_api_contract.py). So each pattern here says
what controlplane/names.py, controlplane/intake/tags.py, controlplane/views/queries.py and controlplane/memory/leases.py
accept, no more and no less. Validation itself stays theirs (their one-line errors); the patterns that need a
look-ahead (a model name without `..`, a tag name that is not a digest prefix) are documented in full and
checked by pydantic in the part its regex engine can express.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Path, Query
from pydantic import BeforeValidator, ConfigDict, Field
from pydantic.config import JsonDict

from controlplane.base.bounds import MAX_COUNT, MAX_DURATION_S, MAX_LIMIT
from controlplane.base.defaults import OUTCOMES
from controlplane.intake.tags import MAX_TAG_LENGTH
from controlplane.memory.leases import MAX_LEASE_S
from controlplane.names import DIGEST_LENGTH, MAX_NAME_LENGTH, MIN_DIGEST_PREFIX

# A model name (controlplane/names.py): ASCII letters, digits, _ . -, not starting with . or -, no `..`, not a
# change set's private step name (`<name>__<8 hex>`), at most 128 characters.
MODEL_NAME_PATTERN = (r"^(?!.*\.\.)(?!.+__[0-9a-f]{8}$)"
                      rf"[A-Za-z0-9_][A-Za-z0-9_.-]{{0,{MAX_NAME_LENGTH - 1}}}$")
_MODEL_NAME_CHECKED = rf"^[A-Za-z0-9_][A-Za-z0-9_.-]{{0,{MAX_NAME_LENGTH - 1}}}$"  # what pydantic can check
# A digest (controlplane/names.validate_digest): a sha256 in hex or a prefix of at least 6 digits, `sha256:` optional.
DIGEST_PATTERN = rf"^(?:[sS][hH][aA]256:)?[0-9a-fA-F]{{{MIN_DIGEST_PREFIX},{DIGEST_LENGTH}}}$"
# A tag name (controlplane/tags.validate_tag_name): lower case, digits, . _ -, not a hex string a digest prefix
# reads as.
TAG_NAME_PATTERN = (rf"^(?![0-9a-f]{{{MIN_DIGEST_PREFIX},}}$)"
                    rf"[a-z0-9][a-z0-9._-]{{0,{MAX_TAG_LENGTH - 1}}}$")
_TAG_NAME_CHECKED = rf"^[a-z0-9][a-z0-9._-]{{0,{MAX_TAG_LENGTH - 1}}}$"
# A digest (prefix) or a tag name (controlplane/tags.resolve_ref): `diff A B`, `tag MODEL NAME REF`.
REF_PATTERN = (rf"^(?:(?:[sS][hH][aA]256:)?[0-9a-fA-F]{{{MIN_DIGEST_PREFIX},{DIGEST_LENGTH}}}"
               rf"|[a-z0-9][a-z0-9._-]{{0,{MAX_TAG_LENGTH - 1}}})$")
# A moment (controlplane/base/clock.py parse_time): ISO 8601 (naive = UTC), or relative to now, e.g. 30m, 2h, 7d.
RELATIVE_TIME_PATTERN = r"^[0-9]{1,5}(?:\.[0-9]{1,3})?[smhdw]$"
TIME_DESCRIPTION = ("ISO 8601 (without a zone: UTC), or back from now: a number and s, m, h, d or w "
                    "(30m, 2h, 7d)")
POLICY_PATTERN = f"^(?:auto|manual|ondemand|inherit|track:{TAG_NAME_PATTERN[1:-1]})$"
# JSON bodies are read strictly: `"wait": 0` is not false, `"keep": false` is not 0 (what the document says).
STRICT = ConfigDict(strict=True)
# policy track:TAG is fleet-wide: it takes no host (controlplane/tags.refuse_host).
TRACK_TAKES_NO_HOST: JsonDict = {"not": {"required": ["policy", "host"], "properties": {
    "policy": {"type": "string", "pattern": "^track:"}, "host": {"type": "string", "minLength": 1}}}}
MAX_KEEP = MAX_COUNT  # gc --keep


def _time_schema(description: str) -> dict[str, Any]:
    return {"anyOf": [{"type": "string", "format": "date-time"},
                      {"type": "string", "pattern": RELATIVE_TIME_PATTERN},
                      {"type": "string", "maxLength": 0, "description": "empty: as if absent"}],
            "description": description}


ModelPath = Annotated[str, Path(description="a model name", min_length=1, max_length=MAX_NAME_LENGTH,
                                pattern=_MODEL_NAME_CHECKED, json_schema_extra={"pattern": MODEL_NAME_PATTERN})]
TagPath = Annotated[str, Path(description="a tag name", min_length=1, max_length=MAX_TAG_LENGTH,
                              pattern=_TAG_NAME_CHECKED, json_schema_extra={"pattern": TAG_NAME_PATTERN})]
ModelQuery = Annotated[str | None, Query(description="only this model", min_length=1,
                                         max_length=MAX_NAME_LENGTH, pattern=_MODEL_NAME_CHECKED,
                                         json_schema_extra={"pattern": MODEL_NAME_PATTERN})]
ModelsQuery = Annotated[list[Annotated[str, Field(min_length=1, max_length=MAX_NAME_LENGTH,
                                                  pattern=_MODEL_NAME_CHECKED,
                                                  json_schema_extra={"pattern": MODEL_NAME_PATTERN})]],
                        Query(description="only these models (repeat the parameter)")]
RefQuery = Annotated[str, Query(description="a digest (a prefix of at least 6 hex digits will do) or a tag name",
                                min_length=1, max_length=DIGEST_LENGTH + len("sha256:"),
                                json_schema_extra={"pattern": REF_PATTERN})]
TimeQuery = Annotated[str | None, Query(description=TIME_DESCRIPTION, json_schema_extra=_time_schema(TIME_DESCRIPTION))]
OutcomeQuery = Annotated[str | None, Query(description="only this outcome", json_schema_extra={"enum": list(OUTCOMES)})]
LimitQuery = Annotated[int, Query(ge=1, le=MAX_LIMIT, description="at most this many rows")]

# Body fields.
DigestField = Annotated[str, Field(description="a digest, or a prefix of at least 6 hex digits; empty: none",
                                   max_length=DIGEST_LENGTH + len("sha256:"),
                                   json_schema_extra={"pattern": f"^$|{DIGEST_PATTERN}"})]
TagField = Annotated[str, Field(description="a tag name; empty: none", max_length=MAX_TAG_LENGTH,
                                json_schema_extra={"pattern": f"^$|{TAG_NAME_PATTERN}"})]
RefField = Annotated[str, Field(description="a digest (prefix) or another tag; empty: what serves now",
                                max_length=DIGEST_LENGTH + len("sha256:"),
                                json_schema_extra={"pattern": f"^$|{REF_PATTERN}"})]
ModelField = Annotated[str, Field(min_length=1, max_length=MAX_NAME_LENGTH, pattern=_MODEL_NAME_CHECKED,
                                  json_schema_extra={"pattern": MODEL_NAME_PATTERN})]
PolicyField = Annotated[str, Field(description="auto, manual, ondemand, inherit or track:TAG",
                                   json_schema_extra={"pattern": POLICY_PATTERN})]
# A lease over the API lasts at least a second (the core takes any positive length): one shorter would end
# before its holder could use or renew it.
LeaseSeconds = Annotated[float, Field(ge=1, le=MAX_LEASE_S, allow_inf_nan=False,
                                      description=f"seconds, at least 1 and at most {MAX_LEASE_S:.0f}")]


# A deploy's own bake (`load --bake`): 0 (none) to a week, the bound of every duration (controlplane/base/bounds.py).
BakeSeconds = Annotated[float | None, Field(ge=0, le=MAX_DURATION_S, allow_inf_nan=False,
                                            description=f"this deploy's bake in seconds, 0 (none) to "
                                                        f"{MAX_DURATION_S:.0f}; absent: the daemon's bake_s")]
# A deploy's own shadow before its first canary step (`load --shadow`), bounded as every duration.
ShadowSeconds = Annotated[float | None, Field(ge=0, le=MAX_DURATION_S, allow_inf_nan=False,
                                              description=f"this deploy's shadow in seconds, 0 (none) to "
                                                          f"{MAX_DURATION_S:.0f}; absent: the daemon's shadow_s")]


def _a_number(value: Any) -> Any:
    """JSON's integer is a number without a fraction (5.0 is one, `false` and "5" are not)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("expected an integer")
    return value


KeepField = Annotated[int, Field(ge=0, le=MAX_KEEP, strict=False, description="keep each model's newest N snapshots"),
                      BeforeValidator(_a_number)]
