"""`JobClaimUnavailable`: a pod of the run could not claim its Job, so a duplicate pod would have run
`main` again (docs/concepts.md#exactly-once). Pure.

Each iteration pod's `fingerprint` container reports in its termination message how its Job claim
went (control/claim.py). When one says the claim could not be taken (a volume its uid may not
write, a read-only mount), the run gets condition `JobClaimUnavailable=True` naming the pod, its Job
and the volume, and one Warning Event of the same name: users look at the run, not at a helper
container's log. The condition stays for the rest of the run (some iteration ran unguarded); it is
set once, by the first such pod the planner sees, so a re-plan changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from agentrun_operator.api import Condition
from agentrun_operator.control.claim import read_report
from agentrun_operator.planner.conditions import Want, apply, became_true
from agentrun_operator.planner.context import PlanContext
from agentrun_operator.planner.observed import ObservedPod

JOB_CLAIM_UNAVAILABLE: Final = "JobClaimUnavailable"
REASON_CLAIM_NOT_TAKEN: Final = "ClaimNotTaken"
HELP: Final = "docs/troubleshooting.md#job-claim-unavailable"


def claim_message(pod: ObservedPod, volume: str, where: str, detail: str) -> str:
    """What the condition and the Event say: which pod and Job, which volume, why, and what to do."""
    on = f'volume "{volume}"' if volume else "its volume"
    why = detail or "no reason given"
    return (
        f"pod {pod.name} could not claim Job {pod.job_name} on {on} ({where}): {why}; "
        "a duplicate pod of a Job would run main again. Make the volume writable for the pod "
        f"(AGENTS_CONTROLLER_POD_FS_GROUP, or a read-write mount) ({HELP})"
    )


def claim_want(pods: Iterable[ObservedPod], current: Sequence[Condition]) -> Want | None:
    """`JobClaimUnavailable=True` for the first pod whose claim could not be taken; None when the
    condition is already True (it is kept as it is) or no pod says so."""
    if any(c.type == JOB_CLAIM_UNAVAILABLE and c.status == "True" for c in current):
        return None
    for pod in pods:
        report = read_report(pod.claim_message)
        if report is not None and report.outcome == "unavailable":
            message = claim_message(pod, report.volume, report.dir, report.detail)
            return Want(JOB_CLAIM_UNAVAILABLE, "True", REASON_CLAIM_NOT_TAKEN, message)
    return None


def conclude(ctx: PlanContext) -> None:
    """After `conditions.conclude`: set `JobClaimUnavailable` when a pod says so, with one Warning
    Event of the same name when it turns True."""
    status = ctx.status
    want = claim_want(ctx.observed.pods, status.conditions)
    if want is None:
        return
    before = list(status.conditions)
    status.conditions = apply(status.conditions, [want], status.observed_generation, ctx.now)
    if became_true(before, status.conditions, JOB_CLAIM_UNAVAILABLE):
        ctx.emit("Warning", JOB_CLAIM_UNAVAILABLE, want.message)
