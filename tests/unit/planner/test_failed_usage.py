"""Usage of failed attempts: a failed (or timed-out) attempt's control file may carry `usage`, which
counts toward `loop.budget` and `goal.tokenBudget` and shows in status like a success's
(docs/concepts.md#usage-and-budgets), driven through the real planner."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrun_operator.api import Usage
from tests.unit.planner.world import PlannerWorld, envelope_found, envelope_status, loop_step, manifest


def _usage(inp: int, out: int = 0, cost: float = 0.0, **control: Any) -> dict[str, Any]:
    return {**control, "usage": {"inputTokens": inp, "outputTokens": out, "costUSD": cost}}


def _totals(usage: Usage | None) -> tuple[int, int, float]:
    assert usage is not None
    return usage.input_tokens, usage.output_tokens, usage.cost_usd


def _run_usage(world: PlannerWorld) -> Usage | None:
    assert world.status is not None and world.status.workflow is not None
    return world.status.workflow.usage


def _retrying(name: str = "a", iterations: int = 3, retries: int = 2, **loop: Any) -> dict[str, Any]:
    step = loop_step(name, iterations, expression="true", loop=loop)
    return {**step, "retries": retries, "retryBackoffSeconds": 10}


def _one_attempt(world: PlannerWorld, fail: bool, **kwargs: Any) -> str:
    """Plan until an attempt's Job is live, then end it; its name."""
    for _ in range(20):
        world.plan()
        if world.live_jobs():
            break
        world.settle()
        world.advance(world.last_requeue or 1.0)
    job = world.active()
    if fail:
        world.fail(job, **kwargs)
    else:
        world.succeed(job, **kwargs)
    world.plan()
    return job


def test_a_failed_attempts_usage_is_summed_per_iteration_step_and_run() -> None:
    world = PlannerWorld(manifest([_retrying()]))
    _one_attempt(world, True, control=_usage(10, 5, 0.25))
    step = world.step_status()
    assert step.phase == "Retrying"
    assert _totals(step.loop.iterations[0].usage) == (10, 5, 0.25)
    _one_attempt(world, False, control=_usage(1, 2, 0.5, **{"continue": True}))
    step = world.step_status()
    assert _totals(step.loop.iterations[0].usage) == (11, 7, 0.75)
    assert _totals(step.usage) == (11, 7, 0.75)
    assert _totals(_run_usage(world)) == (11, 7, 0.75)


def test_a_step_without_a_loop_counts_its_failed_attempts() -> None:
    world = PlannerWorld(manifest([{"name": "a", "retries": 1, "retryBackoffSeconds": 10}]))
    _one_attempt(world, True, control=_usage(100))
    _one_attempt(world, False, control=_usage(1))
    assert world.phase == "Succeeded"
    assert _totals(world.step_status().usage) == (101, 0, 0.0)
    assert _totals(_run_usage(world)) == (101, 0, 0.0)


def test_the_last_failed_attempt_counts_and_the_iteration_still_fails() -> None:
    world = PlannerWorld(manifest([_retrying(retries=0)]))
    _one_attempt(world, True, control=_usage(7))
    step = world.step_status()
    assert world.phase == "Failed" and step.reason == "LoopIterationFailed"
    assert _totals(step.usage) == (7, 0, 0.0) and _totals(_run_usage(world)) == (7, 0, 0.0)


@pytest.mark.parametrize(
    ("budget", "usage", "reached"),
    [
        ({"maxTokens": 100}, _usage(60, 40), "100 tokens of maxTokens 100"),
        ({"maxCostUSD": 1.0}, _usage(1, 0, 1.5), "1.5 USD of maxCostUSD 1"),
    ],
)
def test_a_failed_attempt_that_spends_the_loop_budget_gets_no_retry(
    budget: dict[str, Any], usage: dict[str, Any], reached: str
) -> None:
    world = PlannerWorld(manifest([_retrying(budget=budget)]))
    job = _one_attempt(world, True, control=usage)
    step = world.step_status()
    assert world.phase == "Failed"
    assert step.reason == "LoopBudgetExhausted" and step.loop.stop_reason == "LoopBudgetExhausted"
    assert step.loop.iterations[0].phase == "Failed"
    assert "iteration 1 attempt 1 failed: main container exited with code 1" in step.message
    assert f"no retry: budget exhausted ({reached}); onBudgetExhausted: Fail" in step.message
    assert world.created == [job]


