"""`JobClaimUnavailable`: a pod that could not claim its Job shows on the run as a condition and a
Warning Event naming the volume, not only in a container log (planner/claims.py)."""

from __future__ import annotations

from dataclasses import replace

from agentrun_operator.control.claim import Claim, report_text
from agentrun_operator.planner.claims import JOB_CLAIM_UNAVAILABLE, claim_want
from agentrun_operator.planner.observed import ObservedPod
from agentrun_operator.shell.relevance import pod_relevant
from tests.unit.planner.world import PlannerWorld, loop_step, manifest

UNAVAILABLE = report_text(
    Claim("unavailable", "cannot create /w/.agentrun-claims/j: Read-only file system"),
    "work",
    "/w/.agentrun-claims",
)
CLAIMED = report_text(Claim("claimed"), "work", "/w/.agentrun-claims")


def pod(name: str = "p1", message: str | None = UNAVAILABLE, phase: str = "Succeeded") -> ObservedPod:
    return ObservedPod(name=name, job_name=f"{name}-job", phase=phase, claim_message=message)


def test_a_pod_that_could_not_claim_sets_the_condition_naming_pod_job_and_volume() -> None:
    want = claim_want([pod("a", CLAIMED), pod("b"), pod("c")], [])
    assert want is not None
    assert (want.type, want.status, want.reason) == (JOB_CLAIM_UNAVAILABLE, "True", "ClaimNotTaken")
    assert 'pod b could not claim Job b-job on volume "work" (/w/.agentrun-claims)' in want.message
    assert "Read-only file system" in want.message
    assert "docs/troubleshooting.md#job-claim-unavailable" in want.message


def test_claimed_pods_or_pods_that_tried_no_claim_set_nothing() -> None:
    assert claim_want([pod("a", CLAIMED), pod("b", None), pod("c", "garbage")], []) is None


def test_the_warning_is_posted_once_and_the_condition_stays() -> None:
    world = PlannerWorld(manifest([loop_step(max_iterations=2)]))
    world.plan()
    job = world.active()
    world.pods[f"{job}-pod"] = replace(world.pods[f"{job}-pod"], claim_message=UNAVAILABLE)
    world.succeed(job)
    world.plan()
    assert world.event_reasons().count(JOB_CLAIM_UNAVAILABLE) == 1
    condition = next(c for c in world.status.conditions if c.type == JOB_CLAIM_UNAVAILABLE)  # type: ignore[union-attr]
    assert condition.status == "True" and 'volume "work"' in (condition.message or "")
    world.drive(lambda w, name: w.succeed(name))  # later iterations claim fine: the condition stays
    assert world.phase == "Succeeded"
    assert world.event_reasons().count(JOB_CLAIM_UNAVAILABLE) == 1
    assert any(c.type == JOB_CLAIM_UNAVAILABLE and c.status == "True" for c in world.status.conditions)  # type: ignore[union-attr]


def test_a_running_pod_s_claim_outcome_does_not_re_plan_on_its_own() -> None:
    """The outcome arrives when `fingerprint` ends; it is read when the pod ends (plan relevance)."""
    running = pod(phase="Running")
    assert pod_relevant(running) == pod_relevant(replace(running, claim_message=None))
    ended = pod()
    assert pod_relevant(ended).claim_message == UNAVAILABLE
