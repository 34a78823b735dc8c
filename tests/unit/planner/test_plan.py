"""The planner's execution semantics (docs/concepts.md; docs/design.md#test-matrix and more).

Each test drives the real planner through `PlannerWorld`, a planner-level simulation: actions are applied
to plain ObservedJob/ObservedPod values, and the test finishes pods and moves the clock.
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from agentrun_operator.api import IterationRecord, parse_agentrun
from agentrun_operator.config import OperatorConfig
from agentrun_operator.planner.actions import (
    ClaimIdempotencyKey,
    CreateJob,
    DeleteJob,
    DeleteRun,
    EmitEvent,
    Requeue,
    SetJobTTL,
)
from agentrun_operator.planner.observed import IdempotencyClaim, Observed, ObservedJob, ObservedPod
from agentrun_operator.planner.plan import compact_history
from agentrun_operator.planner.validate import Problem, validate_run
from tests.unit.planner.world import (
    LOOPS_ON,
    T0,
    PlannerWorld,
    envelope_from_bytes,
    envelope_status,
    loop_step,
    manifest,
)

CONTINUE = "iteration.last.control.continue == true"


def succeed_with(*controls: dict[str, Any] | None) -> Any:
    """An outcome function answering successive iterations with the given control payloads."""
    queue = list(controls)

    def outcome(world: PlannerWorld, job: str) -> None:
        world.succeed(job, control=queue.pop(0) if queue else None)

    return outcome


def always_succeed(world: PlannerWorld, job: str) -> None:
    world.succeed(job, control={"continue": True})


def creates(result: Any) -> list[str]:
    return [a.name for a in result.actions if isinstance(a, CreateJob)]


def events_of(result: Any) -> list[str]:
    return [a.reason for a in result.actions if isinstance(a, EmitEvent)]


# ----------------------------------------------------------------------------------- test matrix


def test_fixed_loop_two_iterations_succeeds_with_max_iterations_reached() -> None:
    world = PlannerWorld(manifest([loop_step(max_iterations=2)]))
    world.drive(always_succeed)
    step = world.step_status()
    assert world.phase == "Succeeded"
    assert step.phase == "Succeeded"
    assert step.loop.stop_reason == "LoopMaxIterationsReached"
    assert step.loop.completed_iterations == 2
    assert [r.index for r in step.loop.iterations] == [1, 2]
    assert world.created == ["run-step-1-iter-1-attempt-1", "run-step-1-iter-2-attempt-1"]
    assert world.event_reasons().count("LoopCompleted") == 1
    assert world.event_reasons()[-1] == "RunSucceeded"


def test_conditional_loop_true_then_false_stops_early_with_condition_false() -> None:
    world = PlannerWorld(manifest([loop_step(max_iterations=8, expression=CONTINUE)]))
    world.drive(succeed_with({"continue": True}, {"continue": False}))
    step = world.step_status()
    assert world.phase == "Succeeded"
    assert step.loop.stop_reason == "LoopConditionFalse"
    assert step.loop.completed_iterations == 2
    assert step.loop.last_control == {"continue": False}
    assert len(world.created) == 2
    assert "iteration 2: expression" in step.message and "is false" in step.message
    assert world.event_reasons().count("ConditionEvaluated") == 2


def test_missing_payload_with_on_missing_stop_succeeds_and_stops() -> None:
    world = PlannerWorld(manifest([loop_step(max_iterations=5, expression=CONTINUE, on_missing="stop")]))
    world.drive(succeed_with(None))
    step = world.step_status()
    assert world.phase == "Succeeded"
    assert step.phase == "Succeeded"
    assert step.loop.stop_reason == "LoopConditionFalse"
    assert "iteration 1: control file /workspace/.agentrun/loop-control.json is missing" in step.message
    assert "onMissing: stop" in step.message
    assert len(world.created) == 1


def test_missing_payload_with_on_missing_fail_is_condition_error() -> None:
    world = PlannerWorld(manifest([loop_step(max_iterations=5, expression=CONTINUE, on_missing="fail")]))
    world.drive(succeed_with({"continue": True}, None))
    step = world.step_status()
    assert world.phase == "Failed"
    assert world.status is not None and world.status.reason == "LoopConditionError"
    assert step.phase == "Failed"
    assert step.loop.stop_reason == "LoopConditionError"
    assert step.message.startswith("iteration 2: control file")
    assert "missing" in step.message


def test_invalid_json_with_on_invalid_fail_fails_deterministically() -> None:
    def bad_json(world: PlannerWorld, job: str) -> None:
        world.succeed(job, message=envelope_from_bytes(b"{not json"))

    outcomes = []
    for _ in range(2):
        world = PlannerWorld(manifest([loop_step(max_iterations=5, expression=CONTINUE, on_invalid="fail")]))
        world.drive(bad_json)
        assert world.status is not None
        outcomes.append((world.status.phase, world.status.reason, world.step_status().message))
    assert outcomes[0] == outcomes[1]
    phase, reason, message = outcomes[0]
    assert (phase, reason) == ("Failed", "LoopConditionError")
    assert message.startswith("iteration 1: control file /workspace/.agentrun/loop-control.json is invalid: ")
    assert "invalid JSON" in message and "onInvalid: fail" in message


def test_timeout_with_retries_remaining_retries_only_after_old_pods_are_gone() -> None:
    world = PlannerWorld(
        manifest([loop_step(max_iterations=1, retries=1, retryBackoffSeconds=5, timeoutSeconds=60)])
    )
    world.plan()
    first = world.active()
    world.advance(60)
    world.deadline(first)  # the Job failed; its pod is still terminating
    result = world.plan()
    step = world.step_status()
    assert step.phase == "Retrying"
    assert step.next_retry_at == world.now + timedelta(seconds=5)
    assert step.loop.iterations[-1].phase == "Retrying"
    assert "timed out after 60s" in step.message
    assert "IterationRetrying" in events_of(result)
    world.advance(10)  # backoff over, but the old pod still runs
    result = world.plan()
    assert creates(result) == []
    assert world.step_status().phase == "Retrying"
    world.settle()  # the old pod is gone
    result = world.plan()
    assert creates(result) == ["run-step-1-iter-1-attempt-2"]
    assert world.step_status().attempt == 2
    assert world.step_status().loop.iterations[-1].attempts == 2
    world.succeed()
    world.plan()
    assert world.phase == "Succeeded"


def test_timeout_with_retries_exhausted_is_loop_iteration_failed() -> None:
    world = PlannerWorld(
        manifest([loop_step(max_iterations=3, retries=1, retryBackoffSeconds=0, timeoutSeconds=30)])
    )

    def time_out(w: PlannerWorld, job: str) -> None:
        w.advance(30)
        w.deadline(job)

    world.drive(time_out)
    step = world.step_status()
    assert world.phase == "Failed"
    assert world.status is not None and world.status.reason == "LoopIterationFailed"
    assert step.loop.stop_reason == "LoopIterationFailed"
    assert step.loop.iterations[-1].phase == "Failed"
    assert step.loop.iterations[-1].attempts == 2
    assert "iteration 1 attempt 2 failed: timed out after 30s" in step.message
    assert world.created == ["run-step-1-iter-1-attempt-1", "run-step-1-iter-1-attempt-2"]


@pytest.mark.parametrize(
    ("volumes", "state", "pvc_names", "fragment"),
    [
        ([], {"required": True, "volumeNames": ["workspace"]}, None, "is not among the step's effective"),
        (
            [{"name": "workspace", "type": "emptyDir", "mountPath": "/workspace"}],
            {"required": True, "volumeNames": ["workspace"]},
            None,
            "none of the listed volumes is of type pvc",
        ),
        (
            [
                {
                    "name": "workspace",
                    "type": "pvc",
                    "claimName": "ws",
                    "mountPath": "/workspace",
                    "readOnly": True,
                }
            ],
            {"required": True, "volumeNames": ["workspace"]},
            None,
            "mounted read-only",
        ),
        (None, {"required": True, "volumeNames": ["workspace"]}, frozenset({"other"}), "does not exist"),
    ],
    ids=["not-a-volume", "emptydir", "read-only", "claim-missing"],
)
def test_required_pvc_missing_or_misconfigured_is_invalid_spec_before_any_job(
    volumes: list[dict[str, Any]] | None,
    state: dict[str, Any],
    pvc_names: frozenset[str] | None,
    fragment: str,
) -> None:
    world = PlannerWorld(manifest([loop_step(loop={"state": state})], volumes=volumes), pvc_names=pvc_names)
    world.now = T0 + timedelta(seconds=60)  # past the grace for missing references
    result = world.plan()
    assert world.status is not None
    assert world.status.phase == "Failed"
    assert world.status.reason == "InvalidSpec"
    assert fragment in (world.status.message or "")
    assert "see docs/" in (world.status.message or "")
    assert creates(result) == []
    assert [(c.type, c.status) for c in world.status.conditions] == [
        ("Ready", "False"),
        ("Succeeded", "False"),
        ("Reconciling", "False"),
        ("Stalled", "True"),
        ("InvalidSpec", "True"),
    ]
    assert "InvalidSpec" in events_of(result)


@pytest.mark.parametrize("mode", ["Immediate", "Graceful"])
def test_cancel_during_running_iteration_schedules_no_more_iterations(mode: str) -> None:
    world = PlannerWorld(manifest([loop_step(max_iterations=5)]))
    world.plan()
    world.succeed()
    world.plan()
    running = world.active()
    assert running == "run-step-1-iter-2-attempt-1"
    world.spec_manifest["spec"]["cancel"] = mode
    result = world.plan()
    step = world.step_status()
    if mode == "Immediate":
        assert [a.name for a in result.actions if isinstance(a, DeleteJob)] == [running]
        assert step.loop.iterations[-1].phase == "Cancelled"
    else:
        assert world.phase == "Running"  # the attempt finishes first
        assert not any(isinstance(a, DeleteJob) for a in result.actions)
        world.succeed()
        world.plan()
        step = world.step_status()
        assert step.loop.iterations[-1].phase == "Succeeded"
        assert step.loop.completed_iterations == 2
    assert world.phase == "Cancelled"
    assert step.phase == "Cancelled"
    assert step.loop.stop_reason == "LoopCancelled"
    for _ in range(3):
        world.settle()
        world.advance(30)
        assert creates(world.plan()) == []
    assert len(world.created) == 2
    assert world.event_reasons().count("RunCancelled") == 1


def test_restart_mid_loop_resumes_from_status_without_duplicating() -> None:
    world = PlannerWorld(manifest([loop_step(max_iterations=4)]))
    world.plan()
    world.succeed()
    world.plan()
    world.succeed()
    # The operator restarts: a fresh process plans from the persisted status only, twice.
    first = world.plan()
    second = world.plan()
    assert creates(first) == ["run-step-1-iter-3-attempt-1"]
    assert creates(second) == []
    world.succeed()
    world.succeed_plan = None  # type: ignore[attr-defined]
    world.drive(always_succeed)
    assert world.phase == "Succeeded"
    assert world.created == [f"run-step-1-iter-{i}-attempt-1" for i in range(1, 5)]
    assert world.step_status().loop.completed_iterations == 4


def test_status_write_lost_after_job_creation_adopts_the_existing_job() -> None:
    world = PlannerWorld(manifest([loop_step(max_iterations=3)]))
    world.plan()
    world.succeed()
    world.plan(persist=False)  # iteration 2's Job was created, but the status saying so was lost
    assert world.live_jobs() == ["run-step-1-iter-2-attempt-1"]
    result = world.plan()
    assert creates(result) == []  # adopted, not duplicated
    step = world.step_status()
    assert step.loop.current_iteration == 2
    assert step.job_ref.uid == world.jobs["run-step-1-iter-2-attempt-1"].uid


def test_history_limit_prunes_old_iterations_and_keeps_counters() -> None:
    config = OperatorConfig(loops_enabled=True, loop_max_iterations=100, loop_status_history_limit=5)
    world = PlannerWorld(manifest([loop_step(max_iterations=12)]), config=config)
    world.drive(always_succeed)
    loop = world.step_status().loop
    assert loop.completed_iterations == 12
    assert loop.retained_iterations == 5 == len(loop.iterations)
    assert loop.pruned_iterations == 7
    assert [r.index for r in loop.iterations] == [8, 9, 10, 11, 12]


def test_idempotent_resubmission_fails_as_duplicate_without_resuming_the_loop() -> None:
    first = PlannerWorld(
        manifest([loop_step(max_iterations=3)], idempotencyKey="k1", agentRef={"name": "ag"})
    )
    first.agents = {"ag": {}}
    first.plan()  # claims the key
    assert first.claim is not None
    first.plan()
    first.succeed()
    first.plan()
    assert first.step_status().loop.completed_iterations == 1

    second = PlannerWorld(
        manifest(
            [loop_step(max_iterations=3)], name="run-again", idempotencyKey="k1", agentRef={"name": "ag"}
        )
    )
    second.agents = {"ag": {}}
    second.claim = first.claim
    result = second.plan()
    assert second.status is not None
    assert second.status.phase == "Failed"
    assert second.status.reason == "IdempotencyKeyInUse"
    assert second.status.workflow is None  # no loop state at all
    assert creates(result) == []
    assert [(c.type, c.status, c.reason) for c in second.status.conditions] == [
        ("Ready", "False", "IdempotencyKeyInUse"),
        ("Succeeded", "False", "IdempotencyKeyInUse"),
        ("Reconciling", "False", "IdempotencyKeyInUse"),
        ("Stalled", "True", "IdempotencyKeyInUse"),
        ("Duplicate", "True", "IdempotencyKeyInUse"),
    ]


# ----------------------------------------------------------------------------------- idempotency


def test_claim_is_requested_when_checked_and_absent() -> None:
    world = PlannerWorld(
        manifest(idempotencyKey="key", agentRef={"name": "ag"}), agents={"ag": {}}, claim_checked=True
    )
    result = world.plan(apply=False)
    claims = [a for a in result.actions if isinstance(a, ClaimIdempotencyKey)]
    assert len(claims) == 1 and claims[0].key == "key" and claims[0].agent_ref == "ag"
    assert claims[0].name.startswith("agentrun-idem-")
    assert result.status.phase == "Pending" and result.status.reason == "ClaimingIdempotencyKey"
    assert creates(result) == []


def test_claim_not_requested_before_it_was_looked_up() -> None:
    world = PlannerWorld(manifest(idempotencyKey="key"), claim_checked=False)
    result = world.plan()
    assert not any(isinstance(a, ClaimIdempotencyKey) for a in result.actions)
    assert creates(result) == []
    assert result.status.phase == "Pending"


def test_claim_held_by_this_run_proceeds() -> None:
    world = PlannerWorld(manifest(idempotencyKey="key"))
    world.claim = IdempotencyClaim("c", "uid-run", "run")
    assert creates(world.plan()) == ["run-step-1-iter-1-attempt-1"]


@pytest.mark.parametrize(
    ("phase", "gone", "reason"),
    [
        ("Running", False, "IdempotencyKeyInUse"),
        (None, False, "IdempotencyKeyInUse"),
        ("Succeeded", False, "IdempotencyKeyCompleted"),
        ("Cancelled", False, "IdempotencyKeyCompleted"),
        (None, True, "IdempotencyKeyCompleted"),
    ],
)
def test_claim_held_by_another_run_is_duplicate(phase: str | None, gone: bool, reason: str) -> None:
    world = PlannerWorld(manifest(idempotencyKey="key"))
    world.claim = IdempotencyClaim("c", "uid-other", "other", holder_phase=phase, holder_gone=gone)
    result = world.plan()
    assert result.status.phase == "Failed" and result.status.reason == reason
    assert "other" in (result.status.message or "")
    assert creates(result) == []
    assert events_of(result) == ["RunFailed"]


# ----------------------------------------------------------------------------------- validation


def test_loops_disabled_by_flag_fail_with_workflow_loops_disabled() -> None:
    world = PlannerWorld(manifest([loop_step()]), config=OperatorConfig(loops_enabled=False))
    result = world.plan()
    assert result.status.phase == "Failed"
    assert result.status.reason == "WorkflowLoopsDisabled"
    invalid = next(c for c in result.status.conditions if c.type == "InvalidSpec")
    assert invalid.reason == "WorkflowLoopsDisabled"
    assert "feature flag" in (result.status.message or "")
    assert creates(result) == []


def test_loops_disabled_does_not_affect_runs_without_loops() -> None:
    world = PlannerWorld(manifest([{"name": "a"}]), config=OperatorConfig(loops_enabled=False))
    world.drive(lambda w, j: w.succeed(j))
    assert world.phase == "Succeeded"


def test_loop_already_running_continues_when_the_flag_is_switched_off() -> None:
    world = PlannerWorld(manifest([loop_step(max_iterations=2)]))
    world.plan()
    world.config = OperatorConfig(loops_enabled=False)
    world.drive(always_succeed)
    assert world.phase == "Succeeded"


def test_max_iterations_above_the_operator_cap_is_invalid() -> None:
    world = PlannerWorld(manifest([loop_step(max_iterations=21)]))
    result = world.plan()
    assert result.status.reason == "InvalidSpec"
    assert "spec.workflow.steps[0].loop.maxIterations" in (result.status.message or "")
    assert "cap of 20" in (result.status.message or "")
    assert "docs/concepts.md#iteration-cap" in (result.status.message or "")


def test_missing_reference_waits_within_grace_then_is_invalid() -> None:
    """The default grace: 30 s after the run's creation."""
    world = PlannerWorld(manifest(agentRef={"name": "codex"}), agents={"codex": None})
    assert world.config.reference_grace_seconds == 30.0
    world.now = T0 + timedelta(seconds=5)
    result = world.plan()
    assert result.status.phase == "Pending" and result.status.reason == "WaitingForReferences"
    assert "Agent/codex" in (result.status.message or "")
    assert "InvalidSpec if still missing 30s after creation" in (result.status.message or "")
    assert [a.after_seconds for a in result.actions if isinstance(a, Requeue)] == [25.5]
    assert creates(result) == [] and events_of(result) == []
    world.now = T0 + timedelta(seconds=29)
    assert world.plan().status.reason == "WaitingForReferences"
    world.now = T0 + timedelta(seconds=31)
    result = world.plan()
    assert result.status.phase == "Failed" and result.status.reason == "InvalidSpec"
    assert "Agent 'codex' does not exist" in (result.status.message or "")


