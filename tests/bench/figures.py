"""The figures every benchmark takes and how it summarises them, in one place so they compare.

A process's CPU (utime + stime) and peak RSS (VmHWM) from /proc, a Prometheus endpoint's samples,
and a list of samples as n/p50/p95/p99 (nearest rank, no interpolation: a figure is one that was
seen) — the operator's and Argo's controller's alike.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import urllib.request
from pathlib import Path


def pct(values: list[float], q: float) -> float:
    """The `q`th percentile by nearest rank; NaN for no samples."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def percentiles(values: list[float]) -> dict[str, float]:
    """n, p50, p95 and p99 of samples already in the unit to report."""
    return {"n": len(values), "p50": pct(values, 50), "p95": pct(values, 95), "p99": pct(values, 99)}


def distribution(values: list[float], scale: float = 1000.0) -> dict[str, float]:
    """`percentiles` and the mean of samples times `scale` (seconds -> ms by default)."""
    v = [x * scale for x in values]
    return {**percentiles(v), "mean": statistics.fmean(v) if v else float("nan")}


def line(name: str, d: dict[str, float], unit: str = "ms") -> str:
    """A `distribution` as one aligned row of a benchmark's summary."""
    return (
        f"{name:<44} n={d['n']:<5.0f} p50={d['p50']:8.2f}{unit} p95={d['p95']:8.2f}{unit} "
        f"p99={d['p99']:8.2f}{unit} mean={d['mean']:8.2f}{unit}"
    )


def scrape(port: int) -> dict[str, float]:
    """Every sample of the Prometheus endpoint on localhost:`port`, by its name and labels."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out: dict[str, float] = {}
    for row in text.splitlines():
        if row and not row.startswith("#"):
            key, _, value = row.rpartition(" ")
            with contextlib.suppress(ValueError):
                out[key] = float(value)
    return out


def cpu_times(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def cpu_seconds(pid: int) -> float:
    return sum(cpu_times(pid))


def peak_rss_mb(pid: int) -> float:
    """A process's peak resident set (VmHWM) in MB; NaN if the kernel does not say."""
    for row in Path(f"/proc/{pid}/status").read_text().splitlines():
        if row.startswith("VmHWM:"):
            return int(row.split()[1]) / 1024
    return float("nan")
