"""What the shell's relevance filter lets it skip re-planning for (shell/relevance.py:
`pod_arrival_relevant`, `job_relevant`, `pod_relevant`): at every point of a looped run, seeing
such a change makes the planner act no more than not seeing it -- the same status, and no write it
would not make anyway."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

from agentrun_operator.planner.actions import ClaimIdempotencyKey, CreateJob, DeleteJob, DeleteRun, SetJobTTL
from agentrun_operator.planner.observed import Observed, ObservedJob, ObservedPod
from agentrun_operator.planner.plan import Plan, plan
from agentrun_operator.shell.relevance import job_relevant, pod_arrival_relevant
from tests.unit.planner.world import LOOPS_ON, PlannerWorld, loop_step, manifest

WRITES = (CreateJob, DeleteJob, SetJobTTL, DeleteRun, ClaimIdempotencyKey)


def _writes(result: Plan) -> set[tuple[str, str]]:
    return {(type(a).__name__, str(getattr(a, "name", ""))) for a in result.actions if isinstance(a, WRITES)}


def _situations() -> list[tuple[PlannerWorld, Observed]]:
    """The observed world before each plan of a 3-iteration loop, including the moments between a
    pod's end and its Job's, and between a result being recorded and the Job getting its TTL."""
    world = PlannerWorld(manifest([loop_step("a", 3)]), config=LOOPS_ON)
    seen: list[tuple[PlannerWorld, Observed]] = []

    def snapshot() -> None:
        seen.append((world, world.observed()))

    for _ in range(40):
        snapshot()
        world.plan()
        if world.phase in ("Succeeded", "Failed"):
            break
        live = world.live_jobs()
        if live:
            job = live[0]
            pod = f"{job}-pod"
            world.pods[pod] = replace(world.pods[pod], phase="Succeeded", finished_at=world.now)
            snapshot()
            world.plan()
            world.succeed(job)
        world.advance(1)
    assert world.phase == "Succeeded"
    return seen


def _same_or_less(world: PlannerWorld, base: Observed, changed: Observed) -> None:
    without = plan(world.agentrun(), base, world.now, world.config)
    with_it = plan(world.agentrun(), changed, world.now, world.config)
    assert with_it.status == without.status
    assert _writes(with_it) <= _writes(without)


def test_the_first_pod_of_a_job_appearing_not_yet_ended_changes_no_plan_for_the_worse() -> None:
    for world, observed in _situations():
        for job in observed.jobs:
            others = tuple(p for p in observed.pods if p.job_name != job.name)
            before = replace(observed, pods=others)  # the Job's pod not seen yet
            for phase in ("Pending", "Running"):
                newcomer = ObservedPod(name=f"{job.name}-pod", job_name=job.name, phase=phase)
                assert not pod_arrival_relevant(newcomer, others)
                _same_or_less(world, before, replace(before, pods=(*others, newcomer)))


def test_a_second_pod_of_a_job_or_an_ended_pod_may_change_a_plan() -> None:
    """A Job taken for succeeded by its one pod is live again with two (e.g. a replaced pod): the
    planner deletes it if it is not the active attempt. So such an arrival re-plans."""
    first = ObservedPod(name="j-1", job_name="j", phase="Succeeded")
    assert pod_arrival_relevant(ObservedPod(name="j-2", job_name="j", phase="Pending"), (first,))
    assert pod_arrival_relevant(ObservedPod(name="k-1", job_name="k", phase="Failed"), ())
    assert not pod_arrival_relevant(ObservedPod(name="k-1", job_name="k", phase="Pending"), (first,))


def test_a_job_getting_its_ttl_or_start_time_changes_no_plan_for_the_worse() -> None:
    for world, observed in _situations():
        for index, job in enumerate(observed.jobs):
            jobs = list(observed.jobs)
            jobs[index] = replace(job, ttl_seconds_after_finished=300, started_at=world.now)
            _same_or_less(world, observed, replace(observed, jobs=tuple(jobs)))


def test_a_job_with_its_ttl_set_ending_changes_no_plan_for_the_worse() -> None:
    """The planner sets a TTL once the Job has ended by its pod and a committed status records its
    result; the Job controller then marking it complete (or failed, past a deadline) re-plans
    nothing (`job_relevant`). Walked at each point of a 3-iteration loop where a Job has
    its TTL and has not ended yet (between the plan that recorded it and the Job controller)."""
    world = PlannerWorld(manifest([loop_step("a", 3)]), config=LOOPS_ON)
    checked = 0
    for _ in range(40):
        world.plan()
        if world.phase in ("Succeeded", "Failed"):
            break
        live = world.live_jobs()
        if not live:
            world.advance(1)
            continue
        job_name = live[0]
        pod = f"{job_name}-pod"
        world.pods[pod] = replace(world.pods[pod], phase="Succeeded", finished_at=world.now)
        world.plan()  # records the result, sets the TTL
        observed = world.observed()
        for index, job in enumerate(observed.jobs):
            if job.ttl_seconds_after_finished is None or job.finished:
                continue
            for outcome in ("Succeeded", "Failed", "DeadlineExceeded"):
                jobs = list(observed.jobs)
                jobs[index] = replace(job, outcome=outcome, finished_at=world.now, message="ended")
                assert job_relevant(jobs[index]) == job_relevant(job)
                _same_or_less(world, observed, replace(observed, jobs=tuple(jobs)))
                checked += 1
        world.succeed(job_name)
        world.advance(1)
    assert world.phase == "Succeeded"
    assert checked >= 3, "no Job had its TTL before it ended: the test would be vacuous"


def test_a_warm_jobs_end_stays_news_although_it_has_its_ttl_from_creation() -> None:
    """A warm Job is created with its TTL (planner/podgc.py `warm_creation_ttl`): its TTL says nothing
    of its result, so its end re-plans, as a cold Job's does before its TTL."""
    warm = ObservedJob(
        "run-1-1-1", "uid", 1, 1, 1, "Active", ttl_seconds_after_finished=300, warm_template="d"
    )
    failed = replace(warm, outcome="Failed", finished_at=datetime(2026, 12, 5, tzinfo=UTC), message="died")
    assert job_relevant(warm) != job_relevant(failed)
    cold, cold_failed = replace(warm, warm_template=None), replace(failed, warm_template=None)
    assert job_relevant(cold) == job_relevant(cold_failed)  # a cold Job gets its TTL once recorded
