"""Writes the API server refuses for good, and failures that are not the workload's fault.

A permanent refusal (a 4xx other than 408/409/429 on a create or update) is reported by the shell as
an observed `Refusal`; the planner ends the run `Failed` with the API server's message instead of
asking for the same write again. A pod that failed although its main container exited 0 is reported
as lost or killed, not as an exit code.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from agentrun_operator.planner.actions import CreateJob
from agentrun_operator.planner.observed import Refusal, permanent_refusal
from agentrun_operator.planner.plan import plan
from tests.unit.planner.world import PlannerWorld, loop_step, manifest

INVALID_VOLUME = (
    422,
    'Job.batch "run-step-1-iter-1-attempt-1" is invalid: spec.template.spec.volumes[0].name: Required value',
)


@pytest.mark.parametrize(
    ("code", "permanent"),
    [
        *[(400, True), (403, True), (404, True), (422, True)],
        *[(408, False), (409, False), (429, False), (500, False), (503, False), (504, False), (201, False)],
    ],
)
def test_which_answers_are_permanent_refusals(code: int, permanent: bool) -> None:
    assert permanent_refusal(code) is permanent


def test_refused_job_fails_the_run_with_the_api_servers_message_and_no_retry() -> None:
    world = PlannerWorld(manifest([{"name": "a", "retries": 3}]))
    world.refuse_job["run-step-1-iter-1-attempt-1"] = INVALID_VOLUME
    result = world.plan()
    assert not [a for a in result.actions if isinstance(a, CreateJob)]
    assert world.status is not None
    assert world.phase == "Failed" and world.status.reason == "JobRefused"
    assert "spec.template.spec.volumes[0].name: Required value" in (world.status.message or "")
    assert "HTTP 422" in (world.status.message or "")
    assert "docs/troubleshooting.md#jobrefused" in (world.status.message or "")
    step = world.step_status()
    assert step.phase == "Failed" and step.reason == "JobRefused" and step.attempt == 1
    assert "JobRefused" in world.event_reasons() and "RunFailed" in world.event_reasons()
    # Terminal: re-planning asks for nothing again (the hot loop the issue found is gone).
    again = world.plan()
    assert not [a for a in again.actions if isinstance(a, CreateJob)]
    assert world.created == []


def test_refused_loop_iteration_is_recorded_failed_once() -> None:
    world = PlannerWorld(manifest([loop_step(max_iterations=3, retries=2)]))
    world.plan()
    world.succeed()
    world.refuse_job["run-step-1-iter-2-attempt-1"] = INVALID_VOLUME
    world.plan()
    assert world.phase == "Failed"
    loop = world.step_status().loop
    assert [(r.index, r.phase) for r in loop.iterations] == [(1, "Succeeded"), (2, "Failed")]
    assert loop.stop_reason == "LoopIterationFailed"
    assert "refused to create Job run-step-1-iter-2-attempt-1" in (loop.iterations[1].message or "")
    assert world.created == ["run-step-1-iter-1-attempt-1"]


def test_refused_recreate_of_a_lost_job_fails_the_step() -> None:
    """The Job was asked for, its status written, but it never appeared; asking again is refused."""
    world = PlannerWorld(manifest([loop_step(max_iterations=2)]))
    world.plan()
    world.vanish()  # never became visible (uid not recorded): the planner asks for it again
    world.advance(11)
    world.refuse_job["run-step-1-iter-1-attempt-1"] = (
        403,
        'jobs.batch is forbidden: User "op" cannot create',
    )
    world.plan()
    assert world.phase == "Failed"
    assert world.status is not None and world.status.reason == "JobRefused"
    assert "jobs.batch is forbidden" in (world.status.message or "")
    assert len(world.step_status().loop.iterations) == 1  # the same record, not a second one


def test_refused_status_update_ends_the_run_on_its_persisted_status() -> None:
    world = PlannerWorld(manifest([loop_step(max_iterations=3)]))
    world.plan()
    world.succeed()
    persisted = world.status
    assert persisted is not None and persisted.started_at is not None
    world.refuse_status = (422, "status.workflow.steps[0].message: Too long: must have at most 1024 bytes")
    world.plan()
    assert world.status is not None
    assert world.phase == "Failed" and world.status.reason == "StatusRefused"
    assert "Too long: must have at most 1024 bytes" in (world.status.message or "")
    assert world.status.started_at == persisted.started_at
    assert world.status.finished_at == world.now
    # Nothing new was started on an unrecordable run; its live Jobs are deleted.
    assert world.created == ["run-step-1-iter-1-attempt-1"]


def test_refusal_of_another_job_changes_nothing() -> None:
    world = PlannerWorld(manifest([{"name": "a"}]))
    world.refuse_job["some-other-job"] = INVALID_VOLUME
    world.plan()
    assert world.phase == "Running" and world.created == ["run-step-1-iter-1-attempt-1"]


def test_refusal_is_an_observed_fact_not_a_memory() -> None:
    """A refusal only exists in the reconcile that saw it: the plan is pure in its inputs."""
    world = PlannerWorld(manifest([{"name": "a"}]))
    observed = world.observed()
    refused = replace(observed, refusals=(Refusal("Job", "run-step-1-iter-1-attempt-1", *INVALID_VOLUME),))
    first = plan(world.agentrun(), refused, world.now, world.config)
    second = plan(world.agentrun(), refused, world.now, world.config)
    assert first == second
    assert first.status.phase == "Failed"
    assert plan(world.agentrun(), observed, world.now, world.config).status.phase == "Running"


def test_pod_failed_with_main_exit_zero_is_reported_as_lost_not_as_an_exit_code() -> None:
    world = PlannerWorld(manifest([{"name": "a"}]))
    world.plan()
    name = world.active()
    world.jobs[name] = replace(
        world.jobs[name], outcome="Failed", finished_at=world.now, message="Job has reached the backoff limit"
    )
    pod = world.pods[f"{name}-pod"]
    world.pods[pod.name] = replace(
        pod, phase="Failed", main_exit_code=0, main_reason="Completed", finished_at=world.now
    )
    world.plan()
    message = world.step_status().message
    assert "exited with code 0" not in message
    assert "failed although its main container exited 0: the node lost the pod or it was killed" in message
    assert "Job has reached the backoff limit" in message


def test_pod_reason_is_named_when_the_pod_itself_failed() -> None:
    world = PlannerWorld(manifest([{"name": "a"}]))
    world.plan()
    name = world.active()
    world.jobs[name] = replace(
        world.jobs[name], outcome="Failed", finished_at=world.now, message="BackoffLimit"
    )
    pod = world.pods[f"{name}-pod"]
    world.pods[pod.name] = replace(
        pod, phase="Failed", reason="Evicted", message="The node was low on memory."
    )
    world.plan()
    message = world.step_status().message
    assert (
        f"pod {pod.name} failed before its main container ended (Evicted: The node was low on memory.)"
        in (message)
    )
    # And with main exit 0, the pod's own reason is preferred over the Job's.
    world2 = PlannerWorld(manifest([{"name": "a"}]))
    world2.plan()
    world2.jobs[name] = replace(world2.jobs[name], outcome="Failed", finished_at=world2.now, message="X")
    world2.pods[pod.name] = replace(
        world2.pods[pod.name], phase="Failed", main_exit_code=0, reason="NodeLost", message="node n1 is gone"
    )
    world2.plan()
    assert "(NodeLost: node n1 is gone)" in world2.step_status().message