def test_the_reference_grace_is_the_installation_s() -> None:
    """AGENTS_CONTROLLER_REFERENCE_GRACE_SECONDS: a shorter grace fails the run sooner; 0 at once."""
    config = replace(LOOPS_ON, reference_grace_seconds=5.0)
    world = PlannerWorld(manifest(agentRef={"name": "codex"}), agents={"codex": None}, config=config)
    world.now = T0 + timedelta(seconds=2)
    result = world.plan()
    assert result.status.reason == "WaitingForReferences"
    assert "InvalidSpec if still missing 5s after creation" in (result.status.message or "")
    assert [a.after_seconds for a in result.actions if isinstance(a, Requeue)] == [3.5]
    world.now = T0 + timedelta(seconds=6)
    result = world.plan()
    assert (result.status.phase, result.status.reason) == ("Failed", "InvalidSpec")
    assert "Agent 'codex' does not exist" in (result.status.message or "")
    at_once = PlannerWorld(
        manifest(agentRef={"name": "codex"}),
        agents={"codex": None},
        config=replace(LOOPS_ON, reference_grace_seconds=0.0),
    )
    failed = at_once.plan().status
    assert (failed.phase, failed.reason) == ("Failed", "InvalidSpec")


def test_reference_appearing_within_grace_lets_the_run_start() -> None:
    world = PlannerWorld(manifest(agentRef={"name": "codex"}), agents={"codex": None})
    world.now = T0 + timedelta(seconds=5)
    world.plan()
    world.agents = {"codex": {"env": [{"name": "X", "value": "1"}]}}
    assert creates(world.plan()) == ["run-step-1-iter-1-attempt-1"]


