"""A declared output (`loop.output.name`) is present in `status.workflow.outputs` once its loop has
ended, however it ended, `[]` when nothing was collected; a later forEach over it then runs zero
iterations instead of failing on a missing key (docs/concepts.md#collected-outputs)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.unit.planner.world import PlannerWorld, loop_step, manifest

Outcome = Callable[[PlannerWorld, str], None]


def _succeed(control: dict[str, Any]) -> Outcome:
    return lambda world, job: world.succeed(job, control=control)


def _fail(world: PlannerWorld, job: str) -> None:
    world.fail(job)


def _outputs(world: PlannerWorld) -> dict[str, Any] | None:
    assert world.status is not None and world.status.workflow is not None
    return world.status.workflow.outputs


def _collector(**loop: Any) -> dict[str, Any]:
    extra: dict[str, Any] = {k: v for k, v in loop.items() if k in ("when",)}
    loop = {k: v for k, v in loop.items() if k not in ("when",)}
    return {**loop_step("plan", 3, loop={"output": {"name": "tasks"}, **loop}), **extra}


def _consumer() -> dict[str, Any]:
    return loop_step("work", 5, loop={"items": "outputs.tasks"})


# The ways a collecting loop ends having collected nothing, when the run goes on afterwards.
ENDS_GOING_ON: dict[str, tuple[dict[str, Any], Outcome]] = {
    "zero forEach items": (_collector(items="[]"), _succeed({})),
    "skipped by when": (_collector(when="false"), _succeed({})),
    "output expression error, onInvalid stop": (
        {
            **loop_step("plan", 3, expression="true", on_invalid="stop"),
            "loop": {
                **loop_step("plan", 3, expression="true", on_invalid="stop")["loop"],
                "output": {"name": "tasks"},
            },
        },
        _succeed({"no": "outputs"}),
    ),
    "condition false before a value (expression error), onInvalid stop, at once": (
        {
            **loop_step("plan", 3, until="true", on_invalid="stop"),
            "loop": {
                **loop_step("plan", 3, until="true", on_invalid="stop")["loop"],
                "output": {"name": "tasks", "expression": "iteration.last.control.missing"},
            },
        },
        _succeed({}),
    ),
}


@pytest.mark.parametrize("case", sorted(ENDS_GOING_ON))
def test_a_for_each_over_an_output_nothing_was_collected_into_runs_zero_iterations(case: str) -> None:
    collector, outcome = ENDS_GOING_ON[case]
    world = PlannerWorld(manifest([collector, _consumer()]))
    world.drive(outcome)
    assert world.phase == "Succeeded", world.status
    assert _outputs(world) == {"tasks": []}
    work = world.step_status(1)
    assert work.phase == "Succeeded" and work.reason == "LoopMaxIterationsReached"
    assert work.loop.completed_iterations == 0 and work.loop.item_count == 0
    assert not [j for j in world.created if "-step-2-" in j]


def test_a_collecting_loop_that_failed_at_once_leaves_an_empty_output() -> None:
    world = PlannerWorld(manifest([_collector(), _consumer()]))
    world.drive(_fail)
    assert world.phase == "Failed"
    assert world.step_status(0).reason == "LoopIterationFailed"
    assert _outputs(world) == {"tasks": []}


def test_a_collecting_loop_cancelled_during_its_first_iteration_leaves_an_empty_output() -> None:
    world = PlannerWorld(manifest([_collector(), _consumer()]))
    world.plan()
    world.spec_manifest["spec"]["cancel"] = "Immediate"
    world.plan()
    world.settle()
    world.plan()
    assert world.phase == "Cancelled"
    assert world.step_status(0).loop.stop_reason == "LoopCancelled"
    assert _outputs(world) == {"tasks": []}


def test_a_goal_budget_spent_by_the_first_iteration_leaves_an_empty_output() -> None:
    collector = _collector()
    collector["loop"]["output"]["expression"] = "iteration.last.control.missing"  # nothing collected
    collector["loop"]["condition"] = {"type": "cel", "expression": "true", "source": {"onInvalid": "stop"}}
    world = PlannerWorld(manifest([collector, _consumer()], goal={"objective": "o", "tokenBudget": 5}))
    world.drive(_succeed({"usage": {"inputTokens": 10}}))
    assert _outputs(world) == {"tasks": []}


def test_what_was_collected_stays_and_is_not_reset_when_the_loop_ends() -> None:
    world = PlannerWorld(manifest([_collector(), _consumer()]))
    world.drive(_succeed({"outputs": "a"}))
    assert world.phase == "Succeeded"
    assert _outputs(world) == {"tasks": ["a", "a", "a"]}


def test_a_loop_without_an_output_declares_none() -> None:
    world = PlannerWorld(manifest([loop_step("a", 1, loop={"items": "[]"})]))
    world.drive(_succeed({}))
    assert world.phase == "Succeeded"
    assert not _outputs(world)


def test_a_collecting_loop_in_a_group_body_declares_its_output_after_zero_items() -> None:
    group = {"name": "g", "steps": [_collector(items="[]")]}
    world = PlannerWorld(manifest([group, _consumer()]))
    world.drive(_succeed({}))
    assert world.phase == "Succeeded", world.status
    assert _outputs(world) == {"tasks": []}
    assert world.step_status(1).loop.completed_iterations == 0
