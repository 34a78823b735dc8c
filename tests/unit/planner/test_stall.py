"""Stall detection (`loop.stall`, LoopStalled; planner/stall.py), driven through the real planner,
and its validation (window, progress references, the window against maxIterations)."""

from __future__ import annotations

from typing import Any

import pytest

from agentrun_operator.config import OperatorConfig
from agentrun_operator.planner.facts import LoopStopped, StepEnded
from agentrun_operator.planner.remedies import with_remedy
from agentrun_operator.planner.stall import MAX_KEPT_VALUE_BYTES, kept_value, stalled
from agentrun_operator.planner.validate import validate_manifest
from tests.unit.planner.world import PlannerWorld, loop_step, manifest

PROGRESS = "iteration.last.control.outputs.remaining"


def _stall(window: int = 3, **extra: Any) -> dict[str, Any]:
    return {"stall": {"progress": PROGRESS, "window": window, **extra}}


def _remaining(values: list[Any]) -> Any:
    queue = list(values)

    def outcome(world: PlannerWorld, job: str) -> None:
        world.succeed(job, control={"outputs": {"remaining": queue.pop(0) if queue else 0}})

    return outcome


def _facts(world: PlannerWorld) -> list[Any]:
    return [f for p in world.plans for f in p.facts]


def test_equal_values_for_a_whole_window_stop_the_loop_failed() -> None:
    world = PlannerWorld(manifest([loop_step("a", 10, loop=_stall(3))]))
    world.drive(_remaining([5, 4, 3, 3, 3, 3, 3]))
    step = world.step_status()
    assert world.phase == "Failed" and world.status is not None and world.status.reason == "LoopStalled"
    assert step.phase == "Failed" and step.reason == "LoopStalled"
    assert step.loop.stop_reason == "LoopStalled"
    assert step.loop.completed_iterations == 5 and len(world.created) == 5  # never past the window
    assert step.loop.progress == [3, 3, 3]
    assert step.message == with_remedy(
        "LoopStalled",
        f"iteration 5: no progress in the last 3 iterations: `{PROGRESS}` gave 3 each time; onStall: Fail",
    )
    assert "LoopStalled" in world.event_reasons()
    assert LoopStopped("a", "LoopStalled", 5) in _facts(world)


def test_on_stall_succeed_ends_the_step_successfully_and_the_run_goes_on() -> None:
    world = PlannerWorld(manifest([loop_step("a", 10, loop=_stall(2, onStall="Succeed")), {"name": "b"}]))
    world.drive(_remaining([7, 7]))
    assert world.phase == "Succeeded"
    a = world.step_status(0)
    assert a.phase == "Succeeded" and a.reason == "LoopStalled" and a.loop.completed_iterations == 2
    assert world.step_status(1).phase == "Succeeded"
    ended = [f for f in _facts(world) if isinstance(f, StepEnded) and f.path == "a"]
    assert ended and ended[0].reason == "LoopStalled"


def test_progress_that_keeps_changing_never_stalls() -> None:
    world = PlannerWorld(manifest([loop_step("a", 4, loop=_stall(2))]))
    world.drive(_remaining([4, 3, 2, 1]))
    step = world.step_status()
    assert world.phase == "Succeeded" and step.loop.stop_reason == "LoopMaxIterationsReached"
    assert step.loop.progress == [2, 1]


def test_the_cap_wins_over_a_stall_on_the_last_iteration() -> None:
    world = PlannerWorld(manifest([loop_step("a", 3, loop=_stall(3))]))
    world.drive(_remaining([1, 1, 1]))
    assert world.step_status().loop.stop_reason == "LoopMaxIterationsReached"


def test_a_condition_that_stops_the_loop_wins_over_a_stall() -> None:
    step = loop_step("a", 5, until="iteration.last.control.outputs.remaining == 0", loop=_stall(2))
    world = PlannerWorld(manifest([step]))
    world.drive(_remaining([0, 0]))
    assert world.step_status().loop.stop_reason == "LoopConditionFalse"


