"""A pod that waits for good (image missing, container not creatable, unschedulable): the step's
message says why, naming the container and the image, one Event per wait, and the timeout still
ends the attempt, its message saying what the pod waited for (docs/design.md#pod-waits)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from agentrun_operator.planner.observed import ObservedPod, PodWait
from agentrun_operator.planner.waiting import REASON_WAITING, describe, headline, waited_for
from agentrun_operator.shell.relevance import pod_arrival_relevant, pod_relevant
from tests.unit.planner.world import PlannerWorld, loop_step, manifest

NEVER_PULL = PodWait(
    "ErrImageNeverPull",
    'Container image "busybox:does-not-exist" is not present with pull policy of Never',
    "main",
    "busybox:does-not-exist",
)


def waiting_world(wait: PodWait | None, timeout: int = 10, retries: int = 0) -> tuple[PlannerWorld, str]:
    world = PlannerWorld(manifest([loop_step(max_iterations=2, timeoutSeconds=timeout, retries=retries)]))
    world.plan()
    job = world.active()
    set_wait(world, job, wait)
    return world, job


def set_wait(world: PlannerWorld, job: str, wait: PodWait | None, phase: str = "Pending") -> None:
    pod = f"{job}-pod"
    world.pods[pod] = replace(world.pods[pod], phase=phase, waiting=wait)


def warnings(world: PlannerWorld) -> list[str]:
    return [e.message for e in world.events if e.reason == REASON_WAITING]


def test_a_missing_image_names_the_container_and_the_image_in_the_step_message_and_one_event() -> None:
    world, job = waiting_world(NEVER_PULL)
    world.plan()
    message = world.step_status().message
    assert message.startswith(f"iteration 1/2 attempt 1/1 running (Job {job}): waiting, ")
    assert "container main of pod" in message
    assert "image busybox:does-not-exist is not on the node" in message
    assert "ErrImageNeverPull: Container image" in message
    assert len(warnings(world)) == 1
    world.advance(2)
    world.plan()
    assert len(warnings(world)) == 1, "the same wait seen again posts no second Event"


def test_pull_errors_alternating_with_back_off_are_one_wait() -> None:
    world, job = waiting_world(PodWait("ErrImagePull", "pull failed", "main", "registry.example/x:1"))
    world.plan()
    set_wait(
        world,
        job,
        PodWait(
            "ImagePullBackOff",
            'Back-off pulling image "registry.example/x:1"',
            "main",
            "registry.example/x:1",
        ),
    )
    world.plan()
    set_wait(world, job, PodWait("ErrImagePull", "pull failed again", "main", "registry.example/x:1"))
    world.plan()
    assert len(warnings(world)) == 1
    assert "image registry.example/x:1 cannot be pulled" in world.step_status().message


def test_a_new_wait_is_a_new_event_and_the_end_of_the_wait_restores_the_message() -> None:
    world, job = waiting_world(NEVER_PULL)
    world.plan()
    reporter = PodWait("ErrImageNeverPull", "not present", "reporter", "ghcr.io/x/operator:1")
    set_wait(world, job, reporter)
    world.plan()
    assert len(warnings(world)) == 2
    assert "container reporter" in world.step_status().message
    set_wait(world, job, None, phase="Running")
    world.plan()
    assert world.step_status().message == f"iteration 1/2 attempt 1/1 running (Job {job})"
    assert len(warnings(world)) == 2


@pytest.mark.parametrize(
    ("wait", "words"),
    [
        (
            PodWait("InvalidImageName", "bad", "main", "UPPER:case"),
            "image UPPER:case is not a valid image name",
        ),
        (
            PodWait("CreateContainerConfigError", 'secret "token" not found', "main", "busybox:1.36"),
            'cannot be created (CreateContainerConfigError: secret "token" not found)',
        ),
        (
            PodWait("Unschedulable", "0/1 nodes are available: 1 node(s) had volume node affinity conflict."),
            "cannot be scheduled on any node (Unschedulable: 0/1 nodes are available",
        ),
    ],
)
def test_each_kind_of_wait_says_why(wait: PodWait, words: str) -> None:
    world, _job = waiting_world(wait)
    world.plan()
    assert words in world.step_status().message
    assert len(warnings(world)) == 1


def test_the_timeout_still_ends_a_waiting_attempt_and_says_what_it_waited_for() -> None:
    world, job = waiting_world(NEVER_PULL, timeout=10)
    world.plan()
    world.advance(10)
    world.deadline(job)
    world.plan()
    assert world.phase == "Failed"
    message = world.step_status().message
    assert "timed out after 10s (activeDeadlineSeconds); its pod never started: container main" in message
    assert "busybox:does-not-exist" in message


def test_a_waiting_attempt_that_times_out_with_retries_left_is_retried() -> None:
    world, job = waiting_world(NEVER_PULL, timeout=10, retries=1)
    world.plan()
    world.advance(10)
    world.deadline(job)
    world.plan()
    assert world.step_status().phase == "Retrying"
    assert "its pod never started" in world.step_status().message


def test_a_pod_being_deleted_or_ended_is_not_a_wait() -> None:
    world, job = waiting_world(None)
    world.plan()
    before = world.step_status().message
    pod = f"{job}-pod"
    world.pods[pod] = replace(world.pods[pod], waiting=NEVER_PULL, deleting=True)
    world.plan()
    assert world.step_status().message == before
    assert not warnings(world)


def test_a_waiting_pod_re_plans_while_pending_and_running_stay_alike() -> None:
    pod = ObservedPod("p", "j", "Pending")
    assert pod_relevant(pod) == pod_relevant(replace(pod, phase="Running"))
    assert pod_relevant(replace(pod, waiting=NEVER_PULL)) != pod_relevant(pod)
    assert pod_arrival_relevant(replace(pod, waiting=NEVER_PULL), ())
    assert not pod_arrival_relevant(pod, ())


def test_headline_is_stable_across_reasons_and_describe_clips_the_kubelets_words() -> None:
    pull = PodWait("ErrImagePull", "x" * 5000, "main", "a:1")
    assert headline(pull, "p") == headline(replace(pull, reason="ImagePullBackOff"), "p")
    assert len(describe(pull, "p")) < 500
    assert waited_for("attempt 1/1 running (Job j): waiting, why") == "why"
    assert waited_for("attempt 1/1 running (Job j)") is None
    assert waited_for(None) is None


def test_a_wait_stays_in_the_message_while_its_pod_is_deleted_at_the_deadline() -> None:
    world, job = waiting_world(NEVER_PULL, timeout=10)
    world.plan()
    pod = f"{job}-pod"
    world.pods[pod] = replace(world.pods[pod], deleting=True)  # seen before the Job's FailureTarget
    world.plan()
    assert "busybox:does-not-exist" in world.step_status().message
    world.advance(10)
    world.deadline(job)
    world.plan()
    assert "its pod never started: container main" in world.step_status().message
