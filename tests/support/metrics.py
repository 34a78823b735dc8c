"""Reading the operator's Prometheus metrics in tests: scrape `/metrics`, then compare samples."""

from __future__ import annotations

import re
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Samples:
    """Every sample the operator serves, by (name, sorted labels)."""
    with urllib.request.urlopen(url, timeout=5) as response:
        return parse(response.read().decode())


def parse(text: str) -> Samples:
    """Every sample of a Prometheus text exposition (any component's `/metrics`), by (name, sorted labels)."""
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: Samples, name: str, /, **labels: str) -> float:
    """One sample; 0 when it is not there (a counter never incremented has no labelled sample)."""
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def delta(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of every sample of `name` whose labels include `labels` (e.g. one phase, any reason)."""
    wanted = set(labels.items())
    return sum(v for (n, sample_labels), v in samples.items() if n == name and wanted <= set(sample_labels))


def documented_metrics(page: str) -> dict[str, tuple[str, frozenset[str]]]:
    """The table under `### Metrics {#metrics}` of docs/operator.md: metric -> (type, label names).

    The labels cell lists each label as a backticked name, followed by `:` and its values, or by `,`
    and the next label; `;` separates labels with values; `—` or nothing: no labels.
    """
    section = page.split("### Metrics {#metrics}", 1)[1].split("\n## ", 1)[0]
    found: dict[str, tuple[str, frozenset[str]]] = {}
    for row in section.splitlines():
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        if len(cells) < 4 or not cells[0].startswith("`agentrun_"):
            continue
        labels: set[str] = set()
        for part in cells[2].split(";"):
            names = part.split(":", 1)[0].split("(", 1)[0]
            labels |= set(re.findall(r"`([a-z_]+)`", names))
        found[cells[0].strip("`")] = (cells[1], frozenset(labels))
    return found
