"""The facts a plan reports (what happened, for metrics): one per transition, none on a re-plan."""

from __future__ import annotations

from datetime import datetime, timedelta

from prometheus_client import REGISTRY

from agentrun_operator.planner.actions import CreateJob, DeleteJob, SetJobTTL, Where
from agentrun_operator.planner.facts import (
    IterationFinished,
    LoopStopped,
    NextIterationRequested,
    RunPhaseChanged,
    StepEnded,
    UsageReported,
)
from agentrun_operator.shell import metrics
from tests.unit.planner.world import T0, PlannerWorld, loop_step, manifest


def facts_of(world: PlannerWorld) -> list[object]:
    return [fact for p in world.plans for fact in p.facts]


def test_a_fixed_loop_reports_each_iteration_the_loop_stop_and_the_run_phases() -> None:
    world = PlannerWorld(manifest([loop_step(max_iterations=2)]))
    world.drive(lambda w, job: w.succeed(job, control={"continue": True}))
    assert facts_of(world) == [
        RunPhaseChanged(None, "Running", None),
        IterationFinished("a", 1, 1, "Succeeded"),
        NextIterationRequested("a", 2, "run-step-1-iter-2-attempt-1", T0),
        IterationFinished("a", 2, 1, "Succeeded"),
        LoopStopped("a", "LoopMaxIterationsReached", 2),
        StepEnded("a", "a", "workload", 1, "Succeeded", "LoopMaxIterationsReached", None, 2),
        RunPhaseChanged("Running", "Succeeded", "Completed"),
    ]


def test_a_retried_then_failed_iteration_reports_retrying_then_failed() -> None:
    world = PlannerWorld(manifest([loop_step(max_iterations=3, retries=1, retryBackoffSeconds=0)]))
    world.drive(lambda w, job: w.fail(job))
    finished = [f for f in facts_of(world) if not isinstance(f, RunPhaseChanged)]
    assert finished == [
        IterationFinished("a", 1, 1, "Retrying"),
        IterationFinished("a", 1, 2, "Failed"),
        LoopStopped("a", "LoopIterationFailed", 0),
        StepEnded("a", "a", "workload", 1, "Failed", "LoopIterationFailed", None, 0),
    ]
    assert facts_of(world)[-1] == RunPhaseChanged("Running", "Failed", "LoopIterationFailed")


def test_a_step_without_a_loop_reports_iteration_one_and_no_loop_stop() -> None:
    world = PlannerWorld(manifest())
    world.drive(lambda w, job: w.succeed(job))
    assert [f for f in facts_of(world) if isinstance(f, IterationFinished | LoopStopped)] == [
        IterationFinished("a", 1, 1, "Succeeded")
    ]


def test_facts_match_the_events_one_for_one() -> None:
    world = PlannerWorld(manifest([loop_step(max_iterations=4, retries=1, retryBackoffSeconds=0)]))
    outcomes = iter(["fail", "ok", "ok", "fail", "fail"])

    def outcome(w: PlannerWorld, job: str) -> None:
        w.succeed(job, control={}) if next(outcomes, "ok") == "ok" else w.fail(job)

    world.drive(outcome)
    results = {
        "IterationSucceeded": "Succeeded",
        "IterationFailed": "Failed",
        "IterationRetrying": "Retrying",
    }
    from_events = [results[e.reason] for e in world.events if e.reason in results]
    from_facts = [f.result for f in facts_of(world) if isinstance(f, IterationFinished)]
    assert from_facts == from_events
    assert len([f for f in facts_of(world) if isinstance(f, LoopStopped)]) == world.event_reasons().count(
        "LoopCompleted"
    )


def test_replanning_the_persisted_status_reports_nothing_again() -> None:
    world = PlannerWorld(manifest([loop_step(max_iterations=2)]))
    world.plan()
    world.succeed(control={})
    assert world.plan().facts
    assert world.plan().facts == ()


def test_metrics_count_the_loop_stop_reason_whatever_the_step_is_called() -> None:
    """The counters read the facts: a step named like a stop reason cannot mislabel them."""

    def count(reason: str) -> float:
        return REGISTRY.get_sample_value("agentrun_loop_stops_total", {"reason": reason}) or 0.0

    before = count("LoopConditionFalse"), count("LoopyStep")
    metrics.observe_fact(LoopStopped("LoopyStep", "LoopConditionFalse", 3))
    assert (count("LoopConditionFalse"), count("LoopyStep")) == (before[0] + 1, before[1])


def test_metrics_count_iterations_by_result() -> None:
    def count(result: str) -> float:
        return REGISTRY.get_sample_value("agentrun_iterations_total", {"result": result}) or 0.0

    before = count("Retrying")
    metrics.observe_fact(IterationFinished("a", 1, 1, "Retrying"))
    metrics.observe_fact(RunPhaseChanged(None, "Running", None))
    assert count("Retrying") == before + 1


