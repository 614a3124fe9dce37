"""Smoke requests run after a deploy: each request of the model's smoke file
(controlplane/validation/smokefile.py, its format and offline checks) sent through an `InferFn`, its
answer compared with the expected outputs. A deploy whose model is READY but answers these requests
wrongly (or not at all) is a failed deploy, so the deploy state machine rolls it back. The daemon
supplies the transport, so this module needs no server.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from controlplane.validation.smokefile import SmokeInput, SmokeOutput, SmokeRequest

if TYPE_CHECKING:
    import numpy as np

InferFn = Callable[[str, str, Sequence[SmokeInput], Sequence[str]], "dict[str, np.ndarray]"]


# ---------------------------------------------------------------- running


def run_smoke(model: str, requests: Sequence[SmokeRequest], infer: InferFn) -> list[str]:
    """Send each request through `infer`; one line per failure, an empty list when all pass."""
    failures: list[str] = []
    for i, request in enumerate(requests):
        where = f"{model}" + (f" version {request.version}" if request.version else "") + f" request {i}"
        names = [output.name for output in request.outputs]
        try:
            got = infer(model, request.version, request.inputs, names)
        except Exception as exc:  # noqa: BLE001 - any failure of the call is a smoke failure
            failures.append(_one_line(f"{where}: infer failed: {exc}"))
            continue
        for output in request.outputs:
            problem = _compare(output, got.get(output.name))
            if problem:
                failures.append(_one_line(f"{where}: output '{output.name}' {problem}"))
    return failures


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