def test_on_budget_exhausted_succeed_after_a_failed_attempt_lets_the_run_go_on() -> None:
    loop = {"budget": {"maxTokens": 10}, "onBudgetExhausted": "Succeed"}
    world = PlannerWorld(manifest([_retrying(**loop), loop_step("b", 1)]))
    world.drive(lambda w, job: w.fail(job, control=_usage(10)) if "-step-1-" in job else w.succeed(job))
    assert world.phase == "Succeeded"
    assert world.step_status(0).reason == "LoopBudgetExhausted"
    assert world.step_status(1).phase == "Succeeded"


def test_a_failed_attempt_that_spends_the_goal_budget_stops_the_run() -> None:
    world = PlannerWorld(
        manifest([_retrying(), loop_step("b", 1)], goal={"objective": "o", "tokenBudget": 50})
    )
    job = _one_attempt(world, True, control=_usage(30, 30))
    assert world.phase == "Failed"
    assert world.status is not None and world.status.reason == "GoalTokenBudgetExhausted"
    assert "60 of 50 tokens" in (world.status.message or "")
    assert world.step_status(0).phase == "Cancelled" and world.step_status(1).phase == "Pending"
    assert world.created == [job]


def test_without_the_failed_attempts_usage_the_goal_budget_would_not_be_spent() -> None:
    world = PlannerWorld(manifest([_retrying()], goal={"objective": "o", "tokenBudget": 50}))
    _one_attempt(world, True, control=_usage(49))
    assert world.step_status().phase == "Retrying"
    _one_attempt(world, True, control=_usage(1))
    assert world.status is not None and world.status.reason == "GoalTokenBudgetExhausted"


@pytest.mark.parametrize(
    "report",
    [
        envelope_status("stale", "the control file was not rewritten by this attempt"),
        envelope_status("missing", "no file"),
        envelope_status("invalid", "invalid JSON at line 1 column 2"),
        "not an envelope",
        None,
    ],
)
def test_a_failed_attempt_without_a_fresh_control_file_counts_nothing(report: str | None) -> None:
    world = PlannerWorld(manifest([_retrying()]))
    _one_attempt(world, True, report=report)
    step = world.step_status()
    assert step.phase == "Retrying" and step.usage is None and _run_usage(world) is None


@pytest.mark.parametrize(("on_invalid", "phase"), [("fail", "Failed"), ("stop", "Succeeded")])
@pytest.mark.parametrize("bad", ["many", -1, 1.5, True, None, [1], {"n": 1}])
def test_usage_that_is_not_a_number_in_a_failed_attempt_follows_on_invalid(
    on_invalid: str, phase: str, bad: Any
) -> None:
    step_spec = {**loop_step("a", 3, expression="true", on_invalid=on_invalid), "retries": 2}
    world = PlannerWorld(manifest([step_spec]))
    job = _one_attempt(world, True, control={"usage": {"inputTokens": bad}})
    step = world.step_status()
    assert step.phase == phase and step.reason == "LoopConditionError"
    assert step.loop.iterations[0].phase == "Failed"
    assert "iteration 1 attempt 1 failed: main container exited with code 1" in step.message
    assert "its control file: usage.inputTokens must be" in step.message
    assert f"onInvalid: {on_invalid}" in step.message
    assert world.created == [job]  # no retry: the loop's policy ended it
    assert _run_usage(world) is None


def test_usage_that_is_not_an_object_in_a_failed_attempt_follows_on_invalid() -> None:
    world = PlannerWorld(manifest([_retrying()]))
    _one_attempt(world, True, control={"usage": "lots"})
    step = world.step_status()
    assert step.phase == "Failed" and step.reason == "LoopConditionError"
    assert "usage must be an object" in step.message


def test_a_step_without_a_loop_ignores_unusable_usage_of_a_failed_attempt_and_retries() -> None:
    world = PlannerWorld(manifest([{"name": "a", "retries": 1, "retryBackoffSeconds": 10}]))
    _one_attempt(world, True, control={"usage": {"inputTokens": "many"}})
    assert world.step_status().phase == "Retrying"


def test_a_failed_attempts_usage_is_counted_once_when_a_plan_is_replayed() -> None:
    world = PlannerWorld(manifest([_retrying()]))
    world.plan()
    world.fail(control=_usage(10))
    world.plan(persist=False)  # the status write is lost: the next plan starts from the same status
    world.plan()
    world.plan()
    assert _totals(world.step_status().usage) == (10, 0, 0.0)
    assert _totals(_run_usage(world)) == (10, 0, 0.0)


