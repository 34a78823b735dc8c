"""Line and branch coverage per package, from the coverage data `make test` leaves (`.coverage`).

coverage.py reports per file; a reader of `make test` wants to see at a glance which part of the
code its tests reach (the planner's unit-tier bar is checked by `coverage report`, in the Makefile).
Only coverage.py's public API is used: its JSON report, summed per directory.

    python -m tests.support.coverage_report [DATA_FILE]
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import coverage

ROOTS = (Path("operator/devcluster"), Path("operator"))  # the more specific root first
COUNTS = ("num_statements", "covered_lines", "num_branches", "covered_branches")


def package_of(path: str, cwd: Path) -> str:
    """The dotted package (directory) of a measured file: operator/agentrun_operator/planner/plan.py
    is agentrun_operator.planner."""
    file = Path(path).resolve()
    for root in ROOTS:
        try:
            relative = file.relative_to((cwd / root).resolve())
        except ValueError:
            continue
        return ".".join(relative.parent.parts)
    return str(file.parent)


def by_package(files: dict[str, dict[str, int]], cwd: Path) -> dict[str, dict[str, int]]:
    """The JSON report's per-file summaries, summed per package."""
    out: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(COUNTS, 0))
    for path, summary in files.items():
        totals = out[package_of(path, cwd)]
        for count in COUNTS:
            totals[count] += summary.get(count, 0)
    return dict(sorted(out.items()))


def _percent(covered: int, total: int) -> str:
    return f"{100 * covered / total:5.1f} %" if total else "    - "


def render(packages: dict[str, dict[str, int]]) -> str:
    width = max([len("package"), *map(len, packages)])
    lines = [f"{'package':<{width}}  {'lines':>7}  {'covered':>7}  {'branches':>8}  {'covered':>7}"]
    for name, t in packages.items():
        lines.append(
            f"{name:<{width}}  {t['num_statements']:>7}  {_percent(t['covered_lines'], t['num_statements'])}"
            f"  {t['num_branches']:>8}  {_percent(t['covered_branches'], t['num_branches'])}"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    data_file = argv[0] if argv else ".coverage"
    if not Path(data_file).exists():
        print(f"no coverage data at {data_file}: run `make test` or `make unit` first", file=sys.stderr)
        return 2
    cov = coverage.Coverage(data_file=data_file)
    cov.load()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "coverage.json"
        cov.json_report(outfile=str(out))
        files = {path: doc["summary"] for path, doc in json.loads(out.read_text())["files"].items()}
    print(render(by_package(files, Path.cwd())))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
