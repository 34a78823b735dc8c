"""The Job that puts an iteration's winning candidate into the workspace (loop.candidates,
docs/concepts.md#candidates): one pod, the operator's own image, that restores the winner's end
checkpoint over the checkpointed volume and removes the candidates' copies. Pure.

It runs after the candidates' Job has ended and before the iteration is recorded as succeeded, so
the next iteration, an approval between iterations and the steps after the loop all see the
winner's files. A restore is idempotent: a promotion run twice (a restarted operator, a lost pod)
leaves the same workspace."""

from __future__ import annotations

import posixpath
from typing import Any, Final

from agentrun_operator import naming
from agentrun_operator.api import AgentRun, WorkflowStep
from agentrun_operator.config import OperatorConfig
from agentrun_operator.jobs.builder import (
    ANNOTATION_RUN_NAME,
    PlannedAttempt,
    claim_volume,
    job_labels,
    job_manifest,
    pod_security_context,
    same_node_affinity,
    volume_holding,
    workload_container_name,
)
from agentrun_operator.jobs.checkpoint_args import (
    CHECKPOINT_SECURITY_CONTEXT,
    checkpoint_volume,
    excluded_paths,
)
from agentrun_operator.jobs.reporter_container import helper_container
from agentrun_operator.resolution import control_path, effective_steps, effective_workload

PROMOTION_DEADLINE_SECONDS: Final = 3600
"""A restore of a large workspace takes minutes at most; a pod stuck longer fails the attempt."""


def build_promotion_job(
    run: AgentRun, attempt: PlannedAttempt, config: OperatorConfig, winner: str, attempt_job: str
) -> dict[str, Any] | None:
    """The promotion Job of candidates' Job `attempt_job`, restoring checkpoint `winner`; None when the
    step has no checkpointed volume (validation refuses such a loop before any Job)."""
    step: WorkflowStep = (
        attempt.step if attempt.step is not None else effective_steps(run)[attempt.step_index - 1]
    )
    plan = attempt.checkpoint
    workload = effective_workload(run.spec.workload, step.workload)
    user = list(workload.volumes or [])
    path = attempt.control_path or control_path(step)
    holder = volume_holding(path, user)
    volume = checkpoint_volume(step.loop, user, holder)
    if plan is None or volume is None:
        return None
    claims = claim_volume(user, holder)
    excluded = excluded_paths(plan, volume, path, claims is not None and claims.name == volume.name)
    copies = posixpath.join(volume.mount_path, naming.CANDIDATES_DIR, plan.checkpoint_id)
    args = ["--root", volume.mount_path, "--checkpoint", winner, "--owner", plan.owner, "--copies", copies]
    args += ["--base", plan.checkpoint_id]  # the workspace is still the iteration's start
    for entry in excluded:
        args += ["--exclude", entry]
    mounts = [{"name": volume.name, "mountPath": volume.mount_path}]
    container = {
        **helper_container(workload_container_name(run), "promote", args, mounts, config),
        "securityContext": dict(CHECKPOINT_SECURITY_CONTEXT),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    claim: dict[str, Any] = {"claimName": volume.claim_name}
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "containers": [container],
        "volumes": [{"name": volume.name, "persistentVolumeClaim": claim}],
    }
    security = pod_security_context(volume, config)
    if security is not None:
        pod["securityContext"] = security
    if workload.node_selector:
        pod["nodeSelector"] = dict(workload.node_selector)
    if workload.tolerations:
        pod["tolerations"] = [t.to_dict() for t in workload.tolerations]
    affinity = same_node_affinity(attempt.prefer_node, volume)
    if affinity is not None:
        pod["affinity"] = affinity
    run_name = str(run.metadata.get("name", ""))
    labels = job_labels(run_name, step, attempt)
    annotations = {ANNOTATION_RUN_NAME: run_name}
    if attempt.path is not None:
        annotations[naming.ANNOTATION_STEP] = attempt.path
    spec = {
        "backoffLimit": 0,
        "completions": 1,
        "parallelism": 1,
        "activeDeadlineSeconds": PROMOTION_DEADLINE_SECONDS,
        "template": {"metadata": {"labels": dict(labels), "annotations": dict(annotations)}, "spec": pod},
    }
    return job_manifest(run, naming.promotion_job_name(attempt_job), labels, annotations, spec)
