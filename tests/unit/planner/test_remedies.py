"""Runtime stop messages carry the fix and a docs anchor, like admission problems
(planner/remedies.py): every reason the planner can stop a step or a run with is found in its code,
has a fix and a section in docs/troubleshooting.md, and the messages of real stops show both."""

from __future__ import annotations

import ast
import importlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agentrun_operator.planner.context import MAX_MESSAGE_CHARS
from agentrun_operator.planner.remedies import REMEDIES, docs_of, needs_remedy, with_remedy
from tests.unit.planner.world import PlannerWorld, loop_step, manifest

ROOT = Path(__file__).resolve().parents[3]
PLANNER = ROOT / "operator" / "agentrun_operator" / "planner"
TROUBLESHOOTING = ROOT / "docs" / "troubleshooting.md"

REMEDY = re.compile(r" \(fix: (?P<fix>[^;].*); see docs/troubleshooting\.md#(?P<anchor>[\w-]+)\)$")

PROBLEM_REASONS = frozenset({"InvalidSpec"})
"""Stops whose message is a list of validation problems, each with its own fix and anchor."""

UNRESOLVED: dict[tuple[str, str], frozenset[str]] = {
    # a run failed by a step: the step's reason, its message (with the step's remedy) quoted
    ("run.py", "failed.st.reason or REASON_STEP_FAILED"): frozenset({"StepFailed"}),
    # the admission problems' reason (InvalidSpec, WorkflowLoopsDisabled, NestingTooDeep, …)
    ("admission.py", "reason"): frozenset(),
    # the failed step of a loop or not
    ("attempt_results.py", "reason"): frozenset({"LoopIterationFailed", "StepFailed"}),
}
"""Reason arguments that are not a constant, with the reasons they can hold (the admission's are
problem lists, checked by the validation tests)."""


def _anchors() -> set[str]:
    text = TROUBLESHOOTING.read_text()
    ids = set(re.findall(r'<a id="([\w-]+)"></a>', text))
    headings = {
        re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
        for h in re.findall(r"^#+ (.*)$", text, re.M)
    }
    return ids | headings


