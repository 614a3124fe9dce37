"""Request latency quantiles from tritonserver's Prometheus metrics (its `/metrics` text).

With `--metrics-config=summary_latencies=true` (a launched tritonserver gets it: launcher.py) Triton exports,
per model and version, `nv_inference_request_summary_us{model,version,quantile}` for quantiles 0.5, 0.9,
0.95, 0.99 and 0.999, plus `_count` and `_sum`. Measured on the 2.51 used here:

- it counts successful requests only (as the statistics API's `success`: a request that raised is not in it);
- its quantiles cover a sliding window of about the last minute (they read `Nan` a minute after the last
  request); `_count` and `_sum` are cumulative;
- a reload of the model (a new digest under the same name and version) keeps the series: its window holds
  the previous content's requests too until they age out, whereas the statistics API starts again at 0.

Without summaries (a server started without the flag, metrics disabled) there is no such line and the
callers fall back on the mean from the statistics API.
"""

from __future__ import annotations

import math
import re
import urllib.error
import urllib.request

REQUEST_SUMMARY = "nv_inference_request_summary_us"
P99 = "0.99"
METRICS_TIMEOUT_S = 2.0
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def read_metrics(url: str, timeout_s: float = METRICS_TIMEOUT_S) -> str:
    """The metrics text at `url` (raises OSError / urllib.error.URLError / ValueError when unreadable)."""
    with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 - the server's own endpoint
        return str(response.read().decode("utf-8", "replace"))


def request_quantiles_ms(text: str, quantile: str = P99) -> dict[str, float]:
    """model → its request duration at `quantile` in ms over Triton's window, from metrics `text`; the
    highest over the model's versions. A model whose window is empty (`Nan`) or without summaries is left out."""
    found: dict[str, float] = {}
    prefix = REQUEST_SUMMARY + "{"
    for line in text.splitlines():
        if not line.startswith(prefix):
            continue
        labels_text, _, value_text = line[len(prefix):].rpartition("} ")
        labels = dict(_LABEL.findall(labels_text))
        if labels.get("quantile") != quantile or "model" not in labels:
            continue
        try:
            value = float(value_text.strip())
        except ValueError:
            continue
        if math.isnan(value) or value < 0:
            continue
        model = labels["model"]
        found[model] = max(found.get(model, 0.0), value / 1000.0)
    return found


def fetch_request_p99_ms(url: str, timeout_s: float = METRICS_TIMEOUT_S) -> dict[str, float] | None:
    """model → request p99 in ms from the metrics endpoint `url`; None when it cannot be read."""
    try:
        return request_quantiles_ms(read_metrics(url, timeout_s))
    except (OSError, urllib.error.URLError, ValueError):
        return None