def test_bad_cel_is_invalid_spec_with_the_field_path() -> None:
    world = PlannerWorld(manifest([loop_step(expression="iteration.last.control.continue ==")]))
    result = world.plan()
    assert result.status.reason == "InvalidSpec"
    assert (result.status.message or "").startswith("spec.workflow.steps[0].loop.condition.expression: ")


def test_expression_naming_a_later_step_is_invalid() -> None:
    steps = [{"name": "a", "when": "steps.b.phase == 'Succeeded'"}, {"name": "b"}]
    result = PlannerWorld(manifest(steps)).plan()
    assert result.status.reason == "InvalidSpec"
    assert "steps.b" in (result.status.message or "") and "later step" in (result.status.message or "")


# ----------------------------------------------------------------------------------- loop shapes


def test_until_stops_when_true() -> None:
    world = PlannerWorld(manifest([loop_step(max_iterations=5, until="iteration.last.control.done == true")]))
    world.drive(succeed_with({"done": False}, {"done": False}, {"done": True}))
    step = world.step_status()
    assert step.loop.completed_iterations == 3
    assert step.loop.stop_reason == "LoopConditionFalse"
    assert "until" in step.message and "is true" in step.message


def test_conditional_loop_at_cap_succeeds_without_evaluating() -> None:
    world = PlannerWorld(manifest([loop_step(max_iterations=2, expression=CONTINUE)]))
    world.drive(always_succeed)
    step = world.step_status()
    assert step.phase == "Succeeded"
    assert step.loop.stop_reason == "LoopMaxIterationsReached"
    assert world.event_reasons().count("ConditionEvaluated") == 1  # after iteration 1 only


