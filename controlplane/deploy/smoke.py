"""Smoke requests run after a deploy: each request of the model's smoke file
(controlplane/validation/smokefile.py, its format and offline checks) sent through an `InferFn`, its
answer compared with the expected outputs. A deploy whose model is READY but answers these requests
wrongly (or not at all) is a failed deploy, so the deploy state machine rolls it back. The daemon
supplies the transport, so this module needs no server.

Whose failure it is (issue 57): under client traffic a smoke request shares the model's dynamic batches with
other requests, and a model that fails a batch fails every request in it. So `smoke_test` tries a request
that failed again, alone, a bounded number of times, and reads the model's request counters (Triton's
statistics) around each try. A wrong answer is the request's own (per request, whatever the batch); so is a
failure while no other request failed, or while no request of the model passed at all. A request that
failed only while other requests failed beside it, others passing meanwhile, shows nothing against the
content: the result says so (`shared`), and the deploy is retried later rather than the digest condemned.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from controlplane.validation.smokefile import SmokeInput, SmokeOutput, SmokeRequest

if TYPE_CHECKING:
    import numpy as np

InferFn = Callable[[str, str, Sequence[SmokeInput], Sequence[str]], "dict[str, np.ndarray]"]
# The model's cumulative (successes, failures) over its versions now (Triton's statistics); None: unknown
CountsFn = Callable[[], "tuple[int, int] | None"]

TRIES = 3  # tries of a request that failed with an error, the first included
PAUSES_S = (0.2, 0.5)  # before the second and the third try
COUNTED_S = 0.5  # at most this long for Triton to count a failed try (it counts a request once done with it)


@dataclass(frozen=True)
class SmokeResult:
    """The smoke test's outcome: one line per request that failed (none: it passed), and whether every failure
    was an error in batches other failing requests shared, others passing meanwhile (nobody's proven fault)."""

    failures: list[str]
    shared: bool = False


# ---------------------------------------------------------------- running


def run_smoke(model: str, requests: Sequence[SmokeRequest], infer: InferFn) -> list[str]:
    """Send each request through `infer` once; one line per failure, an empty list when all pass."""
    failures: list[str] = []
    for i, request in enumerate(requests):
        failures += _check(model, i, request, infer)[0]
    return failures


def smoke_test(model: str, requests: Sequence[SmokeRequest], infer: InferFn, counts: CountsFn | None = None,
               *, sleep: Callable[[float], None] = time.sleep) -> SmokeResult:
    """Each request, a request that failed with an error tried again alone (TRIES in all); see the module's
    docstring for whose failure it is. Without `counts` (or when they cannot be read), a failure is the
    request's own, as before counts were read."""
    failures: list[str] = []
    own = False
    first = counts() if counts is not None else None
    for i, request in enumerate(requests):
        for attempt in range(TRIES):
            if attempt:
                sleep(PAUSES_S[min(attempt - 1, len(PAUSES_S) - 1)])
            before = counts() if counts is not None else None
            problems, errored = _check(model, i, request, infer)
            if not problems:
                break
            if not errored or not _others_failed(counts, before, sleep):
                own = True  # a wrong answer, or a failure of its own: no retry changes it
                failures += problems
                break
            if attempt == TRIES - 1:
                failures += problems
    if failures and not own:
        last = counts() if counts is not None else None
        own = first is None or last is None or last[0] <= first[0]  # no request of the model passed meanwhile
    return SmokeResult(failures, shared=bool(failures) and not own)


def _others_failed(counts: CountsFn | None, before: tuple[int, int] | None, sleep: Callable[[float], None]) -> bool:
    """Whether other requests of the model failed while this try did (its batch, or another at that moment):
    Triton's failure count grew by more than this try's one, once it counted this one."""
    if counts is None or before is None:
        return False
    deadline = time.monotonic() + COUNTED_S
    now = counts()
    while now is not None and now[1] - before[1] < 1 and time.monotonic() < deadline:
        sleep(0.02)
        now = counts()
    return now is not None and now[1] - before[1] > 1


def _check(model: str, i: int, request: SmokeRequest, infer: InferFn) -> tuple[list[str], bool]:
    """One request sent once: (one line per problem, whether the call itself failed rather than answered)."""
    where = f"{model}" + (f" version {request.version}" if request.version else "") + f" request {i}"
    names = [output.name for output in request.outputs]
    try:
        got = infer(model, request.version, request.inputs, names)
    except Exception as exc:  # noqa: BLE001 - any failure of the call is a smoke failure
        return [_one_line(f"{where}: infer failed: {exc}")], True
    problems = []
    for output in request.outputs:
        problem = _compare(output, got.get(output.name))
        if problem:
            problems.append(_one_line(f"{where}: output '{output.name}' {problem}"))
    return problems, False


def _compare(output: SmokeOutput, got: np.ndarray | None) -> str | None:
    import numpy as np

    if got is None:
        return "missing from the response"
    got = np.asarray(got)
    if output.shape is not None and tuple(got.shape) != output.shape:
        return f"has shape {list(got.shape)}, expected {list(output.shape)}"
    expected = output.expected
    assert expected is not None, "a smoke file checked with build=False cannot be run"
    if got.size != expected.size:
        return f"has {got.size} values (shape {list(got.shape)}), expected {expected.size}"
    flat_got, flat_expected = got.reshape(-1), expected.reshape(-1)
    if expected.dtype == np.object_:
        texts = [_as_text(value) for value in flat_got]
        bad = [k for k, (g, e) in enumerate(zip(texts, flat_expected, strict=True)) if g != e]
        if bad:
            k = bad[0]
            return f"differs at {_index(k, got.shape)}: expected {flat_expected[k]!r}, got {texts[k]!r}"
        return None
    if got.dtype == np.object_ or got.dtype.kind in "SU":
        return f"is {got.dtype} data, expected numbers"
    if expected.dtype == np.bool_:
        close = flat_got.astype(np.bool_) == flat_expected
    else:
        values = flat_got.astype(np.float64)
        close = np.isclose(values, flat_expected, rtol=0.0, atol=output.tolerance, equal_nan=True)
    if not close.all():
        k = int(np.argmin(close))
        tol = f" (tolerance {output.tolerance:g})" if expected.dtype != np.bool_ else ""
        return (
            f"differs at {_index(k, got.shape)}: expected {flat_expected[k].item()!r}, "
            f"got {flat_got[k].item()!r}{tol}"
        )
    return None


def _as_text(value: object) -> str:
    import numpy as np

    if isinstance(value, (bytes, bytearray)):
        return bytes(value).decode("utf-8", errors="replace")
    if isinstance(value, np.bytes_):
        return bytes(value).decode("utf-8", errors="replace")
    return str(value)


def _index(flat: int, shape: tuple[int, ...]) -> str:
    if len(shape) <= 1:
        return f"index {flat}"
    import numpy as np

    return f"index {list(int(i) for i in np.unravel_index(flat, shape))}"


def _one_line(text: str) -> str:
    return " ".join(text.split())
