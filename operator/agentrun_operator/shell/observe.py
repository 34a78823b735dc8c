"""Turn Kubernetes objects (as dicts) into the planner's observed values. Pure, so it is unit-tested.

Reading a Job's outcome follows batch/v1 semantics: the `Complete`/`Failed` conditions decide, and a
`Failed` condition with reason `DeadlineExceeded` is a timeout of that attempt. Since Kubernetes 1.31
the Job controller first sets `SuccessCriteriaMet` / `FailureTarget` (same reason and message) and
adds `Complete` / `Failed` only once every pod of the Job has terminated: the interim condition
decides the outcome, and the Job is `settling` until the terminal one (docs/design.md#job-lifecycle).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime
from typing import Any, Final

from agentrun_operator import naming
from agentrun_operator.api import AgentRun
from agentrun_operator.control.checkpointing import CHECKPOINT_ANCHOR, CHECKPOINT_EXIT
from agentrun_operator.control.claim import read_report
from agentrun_operator.control.mainwatch import BLIND_ANCHOR
from agentrun_operator.control.reporter import BLIND_EXIT
from agentrun_operator.jobs.reporter_container import (
    FINGERPRINT_CONTAINER,
    GATE_REFUSAL,
    REPORTER_CONTAINER,
    WORKLOAD_CONTAINERS,
)
from agentrun_operator.planner.checkpoints import REASON_CHECKPOINT_FAILED
from agentrun_operator.planner.feedback import REASON_REPORTER_BLIND
from agentrun_operator.planner.observed import JobOutcome, ObservedJob, ObservedPod, PodWait
from agentrun_operator.planner.waiting import CONTAINER_WAIT_REASONS, UNSCHEDULABLE, VOLUME_REASONS
from agentrun_operator.resolution import effective_steps, effective_workload


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
    iteration = _int_label(labels, naming.LABEL_STEP_ITERATION)
    if iteration is None:  # a Job whose label is its own step's iteration (naming.job_iteration)
        iteration = _int_label(labels, naming.LABEL_ITERATION)
    attempt = _int_label(labels, naming.LABEL_ATTEMPT)
    if step_index is None or iteration is None or attempt is None:
        return None
    status = job.get("status") or {}
    outcome, message, decided_at, settled = job_conditions(status.get("conditions") or [])
    finished_at = parse_time(status.get("completionTime")) if outcome == "Succeeded" else None
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
        finished_at=finished_at or decided_at,
        message=message,
        settling=outcome != "Active" and not settled,
        path=str(labels.get(naming.LABEL_STEP_PATH, "")),
        label=str((meta.get("annotations") or {}).get(naming.ANNOTATION_STEP, "")),
        ttl_seconds_after_finished=spec.get("ttlSecondsAfterFinished"),
        completions=_completions(spec),
        warm_template=(meta.get("annotations") or {}).get(naming.ANNOTATION_WARM_TEMPLATE) or None,
    )


def _completions(spec: dict[str, Any]) -> int:
    value = spec.get("completions")
    return value if isinstance(value, int) else 1


_TERMINAL: Final = {"Complete": "Succeeded", "Failed": "Failed"}
_INTERIM: Final = {"SuccessCriteriaMet": "Succeeded", "FailureTarget": "Failed"}


def job_conditions(
    conditions: list[dict[str, Any]],
) -> tuple[JobOutcome, str | None, datetime | None, bool]:
    """(outcome, failure message, when it was decided, whether the Job is marked ended) of a Job's
    conditions. A terminal condition (`Complete`/`Failed`) wins over an interim one
    (`SuccessCriteriaMet`/`FailureTarget`); the decision time is the earliest of these conditions,
    so it does not move when the Job controller adds `Failed` after `FailureTarget`."""
    true = [c for c in conditions if c.get("status") == "True"]
    terminal = [c for c in true if c.get("type") in _TERMINAL]
    interim = [c for c in true if c.get("type") in _INTERIM]
    chosen = terminal or interim
    if not chosen:
        return "Active", None, None, False
    table = _TERMINAL if terminal else _INTERIM
    cond = next((c for c in chosen if table[str(c.get("type"))] == "Failed"), chosen[0])
    decided = [t for t in (parse_time(c.get("lastTransitionTime")) for c in interim + terminal) if t]
    decided_at = min(decided) if decided else None
    if table[str(cond.get("type"))] == "Succeeded":
        return "Succeeded", None, decided_at, bool(terminal)
    reason = cond.get("reason")
    outcome: JobOutcome = "DeadlineExceeded" if reason == "DeadlineExceeded" else "Failed"
    return outcome, cond.get("message") or reason, decided_at, bool(terminal)


def resource_version(obj: dict[str, Any]) -> str | None:
    """An object's resourceVersion: opaque (the API's contract), so only ever compared for equality;
    None when it has none."""
    version = (obj.get("metadata") or {}).get("resourceVersion")
    return str(version) if version else None


def pod_from_k8s(pod: dict[str, Any]) -> ObservedPod | None:
    """A pod of an iteration Job, with the reporter's envelope and the main container's end."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    job_name = labels.get("job-name") or labels.get("batch.kubernetes.io/job-name")
    if not job_name:
        return None
    status = pod.get("status") or {}
    reporter_message = claim_message = refusal = refusal_reason = None
    # The reporter is a regular container (docs/design.md#reporter-first); in pods made before, a
    # native sidecar, listed among the init containers.
    for cs in [*(status.get("containerStatuses") or []), *(status.get("initContainerStatuses") or [])]:
        if cs.get("name") == REPORTER_CONTAINER:
            terminated = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get(
                "terminated"
            )
            if terminated and refused_checkpoint(terminated):
                refusal = str(terminated.get("message") or "").strip() or CHECKPOINT_UNSAID
                refusal_reason = REASON_CHECKPOINT_FAILED
            elif terminated and refused_blind(terminated):
                refusal = str(terminated.get("message") or "").strip() or BLIND_UNSAID
                refusal_reason = REASON_REPORTER_BLIND
            elif terminated:
                reporter_message = terminated.get("message")
                claim_message = claim_message or envelope_claim(reporter_message)
        elif cs.get("name") == FINGERPRINT_CONTAINER:  # older builds: docs/operations.md#earlier-pods
            terminated = (cs.get("state") or {}).get("terminated")
            if terminated:
                claim_message = terminated.get("message")
    exit_code = reason = message = None
    finished_at = None
    for cs in status.get("containerStatuses") or []:
        if cs.get("name") in WORKLOAD_CONTAINERS:
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
        reporter_refusal=refusal,
        reporter_refusal_reason=refusal_reason,
        reporter_lost=None if refusal else reporter_lost(status),
        main_exit_code=exit_code,
        main_reason=reason,
        main_message=message,
        finished_at=finished_at,
        reason=status.get("reason"),
        message=status.get("message"),
        waiting=pod_wait(status),
        creating=pod_creating(status),
        containers_ended=containers_ended(status),
        node_name=(pod.get("spec") or {}).get("nodeName") or None,
        completion_index=completion_index(meta),
        warm_ip=warm_address(labels, status),
    )