def test_on_max_iterations_fail_fails_when_the_condition_still_wants_more() -> None:
    step = loop_step(max_iterations=2, expression=CONTINUE, loop={"onMaxIterations": "Fail"})
    world = PlannerWorld(manifest([step]))
    world.drive(always_succeed)
    assert world.phase == "Failed"
    assert world.status is not None and world.status.reason == "LoopMaxIterationsReached"
    assert world.step_status().loop.completed_iterations == 2


def test_on_max_iterations_fail_does_not_consult_the_file_at_the_cap() -> None:
    step = loop_step(max_iterations=2, expression=CONTINUE, loop={"onMaxIterations": "Fail"})
    world = PlannerWorld(manifest([step]))
    world.drive(succeed_with({"continue": True}, {"continue": False}))
    assert world.phase == "Failed"
    assert world.step_status().loop.stop_reason == "LoopMaxIterationsReached"
    assert world.event_reasons().count("ConditionEvaluated") == 1


def test_on_max_iterations_is_ignored_by_fixed_loops() -> None:
    world = PlannerWorld(manifest([loop_step(max_iterations=2, loop={"onMaxIterations": "Fail"})]))
    world.drive(always_succeed)
    assert world.phase == "Succeeded"


def test_for_each_runs_one_iteration_per_frozen_item_with_the_item_injected() -> None:
    steps = [loop_step(max_iterations=5, loop={"items": "run.parameters.targets.split(',')"})]
    world = PlannerWorld(manifest(steps, parameters={"targets": "x,y,z"}))
    world.drive(always_succeed)
    loop = world.step_status().loop
    assert world.phase == "Succeeded"
    assert loop.items == ["x", "y", "z"] and loop.item_count == 3
    assert loop.max_iterations == 3 and loop.completed_iterations == 3
    assert loop.stop_reason == "LoopMaxIterationsReached"
    envs = [
        {
            e["name"]: e["value"]
            for e in world.manifests[n]["spec"]["template"]["spec"]["containers"][-1]["env"]
        }
        for n in world.created
    ]
    assert [(e["AGENTRUN_ITEM"], e["AGENTRUN_ITEM_INDEX"]) for e in envs] == [
        ('"x"', "0"),
        ('"y"', "1"),
        ('"z"', "2"),
    ]
    assert {e["AGENTRUN_MAX_ITERATIONS"] for e in envs} == {"3"}


def test_for_each_with_no_items_succeeds_with_zero_iterations() -> None:
    world = PlannerWorld(manifest([loop_step(loop={"items": "[]"})]))
    result = world.plan()
    step = world.step_status()
    assert creates(result) == []
    assert world.phase == "Succeeded"
    assert step.phase == "Succeeded" and step.loop.completed_iterations == 0 and step.loop.item_count == 0


def test_for_each_with_more_items_than_max_iterations_fails_before_the_first_iteration() -> None:
    world = PlannerWorld(manifest([loop_step(max_iterations=2, loop={"items": "[1, 2, 3]"})]))
    result = world.plan()
    assert creates(result) == []
    assert world.status is not None and world.status.reason == "LoopItemsExceedMaxIterations"
    assert "3 items but maxIterations is 2" in world.step_status().message


def test_for_each_items_too_large_for_status_fail_with_a_clear_error() -> None:
    items = "[run.parameters.big, run.parameters.big, run.parameters.big]"
    world = PlannerWorld(
        manifest([loop_step(max_iterations=10, loop={"items": items})], parameters={"big": "x" * 3000})
    )
    result = world.plan()
    assert creates(result) == []
    assert world.status is not None and world.status.phase == "Failed"
    assert "at most 8192 bytes" in world.step_status().message


def test_for_each_items_that_are_not_a_list_fail_with_condition_error() -> None:
    world = PlannerWorld(manifest([loop_step(loop={"items": "run.name"})]))
    world.plan()
    assert world.status is not None and world.status.reason == "LoopConditionError"
    assert "expected list" in world.step_status().message


def test_for_each_over_an_earlier_steps_control_outputs() -> None:
    steps = [
        {"name": "plan"},
        loop_step("work", max_iterations=5, loop={"items": "steps.plan.control.outputs"}),
    ]
    world = PlannerWorld(manifest(steps))
    world.plan()
    world.succeed(control={"outputs": ["a", "b"]})
    world.plan()
    assert world.status is not None and world.status.workflow is not None
    assert world.status.workflow.steps[0].control == {"outputs": ["a", "b"]}
    loop = world.status.workflow.steps[1].loop
    assert loop is not None and loop.items == ["a", "b"]


# ----------------------------------------------------------------------------------- when


def test_when_false_skips_the_step_with_an_event() -> None:
    steps = [{"name": "a"}, {"name": "b", "when": "steps.a.control.deploy == true"}, {"name": "c"}]
    world = PlannerWorld(manifest(steps))
    world.plan()
    world.succeed(control={"deploy": False})
    result = world.plan()
    assert world.status is not None and world.status.workflow is not None
    assert [s.phase for s in world.status.workflow.steps] == ["Succeeded", "Skipped", "Running"]
    assert "StepSkipped" in events_of(result)
    assert creates(result) == ["run-step-3-iter-1-attempt-1"]
    world.succeed()
    world.plan()
    assert world.phase == "Succeeded"
    assert "1 skipped" in (world.status.message or "")


def test_when_true_runs_the_step() -> None:
    world = PlannerWorld(
        manifest([{"name": "a", "when": "run.parameters.go == 'yes'"}], parameters={"go": "yes"})
    )
    assert creates(world.plan()) == ["run-step-1-iter-1-attempt-1"]


def test_when_evaluation_error_fails_the_step() -> None:
    world = PlannerWorld(manifest([{"name": "a", "when": "run.parameters.missing == 'x'"}]))
    result = world.plan()
    assert result.status.phase == "Failed" and result.status.reason == "WhenConditionError"
    assert "missing" in (result.status.message or "")


# ----------------------------------------------------------------------------------- retries, Jobs


