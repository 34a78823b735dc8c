"""`loop.intervalSeconds` (planner/interval.py): the wait between an iteration's end and the next
iteration's start, during which no Job exists; its due time lives in status (`loop.nextIterationAt`)
and the planner asks to be requeued for it. Driven through the real planner (`PlannerWorld`)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from agentrun_operator.api import format_timestamp
from agentrun_operator.planner.actions import CreateJob, EmitEvent, Requeue
from agentrun_operator.planner.facts import NextIterationRequested
from agentrun_operator.planner.plan import Plan, plan
from tests.unit.planner.world import T0, PlannerWorld, loop_step, manifest

INTERVAL = 30


def polling(max_iterations: int = 3, interval: int = INTERVAL, **extra: Any) -> PlannerWorld:
    loop = {"intervalSeconds": interval, **extra.pop("loop", {})}
    return PlannerWorld(manifest([loop_step(max_iterations=max_iterations, loop=loop, **extra)]))


def creates(result: Plan) -> list[str]:
    return [a.name for a in result.actions if isinstance(a, CreateJob)]


def reasons(result: Plan) -> list[str]:
    return [a.reason for a in result.actions if isinstance(a, EmitEvent)]


def requeue_of(result: Plan) -> float | None:
    return next((a.after_seconds for a in result.actions if isinstance(a, Requeue)), None)


def job(iteration: int, attempt: int = 1) -> str:
    return f"run-step-1-iter-{iteration}-attempt-{attempt}"


# ------------------------------------------------------------------------------- a workload loop


def test_the_next_iteration_waits_the_interval_with_no_job_and_a_requeue_for_its_due_time() -> None:
    world = polling()
    world.plan()
    world.advance(5)
    world.succeed()  # iteration 1 ends at T0+5
    result = world.plan()
    due = T0 + timedelta(seconds=5 + INTERVAL)
    loop = world.step_status().loop
    assert creates(result) == [] and world.live_jobs() == []
    assert loop.next_iteration_at == due
    assert loop.completed_iterations == 1 and loop.current_iteration == 1
    assert requeue_of(result) == INTERVAL
    assert world.step_status().phase == "Running"
    assert world.step_status().message == (
        f"iteration 1/3 succeeded; iteration 2 starts at {format_timestamp(due)} (loop.intervalSeconds); "
        "no pod runs until then"
    )
    assert reasons(result).count("IterationScheduled") == 1

    world.advance(INTERVAL - 1)
    early = world.plan()
    assert creates(early) == [] and requeue_of(early) == 1.0
    assert world.step_status().loop.next_iteration_at == due
    assert "IterationScheduled" not in reasons(early)  # told once

    world.advance(1)
    assert creates(world.plan()) == [job(2)]
    loop = world.step_status().loop
    assert loop.next_iteration_at is None and loop.current_iteration == 2
    assert loop.iterations[-1].started_at == due


def test_the_wait_counts_from_the_iteration_end_not_from_when_the_operator_saw_it() -> None:
    world = polling()
    world.plan()
    world.succeed()  # ends at T0
    world.advance(12)  # the operator sees it 12 s later
    result = world.plan()
    assert world.step_status().loop.next_iteration_at == T0 + timedelta(seconds=INTERVAL)
    assert requeue_of(result) == INTERVAL - 12


def test_an_operator_that_sees_the_end_after_the_interval_starts_the_next_iteration_at_once() -> None:
    world = polling()
    world.plan()
    world.succeed()
    world.advance(INTERVAL + 5)
    assert creates(world.plan()) == [job(2)]
    assert world.step_status().loop.next_iteration_at is None


def test_a_restarted_operator_keeps_the_schedule_from_status() -> None:
    world = polling()
    world.plan()
    world.succeed()
    first = world.plan()  # the wait is recorded
    persisted = world.status
    assert persisted is not None
    due = persisted.workflow.steps[0].loop.next_iteration_at  # type: ignore[union-attr]
    world.advance(10)
    # a new operator process: nothing in memory, the same persisted status and the same cluster
    again = plan(world.agentrun(), world.observed(), world.now, world.config)
    assert again.status.workflow.steps[0].loop.next_iteration_at == due  # type: ignore[union-attr]
    assert creates(again) == [] and requeue_of(again) == INTERVAL - 10
    assert "IterationScheduled" not in reasons(again)
    assert requeue_of(first) == INTERVAL
    # the same status planned twice at the same moment gives the same plan
    assert plan(world.agentrun(), world.observed(), world.now, world.config) == again


def test_a_changed_clock_does_not_move_a_recorded_due_time() -> None:
    """nextIterationAt is computed once; a re-plan reads it rather than recomputing from the record."""
    world = polling()
    world.plan()
    world.succeed()
    world.plan()
    assert world.status is not None
    record = world.status.workflow.steps[0].loop.iterations[-1]  # type: ignore[union-attr]
    record.finished_at = T0 + timedelta(seconds=100)  # whatever the record says now
    world.advance(INTERVAL)
    assert creates(world.plan()) == [job(2)]


def test_every_iteration_after_the_first_waits_and_the_last_one_does_not() -> None:
    world = polling(max_iterations=3)
    world.drive(lambda w, name: (w.advance(2), w.succeed(name)))
    assert world.phase == "Succeeded"
    loop = world.step_status().loop
    assert loop.stop_reason == "LoopMaxIterationsReached" and loop.next_iteration_at is None
    starts = [r.started_at for r in loop.iterations]
    ends = [r.finished_at for r in loop.iterations]
    assert starts[0] == T0
    assert [s - e for s, e in zip(starts[1:], ends[:-1], strict=True)] == [timedelta(seconds=INTERVAL)] * 2
    # the run ends when the last iteration does: no wait after it
    assert world.status is not None and world.status.finished_at == ends[-1]


def test_a_stopping_condition_ends_the_loop_without_waiting() -> None:
    world = polling(max_iterations=5, until="iteration.last.control.done == true")
    world.plan()
    world.succeed(control={"done": False})
    world.plan()
    assert world.step_status().loop.next_iteration_at == T0 + timedelta(seconds=INTERVAL)
    world.advance(INTERVAL)
    world.plan()
    world.advance(3)
    world.succeed(control={"done": True})
    result = world.plan()
    step = world.step_status()
    assert world.phase == "Succeeded" and step.loop.stop_reason == "LoopConditionFalse"
    assert step.loop.next_iteration_at is None and requeue_of(result) is None
    assert "IterationScheduled" not in reasons(result)
    assert world.status is not None and world.status.finished_at == T0 + timedelta(seconds=INTERVAL + 3)


def test_a_budget_that_stops_the_loop_never_waits() -> None:
    world = polling(max_iterations=5, loop={"budget": {"maxTokens": 100}, "onBudgetExhausted": "Succeed"})
    world.plan()
    world.succeed(control={"usage": {"inputTokens": 150}})
    world.plan()
    step = world.step_status()
    assert world.phase == "Succeeded" and step.loop.stop_reason == "LoopBudgetExhausted"
    assert step.loop.next_iteration_at is None


def test_a_failed_attempt_waits_the_retry_backoff_not_the_interval() -> None:
    world = polling(max_iterations=2, retries=1, retryBackoffSeconds=5)
    world.plan()
    world.succeed()
    world.plan()
    world.advance(INTERVAL)
    assert creates(world.plan()) == [job(2)]
    world.advance(1)
    world.fail()  # iteration 2 attempt 1 fails at T0+31
    world.plan()
    assert world.step_status().phase == "Retrying"
    assert world.step_status().loop.next_iteration_at is None
    world.advance(5)
    assert creates(world.plan()) == [job(2, 2)]  # after the backoff, not the interval
    world.advance(2)
    world.succeed()
    world.plan()
    assert world.phase == "Succeeded"


def test_a_retried_iteration_waits_the_interval_from_its_successful_attempt() -> None:
    world = polling(max_iterations=2, retries=1, retryBackoffSeconds=5)
    world.plan()
    world.fail()
    world.plan()
    world.advance(5)
    assert creates(world.plan()) == [job(1, 2)]
    world.advance(4)
    world.succeed()  # iteration 1 ends at T0+9, on attempt 2
    result = world.plan()
    assert world.step_status().loop.next_iteration_at == T0 + timedelta(seconds=9 + INTERVAL)
    assert requeue_of(result) == INTERVAL
    world.advance(INTERVAL)
    assert creates(world.plan()) == [job(2)]


@pytest.mark.parametrize("mode", ["Graceful", "Immediate"])
def test_cancel_during_the_wait_ends_the_loop_at_once(mode: str) -> None:
    world = polling(max_iterations=5)
    world.plan()
    world.succeed()
    world.plan()
    world.advance(7)
    world.spec_manifest["spec"]["cancel"] = mode
    result = world.plan()
    step = world.step_status()
    assert world.phase == "Cancelled" and creates(result) == []
    assert step.phase == "Cancelled" and step.loop.stop_reason == "LoopCancelled"
    assert step.loop.next_iteration_at is None and step.finished_at == world.now
    assert step.message == (
        f"cancelled ({mode}) after iteration 1, while waiting for iteration 2 (loop.intervalSeconds); "
        "no further iteration or attempt was started"
    )
    assert [r.phase for r in step.loop.iterations] == ["Succeeded"]
    world.advance(INTERVAL)
    assert creates(world.plan()) == [] and world.phase == "Cancelled"


def test_the_workflow_timeout_during_the_wait_ends_the_run() -> None:
    world = polling(max_iterations=5)
    world.spec_manifest["spec"]["workflow"]["timeoutSeconds"] = 20
    world.plan()
    world.advance(2)
    world.succeed()
    result = world.plan()
    assert requeue_of(result) == 18  # the timeout comes before the next iteration
    world.advance(18)
    world.plan()
    step = world.step_status()
    assert world.phase == "Failed" and world.status is not None and world.status.reason == "WorkflowTimedOut"
    assert (
        step.phase == "Cancelled"
        and step.loop.stop_reason == "LoopCancelled"
        and step.loop.next_iteration_at is None
    )
    assert world.created == [job(1)]


def test_the_turnaround_fact_counts_from_the_end_of_the_wait() -> None:
    world = polling(max_iterations=2)
    world.plan()
    world.succeed()
    world.plan()
    world.advance(INTERVAL)
    result = world.plan()
    due = T0 + timedelta(seconds=INTERVAL)
    assert [f for f in result.facts if isinstance(f, NextIterationRequested)] == [
        NextIterationRequested("a", 2, job(2), due)
    ]


def test_an_interval_of_zero_starts_the_next_iteration_in_the_same_plan() -> None:
    world = polling(interval=0)
    world.plan()
    world.succeed()
    assert creates(world.plan()) == [job(2)]
    assert world.step_status().loop.next_iteration_at is None


def test_a_for_each_loop_waits_between_items() -> None:
    world = PlannerWorld(
        manifest([{"name": "a", "loop": {"maxIterations": 3, "items": "['x', 'y']", "intervalSeconds": 10}}])
    )
    world.plan()
    world.succeed()
    assert creates(world.plan()) == []
    world.advance(10)
    assert creates(world.plan()) == [job(2)]


# ------------------------------------------------------------------------------- a loop body


def body(interval: int = INTERVAL, max_iterations: int = 3, **loop: Any) -> dict[str, Any]:
    return {
        "name": "dev",
        "loop": {"maxIterations": max_iterations, "intervalSeconds": interval, **loop},
        "steps": [{"name": "check"}, {"name": "report"}],
    }


def child(iteration: int, index: int) -> str:
    return f"run-step-1i{iteration}-{index}-iter-1-attempt-1"


def test_a_loop_body_waits_the_interval_between_passes() -> None:
    world = PlannerWorld(manifest([body()]))
    world.plan()
    world.succeed()
    assert creates(world.plan()) == [child(1, 2)]
    world.advance(3)
    world.succeed()  # the pass ends at T0+3
    result = world.plan()
    dev = world.step_status()
    due = T0 + timedelta(seconds=3 + INTERVAL)
    assert creates(result) == [] and requeue_of(result) == INTERVAL
    assert dev.loop.next_iteration_at == due and dev.phase == "Running"
    assert [r.phase for r in dev.loop.iterations] == ["Succeeded"]
    assert [c.phase for c in dev.steps] == ["Succeeded", "Succeeded"]  # the ended pass, kept
    assert f"iteration 2 starts at {format_timestamp(due)}" in (dev.message or "")

    world.advance(INTERVAL - 1)
    again = world.plan()  # nothing ends the pass twice while waiting
    assert creates(again) == [] and [r.phase for r in world.step_status().loop.iterations] == ["Succeeded"]
    assert again.facts == () and requeue_of(again) == 1.0

    world.advance(1)
    assert creates(world.plan()) == [child(2, 1)]
    dev = world.step_status()
    assert dev.loop.next_iteration_at is None and dev.loop.current_iteration == 2
    assert [c.phase for c in dev.steps] == ["Running", "Pending"]


def test_a_loop_body_that_stops_on_its_condition_does_not_wait() -> None:
    spec = body(max_iterations=4, condition={"type": "cel", "until": "iteration.last.control.found == true"})
    world = PlannerWorld(manifest([spec]))
    world.plan()
    world.succeed()
    world.plan()
    world.succeed(control={"found": True})
    result = world.plan()
    dev = world.step_status()
    assert world.phase == "Succeeded" and dev.loop.stop_reason == "LoopConditionFalse"
    assert dev.loop.next_iteration_at is None and requeue_of(result) is None


@pytest.mark.parametrize("mode", ["Graceful", "Immediate"])
def test_cancel_while_a_loop_body_waits_ends_it_at_once(mode: str) -> None:
    world = PlannerWorld(manifest([body()]))
    world.plan()
    world.succeed()
    world.plan()
    world.succeed()
    world.plan()
    world.spec_manifest["spec"]["cancel"] = mode
    result = world.plan()
    dev = world.step_status()
    assert world.phase == "Cancelled" and creates(result) == []
    assert dev.loop.stop_reason == "LoopCancelled" and dev.loop.next_iteration_at is None
    assert "while waiting for iteration 2 (loop.intervalSeconds)" in (dev.message or "")
    assert [r.phase for r in dev.loop.iterations] == ["Succeeded"]


def test_a_restarted_operator_keeps_a_loop_body_schedule() -> None:
    world = PlannerWorld(manifest([body()]))
    world.plan()
    world.succeed()
    world.plan()
    world.succeed()
    world.plan()
    world.advance(10)
    again = plan(world.agentrun(), world.observed(), world.now, world.config)
    assert creates(again) == [] and requeue_of(again) == INTERVAL - 10
    assert again.status.workflow.steps[0].loop.next_iteration_at == T0 + timedelta(seconds=INTERVAL)  # type: ignore[union-attr]


def test_a_workload_loop_inside_a_group_waits_and_holds_the_group() -> None:
    group = {
        "name": "g",
        "steps": [loop_step("poll", 2, loop={"intervalSeconds": 10}), {"name": "after"}],
    }
    world = PlannerWorld(manifest([group]))
    world.plan()
    world.succeed()
    result = world.plan()
    poll = world.step_status().steps[0]
    assert creates(result) == [] and requeue_of(result) == 10
    assert poll.loop.next_iteration_at == T0 + timedelta(seconds=10)
    assert world.step_status().steps[1].phase == "Pending"
    world.advance(10)
    assert creates(world.plan()) == ["run-step-1i1-1-iter-2-attempt-1"]