def warm_address(labels: dict[str, Any], status: dict[str, Any]) -> str | None:
    """Where a warm loop's pod serves its channel (`status.podIP`), once its reporter (the supervisor)
    has started: the pod has its IP from its sandbox on, while the kubelet may still pull the
    reporter's image for minutes, and a supervisor not started yet is no silence to count
    (planner/warm.py `WARM_SILENCE_SECONDS`); until then the planner waits for the pod as for one
    without its IP, within the step's timeout. None for any other pod."""
    if labels.get(naming.LABEL_WARM) != "true" or not status.get("podIP"):
        return None
    for cs in status.get("containerStatuses") or []:
        if cs.get("name") == REPORTER_CONTAINER:
            state, last = cs.get("state") or {}, cs.get("lastState") or {}
            if "running" in state or "terminated" in state or "terminated" in last:
                return str(status["podIP"])
    return None


COMPLETION_INDEX_ANNOTATION: Final = "batch.kubernetes.io/job-completion-index"
"""The Job controller's annotation on each pod of an Indexed Job (a loop's candidates)."""


def completion_index(meta: dict[str, Any]) -> int | None:
    """A pod's completion index, when its Job is Indexed and the annotation is a number."""
    value = (meta.get("annotations") or {}).get(COMPLETION_INDEX_ANNOTATION)
    return int(value) if isinstance(value, str) and value.isdigit() else None


BLIND_UNSAID: Final = (
    "the reporter cannot see main's processes (exit code 3, no message): the pod's containers do not "
    "share one PID namespace; docs/troubleshooting.md#reporter-cannot-see-main"
)
"""The refusal of a reporter whose termination message was lost (control/reporter.py `refuse_blind`)."""


