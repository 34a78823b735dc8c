"""An iteration's result recorded from its pod's report, before the pod's phase and the Job's
condition (docs/design.md#early-result): once every container of the pod has ended, `main` with 0
and the reporter's envelope in the status. One Job at a time still holds (no container of the run
runs), and the bad inputs end in documented states: never two live iterations on one claim, never
a lost result."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from agentrun_operator.planner.actions import CreateJob
from agentrun_operator.planner.observed import ObservedPod
from agentrun_operator.shell.relevance import pod_arrival_relevant, pod_relevant
from tests.unit.planner.world import PlannerWorld, envelope_found, loop_step, manifest


def creates(result: Any) -> list[str]:
    return [a.name for a in result.actions if isinstance(a, CreateJob)]


def looping(**step: Any) -> tuple[PlannerWorld, str]:
    world = PlannerWorld(manifest([loop_step(max_iterations=3, **step)]))
    world.plan()
    return world, world.active()


def pod_of(world: PlannerWorld, job: str) -> ObservedPod:
    return world.pods[f"{job}-pod"]


def set_pod(world: PlannerWorld, job: str, **fields: Any) -> None:
    world.pods[f"{job}-pod"] = replace(pod_of(world, job), **fields)


def report(world: PlannerWorld, job: str, **fields: Any) -> None:
    """`main` ended with 0, the reporter ended with its envelope; the phase still says Running."""
    set_pod(
        world,
        job,
        main_exit_code=0,
        reporter_message=envelope_found({"n": 1}),
        containers_ended=True,
        finished_at=world.now,
        **fields,
    )


def records(world: PlannerWorld) -> list[tuple[int, str, int]]:
    loop = world.step_status().loop
    return [(r.index, r.phase, r.attempts) for r in loop.iterations]


def test_a_reported_pod_records_the_result_and_starts_the_next_job_before_its_phase() -> None:
    world, first = looping()
    report(world, first)
    result = world.plan()
    assert records(world)[0] == (1, "Succeeded", 1)
    assert world.step_status().loop.last_control == {"n": 1}
    assert len(creates(result)) == 1 and creates(result)[0] != first
    assert world.jobs[first].outcome == "Active", "the Job controller has not decided yet"


def test_main_ended_but_the_reporter_still_running_records_nothing() -> None:
    world, first = looping()
    set_pod(world, first, main_exit_code=0, finished_at=world.now)  # reporter still running
    result = world.plan()
    assert not creates(result)
    assert records(world) == [(1, "Running", 1)]


def test_a_reporter_that_ended_without_a_report_waits_for_the_phase_then_reads_no_report() -> None:
    world, first = looping()
    set_pod(world, first, main_exit_code=0, containers_ended=True, finished_at=world.now)
    assert not creates(world.plan())
    world.succeed(first, message="")  # the pod and Job end; still no envelope
    set_pod(world, first, reporter_message=None)
    world.plan()
    assert records(world)[0][0:2] == (1, "Succeeded")
    assert world.step_status().loop.last_control is None


def test_a_reporter_that_never_ends_leaves_the_attempt_to_its_timeout_and_holds_the_gate() -> None:
    world, first = looping(timeoutSeconds=10, retries=1)
    set_pod(world, first, main_exit_code=0, finished_at=world.now)  # the reporter hangs
    assert not creates(world.plan())
    world.advance(10)
    world.deadline(first)  # the Job controller decides and deletes the pod, which still runs
    result = world.plan()
    assert world.step_status().phase == "Retrying"
    world.advance(30)
    assert not creates(world.plan()), "the pod still runs a container: no second Job"
    assert not creates(result)
    world.settle()
    assert creates(world.plan()), "once it has stopped, the retry starts"


def test_a_pod_evicted_after_it_reported_keeps_its_recorded_result() -> None:
    world, first = looping()
    report(world, first, phase="Failed", reason="Evicted", message="the node was low on memory")
    result = world.plan()
    assert records(world)[0] == (1, "Succeeded", 1)
    assert len(creates(result)) == 1
    world.jobs[first] = replace(world.jobs[first], outcome="Failed", message="BackoffLimitExceeded")
    world.plan()
    assert records(world)[0] == (1, "Succeeded", 1), "a later Failed Job changes no recorded result"
    assert [r[0] for r in records(world)] == [1, 2]


def test_a_pod_evicted_before_its_report_is_a_lost_pod_retried() -> None:
    world, first = looping(retries=1, retryBackoffSeconds=10)
    set_pod(
        world,
        first,
        phase="Failed",
        reason="Evicted",
        message="low on memory",
        main_exit_code=0,
        containers_ended=True,
    )
    world.jobs[first] = replace(world.jobs[first], outcome="Failed", finished_at=world.now)
    world.plan()
    assert world.step_status().phase == "Retrying"
    assert "exited 0" in world.step_status().message


def test_a_pod_deleted_by_hand_while_main_runs_blocks_the_next_job_until_it_stopped() -> None:
    world, first = looping(retries=1)
    set_pod(world, first, deleting=True)
    world.jobs[first] = replace(world.jobs[first], outcome="Failed", finished_at=world.now, settling=True)
    world.plan()
    world.advance(30)
    assert not creates(world.plan())
    set_pod(world, first, main_exit_code=143, main_reason="Error", containers_ended=True)
    assert not creates(world.plan()), "a failed attempt's Job still settling holds the gate too"
    world.jobs[first] = replace(world.jobs[first], settling=False)
    assert creates(world.plan()), "every container ended and the Job settled: the retry may start"


def test_a_pod_deleted_by_hand_after_it_reported_is_recorded_once_never_retried() -> None:
    world, first = looping(retries=1)
    report(world, first, deleting=True)
    result = world.plan()
    assert records(world)[0] == (1, "Succeeded", 1)
    assert len(creates(result)) == 1
    world.vanish(first)
    world.plan()
    assert [r[0:2] for r in records(world)] == [(1, "Succeeded"), (2, "Running")]


def test_a_node_that_stops_answering_never_gets_a_second_live_iteration() -> None:
    world, first = looping(timeoutSeconds=10, retries=3)
    world.advance(10)
    world.deadline(first)  # the pod is deleted, but no kubelet confirms it: it stays Running
    world.plan()
    for _ in range(10):
        world.advance(60)
        assert not creates(world.plan())
    assert world.step_status().phase == "Retrying"


def test_two_pods_of_one_job_are_never_decided_by_a_report() -> None:
    world, first = looping()
    report(world, first)
    world.pods[f"{first}-pod2"] = ObservedPod(f"{first}-pod2", first, "Pending")
    assert not creates(world.plan())


def test_what_re_plans() -> None:
    running = ObservedPod("p", "j", "Running", main_exit_code=0)
    reported = replace(running, reporter_message="{}", containers_ended=True)
    assert reported.reported and reported.stopped
    assert pod_relevant(reported) == pod_relevant(replace(reported, phase="Succeeded"))
    assert pod_relevant(running) != pod_relevant(reported)
    ended_silent = replace(running, containers_ended=True)
    assert ended_silent.stopped and not ended_silent.reported
    assert pod_relevant(ended_silent) != pod_relevant(replace(ended_silent, phase="Succeeded"))
    assert pod_arrival_relevant(reported, ())


def test_a_reporter_that_refused_main_fails_the_attempt_at_once_with_its_words() -> None:
    """No shared PID namespace (docs/troubleshooting.md#reporter-cannot-see-main): the pod can never
    report, so the attempt fails now, not at its timeout, and its Job is deleted."""
    world, first = looping()
    why = "the reporter cannot see main's processes: this pod's containers do not share one PID namespace"
    set_pod(world, first, reporter_refusal=why)
    assert pod_arrival_relevant(pod_of(world, first), ())
    world.plan()
    assert first in world.deleted
    step = world.step_status()
    assert step.phase == "Failed"
    assert step.last_failure.reason == "ReporterCannotSeeMain"
    assert why in step.last_failure.message and why in (step.message or "")
    assert records(world) == [(1, "Failed", 1)]


def test_a_reporter_that_ended_before_main_started_fails_the_attempt_instead_of_waiting_forever() -> None:
    """Its hook gave up or it crashed (docs/troubleshooting.md#reporter-ended-before-main): `main`
    is held at its shut gate for good, so the attempt fails now (and retries), not at a timeout the
    step may not have."""
    world, first = looping(retries=1)
    why = "the reporter ended before it was ready (exit code 137, OOMKilled); main's gate stays shut"
    set_pod(world, first, reporter_lost=why)
    assert pod_arrival_relevant(pod_of(world, first), ())
    world.plan()
    assert first in world.deleted
    step = world.step_status()
    assert step.last_failure.reason == "ReporterEndedBeforeMain"
    assert why in step.last_failure.message
    assert step.phase == "Retrying"


def test_a_duplicate_held_at_its_gate_beside_a_live_pod_does_not_fail_the_attempt() -> None:
    """Only when no pod of the Job can start `main` does a lost reporter fail the attempt."""
    world, first = looping()
    set_pod(world, first, phase="Running")
    world.pods[f"{first}-pod2"] = ObservedPod(
        f"{first}-pod2", first, "Running", reporter_lost="the reporter ended before it was ready"
    )
    world.plan()
    assert first not in world.deleted
    assert world.step_status().phase == "Running"
