"""The facts a plan reports (what happened, for metrics): one per transition, none on a re-plan."""

from __future__ import annotations

from prometheus_client import REGISTRY

from agentrun_operator.planner.facts import IterationFinished, LoopStopped, RunPhaseChanged
from agentrun_operator.shell import metrics
from tests.unit.planner.world import PlannerWorld, loop_step, manifest


def facts_of(world: PlannerWorld) -> list[object]:
    return [fact for p in world.plans for fact in p.facts]


def test_a_fixed_loop_reports_each_iteration_the_loop_stop_and_the_run_phases() -> None:
    world = PlannerWorld(manifest([loop_step(max_iterations=2)]))
    world.drive(lambda w, job: w.succeed(job, control={"continue": True}))
    assert facts_of(world) == [
        RunPhaseChanged(None, "Running", None),
        IterationFinished("a", 1, 1, "Succeeded"),
        IterationFinished("a", 2, 1, "Succeeded"),
        LoopStopped("a", "LoopMaxIterationsReached", 2),
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
