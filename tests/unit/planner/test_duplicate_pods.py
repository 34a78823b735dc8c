"""A Job with two pods (the Job controller's duplicate, docs/concepts.md#exactly-once): the attempt's
result is the report of the pod whose main container ran, whichever pod ended last."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

from agentrun_operator.planner.observed import ObservedPod
from tests.unit.planner.world import PlannerWorld, envelope_found, envelope_status, loop_step, manifest

CONTINUE = "iteration.last.control.continue"


def test_the_report_of_the_pod_that_ran_main_wins_over_a_later_duplicate() -> None:
    world = PlannerWorld(manifest([loop_step(max_iterations=3, expression=CONTINUE)]))
    world.plan()
    job = world.active()
    world.succeed(job, control={"continue": False})
    # The duplicate waited in its init container and was deleted: it ended later, main never ran,
    # and its reporter reported what it saw without a fingerprint of its own.
    world.advance(5)
    world.pods[f"{job}-duplicate"] = ObservedPod(
        name=f"{job}-duplicate",
        job_name=job,
        phase="Failed",
        reporter_message=envelope_status("missing", "no fingerprint"),
        finished_at=world.now,
    )
    world.plan()
    loop = world.step_status().loop
    assert loop.last_control == {"continue": False}
    assert loop.stop_reason == "LoopConditionFalse" and loop.completed_iterations == 1


def test_while_a_duplicate_is_still_pending_the_attempt_waits_for_it_to_end() -> None:
    world = PlannerWorld(manifest([loop_step(max_iterations=3, expression=CONTINUE)]))
    world.plan()
    job = world.active()
    world.succeed(job, control={"continue": True})
    world.pods[f"{job}-duplicate"] = ObservedPod(name=f"{job}-duplicate", job_name=job, phase="Pending")
    world.plan()
    assert world.step_status().loop.completed_iterations == 0  # not read while a pod may still report
    world.advance(1)
    world.pods[f"{job}-duplicate"] = replace(
        world.pods[f"{job}-duplicate"],
        phase="Failed",
        reporter_message=envelope_found({"continue": False}),  # what the shared file holds by now
        finished_at=world.now + timedelta(seconds=1),
    )
    world.plan()
    loop = world.step_status().loop
    assert loop.completed_iterations == 1 and loop.last_control == {"continue": True}
