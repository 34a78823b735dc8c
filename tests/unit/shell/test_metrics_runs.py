"""`agentrun_runs{phase}`: set from the cache's run phases at each resync (shell/metrics.py)."""

from __future__ import annotations

from prometheus_client import REGISTRY

from agentrun_operator.shell import metrics


def _runs(phase: str) -> float | None:
    return REGISTRY.get_sample_value("agentrun_runs", {"phase": phase})


def test_every_phase_is_counted_and_a_phase_whose_runs_left_drops_to_zero() -> None:
    metrics.count_runs(["Running", "Pending", "Running", "Succeeded"])
    assert (_runs("Pending"), _runs("Running"), _runs("Succeeded")) == (1, 2, 1)
    assert (_runs("Failed"), _runs("Cancelled")) == (0, 0)
    metrics.count_runs(["Failed"])
    assert (_runs("Pending"), _runs("Running"), _runs("Succeeded"), _runs("Failed")) == (0, 0, 0, 1)
