"""The Job lifecycle of Kubernetes >= 1.31: an interim condition (`FailureTarget`,
`SuccessCriteriaMet`) decides a Job's outcome, the terminal one (`Failed`, `Complete`) follows once
every pod of the Job has terminated (docs/design.md#job-lifecycle).

The planner records a result when the Job controller decides it, and starts the next Job only once
the previous one has settled and none of its pods is left running (one Job at a time).
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest

from agentrun_operator.api import AgentRunStatus
from agentrun_operator.planner.actions import CreateJob, DeleteJob, SetJobTTL
from agentrun_operator.planner.context import PlanContext
from agentrun_operator.planner.gating import gate_clear, holds_volume
from agentrun_operator.planner.observed import JobOutcome, Observed, ObservedJob, ObservedPod
from agentrun_operator.shell.relevance import job_relevant
from tests.unit.planner.world import PlannerWorld, loop_step, manifest

DEADLINE_MESSAGE = "timed out after 10s (activeDeadlineSeconds)"


def creates(result: Any) -> list[str]:
    return [a.name for a in result.actions if isinstance(a, CreateJob)]


def deletes(result: Any) -> list[str]:
    return [a.name for a in result.actions if isinstance(a, DeleteJob)]


def ttls(result: Any) -> list[str]:
    return [a.name for a in result.actions if isinstance(a, SetJobTTL)]


def timed_out_world(retries: int, backoff: int = 0, **step: Any) -> tuple[PlannerWorld, str]:
    """A looped step whose first attempt has just hit its deadline: `FailureTarget` is set, the pod
    is being killed and still runs."""
    world = PlannerWorld(
        manifest(
            [
                loop_step(
                    max_iterations=2,
                    retries=retries,
                    retryBackoffSeconds=backoff,
                    timeoutSeconds=10,
                    **step,
                )
            ]
        )
    )
    world.plan()
    first = world.active()
    world.advance(10)
    world.deadline(first)
    return world, first


def test_a_timeout_is_recorded_at_failure_target_with_the_deadline_message() -> None:
    world, _first = timed_out_world(retries=0)
    result = world.plan()
    step = world.step_status()
    assert world.phase == "Failed"
    assert step.loop.stop_reason == "LoopIterationFailed"
    assert DEADLINE_MESSAGE in step.message
    assert "outlived" not in step.message
    assert step.loop.iterations[-1].phase == "Failed"
    assert step.loop.iterations[-1].finished_at == world.now
    # The Job controller is stopping the pod itself: the Job is neither deleted nor given a TTL yet.
    assert deletes(result) == [] and ttls(result) == []
    world.settle()
    result = world.plan()
    # Settled, it is a failed attempt: pod GC OnPodSuccess (the default) keeps it, no TTL.
    assert ttls(result) == [] and deletes(result) == []


def test_a_settled_timeout_gets_its_ttl_under_on_pod_completion() -> None:
    world, first = timed_out_world(retries=0)
    world.config = replace(world.config, pod_gc_strategy="OnPodCompletion")
    result = world.plan()
    assert deletes(result) == [] and ttls(result) == []
    world.settle()
    result = world.plan()
    assert ttls(result) == [first] and deletes(result) == []


def test_a_retry_waits_while_the_timed_out_pod_still_runs() -> None:
    world, _first = timed_out_world(retries=1, backoff=0)
    result = world.plan()
    step = world.step_status()
    assert step.phase == "Retrying"
    assert DEADLINE_MESSAGE in step.message
    assert step.next_retry_at == world.now
    assert creates(result) == []
    for _ in range(3):  # the pod ignores SIGTERM for a while: no second Job meanwhile
        world.advance(5)
        result = world.plan()
        assert creates(result) == [] and deletes(result) == []
        assert world.step_status().phase == "Retrying"
    world.settle()
    result = world.plan()
    assert creates(result) == ["run-step-1-iter-1-attempt-2"]


def test_a_retry_waits_for_the_terminal_condition_even_when_no_pod_is_observed() -> None:
    """The pod may be missing from the operator's view (an informer behind); the Job controller
    counts every pod (finalizers), so `Failed` is the word that the last one has terminated."""
    world, first = timed_out_world(retries=1)
    world.plan()
    del world.pods[f"{first}-pod"]
    world.advance(5)
    assert creates(world.plan()) == []
    world.jobs[first] = replace(world.jobs[first], settling=False)  # `Failed` added
    assert creates(world.plan()) == ["run-step-1-iter-1-attempt-2"]


def test_a_retry_waits_for_a_terminated_pod_of_a_settled_job_too() -> None:
    """The other half of the rule: a pod the operator sees still running holds the gate even when
    the Job already says `Failed` (e.g. an older cluster, or a pod the Job controller let go)."""
    world, first = timed_out_world(retries=1)
    world.jobs[first] = replace(world.jobs[first], settling=False)
    world.plan()
    world.advance(5)
    assert creates(world.plan()) == []
    world.settle()
    assert creates(world.plan()) == ["run-step-1-iter-1-attempt-2"]


def test_the_retry_backoff_counts_from_the_decision() -> None:
    world, _first = timed_out_world(retries=1, backoff=7)
    decided = world.now
    world.plan()
    assert world.step_status().next_retry_at == decided + timedelta(seconds=7)
    world.settle()
    world.advance(6)
    assert creates(world.plan()) == []
    world.advance(1)
    assert creates(world.plan()) == ["run-step-1-iter-1-attempt-2"]


def test_a_failure_target_other_than_the_deadline_names_the_main_exit() -> None:
    world = PlannerWorld(manifest([{"name": "a"}]))
    world.plan()
    job = world.active()
    world.fail(job, exit_code=3)
    world.jobs[job] = replace(world.jobs[job], outcome="Failed", settling=True, message="BackoffLimit")
    world.plan()
    assert world.phase == "Failed"
    assert "main container exited with code 3" in world.step_status().message


def test_success_criteria_met_with_the_pod_succeeded_starts_the_next_iteration_at_once() -> None:
    world = PlannerWorld(manifest([loop_step(max_iterations=2)]))
    world.plan()
    first = world.active()
    world.succeed(first)
    world.jobs[first] = replace(world.jobs[first], settling=True)  # SuccessCriteriaMet, no Complete
    result = world.plan()
    assert world.step_status().loop.iterations[0].phase == "Succeeded"
    assert creates(result) == ["run-step-1-iter-2-attempt-1"]


def test_success_criteria_met_waits_for_the_report_while_the_pod_still_runs() -> None:
    world = PlannerWorld(manifest([loop_step(max_iterations=2)]))
    world.plan()
    first = world.active()
    world.jobs[first] = replace(world.jobs[first], outcome="Succeeded", settling=True, finished_at=world.now)
    result = world.plan()
    assert creates(result) == []
    assert world.step_status().loop.iterations[0].phase == "Running"
    world.succeed(first)
    assert creates(world.plan()) == ["run-step-1-iter-2-attempt-1"]


def test_an_immediate_cancel_leaves_a_settling_job_to_the_job_controller() -> None:
    world, _first = timed_out_world(retries=3)
    world.spec_manifest["spec"]["cancel"] = "Immediate"
    result = world.plan()
    assert world.phase == "Cancelled"
    assert deletes(result) == []
    assert DEADLINE_MESSAGE in world.step_status().message


def test_a_settling_job_is_no_stray_but_holds_the_gate() -> None:
    world = PlannerWorld(manifest([loop_step(max_iterations=3)]))
    world.plan()
    first = world.active()
    world.succeed(first)
    world.plan()  # iteration 2 created
    stray = "run-step-1-iter-9-attempt-1"
    world.jobs[stray] = ObservedJob(stray, "x", 1, 9, 1, "Failed", settling=True)
    world.pods[f"{stray}-pod"] = ObservedPod(f"{stray}-pod", stray, "Running", deleting=True)
    world.succeed()
    result = world.plan()
    assert stray not in deletes(result)
    assert creates(result) == []
    world.settle()
    assert creates(world.plan()) == ["run-step-1-iter-3-attempt-1"]


def test_a_job_never_decided_is_still_deleted_past_its_deadline() -> None:
    """The fallback when no Job controller decides: the planner's own deadline rule."""
    world = PlannerWorld(manifest([{"name": "a", "timeoutSeconds": 10}]))
    world.plan()
    world.advance(10 + 29)
    assert deletes(world.plan()) == []
    world.advance(2)
    result = world.plan()
    assert deletes(result) == ["run-step-1-iter-1-attempt-1"]
    assert "the Job outlived its deadline and was deleted" in world.step_status().message