def test_metrics_sum_the_usage_reported() -> None:
    def sample(name: str) -> float:
        return REGISTRY.get_sample_value(name) or 0.0

    tokens, cost = sample("agentrun_tokens_total"), sample("agentrun_cost_usd_total")
    metrics.observe_fact(UsageReported("a", 400, 0.01))
    metrics.observe_fact(UsageReported("review/iteration 2/fix", 0, 0.25))
    assert sample("agentrun_tokens_total") == tokens + 400
    assert abs(sample("agentrun_cost_usd_total") - (cost + 0.26)) < 1e-9


def test_a_loop_reports_the_usage_of_each_succeeded_iteration_once() -> None:
    world = PlannerWorld(manifest([loop_step(max_iterations=3)]))
    usage = {"inputTokens": 30, "outputTokens": 12, "costUSD": 0.5}
    world.drive(lambda w, job: w.succeed(job, control={"usage": usage}))
    assert [f for f in facts_of(world) if isinstance(f, UsageReported)] == [UsageReported("a", 42, 0.5)] * 3


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_metrics_count_the_steps_of_a_loop_body_by_construct_and_the_depth_reached() -> None:
    body = {"name": "dev", "loop": {"maxIterations": 2}, "steps": [{"name": "implement"}, {"name": "review"}]}
    world = PlannerWorld(manifest([body]))
    world.drive(lambda w, job: w.succeed(job, control={}))
    assert world.phase == "Succeeded"
    children = {"construct": "workload", "loop": "false", "phase": "Succeeded"}
    bodies = {"construct": "group", "loop": "true", "phase": "Succeeded"}
    before = _sample("agentrun_steps_total", **children), _sample("agentrun_steps_total", **bodies)
    for fact in facts_of(world):
        metrics.observe_fact(fact)
    after = _sample("agentrun_steps_total", **children), _sample("agentrun_steps_total", **bodies)
    assert (after[0] - before[0], after[1] - before[1]) == (4, 1)  # 2 children x 2 passes; 1 body
    assert _sample("agentrun_nesting_depth_reached") >= 2


def test_metrics_count_the_branch_each_switch_took() -> None:
    def switch(value: str) -> dict[str, object]:
        cases = [{"value": "bug", "steps": [{"name": "fix"}]}]
        return {"name": "route", "switch": {"expression": f"'{value}'", "cases": cases}}

    def counts() -> tuple[float, float]:
        return _sample("agentrun_switch_cases_total", case="cases[0]"), _sample(
            "agentrun_switch_cases_total", case="none"
        )

    before = counts()
    for value in ("bug", "question"):  # the second matches no case and has no default
        world = PlannerWorld(manifest([switch(value)]))
        world.drive(lambda w, job: w.succeed(job, control={}))
        for fact in facts_of(world):
            metrics.observe_fact(fact)
    assert world.phase == "Failed"
    after = counts()
    assert (after[0] - before[0], after[1] - before[1]) == (1, 1)


def test_the_depth_reached_only_grows() -> None:
    metrics.observe_fact(
        StepEnded("a/b/c/d/e/f/g/h/i", "a/b/c/d/e/f/g/h/i", "workload", 9, "Succeeded", None)
    )
    metrics.observe_fact(StepEnded("a", "a", "workload", 1, "Succeeded", None))
    assert _sample("agentrun_nesting_depth_reached") == 9


# ----------------------------------------------------------------------------------- turnaround


def test_the_next_iteration_starts_its_turnaround_where_the_previous_pod_ended() -> None:
    world = PlannerWorld(manifest([loop_step(max_iterations=3)]))
    world.plan()
    world.advance(7)
    world.succeed(control={})  # the pod ends at T0 + 7 s
    world.advance(2)  # the operator sees it 2 s later
    requested = [f for f in world.plan().facts if isinstance(f, NextIterationRequested)]
    assert requested == [
        NextIterationRequested("a", 2, "run-step-1-iter-2-attempt-1", T0 + timedelta(seconds=7))
    ]


def test_retries_first_iterations_and_steps_without_a_loop_are_no_turnaround() -> None:
    world = PlannerWorld(
        manifest([loop_step(max_iterations=2, retries=1, retryBackoffSeconds=0), {"name": "b"}])
    )
    outcomes = iter(["fail", "ok", "ok", "ok"])
    world.drive(lambda w, job: w.succeed(job, control={}) if next(outcomes) == "ok" else w.fail(job))
    assert world.phase == "Succeeded"
    requested = [f for f in facts_of(world) if isinstance(f, NextIterationRequested)]
    # iteration 1 attempt 2 is a retry, step b is another step: only iteration 2 of the loop counts.
    assert [(f.step, f.iteration, f.job) for f in requested] == [("a", 2, "run-step-1-iter-2-attempt-1")]


def test_an_adopted_job_reports_no_turnaround_again() -> None:
    world = PlannerWorld(manifest([loop_step(max_iterations=2)]))
    world.plan()
    world.succeed(control={})
    lost = world.plan(persist=False)  # the Job is created, but the status write is lost
    assert any(isinstance(f, NextIterationRequested) for f in lost.facts)
    assert not any(isinstance(f, NextIterationRequested) for f in world.plan().facts)  # adopted