def test_failed_attempt_waits_for_backoff_and_budget_resets_per_iteration() -> None:
    world = PlannerWorld(manifest([loop_step(max_iterations=2, retries=1, retryBackoffSeconds=10)]))
    world.plan()
    world.fail()
    world.plan()
    assert world.step_status().phase == "Retrying"
    world.advance(5)
    assert creates(world.plan()) == []
    world.advance(5)
    assert creates(world.plan()) == ["run-step-1-iter-1-attempt-2"]
    world.succeed()
    world.plan()
    world.fail()  # iteration 2 gets its own retry
    world.plan()
    world.advance(10)
    assert creates(world.plan()) == ["run-step-1-iter-2-attempt-2"]
    world.succeed()
    world.plan()
    assert world.phase == "Succeeded"
    assert [r.attempts for r in world.step_status().loop.iterations] == [2, 2]


def test_failure_message_names_the_exit_code() -> None:
    world = PlannerWorld(manifest([{"name": "a"}]))
    world.plan()
    world.fail(exit_code=3)
    world.plan()
    assert world.status is not None and world.status.reason == "StepFailed"
    assert "attempt 1 failed: main container exited with code 3 (Error)" in world.step_status().message


def test_vanished_job_is_a_failed_attempt_and_is_retried() -> None:
    world = PlannerWorld(manifest([loop_step(max_iterations=1, retries=1, retryBackoffSeconds=0)]))
    world.plan()
    world.plan()  # the Job is observed: its uid is recorded
    world.vanish()
    result = world.plan()
    assert "Job run-step-1-iter-1-attempt-1 vanished before its result was recorded" in (
        world.step_status().loop.iterations[-1].message
    )
    assert creates(result) == ["run-step-1-iter-1-attempt-2"]


def test_job_not_yet_visible_is_waited_for_then_requested_again() -> None:
    world = PlannerWorld(manifest([{"name": "a"}]))
    result = world.plan(apply=False)  # the shell crashed before creating the Job
    world.status = result.status
    again = world.plan(apply=False)
    assert creates(again) == [] and events_of(again) == []
    world.advance(11)
    assert creates(world.plan()) == ["run-step-1-iter-1-attempt-1"]


@pytest.mark.parametrize(
    ("step", "config", "grace"),
    [
        ({"name": "a"}, LOOPS_ON, 3),
        ({"name": "a", "terminationGracePeriodSeconds": 20}, LOOPS_ON, 20),
        ({"name": "a"}, replace(LOOPS_ON, termination_grace_seconds=7), 7),
    ],
    ids=["kubernetes-default-pod", "the-step-asked", "the-installation-asked"],
)
def test_an_immediate_cancel_deletes_the_pods_with_a_short_grace_unless_the_run_asked(
    step: dict[str, Any], config: OperatorConfig, grace: int
) -> None:
    """docs/design.md#grace-period: a pod without a grace of its own has Kubernetes' 30 s, which the
    garbage collector would give it; the immediate cancel deletes the Job's pods (by the Job's uid)
    with 3 s instead, or with the grace the step or the installation set."""
    world = PlannerWorld(manifest([step]), config=config)
    world.plan()
    running = world.active()
    uid = world.jobs[running].uid
    world.spec_manifest["spec"]["cancel"] = "Immediate"
    deletes = [a for a in world.plan().actions if isinstance(a, DeleteJob)]
    assert [(d.name, d.grace_seconds, d.uid) for d in deletes] == [(running, grace, uid)]


def test_other_deletes_leave_the_pods_their_own_grace() -> None:
    """A Job deleted past its deadline keeps Kubernetes' rules: the pods' own grace."""
    world = PlannerWorld(manifest([{"name": "a", "timeoutSeconds": 10}]))
    world.plan()
    world.plan()
    world.advance(10 + 31)
    deletes = [a for a in world.plan().actions if isinstance(a, DeleteJob)]
    assert deletes and all(d.grace_seconds is None and d.uid is None for d in deletes)


def test_job_still_active_well_past_its_deadline_is_deleted() -> None:
    world = PlannerWorld(manifest([{"name": "a", "timeoutSeconds": 10}]))
    world.plan()
    world.plan()
    world.advance(10 + 31)
    result = world.plan()
    assert [a.name for a in result.actions if isinstance(a, DeleteJob)] == ["run-step-1-iter-1-attempt-1"]
    assert world.phase == "Failed"
    assert "timed out after 10s" in world.step_status().message


def test_orphan_live_job_of_the_run_is_deleted() -> None:
    world = PlannerWorld(manifest([loop_step(max_iterations=3)]))
    world.plan()
    world.jobs["run-step-1-iter-9-attempt-1"] = ObservedJob(
        "run-step-1-iter-9-attempt-1", "x", 1, 9, 1, "Active"
    )
    result = world.plan()
    deletes = [a for a in result.actions if isinstance(a, DeleteJob)]
    assert [d.name for d in deletes] == ["run-step-1-iter-9-attempt-1"]
    assert "one Job at a time" in deletes[0].reason


def test_next_iteration_waits_until_every_pod_of_other_jobs_is_terminal() -> None:
    world = PlannerWorld(manifest([loop_step(max_iterations=3)]))
    world.plan()
    world.succeed()
    world.pods["stray"] = ObservedPod("stray", "run-step-1-iter-9-attempt-1", "Running")
    result = world.plan()
    assert creates(result) == []
    assert world.step_status().loop.completed_iterations == 1
    del world.pods["stray"]
    assert creates(world.plan()) == ["run-step-1-iter-2-attempt-1"]


def test_set_job_ttl_with_the_status_that_records_the_result_and_never_before() -> None:
    """The plan that records an attempt's result also sets its Job's TTL (the shell applies it only
    once that status is committed); nothing sets it before the Job has ended, or twice."""
    world = PlannerWorld(manifest([loop_step(max_iterations=3)]))
    world.plan()
    job = "run-step-1-iter-1-attempt-1"
    world.pods[f"{job}-pod"] = replace(world.pods[f"{job}-pod"], phase="Running")
    assert not any(isinstance(a, SetJobTTL) for a in world.plan().actions)  # still running
    world.succeed()
    recording = world.plan()
    ttls = [a for a in recording.actions if isinstance(a, SetJobTTL)]
    assert [(t.name, t.seconds) for t in ttls] == [(job, 300)]
    assert world.step_status().loop.completed_iterations == 1
    assert not any(isinstance(a, SetJobTTL) for a in world.plan().actions)  # set once


def test_a_lost_status_write_sets_no_ttl() -> None:
    world = PlannerWorld(manifest([loop_step(max_iterations=3)]))
    world.plan()
    world.succeed()
    world.plan(persist=False)  # the status recording the result is lost: the shell sets no TTL
    job = "run-step-1-iter-1-attempt-1"
    assert world.jobs[job].ttl_seconds_after_finished is None
    again = world.plan()  # recorded once more, from the persisted status
    assert [a.name for a in again.actions if isinstance(a, SetJobTTL)] == [job]


# ----------------------------------------------------------------------------------- control payloads


