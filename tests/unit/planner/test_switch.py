"""Switch (planner/switch.py): first matching case, else default, else SwitchNoMatch."""

from __future__ import annotations

from typing import Any

from agentrun_operator.planner.facts import StepEnded, SwitchCaseTaken
from tests.unit.planner.world import PlannerWorld, manifest


def triage(*, default: bool = True, expression: str = "steps.triage.control.kind") -> list[dict[str, Any]]:
    switch: dict[str, Any] = {
        "expression": expression,
        "cases": [
            {"value": "bug", "steps": [{"name": "fix"}, {"name": "verify"}]},
            {"value": 2, "steps": [{"name": "two"}]},
        ],
    }
    if default:
        switch["default"] = {"steps": [{"name": "ask"}]}
    return [{"name": "triage"}, {"name": "route", "switch": switch}, {"name": "after"}]


def run_with(kind: Any, **kwargs: Any) -> PlannerWorld:
    world = PlannerWorld(manifest(triage(**kwargs)))
    world.drive(lambda w, job: w.succeed(job, control={"kind": kind, "job": job}))
    return world


def test_the_first_matching_case_runs_and_is_recorded() -> None:
    world = run_with("bug")
    route = world.step_status(1)
    assert world.phase == "Succeeded" and route.phase == "Succeeded"
    assert route.case == "cases[0]"
    assert [c.name for c in route.steps] == ["fix", "verify"]
    assert world.created == [
        "run-step-1-iter-1-attempt-1",
        "run-step-2c1-1-iter-1-attempt-1",
        "run-step-2c1-2-iter-1-attempt-1",
        "run-step-3-iter-1-attempt-1",
    ]
    assert route.control == {"kind": "bug", "job": "run-step-2c1-2-iter-1-attempt-1"}
    assert "SwitchCaseTaken" in world.event_reasons()
    taken = [f for p in world.plans for f in p.facts if isinstance(f, SwitchCaseTaken)]
    assert taken == [SwitchCaseTaken("route", "route", 1, "cases[0]", '"bug"')]
    ended = [f for p in world.plans for f in p.facts if isinstance(f, StepEnded) and f.path == "route"]
    assert [(f.kind, f.case, f.phase) for f in ended] == [("switch", "cases[0]", "Succeeded")]


def test_numbers_match_by_value() -> None:
    world = run_with(2.0)
    assert world.step_status(1).case == "cases[1]"
    assert "run-step-2c2-1-iter-1-attempt-1" in world.created


def test_no_match_runs_the_default() -> None:
    world = run_with("feature")
    route = world.step_status(1)
    assert route.case == "default" and [c.name for c in route.steps] == ["ask"]
    assert "run-step-2c0-1-iter-1-attempt-1" in world.created


def test_no_match_without_default_fails_with_switch_no_match_naming_value_and_cases() -> None:
    world = run_with("feature", default=False)
    route = world.step_status(1)
    assert world.phase == "Failed" and world.status is not None
    assert world.status.reason == "SwitchNoMatch" and route.reason == "SwitchNoMatch"
    assert '"feature"' in (route.message or "") and '"bug", 2' in (route.message or "")
    assert "default" in (route.message or "") and "docs/concepts.md#switch" in (route.message or "")
    assert world.created == ["run-step-1-iter-1-attempt-1"]


def test_a_failing_expression_fails_the_step() -> None:
    world = run_with("bug", expression="steps.triage.control.missing")
    assert world.phase == "Failed"
    assert world.step_status(1).reason == "SwitchExpressionError"


def test_a_failed_case_step_fails_the_switch_and_skips_the_rest_of_the_case() -> None:
    world = PlannerWorld(manifest(triage()))

    def outcome(w: PlannerWorld, job: str) -> None:
        if "-step-2c1-1-" in job:
            w.fail(job)
        else:
            w.succeed(job, control={"kind": "bug"})

    world.drive(outcome)
    route = world.step_status(1)
    assert world.phase == "Failed" and route.phase == "Failed"
    assert [c.phase for c in route.steps] == ["Failed", "Skipped"]
    assert "cases[0]: step fix failed" in (route.message or "")


def test_if_else_is_a_switch_on_a_boolean() -> None:
    switch = {
        "expression": "steps.check.control.ok",
        "cases": [{"value": True, "steps": [{"name": "ship"}]}],
        "default": {"steps": [{"name": "repair"}]},
    }
    world = PlannerWorld(manifest([{"name": "check"}, {"name": "branch", "switch": switch}]))
    world.drive(lambda w, job: w.succeed(job, control={"ok": False}))
    assert world.step_status(1).case == "default"
    assert world.step_status(1).steps[0].name == "repair"


def test_a_switch_inside_a_loop_body_decides_in_every_iteration() -> None:
    switch = {
        "expression": "steps.check.control.ok",
        "cases": [{"value": True, "steps": [{"name": "ship"}]}],
        "default": {"steps": [{"name": "repair"}]},
    }
    body = {
        "name": "body",
        "loop": {"maxIterations": 2},
        "steps": [{"name": "check"}, {"name": "branch", "switch": switch}],
    }
    world = PlannerWorld(manifest([body]))
    world.drive(lambda w, job: w.succeed(job, control={"ok": job.startswith("run-step-1i2-")}))
    assert world.phase == "Succeeded"
    assert world.created == [
        "run-step-1i1-1-iter-1-attempt-1",
        "run-step-1i1-2c0-1-iter-1-attempt-1",
        "run-step-1i2-1-iter-1-attempt-1",
        "run-step-1i2-2c1-1-iter-1-attempt-1",
    ]