def test_metrics_observe_the_turnaround_only_for_a_job_created_now() -> None:
    def sample(suffix: str) -> float:
        return REGISTRY.get_sample_value(f"agentrun_iteration_turnaround_seconds_{suffix}") or 0.0

    ended = datetime(2026, 3, 1, 12, 0, 5, tzinfo=T0.tzinfo)
    fact = NextIterationRequested("a", 2, "job-2", ended)
    count, total = sample("count"), sample("sum")
    metrics.observe_fact(fact, {"job-2": ended + timedelta(milliseconds=250)})
    metrics.observe_fact(fact, {})  # adopted, not created: no sample
    metrics.observe_fact(fact, {"job-2": ended - timedelta(seconds=1)})  # clock skew: never negative
    assert sample("count") == count + 2
    assert abs(sample("sum") - (total + 0.25)) < 1e-9


def test_metrics_count_run_phase_transitions_with_their_reason() -> None:
    def count(phase: str, reason: str) -> float:
        labels = {"phase": phase, "reason": reason}
        return REGISTRY.get_sample_value("agentrun_run_phase_transitions_total", labels) or 0.0

    before = count("Running", ""), count("Failed", "LoopIterationFailed")
    metrics.observe_fact(RunPhaseChanged(None, "Running", None))
    metrics.observe_fact(RunPhaseChanged("Running", "Failed", "LoopIterationFailed"))
    assert (count("Running", ""), count("Failed", "LoopIterationFailed")) == (before[0] + 1, before[1] + 1)


# ----------------------------------------------------------------------------------- log fields


def test_events_and_job_actions_name_their_step_iteration_and_attempt() -> None:
    world = PlannerWorld(manifest([loop_step(max_iterations=2, retries=1, retryBackoffSeconds=0)]))
    outcomes = iter(["fail", "ok", "ok"])
    world.drive(lambda w, job: w.succeed(job, control={}) if next(outcomes) == "ok" else w.fail(job))
    world.plan()  # the finished run gives the last Job its TTL
    where = {(e.reason, e.where) for e in world.events}
    assert ("LoopStarted", Where("a", 0, 0)) in where
    assert ("IterationRetrying", Where("a", 1, 1)) in where
    assert ("IterationStarted", Where("a", 1, 2)) in where
    assert ("IterationSucceeded", Where("a", 2, 1)) in where
    assert ("LoopCompleted", Where("a", 2, 1)) in where
    assert ("RunSucceeded", None) in where
    ttls = [a for p in world.plans for a in p.actions if isinstance(a, SetJobTTL)]
    # The failed attempt 1 keeps its pod (pod GC OnPodSuccess, the default): no TTL.
    assert sorted((t.name, t.where) for t in ttls) == [
        ("run-step-1-iter-1-attempt-2", Where("a", 1, 2)),
        ("run-step-1-iter-2-attempt-1", Where("a", 2, 1)),
    ]
    creates = [a.where for p in world.plans for a in p.actions if hasattr(a, "manifest")]
    assert creates == [Where("a", 1, 1), Where("a", 1, 2), Where("a", 2, 1)]


def test_a_nested_steps_decisions_name_its_path_with_the_iteration_of_its_body() -> None:
    body = {"name": "dev", "loop": {"maxIterations": 2}, "steps": [{"name": "implement"}, {"name": "review"}]}
    world = PlannerWorld(manifest([body]))
    world.drive(lambda w, job: w.succeed(job, control={}))
    world.plan()  # the finished run gives the last Job its TTL
    assert world.phase == "Succeeded"
    review_2 = Where("dev/review", 1, 1, "dev/iteration 2/review")
    where = {(e.reason, e.where) for e in world.events}
    assert ("IterationStarted", review_2) in where
    assert ("IterationSucceeded", review_2) in where
    assert ("IterationSucceeded", Where("dev", 2, 0)) in where  # the body's pass: a top-level step
    creates = [a.where for p in world.plans for a in p.actions if isinstance(a, CreateJob)]
    assert creates == [
        Where(f"dev/{child}", 1, 1, f"dev/iteration {k}/{child}")
        for k in (1, 2)
        for child in ("implement", "review")
    ]
    ttls = [a.where for p in world.plans for a in p.actions if isinstance(a, SetJobTTL)]
    assert sorted(ttls, key=str) == sorted(creates, key=str)
    manifest_of = world.manifests["run-step-1i2-2-iter-1-attempt-1"]
    assert manifest_of["metadata"]["annotations"]["agents.proompteng.ai/step"] == "dev/iteration 2/review"


def test_a_deleted_job_names_its_attempt() -> None:
    world = PlannerWorld(manifest([loop_step(max_iterations=3)]))
    world.plan()
    world.spec_manifest["spec"]["cancel"] = "Immediate"
    deletes = [a for a in world.plan().actions if isinstance(a, DeleteJob)]
    assert [(d.name, d.where) for d in deletes] == [("run-step-1-iter-1-attempt-1", Where("a", 1, 1))]
