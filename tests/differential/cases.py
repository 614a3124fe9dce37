"""The differential cases: small model repositories, valid and subtly invalid, for offline validation
and the real tritonserver to judge side by side.

The cases are written by theme (cases_basic, cases_batching, cases_pipelines, cases_autocomplete; their building blocks
in casekit). `all_cases()` is every case in a fixed order; names are unique, and a case's models are
`<case>_<role>`, so every case lives in one repository.
"""

from __future__ import annotations

from collections.abc import Iterator

from tests.differential import cases_autocomplete, cases_basic, cases_batching, cases_pipelines
from tests.differential.casekit import Builder, Case

_GROUPS = (cases_basic.dims, cases_basic.reshape, cases_basic.types, cases_basic.versions, cases_basic.identity,
           cases_basic.instances, cases_batching.dynamic, cases_batching.sequence, cases_batching.batch_input,
           cases_pipelines.warmup, cases_basic.files, cases_pipelines.ensembles, cases_basic.parse,
           cases_autocomplete.completes)


def all_cases() -> list[Case]:
    b = Builder()
    for group in _GROUPS:
        group(b)
    names = [c.name for c in b.cases]
    assert len(names) == len(set(names)), "duplicate case names"
    return b.cases


def categories(cases: list[Case]) -> Iterator[str]:
    yield from dict.fromkeys(c.category for c in cases)


__all__ = ["Case", "all_cases", "categories"]
