"""The per-package coverage table `make test` prints (tests/support/coverage_report.py)."""

from __future__ import annotations

from pathlib import Path

from tests.support.coverage_report import by_package, package_of, render


def test_files_are_summed_per_package_of_either_distribution(tmp_path: Path) -> None:
    one = {"num_statements": 10, "covered_lines": 9, "num_branches": 4, "covered_branches": 3}
    files = {
        "operator/agentrun_operator/planner/plan.py": one,
        "operator/agentrun_operator/planner/loops.py": one,
        "operator/agentrun_operator/naming.py": one,
        "operator/devcluster/agentrun_devcluster/podrunner/worker.py": one,
    }
    assert package_of(str(tmp_path / "operator/agentrun_operator/naming.py"), tmp_path) == "agentrun_operator"
    packages = by_package({str(tmp_path / path): summary for path, summary in files.items()}, tmp_path)
    assert list(packages) == [
        "agentrun_devcluster.podrunner",
        "agentrun_operator",
        "agentrun_operator.planner",
    ]
    assert packages["agentrun_operator.planner"] == {
        "num_statements": 20,
        "covered_lines": 18,
        "num_branches": 8,
        "covered_branches": 6,
    }
    table = render(packages).splitlines()
    assert table[0].split() == ["package", "lines", "covered", "branches", "covered"]
    assert table[3].split() == ["agentrun_operator.planner", "20", "90.0", "%", "8", "75.0", "%"]
