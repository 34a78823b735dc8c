"""The numbers the alerts read (planner/fleet.py and the iteration duration): no run in them, and
a run that waits on purpose is not a stuck one."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from agentrun_operator.planner.facts import IterationFinished
from agentrun_operator.planner.fleet import FleetGauges, summarize
from tests.unit.planner.world import PlannerWorld, loop_step, manifest

NOW = datetime(2026, 11, 28, 6, 0, tzinfo=UTC)


def at(seconds_ago: float) -> str:
    return (NOW - timedelta(seconds=seconds_ago)).isoformat().replace("+00:00", "Z")


def run(
    phase: str | None, updated: float | None = None, steps: list[dict[str, Any]] | None = None, **status: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "metadata": {"name": "r", "creationTimestamp": at(10_000)},
        "status": dict(status),
    }
    if phase is not None:
        body["status"]["phase"] = phase
    if updated is not None:
        body["status"]["updatedAt"] = at(updated)
    if steps is not None:
        body["status"]["workflow"] = {"steps": steps}
    return body


def test_no_runs_no_numbers() -> None:
    assert summarize([], NOW) == FleetGauges(0.0, 0.0, 0)


def test_the_longest_time_without_a_status_change_over_unfinished_runs() -> None:
    runs = [run("Running", 120), run("Running", 30), run("Succeeded", 9_000), run("Failed", 8_000)]
    assert summarize(runs, NOW).no_progress_max == 120


def test_a_run_never_written_counts_from_its_creation() -> None:
    assert summarize([{"metadata": {"creationTimestamp": at(300)}}], NOW).no_progress_max == 300


def test_a_run_waiting_at_an_approval_gate_is_the_approval_gauges_not_a_stuck_one() -> None:
    gate = {"name": "sign-off", "phase": "AwaitingApproval", "startedAt": at(700)}
    body = {
        "name": "develop",
        "phase": "Running",
        "steps": [{"name": "implement", "phase": "Succeeded"}, gate],
    }
    gauges = summarize([run("Running", 600, [body])], NOW)
    assert gauges.no_progress_max == 0
    assert gauges.approval_wait_max == 700


def test_a_scheduled_retry_or_iteration_is_progress_until_it_is_due() -> None:
    retry = {"name": "a", "phase": "Retrying", "nextRetryAt": at(-300)}  # due in 5 minutes
    interval = {"name": "b", "phase": "Running", "loop": {"nextIterationAt": at(-60)}}
    overdue = {"name": "c", "phase": "Retrying", "nextRetryAt": at(40)}  # due 40 s ago
    assert (
        summarize([run("Running", 900, [retry]), run("Running", 900, [interval])], NOW).no_progress_max == 0
    )
    assert summarize([run("Running", 900, [overdue])], NOW).no_progress_max == 40


def test_runs_near_the_status_budget_are_counted_finished_or_not() -> None:
    warned = [{"type": "StatusSizeWarning", "status": "True"}]
    cleared = [{"type": "StatusSizeWarning", "status": "False"}]
    runs = [
        run("Running", 1, conditions=warned),
        run("Succeeded", 1, conditions=warned),
        run("Running", 1, conditions=cleared),
    ]
    assert summarize(runs, NOW).near_budget == 2


def test_each_attempt_reports_how_long_its_pod_ran() -> None:
    """From the Job's start to its pod's end: 42 s for the failed attempt, 7 s for its retry."""
    world = PlannerWorld(manifest([loop_step(max_iterations=1, retries=1, retryBackoffSeconds=0)]))

    def finish(w: PlannerWorld, job: str) -> None:
        if job.endswith("attempt-1"):
            w.advance(42)
            w.fail(job)
        else:
            w.advance(7)
            w.succeed(job, control={"continue": False})

    world.drive(finish)
    finished = [f for p in world.plans for f in p.facts if isinstance(f, IterationFinished)]
    assert [(f.result, f.duration_seconds) for f in finished] == [("Retrying", 42.0), ("Succeeded", 7.0)]