def envelope_claim(message: str | None) -> str | None:
    """The claim report the reporter's envelope carries when the claim's outcome is news (the
    fingerprint hook's, docs/design.md#fingerprint-hook), as the text `control.claim.read_report`
    reads; None when there is none or the message is no such envelope."""
    if not message or '"claim"' not in message:
        return None
    try:
        doc = json.loads(message)
    except ValueError:
        return None
    claim = doc.get("claim") if isinstance(doc, dict) else None
    return json.dumps(claim, separators=(",", ":")) if isinstance(claim, dict) else None


def containers_ended(status: dict[str, Any]) -> bool:
    """Every container in the pod's status has terminated, `main` among them: nothing of the pod
    runs but its sandbox, though the kubelet has not written the terminal phase yet (it does after
    the teardown). A restarting sidecar or a container not listed yet is not ended."""
    statuses = [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]
    if not any(cs.get("name") in WORKLOAD_CONTAINERS for cs in statuses):
        return False
    return all("terminated" in (cs.get("state") or {}) for cs in statuses)


def held_at_gate(cs: dict[str, Any]) -> bool:
    """`main` waits at its shut gate: the kubelet will not mount a gate that leads out of its volume
    (docs/design.md#reporter-first). Only a pod whose reporter does not hold the Job's claim (a
    duplicate of the Job controller's) or was never ready is held so; not a wait to report."""
    waiting = (cs.get("state") or {}).get("waiting") or {}
    return (
        cs.get("name") in WORKLOAD_CONTAINERS
        and waiting.get("reason") == "CreateContainerConfigError"
        and str(waiting.get("message") or "").startswith(GATE_REFUSAL)
    )


def refused_blind(terminated: dict[str, Any]) -> bool:
    """A reporter's end that is its refusal to run blind (control/reporter.py `refuse_blind`): its exit
    code, or its message when something else ended it first -- the gate's hook may give up and have
    the container killed after the reporter wrote why and before it exited (seen on the pod runner)."""
    said = str(terminated.get("message") or "").rstrip()
    return terminated.get("exitCode") == BLIND_EXIT or said.endswith(BLIND_ANCHOR)


CHECKPOINT_UNSAID: Final = (
    f"the reporter's checkpoint failed before main (exit code {CHECKPOINT_EXIT}, no message); "
    f"see {CHECKPOINT_ANCHOR}"
)


def refused_checkpoint(terminated: dict[str, Any]) -> bool:
    """A reporter's end that is its refusal to start `main` because the checkpoint failed
    (control/checkpointing.py): its exit code, or its message when something else ended it first."""
    said = str(terminated.get("message") or "").rstrip()
    return terminated.get("exitCode") == CHECKPOINT_EXIT or said.endswith(CHECKPOINT_ANCHOR)


def reporter_lost(status: dict[str, Any]) -> str | None:
    """What a reporter that ended before it was ready said, when `main` is held at its shut gate
    because of it (docs/troubleshooting.md#reporter-ended-before-main); None otherwise. The reporter
    of a duplicate pod ends so on purpose, with its `taken` claim report as its message: not lost."""
    statuses = [*(status.get("containerStatuses") or []), *(status.get("initContainerStatuses") or [])]
    if not any(held_at_gate(cs) for cs in statuses):
        return None
    reporter = next((cs for cs in statuses if cs.get("name") == REPORTER_CONTAINER), None)
    ended = ((reporter or {}).get("state") or {}).get("terminated")
    if not ended or refused_blind(ended) or refused_checkpoint(ended):
        return None
    said = str(ended.get("message") or "").strip()
    report = read_report(said)
    if report is not None and report.outcome == "taken":
        return None
    how = f"exit code {ended.get('exitCode')}" + (f", {ended['reason']}" if ended.get("reason") else "")
    quoted = f": {said}" if said else ""
    return f"the reporter ended before it was ready ({how}){quoted}; main's gate stays shut"