BAD_PAYLOADS = {
    "empty": (b"", "invalid", "empty file"),
    "non-json": (b"continue: yes", "invalid", "invalid JSON"),
    "array": (b"[true]", "invalid", "root must be a JSON object, got array"),
    "truncated": (b'{"continue": tr', "invalid", "truncated"),
    "oversized": (json.dumps({"blob": "x" * 5000}).encode(), "too large", "bytes"),
    "binary": (b"\x00\x01\x02", "invalid", "binary data"),
    "deeply-nested": (b'{"a":' * 40 + b"1" + b"}" * 40, "invalid", "nested deeper than"),
}


@pytest.mark.parametrize("policy", ["fail", "stop"])
@pytest.mark.parametrize("case", sorted(BAD_PAYLOADS))
def test_bad_control_payload_follows_on_invalid(case: str, policy: str) -> None:
    data, state, cause = BAD_PAYLOADS[case]
    world = PlannerWorld(manifest([loop_step(max_iterations=5, expression=CONTINUE, on_invalid=policy)]))
    world.plan()
    world.succeed(control={"continue": True})
    world.plan()
    world.succeed(message=envelope_from_bytes(data))
    world.plan()
    step = world.step_status()
    assert step.loop.stop_reason == "LoopConditionError"
    assert step.message.startswith(
        f"iteration 2: control file /workspace/.agentrun/loop-control.json is {state}"
    )
    assert cause in step.message
    if policy == "fail":
        assert (world.phase, step.phase) == ("Failed", "Failed")
    else:
        assert (world.phase, step.phase) == ("Succeeded", "Succeeded")
    assert len(world.created) == 2


@pytest.mark.parametrize(("policy", "phase"), [("stop", "Succeeded"), ("fail", "Failed")])
def test_stale_control_file_counts_as_missing(policy: str, phase: str) -> None:
    world = PlannerWorld(manifest([loop_step(max_iterations=5, expression=CONTINUE, on_missing=policy)]))
    world.plan()
    world.succeed(message=envelope_status("stale", "control file was not rewritten by this iteration"))
    world.plan()
    step = world.step_status()
    assert world.phase == phase
    assert step.message.startswith("iteration 1: control file /workspace/.agentrun/loop-control.json was not")
    assert "(stale)" in step.message


def test_missing_termination_message_is_invalid() -> None:
    world = PlannerWorld(manifest([loop_step(max_iterations=5, expression=CONTINUE)]))
    world.plan()
    world.succeed(message="")
    world.plan()
    assert world.phase == "Failed"
    assert "reporter left no termination message" in world.step_status().message


@pytest.mark.parametrize(
    ("expression", "fragment"),
    [("iteration.last.control.count", "expected bool"), ("iteration.last.control.nope == true", "nope")],
    ids=["non-boolean", "eval-error"],
)
def test_cel_result_problems_follow_on_invalid(expression: str, fragment: str) -> None:
    world = PlannerWorld(manifest([loop_step(max_iterations=5, expression=expression)]))
    world.plan()
    world.succeed(control={"count": 3})
    world.plan()
    step = world.step_status()
    assert world.phase == "Failed"
    assert step.loop.stop_reason == "LoopConditionError"
    assert step.message.startswith("iteration 1: condition expression: ")
    assert fragment in step.message


# ----------------------------------------------------------------------------------- stop requests


def test_graceful_cancel_between_steps_starts_no_more_steps() -> None:
    world = PlannerWorld(manifest([{"name": "a"}, {"name": "b"}]))
    world.plan()
    world.spec_manifest["spec"]["cancel"] = "Graceful"
    world.succeed()
    world.plan()
    assert world.status is not None and world.status.workflow is not None
    assert world.phase == "Cancelled"
    assert [s.phase for s in world.status.workflow.steps] == ["Succeeded", "Pending"]
    assert "not started" in (world.status.workflow.steps[1].message or "")
    assert len(world.created) == 1


def test_cancel_before_start_creates_nothing() -> None:
    world = PlannerWorld(manifest(cancel="Immediate"))
    result = world.plan()
    assert result.status.phase == "Cancelled" and creates(result) == []


def test_cancel_while_waiting_to_retry_cancels_the_iteration() -> None:
    world = PlannerWorld(manifest([loop_step(max_iterations=3, retries=2, retryBackoffSeconds=60)]))
    world.plan()
    world.fail()
    world.plan()
    world.spec_manifest["spec"]["cancel"] = "Graceful"
    world.plan()
    step = world.step_status()
    assert world.phase == "Cancelled"
    assert step.loop.iterations[-1].phase == "Cancelled"
    assert step.loop.stop_reason == "LoopCancelled"


def test_workflow_timeout_stops_like_graceful_then_fails() -> None:
    world = PlannerWorld(manifest([loop_step(max_iterations=5)], workflow=None))
    world.spec_manifest["spec"]["workflow"] = {"steps": [loop_step(max_iterations=5)], "timeoutSeconds": 100}
    result = world.plan()
    assert result.actions[-1].after_seconds == 100  # type: ignore[union-attr]
    world.advance(101)
    result = world.plan()
    assert world.phase == "Running"  # the running attempt may finish
    assert creates(result) == []
    world.succeed()
    result = world.plan()
    step = world.step_status()
    assert world.phase == "Failed"
    assert world.status is not None and world.status.reason == "WorkflowTimedOut"
    assert step.phase == "Cancelled" and step.loop.stop_reason == "LoopCancelled"
    assert step.loop.completed_iterations == 1
    assert creates(result) == []


# ----------------------------------------------------------------------------------- run lifecycle


def test_replanning_the_same_observation_emits_nothing_new() -> None:
    world = PlannerWorld(manifest([loop_step(max_iterations=3, expression=CONTINUE)]))
    for control in ({"continue": True}, {"continue": True}):
        world.plan()
        first = world.plan()
        assert events_of(first) == [] and creates(first) == []
        world.succeed(control=control)
    world.plan()  # records iteration 2, creates iteration 3
    world.plan()  # observes iteration 3's Job (its uid enters the status)
    status_before = world.status
    again = world.plan()
    assert again.status == status_before
    assert events_of(again) == [] and creates(again) == []


def test_every_transition_event_is_emitted_exactly_once() -> None:
    world = PlannerWorld(manifest([loop_step(max_iterations=2, expression=CONTINUE)]))
    world.drive(succeed_with({"continue": True}, {"continue": True}))
    assert world.event_reasons() == [
        "LoopStarted",
        "IterationStarted",
        "IterationSucceeded",
        "ConditionEvaluated",
        "IterationStarted",
        "IterationSucceeded",
        "LoopCompleted",
        "RunSucceeded",
    ]


