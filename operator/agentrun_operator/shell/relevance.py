"""What of a watch event reaches the planner: the shell's own relevance filter
(docs/design.md#data-direction).

The watch cache (shell/cache.py) stores every Job and Pod of a run, but re-plans the run only when
what a plan would read of it changed. That judgement is the shell's, made here, on the planner's
plain values (`ObservedJob`, `ObservedPod`); the planner knows nothing of events or filtering. Each
rule below names the planner rule that makes a change no news, and
tests/unit/shell/test_relevance.py checks it against the planner itself: at every point of a looped
run, a change this filter drops makes the planner act no differently.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from agentrun_operator.planner.observed import ObservedJob, ObservedPod


def job_relevant(job: ObservedJob) -> ObservedJob:
    """What of a Job can change a plan: `started_at` only refines a deadline timer, which a plan made
    without it arms earlier (from the attempt's request), never later; a TTL, once set, only keeps the
    planner from setting it (a plan that has not seen it sets it once more, the same value: an
    idempotent write). And a Job with its TTL set is done with: the planner sets it only once the Job
    has ended and a committed status records its result, after which its outcome is never read again
    (`gating.result_recorded`) -- so the Job controller marking it complete re-plans nothing; only
    its deletion does. A `settling` Job gets no TTL (`gating.set_job_ttls`), so its end, which opens
    the one-Job gate, stays news. A warm Job is created with its TTL (planner/podgc.py), so its TTL
    says nothing of its result: its end stays news too."""
    relevant = replace(job, started_at=None, ttl_seconds_after_finished=None)
    if job.ttl_seconds_after_finished is not None and not job.warm:
        return replace(relevant, outcome="Succeeded", finished_at=None, message=None, settling=False)
    return relevant


def pod_relevant(pod: ObservedPod) -> ObservedPod:
    """What of a pod can change a plan: Pending and Running are alike to every rule (only how a pod
    ends, that it is deleted, or why it waits, matters), so the shell need not re-plan between them;
    a change of `waiting` (a new reason, or the wait over) does re-plan. The claim's outcome (known
    once `fingerprint` ends, before `main` starts) is read when the pod ends: it only adds a warning
    (planner/claims.py), so it re-plans nothing on its own. A `reported` pod is recorded by its
    report, so its phase turning `Succeeded` afterwards (the kubelet's teardown done) re-plans nothing
    either. Its node matters only once it has stopped (the next pod's placement), so being scheduled
    re-plans nothing. Nor does its first container starting (`creating` only decides whether a volume
    Event is its wait, shell/observe.with_volume_wait; the wait itself is compared)."""
    pod = replace(pod, creating=False)
    if pod.reported and pod.phase in ("Running", "Succeeded"):
        return replace(pod, phase="Succeeded")  # its report decided; the phase adds nothing
    if pod.terminal:
        return pod
    running = "Running" if pod.phase == "Pending" else pod.phase
    if pod.containers_ended:  # stopped: its node is news for the next pod's placement
        return replace(pod, phase=running, claim_message=None)
    return replace(pod, phase=running, claim_message=None, node_name=None)


def pod_arrival_relevant(pod: ObservedPod, others: tuple[ObservedPod, ...]) -> bool:
    """Whether a plan made before this pod was seen (beside `others`, the run's other pods) may now
    be wrong. The first pod of a Job, not yet ended, can only hold the planner back (the one-Job gate,
    waiting for its report), never make it act, so the shell need not re-plan when it appears: the
    next plan, for any reason, sees it. A further pod of a Job can: a Job taken for succeeded by its
    one pod is live again with two; and so can one that already waits for good (the step's message
    says why), and so can one whose reporter refused to start `main` (the attempt fails at once)."""
    return (
        pod.stopped
        or pod.waiting is not None
        or pod.reporter_refusal is not None
        or pod.reporter_lost is not None
        or any(p.job_name == pod.job_name for p in others)
    )


# The cache's hooks (`Store(change=..., arrival=..., ended=...)`), on its stored views.


def job_change(view: Any) -> Any:
    """What of a Job's view (the Job, its owners) can change a plan: a change of anything else needs
    no reconcile."""
    job, owners = view
    return (job_relevant(job) if job is not None else None, owners)


def pod_change(view: Any) -> Any:
    return pod_relevant(view) if view is not None else None


def pod_arrival(view: Any, others: list[Any]) -> bool:
    """A new pod re-plans its run only when it could change a plan (`pod_arrival_relevant`): the pod
    every iteration starts with, still pending, does not."""
    known = tuple(other for other in others if other is not None)
    return view is not None and pod_arrival_relevant(view, known)


def pod_ended(view: Any) -> bool:
    """A pod that has stopped (its containers ended, or it is terminal): its run's next reconcile
    records the iteration and creates the next Job, so it goes first (a turnaround, shell/workqueue.py).
    Asked only of a change that re-plans its run: a stopped pod's later changes (its phase turning
    Succeeded after its report) re-plan nothing."""
    return view is not None and bool(view.stopped)


def job_ended(view: Any) -> bool:
    """A Job that failed (its pod's own end may never show: deleted, evicted, past its deadline). A
    Job that succeeded is not one: its turnaround was its pod stopping, seen first."""
    job = view[0]
    return job is not None and job.outcome in ("Failed", "DeadlineExceeded")