def pod_wait(status: dict[str, Any]) -> PodWait | None:
    """Why a pod waits, when it may wait for good (`planner/waiting.py`): the first container, init
    containers first, waiting with such a reason (its image from the container's status, which the
    kubelet fills from the spec for a container it could not create), else `Unschedulable`."""
    for key in ("initContainerStatuses", "containerStatuses"):
        for cs in status.get(key) or []:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            reason = waiting.get("reason")
            if held_at_gate(cs):
                continue  # a duplicate pod's main, kept from starting on purpose
            if reason in CONTAINER_WAIT_REASONS:
                image = cs.get("image")
                return PodWait(
                    str(reason),
                    str(waiting.get("message") or ""),
                    str(cs.get("name") or ""),
                    str(image) if image else None,
                )
    for condition in status.get("conditions") or []:
        if (
            condition.get("type") == "PodScheduled"
            and condition.get("status") == "False"
            and condition.get("reason") == UNSCHEDULABLE
        ):
            return PodWait(UNSCHEDULABLE, str(condition.get("message") or ""))
    return None


def pod_creating(status: dict[str, Any]) -> bool:
    """No container of the pod has started: `Pending`, and no container (init or regular) is running
    or has ever ended. The kubelet mounts every volume before it starts the first container, so only
    such a pod can be waiting for a volume."""
    if str(status.get("phase") or "Pending") != "Pending":
        return False
    for cs in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        state = cs.get("state") or {}
        if "running" in state or "terminated" in state or "terminated" in (cs.get("lastState") or {}):
            return False
    return True


_FOR_VOLUME: Final = re.compile(r'for volume "([^"]+)"')
_UNMOUNTED: Final = re.compile(r"unmounted volumes=\[([^\]]*)\]")


def event_volume(message: str) -> str | None:
    """The volume a `FailedMount`/`FailedAttachVolume` Event names: `… for volume "pv-x" …` (the
    kubelet's and the attach/detach controller's specific errors name the volume so: for a claim,
    its PersistentVolume), else the pod's volumes of the kubelet's summary `Unable to attach or mount
    volumes: unmounted volumes=[data], …` (its own names), None when neither is there."""
    found = _FOR_VOLUME.search(message)
    if found:
        return found.group(1)
    listed = _UNMOUNTED.search(message)
    names = listed.group(1).split() if listed else []
    return ", ".join(names) or None


VolumeEvent = tuple[str, str, str, PodWait]
"""(namespace, pod name, pod uid, the wait) of a volume Event."""


def event_volume_wait(event: dict[str, Any]) -> VolumeEvent | None:
    """A core/v1 Event that says a pod's volume cannot be attached or mounted, as the pod's wait;
    None for any other Event (another reason, not about a pod)."""
    involved = event.get("involvedObject") or {}
    reason = event.get("reason")
    if involved.get("kind") != "Pod" or reason not in VOLUME_REASONS or not involved.get("name"):
        return None
    namespace = involved.get("namespace") or (event.get("metadata") or {}).get("namespace")
    message = str(event.get("message") or "")
    wait = PodWait(str(reason), message, volume=event_volume(message))
    return str(namespace), str(involved["name"]), str(involved.get("uid") or ""), wait


def names_its_cause(wait: PodWait) -> bool:
    """An Event that says which volume fails and why, not the kubelet's summary after its mount
    timeout (`Unable to attach or mount volumes: … timed out waiting for the condition`), which
    only restates that the specific errors before it have not cleared."""
    return bool(_FOR_VOLUME.search(wait.message))


def newest_volume_wait(waits: Iterable[tuple[int, PodWait]]) -> PodWait | None:
    """The wait of a pod's newest volume Event (the one taken in last: (when, wait) pairs), of those
    that name their cause when there are any: the kubelet's periodic summary does not push the cause
    it sums up out of the step's message (and the one Event per distinct wait stays one)."""
    ordered = sorted(waits, key=lambda item: item[0], reverse=True)
    specific = [wait for _, wait in ordered if names_its_cause(wait)]
    if specific:
        return specific[0]
    return ordered[0][1] if ordered else None


def with_volume_wait(pod: ObservedPod, wait: PodWait | None) -> ObservedPod:
    """The pod with its volume wait: recorded only while no container of it has started and its own
    status says nothing stronger (a container's or the scheduler's reason, read from the status,
    wins); a volume wait recorded before is replaced (or removed with `None`)."""
    own = pod.waiting
    if own is not None and own.reason in VOLUME_REASONS:
        own = None
    if wait is None or not pod.creating or own is not None:
        return pod if own is pod.waiting else replace(pod, waiting=own)
    return pod if wait == pod.waiting else replace(pod, waiting=wait)


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