def test_finished_run_is_deleted_after_its_ttl_and_leftover_jobs_go() -> None:
    world = PlannerWorld(manifest([{"name": "a"}], ttlSecondsAfterFinished=60))
    world.plan()
    world.succeed()
    result = world.plan()
    assert world.phase == "Succeeded"
    assert result.actions[-1].after_seconds == 60  # type: ignore[union-attr]
    world.jobs["leftover"] = ObservedJob("leftover", "u", 1, 1, 9, "Active")
    result = world.plan()
    assert [a.name for a in result.actions if isinstance(a, DeleteJob)] == ["leftover"]
    assert not any(isinstance(a, DeleteRun) for a in result.actions)
    world.advance(60)
    result = world.plan()
    assert [a.uid for a in result.actions if isinstance(a, DeleteRun)] == ["uid-run"]
    assert events_of(result) == []


def test_runtime_job_runs_one_implicit_main_step() -> None:
    body = manifest()
    del body["spec"]["workflow"]
    body["spec"]["runtime"] = {"type": "job"}
    world = PlannerWorld(body)
    world.drive(lambda w, j: w.succeed(j))
    assert world.phase == "Succeeded"
    assert world.step_status().name == "main"
    assert world.created == ["run-step-1-iter-1-attempt-1"]


def test_non_loop_step_records_its_control_and_has_no_loop_block() -> None:
    world = PlannerWorld(manifest([{"name": "a"}, {"name": "b"}]))
    world.plan()
    world.succeed(control={"answer": 42})
    world.plan()
    assert world.status is not None and world.status.workflow is not None
    first = world.status.workflow.steps[0]
    assert first.loop is None and first.control == {"answer": 42}
    env = {
        e["name"]: e["value"]
        for e in world.manifests[world.active()]["spec"]["template"]["spec"]["containers"][-1]["env"]
    }
    assert env["AGENTRUN_ITERATION"] == "1" and env["AGENTRUN_MAX_ITERATIONS"] == "1"


def test_printer_columns_show_step_and_iteration() -> None:
    world = PlannerWorld(manifest([{"name": "prep"}, loop_step("impl", max_iterations=8)]))
    world.plan()
    assert world.status is not None
    assert (world.status.current_step, world.status.iteration) == ("prep", None)
    world.succeed()
    world.plan()
    world.succeed()
    world.plan()
    assert (world.status.current_step, world.status.iteration) == ("impl", "2/8")


def test_previous_control_is_passed_to_the_next_iteration() -> None:
    world = PlannerWorld(manifest([loop_step(max_iterations=3, expression=CONTINUE)]))
    world.plan()
    world.succeed(control={"continue": True, "n": 1})
    world.plan()
    env = {
        e["name"]: e["value"]
        for e in world.manifests[world.active()]["spec"]["template"]["spec"]["containers"][-1]["env"]
    }
    assert json.loads(env["AGENTRUN_PREVIOUS_CONTROL"]) == {"continue": True, "n": 1}
    assert env["AGENTRUN_ITERATION"] == "2"


# ----------------------------------------------------------------------------------- compaction


def _record(index: int, phase: str) -> IterationRecord:
    return IterationRecord.model_validate({"index": index, "phase": phase, "attempts": 1})


def test_compaction_keeps_the_newest_failed_entry_even_when_old() -> None:
    records = [_record(1, "Succeeded"), _record(2, "Failed"), *[_record(i, "Succeeded") for i in range(3, 9)]]
    kept, dropped = compact_history(records, 3)
    assert [r.index for r in kept] == [2, 6, 7, 8]
    assert dropped == 4


def test_compaction_keeps_only_the_newest_of_several_failures() -> None:
    records = [_record(1, "Cancelled"), _record(2, "Failed"), *[_record(i, "Succeeded") for i in range(3, 6)]]
    kept, dropped = compact_history(records, 2)
    assert [r.index for r in kept] == [2, 4, 5]
    assert dropped == 2


def test_compaction_keeps_a_recent_failure_without_extra_entries() -> None:
    records = [_record(i, "Succeeded") for i in range(1, 6)] + [_record(6, "Failed")]
    kept, dropped = compact_history(records, 3)
    assert [r.index for r in kept] == [4, 5, 6] and dropped == 3


def test_compaction_in_a_run_keeps_the_cancelled_iteration() -> None:
    config = OperatorConfig(loops_enabled=True, loop_max_iterations=100, loop_status_history_limit=2)
    world = PlannerWorld(manifest([loop_step(max_iterations=10)]), config=config)
    for _ in range(4):
        world.plan()
        world.succeed()
    world.plan()
    world.spec_manifest["spec"]["cancel"] = "Immediate"
    world.plan()
    loop = world.step_status().loop
    assert [(r.index, r.phase) for r in loop.iterations] == [(4, "Succeeded"), (5, "Cancelled")]
    assert loop.pruned_iterations == 3 and loop.retained_iterations == 2


def test_loops_on_config_is_the_default_of_the_world() -> None:
    assert LOOPS_ON.loops_enabled


# ----------------------------------------------------------------------------------- validation messages


def _problems(
    steps: list[dict[str, Any]] | None = None,
    *,
    config: OperatorConfig = LOOPS_ON,
    observed: Observed | None = None,
    **kw: Any,
) -> list[Problem]:
    return validate_run(parse_agentrun(manifest(steps, **kw)), observed or Observed(), config)


STATE = {"state": {"required": True, "volumeNames": ["workspace"]}}