def test_a_duplicate_pod_that_never_ran_main_does_not_count() -> None:
    from dataclasses import replace

    from agentrun_operator.planner.observed import ObservedPod

    world = PlannerWorld(manifest([_retrying()]))
    world.plan()
    job = world.active()
    world.fail(job, control=_usage(5))
    world.pods[f"{job}-dup"] = ObservedPod(
        name=f"{job}-dup", job_name=job, phase="Failed", reporter_message=envelope_found(_usage(1000))
    )
    world.pods[f"{job}-pod"] = replace(world.pods[f"{job}-pod"], finished_at=None)
    world.plan()
    assert _totals(world.step_status().usage) == (5, 0, 0.0)


def test_a_timed_out_attempt_counts_what_its_pod_reported_when_the_timeout_is_recorded() -> None:
    from dataclasses import replace

    world = PlannerWorld(manifest([{**_retrying(), "timeoutSeconds": 60}]))
    world.plan()
    job = world.active()
    world.deadline(job)  # the pod is being killed; here its reporter has reported already
    pod = f"{job}-pod"
    world.pods[pod] = replace(
        world.pods[pod], main_exit_code=143, reporter_message=envelope_found(_usage(40))
    )
    world.plan()
    step = world.step_status()
    assert step.phase == "Retrying" and "timed out after 60s" in (step.message or "")
    assert _totals(step.usage) == (40, 0, 0.0)


def test_a_timeout_is_recorded_at_once_even_before_its_pod_reports() -> None:
    """docs/design.md#job-lifecycle: the timeout is recorded while the pod still stops; what it
    reports afterwards is not waited for (docs/concepts.md#usage-and-budgets)."""
    world = PlannerWorld(manifest([{**_retrying(), "timeoutSeconds": 60}]))
    world.plan()
    world.deadline()
    world.plan()
    assert world.step_status().phase == "Retrying" and world.step_status().usage is None


# ------------------------------------------------------------------------------------- properties

_ATTEMPT = st.tuples(st.sampled_from(["succeed", "fail", "fail-silent"]), st.integers(0, 40))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(outcomes=st.lists(_ATTEMPT, min_size=1, max_size=12), budget=st.none() | st.integers(1, 150))
def test_every_reported_attempt_counts_exactly_once_and_the_budget_stops_the_loop(
    outcomes: list[tuple[str, int]], budget: int | None
) -> None:
    loop: dict[str, Any] = {"budget": {"maxTokens": budget}} if budget is not None else {}
    world = PlannerWorld(manifest([_retrying("a", 4, retries=2, **loop)]))
    queue = list(outcomes)
    counted: list[int] = []

    def outcome(w: PlannerWorld, job: str) -> None:
        kind, tokens = queue.pop(0) if queue else ("succeed", 0)
        control = _usage(tokens, **{"continue": True})
        if kind == "succeed":
            w.succeed(job, control=control)
        elif kind == "fail":
            w.fail(job, control=control)
        else:
            w.fail(job)
        counted.append(0 if kind == "fail-silent" else tokens)

    world.drive(outcome)
    step = world.step_status()
    total = sum(counted)
    used = step.usage.tokens if step.usage is not None else 0
    assert used == total
    assert (_run_usage(world).tokens if _run_usage(world) is not None else 0) == total  # type: ignore[union-attr]
    assert sum(r.usage.tokens for r in step.loop.iterations if r.usage is not None) == total
    if budget is not None:
        # no attempt started once the budget was reached: only the last one may have reached it
        assert sum(counted[:-1]) < budget
        if total >= budget:
            # the budget, or an end that came with the same attempt: its last retry, or the cap
            assert step.reason in ("LoopBudgetExhausted", "LoopIterationFailed", "LoopMaxIterationsReached")
    if step.reason == "LoopBudgetExhausted":
        assert budget is not None and total >= budget


@settings(max_examples=40, deadline=None)
@given(
    value=st.recursive(
        st.none()
        | st.booleans()
        | st.integers(-5, 5)
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=5),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
        max_leaves=5,
    ),
    field=st.sampled_from(["inputTokens", "outputTokens", "costUSD"]),
)
def test_any_usage_value_in_a_failed_attempt_is_counted_or_follows_on_invalid(value: Any, field: str) -> None:
    # no infinities: a control file is strict JSON (control/envelope.py refuses NaN/Infinity/1e999),
    # so no usage value read from one is ever infinite
    world = PlannerWorld(manifest([_retrying()]))
    world.plan()
    world.fail(control={"usage": {field: value}})
    world.plan()  # never raises
    step = world.step_status()
    number = isinstance(value, int | float) and not isinstance(value, bool) and value >= 0
    whole = number and (field == "costUSD" or value == int(value))
    if number and whole:
        assert step.phase == "Retrying"
    else:
        assert step.phase == "Failed" and step.reason == "LoopConditionError"
        assert f"usage.{field} must be" in (step.message or "")
