"""Properties of the planner on nested control flow (groups, loop bodies, switches, nested loops).

The same random worlds as test_properties (Job outcomes, restarts, lost writes, TTL sweeps, cancels)
on workflows whose loops are bodies of several children, at depth up to 4. After every operation:
never two live Jobs of the run; no Job of a body child created again once that child succeeded in
that iteration (its address names every ancestor's iteration, so this also says no iteration is
repeated after success); the status within its budget at any depth. A world that keeps completing
pods always brings the run to an end.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrun_operator.celeval import compile_expression
from agentrun_operator.config import OperatorConfig
from agentrun_operator.planner.conditions import exact_size
from agentrun_operator.planner.plan import plan, result_recorded
from tests.unit.planner.test_properties import OPS, TERMINAL, apply_op, finish
from tests.unit.planner.world import PlannerWorld, manifest

compile_expression("true")

BUDGET = 6 * 1024
CONFIG = OperatorConfig(
    loops_enabled=True, loop_max_iterations=50, loop_status_history_limit=6, status_budget_bytes=BUDGET
)


def _leaf(name: str, retries: int, always: bool) -> dict[str, Any]:
    step: dict[str, Any] = {"name": name, "retries": retries, "retryBackoffSeconds": 3, "timeoutSeconds": 30}
    if always:
        step["alwaysRun"] = True
    return step


@st.composite
def nested_specs(draw: st.DrawFn) -> dict[str, Any]:
    """prep, then a loop body (implement, an optional inner loop, an optional switch, review),
    wrapped in 0..2 plain groups (depth up to 4)."""
    children = [_leaf("implement", draw(st.integers(0, 1)), False)]
    if draw(st.booleans()):
        children.append({"name": "refine", "loop": {"maxIterations": draw(st.integers(1, 3))}})
    if draw(st.booleans()):
        switch = {
            "expression": "steps.implement.control.continue",
            "cases": [{"value": True, "steps": [_leaf("ship", 0, False)]}],
            "default": {"steps": [_leaf("repair", draw(st.integers(0, 1)), False)]},
        }
        children.append({"name": "route", "switch": switch})
    children.append(_leaf("review", draw(st.integers(0, 1)), draw(st.booleans())))
    loop: dict[str, Any] = {"maxIterations": draw(st.integers(1, 5))}
    if draw(st.booleans()):
        loop["condition"] = {
            "type": "cel",
            "expression": draw(
                st.sampled_from(
                    [
                        "iteration.last.control.continue == true",
                        "iteration.steps.review.control.continue == true",
                    ]
                )
            ),
            "source": {"onMissing": "stop", "onInvalid": draw(st.sampled_from(["fail", "stop"]))},
        }
    if draw(st.booleans()):
        loop["output"] = {"name": "notes", "expression": "iteration.index"}
    step: dict[str, Any] = {"name": "body", "loop": loop, "steps": children}
    for depth in range(draw(st.integers(0, 2))):
        step = {"name": f"wrap{depth}", "steps": [step]}
    return manifest([{"name": "prep"}, step])


@dataclass
class NestedChecker:
    """Invariants across the run; `succeeded` holds (address, iteration) of recorded successes."""

    succeeded: set[tuple[str, int]] = field(default_factory=set)
    succeeded_jobs: set[str] = field(default_factory=set)
    seen_created: int = 0
    terminal_phase: str | None = None

    def check(self, world: PlannerWorld) -> None:
        live = world.live_jobs()
        assert len(live) <= 1, f"two live Jobs in one run: {live}"
        for name in world.created[self.seen_created :]:
            job = world.jobs.get(name)
            if job is not None:
                key = (job.path or str(job.step_index), job.iteration)
                assert key not in self.succeeded, f"{name}: a child ran again after it succeeded"
        self.seen_created = len(world.created)
        status = world.status
        if status is None:
            return
        if self.terminal_phase is not None:
            assert status.phase == self.terminal_phase, "a finished run changed phase"
        elif status.phase in TERMINAL:
            self.terminal_phase = status.phase
        assert exact_size(status) <= BUDGET, f"status over its budget: {exact_size(status)}"

    def mark_succeeded(self, world: PlannerWorld, name: str) -> None:
        job = world.jobs[name]
        if result_recorded(world.status, job):
            return
        self.succeeded.add((job.path or str(job.step_index), job.iteration))
        self.succeeded_jobs.add(name)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=nested_specs(), ops=st.lists(OPS, min_size=40, max_size=200))
def test_nested_worlds_keep_the_invariants_and_always_finish(spec: dict[str, Any], ops: list[Any]) -> None:
    world = PlannerWorld(spec, config=CONFIG)
    checker = NestedChecker()
    for op in ops:
        apply_op(world, checker, op)
        checker.check(world)
    finish(world, checker, max_plans=600)  # nested runs take more plans


def test_a_failed_nested_run_whose_message_chains_its_steps_stays_within_budget() -> None:
    """Found by the property above: a switch child four levels down fails for good, and its failure
    text is repeated by every entry above it (switch, loop body and its iteration record, two groups,
    the run), each with its own prefix. Nothing is left to drop (no outputs, the one record left is
    the body's newest failure), so only clipping the messages keeps the status within its budget."""
    switch = {
        "expression": "steps.implement.control.continue",
        "cases": [{"value": True, "steps": [_leaf("ship", 0, False)]}],
        "default": {"steps": [_leaf("repair", 1, False)]},
    }
    children = [
        _leaf("implement", 0, False),
        {"name": "refine", "loop": {"maxIterations": 1}},
        {"name": "route", "switch": switch},
        _leaf("review", 0, False),
    ]
    body = {"name": "body", "loop": {"maxIterations": 1}, "steps": children}
    spec = manifest([{"name": "prep"}, {"name": "wrap1", "steps": [{"name": "wrap0", "steps": [body]}]}])
    ops = [("plan", 0)] * 30 + [("succeed", 0), ("plan", 0), ("succeed", 2), ("plan", 0), ("succeed", 0)]
    ops += [("plan", 0), ("fail", 0), ("advance", 1), ("plan", 0), ("fail", 0)]
    world = PlannerWorld(spec, config=CONFIG)
    checker = NestedChecker()
    for op in ops:
        apply_op(world, checker, op)
        checker.check(world)
    finish(world, checker, max_plans=600)
    assert world.status is not None and world.phase == "Failed"
    assert world.status.message is not None and "step repair failed" in world.status.message
    body_status = world.step_status(1).steps[0].steps[0]
    assert body_status.name == "body" and body_status.phase == "Failed"
    assert [r.phase for r in body_status.loop.iterations] == ["Failed"]  # the newest failure is kept


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=nested_specs(), ops=st.lists(OPS, min_size=5, max_size=80))
def test_replanning_a_nested_world_without_change_is_quiet(spec: dict[str, Any], ops: list[Any]) -> None:
    world = PlannerWorld(spec, config=CONFIG)
    checker = NestedChecker()
    for op in ops:
        apply_op(world, checker, op)
    world.plan()
    world.plan()
    before = world.status
    again = world.plan()
    assert again.status == before
    kinds = {type(a).__name__ for a in again.actions}
    assert kinds <= {"Requeue", "DeleteJob", "SetJobTTL"}, kinds


