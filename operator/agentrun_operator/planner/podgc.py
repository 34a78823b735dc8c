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


def ttl_changes(policy: PodGCPolicy, jobs: Iterable[EndedJob], run_finished: bool) -> list[tuple[str, int]]:
    """(Job name, TTL) for every Job whose TTL must be set or changed, in the order given.

    A TTL is never removed: a Job that has one (set by an older operator or another policy) and should
    be kept without one keeps the TTL it has (docs/migration.md#pod-gc)."""
    listed = list(jobs)
    wanted = wanted_ttls(policy, listed, run_finished)
    changes: list[tuple[str, int]] = []
    for job in listed:
        ttl = wanted[job.name]
        if ttl is not None and job.ttl_seconds != ttl:
            changes.append((job.name, ttl))
    return changes
