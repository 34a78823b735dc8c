"""Pod GC (planner/podgc.py): which recorded attempts keep their Job and pod, and which get a TTL."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from agentrun_operator.api import parse_agentrun
from agentrun_operator.config import ConfigError, OperatorConfig
from agentrun_operator.planner.podgc import (
    WARM_CREATION_TTL_FLOOR_SECONDS,
    EndedJob,
    PodGCPolicy,
    policy_of,
    ttl_changes,
    wanted_ttls,
    warm_creation_ttl,
)
from tests.unit.planner.world import PlannerWorld, loop_step, manifest

T0 = datetime(2026, 11, 28, 5, 0, tzinfo=UTC)


def policy(strategy: str = "OnPodSuccess", retention: int = 0, kept: int = 10, ttl: int = 300) -> PodGCPolicy:
    return PodGCPolicy(strategy, retention, kept, ttl)


def job(name: str, succeeded: bool, minute: int, ttl: int | None = None) -> EndedJob:
    return EndedJob(name, succeeded, T0 + timedelta(minutes=minute), ttl)


def test_on_pod_success_keeps_failed_pods_and_gives_succeeded_ones_the_job_ttl() -> None:
    jobs = [job("fail-1", False, 1), job("ok-2", True, 2)]
    assert wanted_ttls(policy(), jobs, run_finished=False) == {"fail-1": None, "ok-2": 300}
    assert ttl_changes(policy(), jobs, run_finished=True) == [("ok-2", 300)]


def test_a_retention_gives_kept_pods_that_ttl() -> None:
    jobs = [job("fail-1", False, 1), job("ok-2", True, 2)]
    assert ttl_changes(policy(retention=3600), jobs, run_finished=False) == [("fail-1", 3600), ("ok-2", 300)]
    # Already set: nothing to write again (one write per Job, not one per reconcile).
    done = [job("fail-1", False, 1, ttl=3600), job("ok-2", True, 2, ttl=300)]
    assert ttl_changes(policy(retention=3600), done, run_finished=False) == []


def test_on_pod_completion_gives_every_attempt_the_job_ttl() -> None:
    jobs = [job("fail-1", False, 1), job("ok-2", True, 2)]
    assert ttl_changes(policy("OnPodCompletion"), jobs, run_finished=False) == [
        ("fail-1", 300),
        ("ok-2", 300),
    ]


def test_on_run_completion_keeps_every_pod_until_the_run_finished() -> None:
    jobs = [job("fail-1", False, 1), job("ok-2", True, 2)]
    assert ttl_changes(policy("OnRunCompletion", retention=60), jobs, run_finished=False) == []
    assert ttl_changes(policy("OnRunCompletion"), jobs, run_finished=True) == [("fail-1", 300), ("ok-2", 300)]


def test_past_the_bound_the_oldest_kept_pods_are_released() -> None:
    jobs = [job(f"fail-{k}", False, k) for k in range(1, 1001)]
    wanted = wanted_ttls(policy(kept=3), jobs, run_finished=False)
    assert [name for name, ttl in wanted.items() if ttl is None] == ["fail-998", "fail-999", "fail-1000"]
    assert len(ttl_changes(policy(kept=3), jobs, run_finished=False)) == 997
    # A released Job that had the (longer) retention gets the Job TTL instead.
    held = [job("fail-1", False, 1, ttl=3600), job("fail-2", False, 2, ttl=3600)]
    assert ttl_changes(policy(retention=3600, kept=1), held, run_finished=False) == [("fail-1", 300)]
    assert wanted_ttls(policy(kept=0), held, run_finished=False) == {"fail-1": 300, "fail-2": 300}


def test_a_ttl_is_never_removed() -> None:
    """A Job an older operator gave a TTL keeps it: the rule only sets or shortens, never unsets."""
    assert ttl_changes(policy(), [job("fail-1", False, 1, ttl=300)], run_finished=False) == []


def test_the_run_wins_over_the_installation() -> None:
    config = OperatorConfig(
        pod_gc_strategy="OnPodCompletion", pod_gc_retention_seconds=60, pod_gc_max_kept_pods=5
    )
    doc = manifest([loop_step(max_iterations=2)])
    assert policy_of(parse_agentrun(doc), config) == PodGCPolicy("OnPodCompletion", 60, 5, 300)
    doc["spec"]["podGC"] = {"strategy": "OnRunCompletion", "maxKeptPods": 2}
    assert policy_of(parse_agentrun(doc), config) == PodGCPolicy("OnRunCompletion", 60, 2, 300)


def test_the_installation_setting_is_read_and_checked() -> None:
    env = {
        "AGENTS_CONTROLLER_POD_GC_STRATEGY": "OnRunCompletion",
        "AGENTS_CONTROLLER_POD_GC_RETENTION_SECONDS": "600",
        "AGENTS_CONTROLLER_POD_GC_MAX_KEPT_PODS": "3",
    }
    config = OperatorConfig.from_env(env)
    assert (config.pod_gc_strategy, config.pod_gc_retention_seconds, config.pod_gc_max_kept_pods) == (
        "OnRunCompletion",
        600,
        3,
    )
    for key, value in (
        ("AGENTS_CONTROLLER_POD_GC_STRATEGY", "Never"),
        ("AGENTS_CONTROLLER_POD_GC_RETENTION_SECONDS", "-1"),
        ("AGENTS_CONTROLLER_POD_GC_RETENTION_SECONDS", "99999999999"),
    ):
        try:
            OperatorConfig.from_env({key: value})
        except ConfigError as exc:
            assert key in str(exc)
        else:
            raise AssertionError(f"{key}={value} was accepted")


def test_a_failing_loop_keeps_its_failed_pods_through_the_planner() -> None:
    """The rule as the planner applies it: a loop whose attempts all fail gives none of them a TTL,
    except those past the bound."""
    doc = manifest([loop_step(max_iterations=1, retries=4, retryBackoffSeconds=0)])
    doc["spec"]["podGC"] = {"maxKeptPods": 2}
    world = PlannerWorld(doc)
    world.drive(lambda w, job: w.fail(job))
    world.plan()
    assert world.phase == "Failed"
    ttls = sorted(a.name for p in world.plans for a in p.actions if type(a).__name__ == "SetJobTTL")
    assert ttls == [
        "run-step-1-iter-1-attempt-1",
        "run-step-1-iter-1-attempt-2",
        "run-step-1-iter-1-attempt-3",
    ]


def test_a_warm_job_is_created_with_the_ttl_a_succeeded_attempt_gets_where_the_policy_allows() -> None:
    assert warm_creation_ttl(policy("OnPodSuccess")) == 300
    assert warm_creation_ttl(policy("OnPodCompletion")) == 300
    assert warm_creation_ttl(policy("OnRunCompletion")) is None  # kept while the run runs
    assert warm_creation_ttl(policy(ttl=WARM_CREATION_TTL_FLOOR_SECONDS)) == WARM_CREATION_TTL_FLOOR_SECONDS
    assert warm_creation_ttl(policy(ttl=WARM_CREATION_TTL_FLOOR_SECONDS - 1)) is None  # set once recorded


def test_a_kept_warm_jobs_creation_ttl_is_removed_or_changed_a_cold_ones_never_removed() -> None:
    warm_failed = EndedJob("warm-1", False, T0, 300, warm=True)
    cold_failed = EndedJob("cold-1", False, T0, 300)
    assert ttl_changes(policy(), [warm_failed, cold_failed], run_finished=False) == [("warm-1", None)]
    assert ttl_changes(policy(retention=3600), [warm_failed], run_finished=False) == [("warm-1", 3600)]
    # A succeeded warm Job already has what it should: no write at its end.
    assert ttl_changes(policy(), [EndedJob("warm-2", True, T0, 300, warm=True)], run_finished=True) == []
    # Released past maxKeptPods: the TTL comes back.
    removed = EndedJob("warm-1", False, T0, None, warm=True)
    newer = EndedJob("warm-3", False, T0 + timedelta(minutes=1), None, warm=True)
    assert ttl_changes(policy(kept=1), [removed, newer], run_finished=False) == [("warm-1", 300)]
