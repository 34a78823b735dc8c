"""Collected outputs (`loop.output`, `outputs.N`, AGENTRUN_OUTPUTS) and usage budgets
(`loop.budget`, LoopBudgetExhausted), driven through the real planner."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentrun_operator.planner.budgets import parse_usage
from tests.unit.planner.world import PlannerWorld, loop_step, manifest


def _env(world: PlannerWorld, job: str) -> dict[str, str]:
    containers = world.manifests[job]["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in containers[-1]["env"] if "value" in e}


def _plan_then_work(plan_iterations: int = 3, **output: Any) -> dict[str, Any]:
    plan = loop_step("plan", plan_iterations, loop={"output": {"name": "tasks", **output}})
    work = loop_step("work", 5, loop={"items": "outputs.tasks"})
    return manifest([plan, work])


def _succeed_with(controls: list[dict[str, Any]]) -> Any:
    queue = list(controls)

    def outcome(world: PlannerWorld, job: str) -> None:
        world.succeed(job, control=queue.pop(0) if queue else {})

    return outcome


def test_outputs_are_collected_per_iteration_and_drive_a_later_for_each() -> None:
    world = PlannerWorld(_plan_then_work())
    controls = [{"outputs": "mod-a"}, {"outputs": "mod-b"}, {"outputs": "mod-c"}]
    world.drive(_succeed_with(controls))
    assert world.phase == "Succeeded"
    assert world.status is not None and world.status.workflow is not None
    assert world.status.workflow.outputs == {"tasks": ["mod-a", "mod-b", "mod-c"]}
    work = world.step_status(1).loop
    assert work.items == ["mod-a", "mod-b", "mod-c"] and work.completed_iterations == 3
    work_jobs = [j for j in world.created if "-step-2-" in j]
    assert [_env(world, j)["AGENTRUN_ITEM"] for j in work_jobs] == ['"mod-a"', '"mod-b"', '"mod-c"']
    assert json.loads(_env(world, work_jobs[0])["AGENTRUN_OUTPUTS"]) == {"tasks": ["mod-a", "mod-b", "mod-c"]}


def test_pods_see_the_outputs_collected_so_far() -> None:
    world = PlannerWorld(_plan_then_work(2))
    world.drive(_succeed_with([{"outputs": 1}, {"outputs": 2}]))
    plan_jobs = [j for j in world.created if "-step-1-" in j]
    seen = [json.loads(_env(world, j)["AGENTRUN_OUTPUTS"]) for j in plan_jobs]
    assert seen == [{}, {"tasks": [1]}]


def test_runs_without_outputs_get_no_outputs_env() -> None:
    world = PlannerWorld(manifest([loop_step("a", 2)]))
    world.drive(_succeed_with([]))
    assert all("AGENTRUN_OUTPUTS" not in _env(world, j) for j in world.created)


def test_an_empty_output_list_gives_a_for_each_of_zero_iterations() -> None:
    plan = loop_step("plan", 2, until="true", loop={"output": {"name": "tasks", "expression": "[]"}})
    work = loop_step("work", 5, loop={"items": "outputs.tasks.filter(t, t != [])"})
    world = PlannerWorld(manifest([plan, work]))
    world.drive(_succeed_with([{}]))
    assert world.phase == "Succeeded"
    work_status = world.step_status(1)
    assert work_status.loop.completed_iterations == 0 and work_status.loop.item_count == 0
    assert not [j for j in world.created if "-step-2-" in j]


def test_a_custom_output_expression_reads_the_iteration() -> None:
    world = PlannerWorld(
        _plan_then_work(2, expression="{'i': iteration.index, 'v': iteration.last.control.v}")
    )
    world.drive(_succeed_with([{"v": "x"}, {"v": "y"}, {}, {}]))
    assert world.status is not None and world.status.workflow is not None
    assert world.status.workflow.outputs == {"tasks": [{"i": 1, "v": "x"}, {"i": 2, "v": "y"}]}


@pytest.mark.parametrize(("on_invalid", "phase"), [("fail", "Failed"), ("stop", "Succeeded")])
def test_an_output_expression_error_follows_on_invalid_and_keeps_what_was_collected(
    on_invalid: str, phase: str
) -> None:
    plan = loop_step("plan", 3, expression="true", on_invalid=on_invalid, loop={"output": {"name": "tasks"}})
    world = PlannerWorld(manifest([plan]))
    world.drive(_succeed_with([{"outputs": "a"}, {"no": "outputs"}]))
    step = world.step_status()
    assert step.phase == phase and step.reason == "LoopConditionError"
    assert "loop.output 'tasks'" in step.message and "no such key" in step.message
    assert world.status is not None and world.status.workflow is not None
    assert world.status.workflow.outputs == {"tasks": ["a"]}


def test_outputs_are_appended_once_even_when_a_plan_is_replayed() -> None:
    world = PlannerWorld(_plan_then_work(1))
    world.plan()
    world.succeed(control={"outputs": "only"})
    world.plan(persist=False)  # the status write is lost: the next plan starts from the same status
    world.plan()
    world.plan()
    assert world.status is not None and world.status.workflow is not None
    assert world.status.workflow.outputs == {"tasks": ["only"]}


# ------------------------------------------------------------------------------ usage and budgets


def _usage(inp: int, out: int, cost: float) -> dict[str, Any]:
    return {"continue": True, "usage": {"inputTokens": inp, "outputTokens": out, "costUSD": cost}}


def test_usage_is_summed_per_iteration_step_and_run() -> None:
    world = PlannerWorld(manifest([loop_step("a", 2), loop_step("b", 1)]))
    world.drive(_succeed_with([_usage(10, 5, 0.25), _usage(1, 2, 0.5), _usage(100, 0, 1.0)]))
    assert world.phase == "Succeeded"
    a = world.step_status(0)
    assert [r.usage.input_tokens for r in a.loop.iterations] == [10, 1]
    assert (a.usage.input_tokens, a.usage.output_tokens, a.usage.cost_usd) == (11, 7, 0.75)
    assert world.status is not None and world.status.workflow is not None
    total = world.status.workflow.usage
    assert total is not None and (total.tokens, total.cost_usd) == (118, 1.75)


@pytest.mark.parametrize(
    ("budget", "expected"),
    [({"maxTokens": 30}, "30 tokens of maxTokens 30"), ({"maxCostUSD": 1.0}, "1 USD of maxCostUSD 1")],
)
def test_a_budget_stops_the_loop_failed_by_default(budget: dict[str, Any], expected: str) -> None:
    world = PlannerWorld(manifest([loop_step("a", 10, expression="true", loop={"budget": budget})]))
    world.drive(_succeed_with([_usage(10, 5, 0.5)] * 10))
    step = world.step_status()
    assert world.phase == "Failed"
    assert step.phase == "Failed" and step.reason == "LoopBudgetExhausted"
    assert step.loop.stop_reason == "LoopBudgetExhausted"
    assert step.loop.completed_iterations == 2
    assert expected in step.message


def test_on_budget_exhausted_succeed_ends_the_step_successfully() -> None:
    loop = {"budget": {"maxTokens": 15}, "onBudgetExhausted": "Succeed"}
    world = PlannerWorld(manifest([loop_step("a", 10, loop=loop), loop_step("b", 1)]))
    world.drive(_succeed_with([_usage(10, 5, 0.0)] * 3))
    assert world.phase == "Succeeded"
    assert world.step_status(0).loop.stop_reason == "LoopBudgetExhausted"
    assert world.step_status(0).loop.completed_iterations == 1
    assert world.step_status(1).phase == "Succeeded"


@pytest.mark.parametrize(("on_invalid", "phase"), [("fail", "Failed"), ("stop", "Succeeded")])
def test_usage_that_is_not_a_number_follows_on_invalid(on_invalid: str, phase: str) -> None:
    world = PlannerWorld(manifest([loop_step("a", 5, expression="true", on_invalid=on_invalid)]))
    world.drive(_succeed_with([{"continue": True, "usage": {"inputTokens": "many"}}]))
    step = world.step_status()
    assert step.phase == phase and step.reason == "LoopConditionError"
    assert "usage.inputTokens must be a non-negative number, got 'many'" in step.message


@pytest.mark.parametrize(
    ("control", "problem"),
    [
        ({"usage": 5}, "usage must be an object"),
        ({"usage": {"outputTokens": -1}}, "usage.outputTokens must be a non-negative number"),
        ({"usage": {"inputTokens": 1.5}}, "whole number"),
        ({"usage": {"costUSD": True}}, "usage.costUSD must be a non-negative number"),
    ],
)
def test_parse_usage_names_the_bad_field(control: dict[str, Any], problem: str) -> None:
    result = parse_usage(control)
    assert isinstance(result, str) and problem in result


def test_parse_usage_absent_and_partial() -> None:
    assert parse_usage(None) is None and parse_usage({"continue": True}) is None
    usage = parse_usage({"usage": {"costUSD": 2}})
    assert not isinstance(usage, str) and usage is not None
    assert (usage.tokens, usage.cost_usd) == (0, 2.0)


def test_an_output_value_too_large_for_status_follows_on_invalid_keeping_the_rest() -> None:
    output = {"name": "tasks", "expression": "iteration.last.control.v + iteration.last.control.v"}
    world = PlannerWorld(manifest([loop_step("plan", 3, expression="true", loop={"output": output})]))
    world.drive(_succeed_with([{"v": "sm"}, {"v": "x" * 2500}]))
    step = world.step_status()
    assert step.phase == "Failed" and step.reason == "LoopConditionError"
    assert "loop.output 'tasks': the value is 5002 bytes of JSON (at most 4096)" in step.message
    assert world.status is not None and world.status.workflow is not None
    assert world.status.workflow.outputs == {"tasks": ["smsm"]}