@pytest.mark.parametrize(("on_invalid", "phase"), [("fail", "Failed"), ("stop", "Succeeded")])
def test_a_progress_expression_that_fails_follows_on_invalid(on_invalid: str, phase: str) -> None:
    step = loop_step("a", 5, expression="true", on_invalid=on_invalid, loop=_stall(2))
    world = PlannerWorld(manifest([step]))
    world.drive(lambda w, job: w.succeed(job, control={"continue": True}))
    status = world.step_status()
    assert status.phase == phase and status.reason == "LoopConditionError"
    assert "iteration 1: loop.stall.progress:" in status.message and "no such key" in status.message


def test_structured_values_compare_by_json_value_not_key_order() -> None:
    values = [{"a": 1, "b": [1, 2]}, {"b": [1, 2], "a": 1}]
    assert stalled(values, 2)
    assert not stalled([1, 1.5], 2) and not stalled([1], 2) and not stalled([1, 1], 3)
    assert stalled([3, 1, 1], 2) and not stalled([1, 1, 3], 2)


def test_a_large_value_is_kept_as_its_digest_and_still_compares() -> None:
    big = "x" * (MAX_KEPT_VALUE_BYTES + 10)
    kept = kept_value(big)
    assert isinstance(kept, dict) and set(kept) == {"sha256"}
    assert kept_value(big) == kept and kept_value(big + "y") != kept
    assert kept_value("small") == "small"


def test_a_replayed_plan_records_a_value_once() -> None:
    world = PlannerWorld(manifest([loop_step("a", 5, loop=_stall(2))]))
    world.plan()
    world.succeed(control={"outputs": {"remaining": 9}})
    world.plan(persist=False)  # the status write is lost
    world.plan()
    assert world.step_status().loop.progress == [9]
    assert world.step_status().phase == "Running"


def test_a_loop_body_stalls_on_the_last_child_s_control() -> None:
    body = {
        "name": "dev",
        "loop": {"maxIterations": 6, **_stall(2)},
        "steps": [{"name": "work"}, {"name": "check"}],
    }
    world = PlannerWorld(manifest([body]))
    world.drive(_remaining([3, 2, 2]))  # the last child (check) gives the pass its control
    dev = world.step_status()
    assert dev.phase == "Failed" and dev.reason == "LoopStalled"
    assert dev.loop.completed_iterations <= 6


# ------------------------------------------------------------------------------ validation

CONFIG = OperatorConfig(loops_enabled=True)


def _validate(loop: dict[str, Any], steps_before: list[dict[str, Any]] | None = None) -> list[str]:
    doc = manifest([*(steps_before or []), {"name": "a", "loop": {"maxIterations": 5, **loop}}])
    return [p.render() for p in validate_manifest(doc, CONFIG)]


def test_a_window_of_one_is_rejected_naming_the_field() -> None:
    problems = _validate({"stall": {"progress": PROGRESS, "window": 1}})
    assert len(problems) == 1
    assert "spec.workflow.steps[0].loop.stall.window" in problems[0]
    assert "between 2 and 100" in problems[0] and "docs/api.md#loop-stall" in problems[0]


def test_a_window_larger_than_max_iterations_is_rejected() -> None:
    problems = _validate({"stall": {"progress": PROGRESS, "window": 6}})
    assert len(problems) == 1 and "loop.stall.window" in problems[0]
    assert "larger than loop.maxIterations (5)" in problems[0] and "#stall-detection" in problems[0]


def test_progress_reading_a_later_step_is_rejected() -> None:
    problems = _validate({"stall": {"progress": "steps.later.control.n"}})
    assert len(problems) == 1 and "loop.stall.progress" in problems[0]
    assert "there is no step named 'later'" in problems[0]


def test_progress_reading_an_earlier_step_is_accepted() -> None:
    assert _validate({"stall": {"progress": "steps.plan.control.n"}}, [{"name": "plan"}]) == []


def test_progress_that_does_not_compile_is_rejected() -> None:
    problems = _validate({"stall": {"progress": "iteration.last.control.("}})
    assert len(problems) == 1 and "loop.stall.progress" in problems[0]
