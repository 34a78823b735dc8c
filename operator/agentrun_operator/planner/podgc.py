"""Pod GC: which recorded attempts keep their Job (and so its pod and log), and for how long
(docs/api.md#podgc). In the spirit of Argo's `podGC`.

A Job is only ever removed by the TTL controller: this rule says which `ttlSecondsAfterFinished` a
recorded, ended Job should have (None: none, it stays until the run is deleted), and the gating code
turns a difference into a `SetJobTTL`. Strategies:

- `OnPodSuccess` (the default): a failed attempt keeps its pod (for `retentionSeconds` when set, else
  until the run is deleted); a succeeded one gets the installation's Job TTL, as before.
- `OnPodCompletion`: every recorded attempt gets the Job TTL (the behaviour before pod GC existed).
- `OnRunCompletion`: every pod stays while the run runs; once it finished, each gets the Job TTL.

At most `maxKeptPods` Jobs are kept per run: past it the oldest kept ones are released (they get the
Job TTL like a succeeded attempt), so a loop of 1,000 failing attempts cannot pile up pods.

A warm loop's Job is created with its TTL (`warm_creation_ttl`): it ends only after its loop's last
result is recorded (the pod is told to stop), so setting the TTL then would be a write per run for
nothing. Should it end otherwise (its pod died) and the policy keep it, that TTL is removed or
changed like any other (`ttl_changes`), once the status records what the pod left.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from agentrun_operator.api import AgentRun
from agentrun_operator.config import OperatorConfig


@dataclass(frozen=True)
class PodGCPolicy:
    """The effective policy of one run: its `spec.podGC` over the installation's settings."""

    strategy: str
    retention_seconds: int  # 0: a kept pod stays until the run is deleted
    max_kept_pods: int
    job_ttl_seconds: int  # what a Job that is not kept gets (AGENTS_CONTROLLER_JOB_TTL_SECONDS)


def policy_of(run: AgentRun, config: OperatorConfig) -> PodGCPolicy:
    """The run's own settings where it has them, else the installation's."""
    spec = run.spec.pod_gc
    strategy = spec.strategy if spec is not None and spec.strategy is not None else None
    retention = spec.retention_seconds if spec is not None else None
    kept = spec.max_kept_pods if spec is not None else None
    return PodGCPolicy(
        strategy=strategy or config.pod_gc_strategy,
        retention_seconds=config.pod_gc_retention_seconds if retention is None else retention,
        max_kept_pods=config.pod_gc_max_kept_pods if kept is None else kept,
        job_ttl_seconds=config.job_ttl_seconds_after_recorded,
    )


@dataclass(frozen=True)
class EndedJob:
    """A Job whose attempt ended and whose result is recorded: the only kind pod GC decides about."""

    name: str
    succeeded: bool
    ended_at: datetime | None
    ttl_seconds: int | None  # its current `ttlSecondsAfterFinished`
    warm: bool = False  # a warm loop's Job: created with its TTL, which may be removed


def _kept(policy: PodGCPolicy, job: EndedJob, run_finished: bool) -> bool:
    if policy.strategy == "OnPodSuccess":
        return not job.succeeded
    if policy.strategy == "OnRunCompletion":
        return not run_finished
    return False


def wanted_ttls(policy: PodGCPolicy, jobs: Iterable[EndedJob], run_finished: bool) -> dict[str, int | None]:
    """The TTL each Job should have (None: no TTL, kept until the run is deleted).

    Kept Jobs beyond `max_kept_pods` are released oldest first (by when they ended, then by name, so
    the choice is deterministic and stable across reconciles)."""
    listed = list(jobs)
    kept = [job for job in listed if _kept(policy, job, run_finished)]
    kept.sort(key=lambda j: (j.ended_at is not None, j.ended_at or datetime.min, j.name), reverse=True)
    keep = {job.name for job in kept[: policy.max_kept_pods]}
    # OnRunCompletion keeps pods only for the run's lifetime: no retention while it runs.
    retained = (policy.retention_seconds or None) if policy.strategy == "OnPodSuccess" else None
    return {job.name: retained if job.name in keep else policy.job_ttl_seconds for job in listed}


WARM_CREATION_TTL_FLOOR_SECONDS = 60
"""A warm Job gets its TTL at creation only when it is at least this long: should its pod die, the
operator has that long to read what the pod left (its termination message) before the Job goes."""


def warm_creation_ttl(policy: PodGCPolicy) -> int | None:
    """The `ttlSecondsAfterFinished` a warm loop's Job is created with: the one a succeeded attempt
    gets (`OnPodSuccess`, `OnPodCompletion`), None when pods are kept while the run runs
    (`OnRunCompletion`) or the TTL is below the floor (then it is set once the end is recorded)."""
    if policy.strategy == "OnRunCompletion" or policy.job_ttl_seconds < WARM_CREATION_TTL_FLOOR_SECONDS:
        return None
    return policy.job_ttl_seconds


def ttl_changes(
    policy: PodGCPolicy, jobs: Iterable[EndedJob], run_finished: bool
) -> list[tuple[str, int | None]]:
    """(Job name, TTL) for every Job whose TTL must be set, changed or (None) removed, in the order given.

    A cold Job's TTL is never removed: a Job that has one (set by an older operator or another policy)
    and should be kept without one keeps the TTL it has (docs/migration.md#pod-gc). A warm Job's is:
    it was given at creation, before anyone knew how the Job would end (`warm_creation_ttl`)."""
    listed = list(jobs)
    wanted = wanted_ttls(policy, listed, run_finished)
    changes: list[tuple[str, int | None]] = []
    for job in listed:
        ttl = wanted[job.name]
        if ttl is not None and job.ttl_seconds != ttl:
            changes.append((job.name, ttl))
        elif ttl is None and job.warm and job.ttl_seconds is not None:
            changes.append((job.name, None))
    return changes
