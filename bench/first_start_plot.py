"""Draw docs/first_start.png from a bench/scale.py results file (issue 39): seconds until every model
serves, against the number of models, for tritonctl's first start under auto policy beside Triton
explicit `--load-model=*`, Triton poll and Triton with one load request per model.

    python bench/first_start_plot.py                                   # bench/results/scale-39.json
    python bench/first_start_plot.py RESULTS.json docs/first_start.png
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common as c  # noqa: E402
import run_all  # noqa: E402

RESULTS = c.RESULTS / "scale-39.json"
PNG = c.ROOT / "docs" / "first_start.png"


def series(report: dict[str, Any]) -> dict[str, list[tuple[int, float]]]:
    """Each system's (models, seconds until every model serves), where the run measured it."""
    paths = {
        "tritonctl first start, auto: every model serving (recorded)": ("tritonctl", "all_recorded_s"),
        "tritonctl first start, auto: every model READY in Triton": ("tritonctl", "all_serving_s"),
        "Triton explicit --load-model=*: every model READY": ("triton_explicit", "all_ready_s"),
        "Triton poll: live (every model loaded)": ("triton_poll", "live_s"),
        "Triton, one load request per model": ("triton_requests", "concurrency_1", "all_loaded_s"),
    }
    out: dict[str, list[tuple[int, float]]] = {}
    for label, keys in paths.items():
        points = []
        for result in sorted(report["results"], key=lambda r: r["models"]):
            value: Any = result
            for key in keys:
                value = value.get(key) if isinstance(value, dict) else None
            if isinstance(value, (int, float)):
                points.append((int(result["models"]), float(value)))
        out[label] = points
    return out


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=90)
    for label, points in series(report).items():
        if points:
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=label)
    explicit = series(report)["Triton explicit --load-model=*: every model READY"]
    if explicit:
        ax.plot([p[0] for p in explicit], [4 * p[1] for p in explicit], color="#555555", linestyle="--", lw=0.8,
                label="target at 2,000 models: 4x Triton explicit --load-model=*")
    if any(p[0] >= 10_000 for p in explicit):
        ax.plot([10_000], [60.0], marker="x", color="#555555", linestyle="none", label="target at 10,000 models: 60 s")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("models (1 python model + ensembles over it)")
    ax.set_ylabel("seconds until every model serves")
    ax.legend(fontsize=8)
    run_all.save_plot(fig, plt, path, report, "First start, every model serving")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    results = Path(args[0]) if args else RESULTS
    png = Path(args[1]) if len(args) > 1 else PNG
    plot(json.loads(results.read_text()), png)
    print(f"plot: {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
