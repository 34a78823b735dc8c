"""A pod whose volume cannot be attached or mounted: its wait (from the Events the shell watches,
tests/unit/shell/test_volume_waits.py) in the step's message, one Event per distinct wait, the
message restored when it ends, and the timeout naming it (docs/design.md#pod-waits)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from agentrun_operator.planner.observed import ObservedPod, PodWait
from agentrun_operator.planner.waiting import describe, headline
from agentrun_operator.shell.relevance import pod_arrival_relevant, pod_relevant
from tests.unit.planner.test_pod_waits import set_wait, waiting_world, warnings

MISSING_PATH = PodWait(
    "FailedMount",
    'MountVolume.NewMounter initialization failed for volume "pv-x" : path "/does/not/exist" does not exist',
    volume="pv-x",
)
MULTI_ATTACH = PodWait(
    "FailedAttachVolume",
    'Multi-Attach error for volume "pvc-1" Volume is already exclusively attached to one node and '
    "can't be attached to another",
    volume="pvc-1",
)


@pytest.mark.parametrize(
    ("wait", "words"),
    [
        (
            MISSING_PATH,
            "pod {pod} cannot start: volume pv-x cannot be mounted (FailedMount: MountVolume.NewMounter",
        ),
        (
            MULTI_ATTACH,
            "pod {pod} cannot start: volume pvc-1 cannot be attached (FailedAttachVolume: Multi-Attach",
        ),
        (
            PodWait("FailedMount", "Unable to attach or mount volumes: timed out"),
            "pod {pod} cannot start: a volume cannot be mounted (FailedMount: Unable to attach",
        ),
    ],
)
def test_a_volume_wait_names_the_volume_and_the_cause(wait: PodWait, words: str) -> None:
    world, job = waiting_world(wait)
    world.plan()
    message = world.step_status().message
    assert message.startswith(f"iteration 1/2 attempt 1/1 running (Job {job}): waiting, "), message
    assert words.format(pod=f"{job}-pod") in message, message
    assert len(warnings(world)) == 1


def test_the_kubelets_retries_are_one_wait_and_a_new_volume_is_a_new_one() -> None:
    world, job = waiting_world(MISSING_PATH)
    world.plan()
    set_wait(world, job, replace(MISSING_PATH, message=MISSING_PATH.message + " (again)"))
    world.plan()
    assert len(warnings(world)) == 1
    set_wait(world, job, MULTI_ATTACH)
    world.plan()
    assert len(warnings(world)) == 2
    set_wait(world, job, None, phase="Running")
    world.plan()
    assert world.step_status().message == f"iteration 1/2 attempt 1/1 running (Job {job})"
    assert len(warnings(world)) == 2


def test_the_timeout_ends_a_volume_wait_and_says_what_it_waited_for() -> None:
    world, job = waiting_world(MISSING_PATH, timeout=15)
    world.plan()
    world.advance(15)
    world.deadline(job)
    world.plan()
    assert world.phase == "Failed"
    message = world.step_status().message
    assert "timed out after 15s (activeDeadlineSeconds); its pod never started: pod" in message
    assert "volume pv-x cannot be mounted (FailedMount" in message


def test_headline_and_describe_of_volume_waits() -> None:
    assert headline(MISSING_PATH, "p") == "pod p cannot start: volume pv-x cannot be mounted"
    assert headline(MULTI_ATTACH, "p") == "pod p cannot start: volume pvc-1 cannot be attached"
    assert headline(replace(MISSING_PATH, message="other words"), "p") == headline(MISSING_PATH, "p")
    assert describe(replace(MISSING_PATH, message=""), "p").endswith("cannot be mounted (FailedMount)")
    assert len(describe(replace(MISSING_PATH, message="x" * 5000), "p")) < 500


def test_a_volume_wait_re_plans_and_the_first_container_starting_does_not() -> None:
    pod = ObservedPod("p", "j", "Pending", creating=True)
    assert pod_relevant(pod) == pod_relevant(replace(pod, phase="Running", creating=False))
    assert pod_relevant(replace(pod, waiting=MISSING_PATH)) != pod_relevant(pod)
    assert pod_relevant(replace(pod, waiting=MISSING_PATH)) != pod_relevant(
        replace(pod, waiting=MULTI_ATTACH)
    )
    assert pod_arrival_relevant(replace(pod, waiting=MISSING_PATH), ())
