"""Control-flow validation: each bad input of groups, switches, nesting, outputs and budgets gets one
actionable problem (field path, bad value, fix, docs anchor) before any Job, offline and in the
operator alike."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest

from agentrun_operator.api import parse_agentrun
from agentrun_operator.api.crd import crd_documents
from agentrun_operator.config import OperatorConfig
from agentrun_operator.planner.tree import walk
from agentrun_operator.planner.validate import Problem, validate_manifest, validate_static

CONFIG = OperatorConfig(loops_enabled=True)
DOCS = re.compile(r"^docs/[\w-]+\.md#[\w-]+$")


def _run(steps: list[dict[str, Any]], **workflow: Any) -> dict[str, Any]:
    return {
        "apiVersion": "agents.proompteng.ai/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": "flow"},
        "spec": {
            "workload": {"image": "busybox", "command": ["true"]},
            "workflow": {"steps": steps, **workflow},
        },
    }


def _work(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, **extra}


def _group(name: str, children: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"name": name, "steps": children, **extra}


def _nested(depth: int) -> dict[str, Any]:
    """A chain of groups `d1/d2/…/d<depth>` whose innermost step is a workload step."""
    step = _work(f"d{depth}")
    for level in range(depth - 1, 0, -1):
        step = _group(f"d{level}", [step])
    return step


def _problems(manifest: dict[str, Any]) -> list[Problem]:
    return validate_manifest(manifest, CONFIG)


def _actionable(problem: Problem) -> None:
    assert problem.path and problem.message and problem.fix
    assert DOCS.match(problem.docs), problem.docs


def _only(problems: list[Problem], path_part: str) -> Problem:
    matching = [p for p in problems if path_part in p.path]
    assert len(matching) == 1, [p.render() for p in problems]
    _actionable(matching[0])
    return matching[0]


# ------------------------------------------------------------------------------ the models


def test_a_step_with_a_workload_and_steps_is_rejected_with_its_path() -> None:
    manifest = _run([_group("outer", [_work("child", workload={"image": "x"}, steps=[_work("c")])])])
    problem = _only(_problems(manifest), "steps[0].steps[0]")
    assert problem.path == "spec.workflow.steps[0].steps[0]"
    assert "exactly one of a workload step" in problem.message
    assert problem.docs == "docs/api.md#step-kinds"


def test_a_switch_without_cases_is_rejected() -> None:
    manifest = _run([_work("route", switch={"expression": "'a'", "cases": []})])
    problem = _only(_problems(manifest), "switch")
    assert problem.path == "spec.workflow.steps[0].switch.cases"
    assert "at least one case" in problem.message
    assert problem.docs == "docs/api.md#switch"


def test_duplicate_case_values_are_rejected_numbers_by_value() -> None:
    cases = [{"value": 1, "steps": [_work("a")]}, {"value": 1.0, "steps": [_work("b")]}]
    problem = _only(_problems(_run([_work("route", switch={"expression": "1", "cases": cases})])), "switch")
    assert "must be unique" in problem.message


def test_true_and_one_are_distinct_case_values() -> None:
    cases = [{"value": True, "steps": [_work("a")]}, {"value": 1, "steps": [_work("b")]}]
    problems = _problems(_run([_work("route", switch={"expression": "1", "cases": cases})]))
    assert not any("must be unique" in p.message for p in problems)


@pytest.mark.parametrize("value", [{"kind": "bug"}, ["a"]])
def test_a_non_scalar_case_value_is_rejected_naming_the_value(value: Any) -> None:
    cases = [{"value": value, "steps": [_work("a")]}]
    problem = _only(_problems(_run([_work("route", switch={"expression": "'a'", "cases": cases})])), "value")
    assert problem.path == "spec.workflow.steps[0].switch.cases[0].value"
    assert problem.value == value
    assert "JSON scalar" in problem.message


@pytest.mark.parametrize(
    "budget", [{"maxTokens": 0}, {"maxCostUSD": 0}, {"maxTokens": -5, "maxCostUSD": 1.0}, {}]
)
def test_a_budget_not_above_zero_is_rejected(budget: dict[str, Any]) -> None:
    manifest = _run([_work("w", loop={"maxIterations": 3, "budget": budget})])
    problem = _only(_problems(manifest), "budget")
    assert problem.path == "spec.workflow.steps[0].loop.budget"
    assert "greater than 0" in problem.message
    assert problem.docs == "docs/api.md#loop-budget"


def test_a_loop_on_a_switch_is_rejected() -> None:
    switch = {"expression": "true", "cases": [{"value": True, "steps": [_work("a")]}]}
    problem = _only(_problems(_run([_work("s", switch=switch, loop={"maxIterations": 2})])), "steps[0]")
    assert "not on a switch" in problem.message


def test_sibling_names_must_be_unique_inside_a_group() -> None:
    problem = _only(_problems(_run([_group("g", [_work("a"), _work("a")])])), "steps[0].steps")
    assert "must be unique" in problem.message


def test_max_nesting_depth_is_bounded() -> None:
    problem = _only(_problems(_run([_work("a")], maxNestingDepth=11)), "maxNestingDepth")
    assert "between 1 and 10" in problem.message


# ------------------------------------------------------------------------------ the tree


def test_nesting_at_the_limit_passes_and_one_past_is_nesting_too_deep_naming_the_path() -> None:
    at_limit = _problems(_run([_nested(5)]))
    assert not any(p.reason == "NestingTooDeep" for p in at_limit)
    past = _problems(_run([_nested(6)]))
    deep = [p for p in past if p.reason == "NestingTooDeep"]
    assert len(deep) == 1
    _actionable(deep[0])
    assert deep[0].value == "d1/d2/d3/d4/d5/d6"
    assert deep[0].path == "spec.workflow.steps[0]" + ".steps[0]" * 5
    assert "NestingTooDeep" in deep[0].message and "maxNestingDepth 5" in deep[0].message


def test_max_nesting_depth_raises_the_limit() -> None:
    assert not any(p.reason == "NestingTooDeep" for p in _problems(_run([_nested(7)], maxNestingDepth=7)))
    assert any(p.reason == "NestingTooDeep" for p in _problems(_run([_nested(3)], maxNestingDepth=2)))


def test_an_output_name_used_twice_is_rejected_naming_the_first_collector() -> None:
    steps = [
        _work("plan", loop={"maxIterations": 1, "output": {"name": "tasks"}}),
        _group("g", [_work("again", loop={"maxIterations": 1, "output": {"name": "tasks"}})]),
    ]
    problem = _only(_problems(_run(steps)), "output.name")
    assert problem.path == "spec.workflow.steps[1].steps[0].loop.output.name"
    assert problem.value == "tasks"
    assert "'plan'" in problem.message


def test_outputs_forward_reference_is_rejected() -> None:
    steps = [
        _work("use", loop={"maxIterations": 3, "items": "outputs.tasks"}),
        _work("plan", loop={"maxIterations": 1, "output": {"name": "tasks"}}),
    ]
    problem = _only(_problems(_run(steps)), "items")
    assert problem.path == "spec.workflow.steps[0].loop.items"
    assert "outputs.tasks" in problem.message and "later one" in problem.message
    assert problem.docs == "docs/concepts.md#collected-outputs"


def test_an_unknown_output_is_rejected() -> None:
    problem = _only(_problems(_run([_work("w", when="size(outputs.nothing) > 0")])), "when")
    assert "no loop collects an output named 'nothing'" in problem.message


def test_outputs_of_an_earlier_step_are_in_scope_even_inside_a_later_group() -> None:
    steps = [
        _work("plan", loop={"maxIterations": 1, "output": {"name": "tasks"}}),
        _group("g", [_work("do", loop={"maxIterations": 5, "items": "outputs.tasks"})]),
    ]
    assert not any("outputs.tasks" in p.message for p in _problems(_run(steps)))


def test_steps_forward_reference_inside_a_group_is_rejected() -> None:
    steps = [_group("g", [_work("a", when="steps.b.phase == 'Succeeded'"), _work("b")])]
    problem = _only(_problems(_run(steps)), "when")
    assert problem.path == "spec.workflow.steps[0].steps[0].when"
    assert "steps.b" in problem.message


def test_steps_of_earlier_siblings_and_of_the_enclosing_scope_are_visible() -> None:
    steps = [
        _work("triage"),
        _group("g", [_work("a"), _work("b", when="steps.a.phase == 'Succeeded' && steps.triage.control.x")]),
    ]
    assert not any("steps." in p.message for p in _problems(_run(steps)))


def test_switch_expression_and_output_expression_are_compiled() -> None:
    switch = {"expression": "steps.later.control.kind", "cases": [{"value": "a", "steps": [_work("x")]}]}
    steps = [
        _work("route", switch=switch),
        _work("later", loop={"maxIterations": 2, "output": {"name": "o", "expression": "iteration.("}}),
    ]
    problems = _problems(_run(steps))
    _only(problems, "switch.expression")
    _only(problems, "output.expression")


def test_groups_switches_outputs_and_budgets_are_accepted() -> None:
    switch = {"expression": "'a'", "cases": [{"value": "a", "steps": [_work("x")]}]}
    steps = [
        _group("g", [_work("a")]),
        _work("s", switch=switch),
        _work("w", loop={"maxIterations": 2, "output": {"name": "o"}, "budget": {"maxTokens": 10}}),
    ]
    assert _problems(_run(steps)) == []


def test_nested_loop_rules_apply_at_any_depth() -> None:
    """The rules of a workload step (e.g. the iteration cap) also reach a child step."""
    problems = validate_static(
        parse_agentrun(_run([_group("g", [_work("w", loop={"maxIterations": 999})])])), CONFIG
    )
    capped = [p for p in problems if p.path == "spec.workflow.steps[0].steps[0].loop.maxIterations"]
    assert len(capped) == 1


def test_walk_names_run_paths_and_field_paths_in_document_order() -> None:
    switch = {
        "expression": "'a'",
        "cases": [{"value": "a", "steps": [_work("fix")]}],
        "default": {"steps": [_work("skip")]},
    }
    run = parse_agentrun(_run([_group("review", [_work("impl"), _work("route", switch=switch)])]))
    nodes = [(n.path, n.field_path, n.depth) for n in walk(run)]
    assert nodes == [
        ("review", "spec.workflow.steps[0]", 1),
        ("review/impl", "spec.workflow.steps[0].steps[0]", 2),
        ("review/route", "spec.workflow.steps[0].steps[1]", 2),
        ("review/route/fix", "spec.workflow.steps[0].steps[1].switch.cases[0].steps[0]", 3),
        ("review/route/skip", "spec.workflow.steps[0].steps[1].switch.default.steps[0]", 3),
    ]


# ------------------------------------------------------------------------------ today's manifests


def test_a_flat_workflow_has_no_new_problems_and_dumps_unchanged() -> None:
    manifest = _run([_work("a", loop={"maxIterations": 2}), _work("b", when="steps.a.phase == 'Succeeded'")])
    assert _problems(manifest) == []
    dumped = str(parse_agentrun(copy.deepcopy(manifest)).model_dump(by_alias=True, exclude_none=True))
    for new_field in ("alwaysRun", "maxNestingDepth", "onBudgetExhausted", "output", "budget", "switch"):
        assert new_field not in dumped  # no new defaults: stored specs and their dumps stay the same


def test_crd_types_top_level_steps_and_keeps_children_free_form() -> None:
    crd = crd_documents()[0]
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    step = spec["properties"]["workflow"]["properties"]["steps"]["items"]
    assert {"steps", "switch", "alwaysRun", "loop"} <= set(step["properties"])
    child = step["properties"]["steps"]["items"]
    assert child["x-kubernetes-preserve-unknown-fields"] is True
    loop = step["properties"]["loop"]["properties"]
    assert {"output", "budget", "onBudgetExhausted"} <= set(loop)
    rules = [r["message"] for r in step["x-kubernetes-validations"]]
    assert any("exactly one of a workload step" in m for m in rules)


def test_iteration_steps_names_a_child_of_the_loop_body_in_its_condition_only() -> None:
    ok = _group("body", [_work("implement"), _work("review")])
    ok["loop"] = {
        "maxIterations": 3,
        "condition": {"type": "cel", "until": "iteration.steps.review.control.approved"},
        "output": {"name": "o", "expression": "iteration.steps['implement'].phase"},
    }
    assert _problems(_run([ok])) == []
    bad = _group("body", [_work("implement"), _work("review")])
    bad["loop"] = {
        "maxIterations": 3,
        "condition": {"type": "cel", "until": "iteration.steps.reveiw.control.ok"},
    }
    problems = _problems(_run([bad, _work("after", when="iteration.steps.review.phase == 'Succeeded'")]))
    typo = _only(problems, "steps[0].loop.condition.until")
    assert "no child named 'reveiw'" in typo.message and "implement, review" in typo.message
    _actionable(typo)
    assert typo.docs == "docs/cel.md#iteration-steps"
    outside = _only(problems, "steps[1].when")
    assert "only filled in the loop.condition, loop.output and loop.stall of a loop body" in outside.message
    _actionable(outside)