# -- the gate rule, exhaustively -------------------------------------------------------------

OUTCOMES: tuple[JobOutcome, ...] = ("Active", "Succeeded", "Failed", "DeadlineExceeded")
POD_STATES: tuple[str | None, ...] = (None, "Pending", "Running", "Succeeded", "Failed")


def _ctx(job: ObservedJob, pods: tuple[ObservedPod, ...]) -> PlanContext:
    world = PlannerWorld(manifest([{"name": "a"}]))
    run = world.agentrun()
    observed = Observed(jobs=(job,), pods=pods)
    return PlanContext(run, observed, world.now, world.config, None, AgentRunStatus(), [])


@pytest.mark.parametrize(
    ("outcome", "settling", "deleting", "pod_phase", "pod_deleting"),
    [
        combo
        for combo in itertools.product(OUTCOMES, (False, True), (False, True), POD_STATES, (False, True))
        if combo[3] is not None or not combo[4]  # no pod: nothing to be deleting
    ],
)
def test_gate_rule(
    outcome: JobOutcome, settling: bool, deleting: bool, pod_phase: str | None, pod_deleting: bool
) -> None:
    """The gate opens for another Job exactly when no pod of this one is observed alive and this
    Job is settled, deleted, or done by its one succeeded pod."""
    settling = settling and outcome != "Active"
    job = ObservedJob("old", "u", 1, 1, 1, outcome, deleting=deleting, settling=settling)
    pods = () if pod_phase is None else (ObservedPod("old-pod", "old", pod_phase, deleting=pod_deleting),)
    ctx = _ctx(job, pods)
    pod_alive = pod_phase in ("Pending", "Running")
    by_pod = pod_phase == "Succeeded" and not pod_deleting and not deleting
    settled = outcome != "Active" and not settling
    expected_hold = not deleting and not by_pod and not settled
    assert holds_volume(ctx, job) is expected_hold
    assert gate_clear(ctx, "new") is (not expected_hold and not pod_alive)
    assert gate_clear(ctx, "old")  # a Job's own pods never hold its own gate


def test_settling_is_news_until_a_ttl_is_set() -> None:
    decided = ObservedJob("j", "u", 1, 1, 1, "DeadlineExceeded", settling=True)
    ended = replace(decided, settling=False)
    assert job_relevant(decided) != job_relevant(ended)
    assert not decided.settled and ended.settled and decided.finished
    with_ttl = replace(decided, ttl_seconds_after_finished=5)
    assert job_relevant(with_ttl) == job_relevant(replace(ended, ttl_seconds_after_finished=5))