def _values(node: ast.expr, module: Any) -> set[str] | None:
    """The strings an argument can be: a literal, a module constant, either side of a conditional."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Constant) and node.value is None:
        return set()
    if isinstance(node, ast.Name) and isinstance(getattr(module, node.id, None), str):
        return {getattr(module, node.id)}
    if isinstance(node, ast.IfExp):
        body, orelse = _values(node.body, module), _values(node.orelse, module)
        return None if body is None or orelse is None else body | orelse
    return None


def _stops() -> set[tuple[str, str]]:
    """(phase, reason) of every `end_step`/`finish_run` call in the planner that can fail."""
    found: set[tuple[str, str]] = set()
    for path in sorted(PLANNER.glob("*.py")):
        module = importlib.import_module(f"agentrun_operator.planner.{path.stem}")
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
                continue
            if node.func.id == "end_step" and len(node.args) >= 4:
                phase_arg, reason_arg = node.args[2], node.args[3]
            elif node.func.id == "finish_run" and len(node.args) >= 3:
                phase_arg, reason_arg = node.args[1], node.args[2]
            else:
                continue
            phases = _values(phase_arg, module)
            assert phases is not None, f"{path.name}:{node.lineno}: the phase is not a literal"
            if "Failed" not in phases and "Succeeded" not in phases:
                continue
            reasons = _values(reason_arg, module)
            if reasons is None:
                key = (path.name, ast.unparse(reason_arg))
                assert key in UNRESOLVED, f"{path.name}:{node.lineno}: unknown reason {key[1]}"
                reasons = set(UNRESOLVED[key])
            found |= {(phase, reason) for phase in phases for reason in reasons}
    return found


def test_the_enumeration_finds_the_planners_stops() -> None:
    reasons = {reason for _, reason in _stops()}
    expected = {"LoopConditionError", "LoopBudgetExhausted", "LoopStalled", "SwitchNoMatch"}
    assert expected | {"LoopItemsExceedMaxIterations", "WorkflowTimedOut", "ApprovalTimedOut"} <= reasons


def test_every_failing_stop_of_the_planner_has_a_remedy() -> None:
    missing = sorted(
        f"{phase} {reason}"
        for phase, reason in _stops()
        if reason not in PROBLEM_REASONS and phase == "Failed" and not needs_remedy(phase, reason)
    )
    assert missing == [], "stop reasons without a fix in planner/remedies.py: " + ", ".join(missing)


@pytest.mark.parametrize("reason", sorted(REMEDIES))
def test_every_remedy_has_a_fix_and_a_troubleshooting_section(reason: str) -> None:
    assert REMEDIES[reason].strip()
    assert reason.lower() in _anchors(), f"docs/troubleshooting.md has no #{reason.lower()}"
    message = with_remedy(reason, "something stopped")
    match = REMEDY.search(message)
    assert match and match["anchor"] == reason.lower() and docs_of(reason) in message


@pytest.mark.parametrize("reason", sorted(REMEDIES))
def test_every_remedied_reason_is_documented_in_its_section(reason: str) -> None:
    lines = TROUBLESHOOTING.read_text().splitlines()
    start = lines.index(f'<a id="{reason.lower()}"></a>')
    heading = next(line for line in lines[start:] if line.startswith("#"))
    assert f"`{reason}`" in heading, heading


@given(st.text(max_size=3000), st.sampled_from(sorted(REMEDIES)))
def test_the_remedy_survives_any_message_length(message: str, reason: str) -> None:
    out = with_remedy(reason, message)
    assert len(out) <= MAX_MESSAGE_CHARS
    if "fix: " not in message:
        assert REMEDY.search(out), out


def test_a_message_that_already_carries_a_remedy_is_kept() -> None:
    inner = with_remedy("LoopIterationFailed", "iteration 1 attempt 1 failed: exit 1")
    outer = with_remedy("LoopIterationFailed", f"iteration 1: step test failed: {inner}")
    assert outer.count("(fix: ") == 1


# --------------------------------------------------------------------------- real stops, end to end


def _succeed(control: dict[str, Any]) -> Callable[[PlannerWorld, str], None]:
    return lambda world, job: world.succeed(job, control=control)


def _timed_out_workflow() -> PlannerWorld:
    world = PlannerWorld(manifest([loop_step("a", 5)]))
    world.spec_manifest["spec"]["workflow"]["timeoutSeconds"] = 30
    world.plan()
    world.advance(31)
    world.plan()  # graceful: the running attempt may finish
    world.succeed()
    world.plan()
    return world


def _world_for(reason: str) -> PlannerWorld:
    """A run that stops with `reason`, driven through the planner."""
    if reason == "WorkflowTimedOut":
        return _timed_out_workflow()
    if reason == "ApprovalRejected":
        gate = {"name": "gate", "approval": {"message": "ok?"}}
        rejected = {"step": "gate", "iteration": 1, "decision": "Rejected", "reason": "no"}
        world = PlannerWorld(manifest([gate]))
        world.plan()
        world.spec_manifest["spec"]["approvals"] = [rejected]
        world.plan()
        return world
    if reason == "ApprovalTimedOut":
        gate = {"name": "gate", "approval": {"message": "ok?", "timeoutSeconds": 60}}
        world = PlannerWorld(manifest([gate]))
        world.plan()
        world.advance(61)
        world.plan()
        return world
    scenarios: dict[str, tuple[list[dict[str, Any]], Callable[[PlannerWorld, str], None], dict[str, Any]]] = {
        "LoopConditionError": (
            [loop_step("a", 3, expression="true", on_missing="fail")],
            lambda w, j: w.succeed(j),  # no control file
            {},
        ),
        "LoopIterationFailed": ([loop_step("a", 3)], lambda w, j: w.fail(j), {}),
        "StepFailed": ([{"name": "a"}], lambda w, j: w.fail(j), {}),
        "LoopBudgetExhausted": (
            [loop_step("a", 5, loop={"budget": {"maxTokens": 1}})],
            _succeed({"usage": {"inputTokens": 5}}),
            {},
        ),
        "LoopStalled": (
            [loop_step("a", 5, loop={"stall": {"progress": "1", "window": 2}})],
            _succeed({}),
            {},
        ),
        "LoopMaxIterationsReached": (
            [
                {
                    **loop_step("a", 2, expression="true"),
                    "loop": {**loop_step("a", 2, expression="true")["loop"], "onMaxIterations": "Fail"},
                }
            ],
            _succeed({}),
            {},
        ),
        "LoopItemsExceedMaxIterations": ([loop_step("a", 1, loop={"items": "[1, 2]"})], _succeed({}), {}),
        "WhenConditionError": ([{"name": "a", "when": "run.parameters.nope == 'x'"}], _succeed({}), {}),
        "SwitchNoMatch": (
            [
                {
                    "name": "s",
                    "switch": {"expression": "'z'", "cases": [{"value": "a", "steps": [{"name": "x"}]}]},
                }
            ],
            _succeed({}),
            {},
        ),
        "SwitchExpressionError": (
            [
                {
                    "name": "s",
                    "switch": {
                        "expression": "run.parameters.nope",
                        "cases": [{"value": "a", "steps": [{"name": "x"}]}],
                    },
                }
            ],
            _succeed({}),
            {},
        ),
        "GoalTokenBudgetExhausted": (
            [loop_step("a", 5)],
            _succeed({"usage": {"inputTokens": 10}}),
            {"goal": {"objective": "o", "tokenBudget": 5}},
        ),
    }
    steps, outcome, spec = scenarios[reason]
    world = PlannerWorld(manifest(steps, **spec))
    world.drive(outcome)
    return world


DRIVEN = (
    "LoopConditionError",
    "LoopIterationFailed",
    "StepFailed",
    "LoopBudgetExhausted",
    "LoopStalled",
    "LoopMaxIterationsReached",
    "LoopItemsExceedMaxIterations",
    "WhenConditionError",
    "SwitchNoMatch",
    "SwitchExpressionError",
    "GoalTokenBudgetExhausted",
    "WorkflowTimedOut",
    "ApprovalTimedOut",
    "ApprovalRejected",
)


@pytest.mark.parametrize("reason", DRIVEN)
def test_a_real_stop_names_the_fix_and_an_existing_anchor(reason: str) -> None:
    world = _world_for(reason)
    assert world.status is not None and world.status.phase == "Failed", world.status
    assert world.status.reason == reason, world.status
    messages = [world.status.message or ""]
    step = world.step_status()
    if step.reason == reason:
        messages.append(step.message or "")
    for message in messages:
        match = REMEDY.search(message)
        assert match, message
        assert match["anchor"] == reason.lower() and match["anchor"] in _anchors()
        assert match["fix"] == REMEDIES[reason] or reason in (
            "LoopConditionError",
            "LoopItemsExceedMaxIterations",
        )


def test_every_remedied_reason_is_driven_or_needs_a_real_api_server() -> None:
    # JobRefused/StatusRefused: tests/unit/planner/test_refusals.py; the idempotency keys: a claim
    # held by another run (test_claims / test_plan).
    elsewhere = {"JobRefused", "StatusRefused", "IdempotencyKeyInUse", "IdempotencyKeyCompleted"}
    assert set(REMEDIES) == set(DRIVEN) | elsewhere


def test_normal_ends_carry_no_fix() -> None:
    world = PlannerWorld(manifest([loop_step("a", 2)]))
    world.drive(_succeed({}))
    assert world.status is not None and world.status.phase == "Succeeded"
    assert "fix:" not in (world.status.message or "") and "fix:" not in (world.step_status().message or "")
