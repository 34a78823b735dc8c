"""loop.candidates in the iteration pod (docs/concepts.md#candidates): one Indexed Job runs the
iteration's candidates at once, each pod `main` working on its own copy of the iteration's start
checkpoint, and the Job that puts the winner's files into the workspace afterwards. Pure."""

from __future__ import annotations

import posixpath
from typing import Any, Final

from agentrun_operator import naming
from agentrun_operator.api import WorkloadVolume
from agentrun_operator.jobs.checkpoint_args import CheckpointPlan

INDEX_ENV: Final = "JOB_COMPLETION_INDEX"
"""The Job controller's name for a pod's completion index; the builder sets it too, so both
containers can use `$(JOB_COMPLETION_INDEX)` whatever adds it first."""
CANDIDATE_ENV: Final = "AGENTRUN_CANDIDATE"
"""What `main` reads to know which candidate it is (0-based)."""
INDEX_FIELD: Final = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
INDEX_REF: Final = f"$({INDEX_ENV})"


def _index_env(name: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": INDEX_FIELD}}}


def candidate_subpath(plan: CheckpointPlan) -> str:
    """The candidate's copy, relative to the checkpointed volume's root (`$(JOB_COMPLETION_INDEX)`
    left for the kubelet to expand)."""
    return posixpath.join(naming.CANDIDATES_DIR, plan.checkpoint_id, INDEX_REF)


JOB_NAME_LABEL: Final = "batch.kubernetes.io/job-name"
HOSTNAME_TOPOLOGY: Final = "kubernetes.io/hostname"


def candidates_job_spec(job_spec: dict[str, Any], count: int, job_name: str) -> None:
    """An Indexed Job of `count` pods at once. `backoffLimitPerIndex: 0`: a failed candidate is not
    run again and does not stop the others (the planner's retries rerun the whole iteration).

    The pods must share the node: their copies are on one claim, which a ReadWriteOnce volume gives
    to one node. A required pod affinity to the Job's own pods puts every candidate where the first
    one went (the scheduler lets the first pod match its own term)."""
    job_spec.pop("backoffLimit", None)
    job_spec["completions"] = count
    job_spec["parallelism"] = count
    job_spec["completionMode"] = "Indexed"
    job_spec["backoffLimitPerIndex"] = 0
    pod = job_spec["template"]["spec"]
    term = {"labelSelector": {"matchLabels": {JOB_NAME_LABEL: job_name}}, "topologyKey": HOSTNAME_TOPOLOGY}
    affinity = pod.setdefault("affinity", {})
    affinity["podAffinity"] = {"requiredDuringSchedulingIgnoredDuringExecution": [term]}


def add_candidates(
    reporter: dict[str, Any], main: dict[str, Any], plan: CheckpointPlan, volume: WorkloadVolume
) -> None:
    """`main` mounts its candidate's copy where the volume belongs; the reporter (which mounts the
    whole volume) reads the control file from the copy and is told the copy and the end checkpoint to
    record (control/checkpointing.py)."""
    sub = candidate_subpath(plan)
    for mount in main.get("volumeMounts") or []:
        if mount["name"] == volume.name and mount["mountPath"] == volume.mount_path:
            mount["subPathExpr"] = sub
    main["env"] = [_index_env(INDEX_ENV), _index_env(CANDIDATE_ENV), *main.get("env", [])]
    reporter["env"] = [_index_env(INDEX_ENV), *reporter.get("env", [])]
    copy = posixpath.join(volume.mount_path, sub)
    args = list(reporter["args"])
    where = args.index("--path") + 1
    args[where] = _inside_copy(args[where], volume.mount_path, copy)
    args += [
        "--candidate-index",
        INDEX_REF,
        "--candidate-dir",
        copy,
        "--candidate-checkpoint",
        naming.candidate_checkpoint_id(plan.checkpoint_id, INDEX_REF),
    ]
    reporter["args"] = args


def _inside_copy(path: str, root: str, copy: str) -> str:
    """A path `main` writes under the volume's mountPath, as the reporter finds it in the copy."""
    base = root.rstrip("/") or "/"
    if base == "/" or path.startswith(base + "/"):
        return posixpath.join(copy, path[len(base) :].lstrip("/"))
    return path
