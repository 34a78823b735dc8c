"""Plot the scale benchmark: operator memory and work-queue latency against the number of runs.

Reads the `--json` files of tests/bench/bench_scale.py (one per size; those with unrelated pods are
drawn as separate points) and writes a PNG (docs/operator.md#scale). matplotlib is a benchmark-only
dependency: `pip install -e '.[bench]'`.

    .venv/bin/python -m tests.bench.plot_scale /tmp/scale-*.json --out docs/images/scale.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def load(paths: list[Path]) -> list[dict[str, Any]]:
    reports = [json.loads(p.read_text()) for p in paths]
    return sorted(reports, key=lambda r: (r.get("unrelated_pods", 0), r["runs"]))


def plot(reports: list[dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plain = [r for r in reports if not r.get("unrelated_pods")]
    loaded = [r for r in reports if r.get("unrelated_pods")]
    fig, (mem, lat) = plt.subplots(1, 2, figsize=(11, 4.2))
    xs = [r["runs"] for r in plain]
    mem.plot(xs, [r["operator_peak_rss_mb"] for r in plain], "o-", label="operator peak RSS")
    for r in plain:
        if r.get("partial"):
            mem.annotate("stopped unfinished", (r["runs"], r["operator_peak_rss_mb"]), fontsize=8)
    if loaded:
        mem.plot(
            [r["runs"] for r in loaded],
            [r["operator_peak_rss_mb"] for r in loaded],
            "s",
            label=f"with {loaded[0]['unrelated_pods']:,} unrelated pods",
        )
    mem.set_xscale("log")
    mem.set_xlabel("concurrent runs (x 3 iterations)")
    mem.set_ylabel("MB")
    mem.set_ylim(bottom=0)
    mem.set_title("operator memory")
    mem.grid(True, which="both", alpha=0.3)
    mem.legend()
    # A size stopped before its runs ended (`"partial": true`) has a memory figure and no latency.
    timed = [r for r in plain if r.get("queue_latency_ms")]
    for q, style in (("p50", "o-"), ("p95", "s-"), ("p99", "^-")):
        lat.plot([r["runs"] for r in timed], [r["queue_latency_ms"][q] for r in timed], style, label=q)
    lat.set_xscale("log")
    lat.set_yscale("log")
    lat.set_xlabel("concurrent runs (x 3 iterations)")
    lat.set_ylabel("ms")
    lat.set_title("work-queue latency: pod ended → next Job")
    lat.grid(True, which="both", alpha=0.3)
    lat.legend()
    fig.suptitle("AgentRun operator on KWOK (2-core machine; the API server is the limit)")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("reports", type=Path, nargs="+", help="bench_scale --json files")
    ap.add_argument("--out", type=Path, required=True, help="the PNG to write")
    args = ap.parse_args()
    plot(load(args.reports), args.out)
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
