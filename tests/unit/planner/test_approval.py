"""Approval gates (planner/approval.py): waiting, decisions from spec.approvals applied exactly once,
refusals, timeouts, cancellation, gates in loop bodies, and the validation of gates and decisions."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import REGISTRY

from agentrun_operator.api import AgentRun, ApprovalDecision, agentrun_errors, immutability_violations
from agentrun_operator.api.approval import StepApproval
from agentrun_operator.config import OperatorConfig
from agentrun_operator.planner.approval import (
    Gate,
    approve_command,
    decision_problems,
    find_gate,
    required_inputs_note,
)
from agentrun_operator.planner.facts import ApprovalDecided, ApprovalRequested
from agentrun_operator.planner.remedies import with_remedy
from agentrun_operator.planner.validate import validate_manifest
from agentrun_operator.shell import metrics
from tests.unit.planner.world import PlannerWorld, manifest

MESSAGE = "Review the change in /workspace and approve"
GATE: dict[str, Any] = {
    "name": "sign-off",
    "approval": {
        "message": MESSAGE,
        "inputs": [{"name": "verdict", "required": True}, {"name": "note", "default": ""}],
    },
}


def _world(steps: list[dict[str, Any]] | None = None) -> PlannerWorld:
    return PlannerWorld(manifest(steps if steps is not None else [{"name": "build"}, GATE, {"name": "ship"}]))


def _decide(world: PlannerWorld, step: str = "sign-off", iteration: int = 1, **entry: Any) -> None:
    decision = {"step": step, "iteration": iteration, "decision": "Approved", **entry}
    world.spec_manifest["spec"].setdefault("approvals", []).append(decision)


def _to_gate(world: PlannerWorld) -> None:
    world.plan()
    world.succeed(control={})
    world.plan()


def _facts(world: PlannerWorld) -> list[Any]:
    return [f for p in world.plans for f in p.facts]


def _condition(world: PlannerWorld, type_: str) -> Any:
    assert world.status is not None
    return next((c for c in world.status.conditions if c.type == type_), None)


def test_a_gate_waits_without_a_job_and_says_so_everywhere() -> None:
    world = _world()
    _to_gate(world)
    gate = world.step_status(1)
    assert gate.phase == "AwaitingApproval" and gate.approval.iteration == 1
    assert gate.message == f"awaiting approval: {MESSAGE}"
    assert world.live_jobs() == [] and len(world.created) == 1
    assert world.phase == "Running" and world.status is not None
    assert world.status.message == f"step sign-off: awaiting approval: {MESSAGE}"
    assert world.status.current_step == "sign-off"
    waiting = _condition(world, "AwaitingApproval")
    assert waiting.status == "True"
    # The hint is a command the gate accepts: its required input is a flag (without it, refused).
    assert "`agentrun approve run -n ns --step sign-off --input verdict=VALUE`" in waiting.message
    assert "--input note" not in waiting.message  # optional inputs keep their defaults
    awaiting = next(
        a for p in world.plans for a in p.actions if getattr(a, "reason", "") == "AwaitingApproval"
    )
    assert "--input verdict=VALUE" in awaiting.message
    assert "AwaitingApproval" in world.event_reasons()
    assert ApprovalRequested("sign-off", "sign-off") in _facts(world)
    world.plan()  # waiting stays quiet
    assert world.plans[-1].status == world.status and not [
        a for a in world.plans[-1].actions if type(a).__name__ == "EmitEvent"
    ]


def test_an_approval_ends_the_gate_with_its_inputs_as_outputs_and_the_run_goes_on() -> None:
    world = _world(
        [{"name": "build"}, GATE, {"name": "ship", "when": "steps['sign-off'].phase == 'Succeeded'"}]
    )
    _to_gate(world)
    _decide(world, inputs={"verdict": "ship"}, reason="looks good")
    world.plan()
    gate = world.step_status(1)
    assert gate.phase == "Succeeded" and gate.reason == "Approved"
    assert gate.control == {"decision": "Approved", "outputs": {"verdict": "ship", "note": ""}}
    assert gate.approval.decision == "Approved" and gate.approval.index == 0
    assert world.status is not None and world.status.workflow is not None
    assert world.status.workflow.approvals_judged == 1
    assert _condition(world, "AwaitingApproval").status == "False"
    assert ApprovalDecided("sign-off", "Approved", 0) in _facts(world)
    world.drive(lambda w, job: w.succeed(job, control={}))
    assert world.phase == "Succeeded" and len(world.created) == 2


def test_later_steps_read_the_gate_s_outputs_in_cel() -> None:
    chooser = {"name": "ship", "when": "steps['sign-off'].control.outputs.verdict == 'ship'"}
    world = _world([{"name": "build"}, GATE, chooser])
    _to_gate(world)
    _decide(world, inputs={"verdict": "hold"})
    world.drive(lambda w, job: w.succeed(job, control={}))
    assert world.phase == "Succeeded" and world.step_status(2).phase == "Skipped"


def test_a_rejection_fails_the_gate_and_the_run_with_approval_rejected() -> None:
    world = _world()
    _to_gate(world)
    _decide(world, decision="Rejected", reason="tests fail")
    world.plan()
    gate = world.step_status(1)
    assert gate.phase == "Failed" and gate.reason == "ApprovalRejected"
    assert gate.message == with_remedy("ApprovalRejected", "rejected (spec.approvals[0]): tests fail")
    assert world.phase == "Failed" and world.status is not None
    assert world.status.reason == "ApprovalRejected" and world.step_status(2).phase == "Pending"


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ({"inputs": {"verdict": "ok", "colour": "red"}}, "input 'colour' is not declared by the gate"),
        ({"inputs": {"note": "x"}}, "the gate requires input 'verdict'"),
        ({"step": "build"}, "is a workload step, not an approval gate"),
        ({"step": "nope"}, "there is no step 'nope'"),
        ({"iteration": 2}, "waits in iteration 1, not 2"),
    ],
)
def test_a_decision_that_does_not_fit_is_refused_and_the_gate_keeps_waiting(
    entry: dict[str, Any], problem: str
) -> None:
    world = _world()
    _to_gate(world)
    _decide(world, **{"inputs": {"verdict": "ok"}, **entry})
    world.plan()
    assert world.step_status(1).phase == "AwaitingApproval"
    refused = [e for e in world.events if e.reason == "ApprovalRefused"]
    assert len(refused) == 1 and problem in refused[0].message
    assert refused[0].message.startswith("spec.approvals[0]")
    assert "docs/concepts.md#approval-gates" in refused[0].message
    assert world.status is not None and world.status.workflow is not None
    assert world.status.workflow.approvals_judged == 1
    _decide(world, inputs={"verdict": "ok"})  # a correct one afterwards still applies
    world.plan()
    assert world.step_status(1).phase == "Succeeded" and world.step_status(1).approval.index == 1


def test_a_second_decision_for_the_same_gate_is_refused_not_applied() -> None:
    world = _world()
    _to_gate(world)
    _decide(world, inputs={"verdict": "ship"})
    _decide(world, decision="Rejected", reason="changed my mind")
    world.plan()
    assert world.step_status(1).phase == "Succeeded"
    refused = [e for e in world.events if e.reason == "ApprovalRefused"]
    assert len(refused) == 1 and "spec.approvals[1]" in refused[0].message
    assert "is not waiting" in refused[0].message or "not waiting" in refused[0].message


def test_a_decision_before_the_gate_waits_is_refused() -> None:
    world = _world()
    world.plan()
    _decide(world, inputs={"verdict": "ship"})
    world.plan()
    assert [e.reason for e in world.events].count("ApprovalRefused") == 1
    world.succeed(control={})
    world.plan()
    assert world.step_status(1).phase == "AwaitingApproval"


def test_a_decision_is_applied_exactly_once_when_status_writes_are_lost() -> None:
    world = _world()
    _to_gate(world)
    _decide(world, inputs={"verdict": "ship"})
    world.plan(persist=False)  # the operator dies before the status write
    world.plan(persist=False)
    world.plan()
    world.plan()
    assert world.step_status(1).approval.index == 0
    decided = [i for i, p in enumerate(world.plans) if any(isinstance(f, ApprovalDecided) for f in p.facts)]
    assert decided == [2, 3, 4]  # replayed while unpersisted, applied once persisted, never again
    assert world.status is not None and world.status.workflow is not None
    assert world.status.workflow.approvals_judged == 1


def test_timeout_fails_or_approves_with_defaults() -> None:
    for on_timeout, phase in (("Fail", "Failed"), ("Approve", "Succeeded")):
        gate = {
            "name": "sign-off",
            "approval": {
                "message": "ok?",
                "inputs": [{"name": "note", "default": "none"}],
                "timeoutSeconds": 60,
                "onTimeout": on_timeout,
            },
        }
        world = _world([gate])
        world.plan()
        assert world.step_status().phase == "AwaitingApproval" and world.last_requeue == 60
        world.advance(59)
        world.plan()
        assert world.step_status().phase == "AwaitingApproval"
        world.advance(1)
        world.plan()
        step = world.step_status()
        assert step.phase == phase and step.reason == "ApprovalTimedOut", on_timeout
        assert "no decision within timeoutSeconds 60" in step.message
        if on_timeout == "Approve":
            assert step.control == {"decision": "Approved", "outputs": {"note": "none"}}


def test_cancel_ends_a_waiting_gate() -> None:
    world = _world()
    _to_gate(world)
    world.spec_manifest["spec"]["cancel"] = "Graceful"
    world.plan()
    assert world.step_status(1).phase == "Cancelled" and world.phase == "Cancelled"
    assert "awaiting approval" in world.step_status(1).message


def test_a_gate_in_a_loop_body_takes_one_decision_per_iteration() -> None:
    body = {
        "name": "develop",
        "loop": {
            "maxIterations": 5,
            "condition": {"until": "iteration.last.control.outputs.verdict == 'final'"},
        },
        "steps": [
            {"name": "work"},
            {"name": "sign-off", "approval": {"message": "ok?", "inputs": [{"name": "verdict"}]}},
        ],
    }
    world = _world([body])
    for iteration, verdict in ((1, "more"), (2, "final")):
        world.plan()
        world.succeed(control={})
        world.plan()
        steps = world.agentrun().spec.workflow.steps  # type: ignore[union-attr]
        gate = find_gate(steps, world.status, "develop/sign-off")
        assert isinstance(gate, Gate) and gate.iteration == iteration and gate.waiting
        assert world.status is not None
        assert f"step develop/iteration {iteration}/sign-off: awaiting approval" in str(world.status.message)
        _decide(world, "develop/sign-off", iteration, inputs={"verdict": verdict})
    world.plan()
    develop = world.step_status()
    assert world.phase == "Succeeded" and develop.loop.completed_iterations == 2
    assert develop.loop.stop_reason == "LoopConditionFalse"
    assert develop.loop.last_control == {"decision": "Approved", "outputs": {"verdict": "final"}}
    assert [r.steps for r in develop.loop.iterations] == [{"work": "Succeeded", "sign-off": "Succeeded"}] * 2


def test_decision_problems_name_the_field_value_fix_and_docs() -> None:
    run = AgentRun.model_validate(_world().spec_manifest)
    gate = run.spec.workflow.steps[1].approval  # type: ignore[union-attr]
    assert gate is not None
    decision = ApprovalDecision(step="sign-off", decision="Approved", inputs={"x": "1"})
    rendered = [p.render() for p in decision_problems(gate, decision, "--input")]
    assert rendered == [
        "--input x: input 'x' is not declared by the gate (declared: note, verdict) (value: \"1\"; "
        "fix: give only the gate's declared inputs (approval.inputs[].name); see "
        "docs/concepts.md#approval-gates)",
        '--input: the gate requires input \'verdict\' (value: {"x": "1"}; fix: give it: agentrun '
        "approve NAME --step PATH --input verdict=VALUE; see docs/concepts.md#approval-gates)",
    ]


# ------------------------------------------------------------------------------ validation

CONFIG = OperatorConfig(loops_enabled=True)


@pytest.mark.parametrize(
    ("gate", "path", "fragment"),
    [
        ({"message": "ok?", "inputs": [{"name": "a-b"}]}, "approval.inputs[0].name", "must be an identifier"),
        ({"message": "ok?", "inputs": [{"name": "a"}, {"name": "a"}]}, "approval.inputs", "must be unique"),
        (
            {"message": "ok?", "inputs": [{"name": "a", "required": True}], "onTimeout": "Approve"},
            "approval.onTimeout",
            "cannot give a required input",
        ),
        ({"message": ""}, "approval.message", "at least 1 character"),
    ],
)
def test_bad_gates_are_rejected_naming_the_field(gate: dict[str, Any], path: str, fragment: str) -> None:
    problems = [p.render() for p in validate_manifest(manifest([{"name": "g", "approval": gate}]), CONFIG)]
    assert len(problems) == 1 and f"spec.workflow.steps[0].{path}" in problems[0], problems
    assert fragment in problems[0]


def test_a_gate_with_a_loop_or_a_workload_is_rejected() -> None:
    looped = manifest([{"name": "g", "approval": {"message": "ok?"}, "loop": {"maxIterations": 2}}])
    assert "loop is not allowed on an approval gate" in "\n".join(agentrun_errors(looped))
    both = manifest([{"name": "g", "approval": {"message": "ok?"}, "workload": {"image": "x"}}])
    assert "or an approval gate" in "\n".join(agentrun_errors(both))


def test_a_reject_without_a_reason_is_rejected() -> None:
    doc = manifest([GATE])
    doc["spec"]["approvals"] = [{"step": "sign-off", "decision": "Rejected"}]
    errors = agentrun_errors(doc)
    assert len(errors) == 1 and errors[0].startswith("spec.approvals[0]")
    assert "reason is required for a Rejected decision" in errors[0]


def test_the_models_keep_approvals_append_only() -> None:
    base = manifest([GATE])
    first = {"step": "sign-off", "decision": "Approved", "inputs": {"verdict": "a"}}
    second = {"step": "sign-off", "iteration": 2, "decision": "Rejected", "reason": "no"}

    def spec(*entries: dict[str, Any]) -> Any:
        doc = {**base, "spec": {**base["spec"], "approvals": list(entries)}}
        if not entries:
            doc["spec"].pop("approvals")
        return AgentRun.model_validate(doc).spec

    assert immutability_violations(spec(), spec(first)) == []
    assert immutability_violations(spec(first), spec(first, second)) == []
    assert (
        "append-only" in immutability_violations(spec(first), spec({**first, "inputs": {"verdict": "b"}}))[0]
    )
    assert "append-only" in immutability_violations(spec(first, second), spec(second, first))[0]
    assert "cannot be removed" in immutability_violations(spec(first), spec())[0]


def test_metrics_count_waits_and_decisions() -> None:
    def sample(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    waits = sample("agentrun_approval_waits_total")
    refused = sample("agentrun_approval_decisions_total", decision="Refused")
    metrics.observe_fact(ApprovalRequested("develop/sign-off", "develop/iteration 1/sign-off"))
    metrics.observe_fact(ApprovalDecided("develop/sign-off", "Refused", 3))
    assert sample("agentrun_approval_waits_total") == waits + 1
    assert sample("agentrun_approval_decisions_total", decision="Refused") == refused + 1


def test_the_approve_hint_names_each_required_input_with_its_description() -> None:
    gate = StepApproval.model_validate(
        {
            "message": "m",
            "inputs": [
                {"name": "verdict", "required": True, "description": "revise or final"},
                {"name": "ticket", "required": True},
                {"name": "note", "default": ""},
            ],
        }
    )
    assert approve_command("r", None, "develop/sign-off", gate) == (
        "agentrun approve r --step develop/sign-off --input verdict=VALUE --input ticket=VALUE"
    )
    assert required_inputs_note(gate) == " (required: verdict: revise or final; ticket)"
    bare = StepApproval(message="m")
    assert approve_command("r", "ns", "gate", bare) == "agentrun approve r -n ns --step gate"
    assert required_inputs_note(bare) == ""