@pytest.mark.parametrize(
    ("kwargs", "path", "fragment", "anchor"),
    [
        (
            {"steps": [loop_step(max_iterations=25)]},
            "spec.workflow.steps[0].loop.maxIterations",
            "exceeds this operator's cap of 20",
            "docs/concepts.md#iteration-cap",
        ),
        (
            {"steps": [loop_step(loop={"state": {"volumeNames": ["data"]}})]},
            "spec.workflow.steps[0].loop.state.volumeNames[0]",
            "volume 'data' is not among the step's effective workload volumes",
            "docs/concepts.md#loop-state",
        ),
        (
            {
                "steps": [loop_step(loop=STATE)],
                "volumes": [
                    {"name": "workspace", "type": "secret", "secretName": "s", "mountPath": "/workspace"}
                ],
            },
            "spec.workflow.steps[0].loop.state.volumeNames",
            "none of the listed volumes is of type pvc",
            "docs/concepts.md#loop-state",
        ),
        (
            {
                "steps": [
                    loop_step(
                        loop=STATE,
                        workload={"volumes": [{"name": "workspace", "type": "emptyDir", "mountPath": "/w"}]},
                    )
                ]
            },
            "spec.workflow.steps[0].loop.state.volumeNames",
            "(workspace: emptyDir)",
            "docs/concepts.md#loop-state",
        ),
        (
            {
                "steps": [loop_step(loop=STATE)],
                "volumes": [
                    {
                        "name": "workspace",
                        "type": "pvc",
                        "claimName": "w",
                        "mountPath": "/w",
                        "readOnly": True,
                    }
                ],
            },
            "spec.workload.volumes[0].readOnly",
            "mounted read-only",
            "docs/concepts.md#loop-state",
        ),
        (
            {"steps": [{"name": "a", "when": "steps.a.phase == 'x'"}]},
            "spec.workflow.steps[0].when",
            "step 'a' is itself",
            "docs/concepts.md#cel-expressions",
        ),
        (
            {"steps": [{"name": "a"}, {"name": "b", "when": "steps.zzz.phase == 'x'"}]},
            "spec.workflow.steps[1].when",
            "there is no step named 'zzz'; only earlier steps (a)",
            "docs/concepts.md#cel-expressions",
        ),
        (
            {"steps": [loop_step(until="iteration.last.control.done ==")]},
            "spec.workflow.steps[0].loop.condition.until",
            "invalid CEL expression",
            "docs/concepts.md#cel-expressions",
        ),
        (
            {"steps": [loop_step(loop={"items": "[1, 2"})]},
            "spec.workflow.steps[0].loop.items",
            "invalid CEL expression",
            "docs/concepts.md#cel-expressions",
        ),
        (
            {"steps": [{"name": "a", "when": "iteraton.index > 0"}]},
            "spec.workflow.steps[0].when",
            "undeclared reference to 'iteraton'",
            "docs/concepts.md#cel-expressions",
        ),
        (
            {
                "steps": [{"name": "a"}],
                "volumes": [{"name": "agentrun-x", "type": "emptyDir", "mountPath": "/x"}],
            },
            "spec.workload.volumes[0].name",
            "reserved",
            "docs/concepts.md#iteration-pod",
        ),
        (
            {
                "steps": [{"name": "a"}],
                "volumes": [
                    {"name": "one", "type": "emptyDir", "mountPath": "/x"},
                    {"name": "two", "type": "emptyDir", "mountPath": "/x/"},
                ],
            },
            "spec.workload.volumes[1].mountPath",
            "mounted at the same path",
            "docs/api.md#workload-volumes",
        ),
        (
            {"steps": [{"name": "a"}, {"name": "b"}], "runtime": {"type": "job"}},
            "spec.workflow.steps",
            "runtime.type job runs a single Job",
            "docs/concepts.md#runtime-job",
        ),
    ],
)
def test_each_validation_rule_names_path_value_fix_and_anchor(
    kwargs: dict[str, Any], path: str, fragment: str, anchor: str
) -> None:
    problems = _problems(**kwargs)
    assert problems, "expected a problem"
    match = [p for p in problems if p.path == path and fragment in p.message]
    assert match, [p.render() for p in problems]
    problem = match[0]
    assert problem.docs == anchor
    assert problem.fix
    line = problem.render()
    assert (
        line.startswith(f"{path}: ") and "(value: " in line and "; fix: " in line and f"see {anchor})" in line
    )


def test_loops_flag_problem_has_its_own_reason() -> None:
    problems = _problems([loop_step()], config=OperatorConfig(loops_enabled=False))
    assert [(p.reason, p.path, p.docs) for p in problems] == [
        ("WorkflowLoopsDisabled", "spec.workflow.steps[0].loop", "docs/concepts.md#feature-flag")
    ]


@pytest.mark.parametrize(
    ("observed", "path", "missing"),
    [
        (Observed(agents={"codex": None}), "spec.agentRef.name", "Agent/codex"),
        (
            Observed(agents={"codex": {"providerRef": {"name": "prov"}}}, providers={"prov": None}),
            "spec.agentRef.name",
            "AgentProvider/prov",
        ),
        (
            Observed(agents={"codex": {}}, implementation_specs={"task": None}),
            "spec.implementationSpecRef.name",
            "ImplementationSpec/task",
        ),
        (
            Observed(agents={"codex": {}}, pvc_names=frozenset()),
            "spec.workload.volumes[0].claimName",
            "PersistentVolumeClaim/ws",
        ),
    ],
    ids=["agent", "provider", "implementation-spec", "pvc"],
)
def test_missing_references_are_problems_marked_missing(observed: Observed, path: str, missing: str) -> None:
    problems = _problems(
        [{"name": "a"}], observed=observed, agentRef={"name": "codex"}, implementationSpecRef={"name": "task"}
    )
    if missing != "ImplementationSpec/task":
        problems = [p for p in problems if p.missing != "ImplementationSpec/task"]
    assert [(p.path, p.missing) for p in problems] == [(path, missing)]
    assert problems[0].docs == "docs/concepts.md#references"


def test_malformed_referenced_object_is_invalid_not_missing() -> None:
    problems = _problems(
        [{"name": "a"}], observed=Observed(agents={"codex": {"env": "nope"}}), agentRef={"name": "codex"}
    )
    assert len(problems) == 1 and problems[0].missing is None
    assert "Agent 'codex' has an invalid spec" in problems[0].message


def test_valid_reference_manifests_have_no_problems() -> None:
    assert _problems([loop_step(expression=CONTINUE, loop=STATE)]) == []


# ----------------------------------------------------------------- acting on the pod, not the Job


def test_pod_success_ends_the_attempt_before_the_job_controller_does() -> None:
    """A succeeded pod (backoffLimit 0: the only one) is the attempt's success: next Job at once."""
    from dataclasses import replace

    world = PlannerWorld(manifest([loop_step(max_iterations=3)]))
    world.plan()
    first = world.active()
    pod = f"{first}-pod"
    world.pods[pod] = replace(
        world.pods[pod],
        phase="Succeeded",
        reporter_message=envelope_status("missing", "none"),
        main_exit_code=0,
    )
    assert not world.jobs[first].finished  # the Job controller has not caught up yet
    result = world.plan()
    created = [a.name for a in result.actions if isinstance(a, CreateJob)]
    assert created == ["run-step-1-iter-2-attempt-1"]
    record = world.step_status().loop.iterations[0]
    assert record.phase == "Succeeded" and world.step_status().loop.completed_iterations == 1


def test_pod_failure_waits_for_the_jobs_verdict() -> None:
    """A failed pod is not acted on alone: the Job's condition names the cause (e.g. the deadline)."""
    from dataclasses import replace

    world = PlannerWorld(manifest([loop_step(max_iterations=3, retries=1)]))
    world.plan()
    first = world.active()
    pod = f"{first}-pod"
    world.pods[pod] = replace(world.pods[pod], phase="Failed", main_exit_code=1)
    result = world.plan()
    assert not any(isinstance(a, CreateJob) for a in result.actions)
    assert world.step_status().phase == "Running"


def test_an_iteration_never_finishes_before_it_started() -> None:
    """The record's start has the operator's microseconds, a Job's completionTime whole seconds: an
    iteration that ends within the second it started is recorded as ending at its start, not before
    (`agentrun status` showed 0ms for it, from a negative duration)."""
    world = PlannerWorld(manifest([loop_step("a", 2)]), config=LOOPS_ON)
    world.now = world.now.replace(microsecond=600000)
    world.plan()
    world.plan()
    job = world.active()
    world.advance(0.3)
    world.succeed(job)
    whole_second = world.now.replace(microsecond=0)
    world.jobs[job] = replace(world.jobs[job], finished_at=whole_second)
    world.plan()
    first = world.step_status(0).loop.iterations[0]
    assert first.phase == "Succeeded"
    assert first.started_at is not None and first.finished_at is not None
    assert first.finished_at >= first.started_at