def _body_run(iterations: int, config: OperatorConfig) -> PlannerWorld:
    body = {
        "name": "develop-until-approved",
        "loop": {"maxIterations": iterations},
        "steps": [{"name": "implement"}, {"name": "test"}, {"name": "review"}],
    }
    world = PlannerWorld(manifest([body], name="r" * 40), config=config)

    def outcome(w: PlannerWorld, job: str) -> None:
        w.succeed(job, control={"continue": True, "notes": "n" * 200})
        w.ttl_sweep()

    world.drive(outcome, max_plans=20 * iterations)
    return world


def test_a_1000_iteration_body_of_3_children_keeps_its_status_bounded() -> None:
    config = OperatorConfig(loops_enabled=True, loop_max_iterations=1000, loop_status_history_limit=50)
    world = _body_run(1000, config)
    assert world.phase == "Succeeded" and world.status is not None
    loop = world.step_status().loop
    assert loop.completed_iterations == 1000 and loop.retained_iterations == 50
    assert loop.pruned_iterations == 950
    assert all(
        r.steps == {"implement": "Succeeded", "test": "Succeeded", "review": "Succeeded"}
        for r in loop.iterations
    )
    assert exact_size(world.status) <= 32 * 1024, exact_size(world.status)


def test_a_small_budget_compacts_a_body_without_failing_it() -> None:
    config = OperatorConfig(
        loops_enabled=True, loop_max_iterations=1000, loop_status_history_limit=1000, status_budget_bytes=4096
    )
    world = _body_run(60, config)
    assert world.phase == "Succeeded" and world.status is not None
    loop = world.step_status().loop
    assert loop.completed_iterations == 60 and loop.pruned_iterations > 0
    assert exact_size(world.status) <= 4096
    assert any(c.type == "StatusSizeWarning" and c.status == "True" for c in world.status.conditions)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=nested_specs(), ops=st.lists(OPS, min_size=5, max_size=60))
def test_planning_a_nested_run_never_mutates_the_run_it_is_given(
    spec: dict[str, Any], ops: list[Any]
) -> None:
    """The children's status entries are copied too (the shell reuses one parsed run per version)."""
    world = PlannerWorld(spec, config=CONFIG)
    checker = NestedChecker()
    for op in ops:
        apply_op(world, checker, op)
    run = world.agentrun()
    before = run.model_dump(by_alias=True, mode="json")
    plan(run, world.observed(), world.now, CONFIG)
    plan(run, world.observed(), world.now, CONFIG)
    assert run.model_dump(by_alias=True, mode="json") == before
