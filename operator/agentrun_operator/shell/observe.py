"""Turn Kubernetes objects (as dicts) into the planner's observed values. Pure, so it is unit-tested.

Reading a Job's outcome follows batch/v1 semantics: the `Complete`/`Failed` conditions decide, and a
`Failed` condition with reason `DeadlineExceeded` is a timeout of that attempt.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from agentrun_operator import naming
from agentrun_operator.api import AgentRun
from agentrun_operator.jobs.builder import FINGERPRINT_CONTAINER, MAIN_CONTAINER, REPORTER_CONTAINER
from agentrun_operator.planner.observed import JobOutcome, ObservedJob, ObservedPod
from agentrun_operator.planner.resolution import effective_steps, effective_workload


def parse_time(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None


def _int_label(labels: dict[str, str], key: str) -> int | None:
    try:
        return int(labels.get(key, ""))
    except ValueError:
        return None


def job_from_k8s(job: dict[str, Any]) -> ObservedJob | None:
    """An iteration Job, or None when its labels are not ours (never guess at a foreign Job)."""
    meta = job.get("metadata") or {}
    labels = meta.get("labels") or {}
    step_index = _int_label(labels, naming.LABEL_STEP_INDEX)
    iteration = _int_label(labels, naming.LABEL_ITERATION)
    attempt = _int_label(labels, naming.LABEL_ATTEMPT)
    if step_index is None or iteration is None or attempt is None:
        return None
    status = job.get("status") or {}
    outcome: JobOutcome = "Active"
    message = None
    finished_at = parse_time(status.get("completionTime"))
    for cond in status.get("conditions") or []:
        if cond.get("status") != "True":
            continue
        if cond.get("type") == "Complete":
            outcome = "Succeeded"
        elif cond.get("type") == "Failed":
            outcome = "DeadlineExceeded" if cond.get("reason") == "DeadlineExceeded" else "Failed"
            message = cond.get("message") or cond.get("reason")
            finished_at = finished_at or parse_time(cond.get("lastTransitionTime"))
    spec = job.get("spec") or {}
    return ObservedJob(
        name=str(meta.get("name")),
        uid=str(meta.get("uid", "")),
        step_index=step_index,
        iteration=iteration,
        attempt=attempt,
        outcome=outcome,
        deleting=bool(meta.get("deletionTimestamp")),
        started_at=parse_time(status.get("startTime")),
        finished_at=finished_at,
        message=message,
        path=str(labels.get(naming.LABEL_STEP_PATH, "")),
        label=str((meta.get("annotations") or {}).get(naming.ANNOTATION_STEP, "")),
        ttl_seconds_after_finished=spec.get("ttlSecondsAfterFinished"),
    )


def pod_from_k8s(pod: dict[str, Any]) -> ObservedPod | None:
    """A pod of an iteration Job, with the reporter's envelope and the main container's end."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    job_name = labels.get("job-name") or labels.get("batch.kubernetes.io/job-name")
    if not job_name:
        return None
    status = pod.get("status") or {}
    reporter_message = claim_message = None
    for cs in status.get("initContainerStatuses") or []:
        if cs.get("name") == REPORTER_CONTAINER:
            terminated = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get(
                "terminated"
            )
            if terminated:
                reporter_message = terminated.get("message")
        elif cs.get("name") == FINGERPRINT_CONTAINER:
            terminated = (cs.get("state") or {}).get("terminated")
            if terminated:
                claim_message = terminated.get("message")
    exit_code = reason = message = None
    finished_at = None
    for cs in status.get("containerStatuses") or []:
        if cs.get("name") == MAIN_CONTAINER:
            terminated = (cs.get("state") or {}).get("terminated")
            if terminated:
                exit_code = terminated.get("exitCode")
                reason = terminated.get("reason")
                message = terminated.get("message")
                finished_at = parse_time(terminated.get("finishedAt"))
    return ObservedPod(
        name=str(meta.get("name")),
        job_name=str(job_name),
        phase=str(status.get("phase") or "Pending"),
        deleting=bool(meta.get("deletionTimestamp")),
        reporter_message=reporter_message,
        claim_message=claim_message,
        main_exit_code=exit_code,
        main_reason=reason,
        main_message=message,
        finished_at=finished_at,
        reason=status.get("reason"),
        message=status.get("message"),
    )


def claim_names(run: AgentRun) -> list[str]:
    """The PersistentVolumeClaims the run's pods would mount: every `pvc` volume of every step's
    effective workload (a step's volumes replace the run's), each name once, in spec order."""
    names: list[str] = []
    for step in effective_steps(run):
        workload = effective_workload(run.spec.workload, step.workload)
        for volume in workload.volumes or []:
            if volume.type == "pvc" and volume.claim_name and volume.claim_name not in names:
                names.append(volume.claim_name)
    return names


def claim_phase(claim: dict[str, Any] | None) -> str | None:
    """`Bound`, `Pending`, `Lost`… of a PersistentVolumeClaim object; None when it does not exist."""
    if claim is None:
        return None
    status = claim.get("status") or {}
    phase = str(status.get("phase") or "Pending")
    if phase == "Bound" and not (claim.get("spec") or {}).get("volumeName"):
        return "Pending"
    return phase
