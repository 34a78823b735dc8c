"""Properties of the planner under random worlds (hypothesis).

Random sequences of Job/Pod outcomes (success with various control payloads, failure, deadline,
vanish), operator restarts, lost status writes, lost actions and cancellations are applied to a
`PlannerWorld`; after every step the safety properties must hold, and at the end a world that keeps
completing pods must bring the run to a terminal phase.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrun_operator.celeval import compile_expression
from agentrun_operator.config import OperatorConfig
from agentrun_operator.planner.plan import plan, result_recorded
from tests.unit.planner.world import PlannerWorld, envelope_from_bytes, loop_step, manifest

compile_expression("true")  # celpy raises the recursion limit once; do it before hypothesis watches

LIMIT = 4
CONFIG = OperatorConfig(loops_enabled=True, loop_max_iterations=50, loop_status_history_limit=LIMIT)
TERMINAL = ("Succeeded", "Failed", "Cancelled")

USAGE_TOKENS = 7
OUTPUT = "work_out"

STALL_PROGRESS = "iteration.index / 3"
"""0, 0, 1, 1, 1, 2, …: the last `window` values are first all equal after iteration STALL_AT[window]."""
STALL_AT = {2: 2, 3: 5}

CONTROLS: list[dict[str, Any] | bytes | None] = [
    {"continue": True},
    {"continue": True},
    {"continue": False},
    None,  # missing
    b"{oops",  # invalid JSON
    {"continue": 1},  # non-boolean comparison: `1 == true` is false in CEL
    {"continue": True, "usage": {"inputTokens": USAGE_TOKENS}},
    {"continue": True, "usage": {"inputTokens": "many"}},  # not a number: onInvalid
]


def spec_shapes() -> st.SearchStrategy[dict[str, Any]]:
    loop = st.builds(
        lambda n, cond, retries, on_invalid, extra: loop_step(
            "work",
            n,
            expression="iteration.last.control.continue == true" if cond else None,
            on_invalid=on_invalid,
            retries=retries,
            retryBackoffSeconds=5,
            timeoutSeconds=30,
            loop=extra,
        ),
        st.integers(1, 7),
        st.booleans(),
        st.integers(0, 2),
        st.sampled_from(["fail", "stop"]),
        st.fixed_dictionaries(
            {},
            optional={
                "output": st.just({"name": OUTPUT, "expression": "iteration.index"}),
                "budget": st.integers(1, 30).map(lambda n: {"maxTokens": n}),
                "onBudgetExhausted": st.sampled_from(["Succeed", "Fail"]),
                "stall": st.sampled_from(sorted(STALL_AT)).map(
                    lambda w: {"progress": STALL_PROGRESS, "window": w}
                ),
                "intervalSeconds": st.sampled_from([3, 20]),
            },
        ),
    )
    return st.builds(
        lambda work, with_prep: manifest(([{"name": "prep", "retries": 1}] if with_prep else []) + [work]),
        loop,
        st.booleans(),
    )


_WEIGHTED_OPS = (
    ["plan"] * 8
    + ["plan_lost_status"] * 3
    + ["plan_lost_actions"] * 2
    + ["succeed"] * 6
    + ["fail", "deadline", "vanish"]
    + ["settle"] * 3
    + ["advance"] * 3
    + ["ttl_sweep"] * 2
    + ["cancel"]
)
OPS = st.tuples(st.sampled_from(_WEIGHTED_OPS), st.integers(0, 1000))
"""Weighted towards planning, completing pods, lost writes and TTL sweeps (the interleavings that
could repeat or lose work); cancellation is one op in many. The integer parameterises the op."""
ADVANCES = [1, 5, 11, 31, 61]


class WorldChecker(Protocol):
    """What the random walks need of a checker (this module's `Checker`, the nested one)."""

    def check(self, world: PlannerWorld) -> None: ...

    def mark_succeeded(self, world: PlannerWorld, name: str) -> None: ...


@dataclass
class Checker:
    """Tracks history across the run and checks the invariants after every operation."""

    completed: dict[str, int] = field(default_factory=dict)
    succeeded: set[tuple[int, int]] = field(default_factory=set)
    succeeded_jobs: set[str] = field(default_factory=set)
    seen_created: int = 0
    terminal_phase: str | None = None
    collected: int = 0

    def check(self, world: PlannerWorld) -> None:
        live_per_step: dict[int, int] = {}
        for job in world.jobs.values():
            if not job.finished:
                live_per_step[job.step_index] = live_per_step.get(job.step_index, 0) + 1
        assert all(n <= 1 for n in live_per_step.values()), f"two live Jobs for one step: {world.live_jobs()}"
        running_pods = [p.name for p in world.pods.values() if not p.terminal]
        assert len(running_pods) <= 1, f"two pods may touch the volume at once: {running_pods}"
        for name in world.created[self.seen_created :]:
            created = world.jobs.get(name)
            if created is not None:
                key = (created.step_index, created.iteration)
                assert key not in self.succeeded, f"iteration {key} started again after it succeeded"
                self._check_not_early(world, created.iteration, created.attempt)
        self.seen_created = len(world.created)
        self._check_waiting(world)
        self._check_status(world)

    def _check_not_early(self, world: PlannerWorld, iteration: int, attempt: int) -> None:
        """loop.intervalSeconds: an iteration's first Job is never created before the interval since
        the previous iteration's end has passed (a retry waits the backoff instead)."""
        interval = self._interval(world)
        work = self._work(world)
        if not interval or attempt != 1 or iteration < 2 or work is None or work.loop is None:
            return
        ended = next((r.finished_at for r in work.loop.iterations if r.index == iteration - 1), None)
        if ended is not None:
            assert world.now >= ended + timedelta(seconds=interval), (
                f"iteration {iteration} started before loop.intervalSeconds had passed"
            )

    def _check_waiting(self, world: PlannerWorld) -> None:
        """While a loop waits (nextIterationAt set, not yet due) no Job of it is live, and the wait is
        the interval after the iteration that ended. (Once due, a Job may exist before the status
        that records its start: a lost status write.)"""
        work = self._work(world)
        if work is None or work.loop is None or work.loop.next_iteration_at is None:
            return
        assert work.phase == "Running", work.phase
        record = work.loop.iterations[-1]
        assert record.phase == "Succeeded" and record.finished_at is not None
        assert work.loop.next_iteration_at == record.finished_at + timedelta(seconds=self._interval(world))
        if world.now < work.loop.next_iteration_at:
            index = len(world.agentrun().spec.workflow.steps)  # type: ignore[union-attr]
            live = [j.name for j in world.jobs.values() if not j.finished and j.step_index == index]
            assert not live, f"a Job runs while the loop waits: {live}"

    @staticmethod
    def _interval(world: PlannerWorld) -> int:
        spec_loop = world.agentrun().spec.workflow.steps[-1].loop  # type: ignore[union-attr]
        return spec_loop.interval_seconds if spec_loop is not None else 0

    @staticmethod
    def _work(world: PlannerWorld) -> Any:
        workflow = world.status.workflow if world.status is not None else None
        return next((s for s in workflow.steps if s.name == "work"), None) if workflow else None

    def _check_status(self, world: PlannerWorld) -> None:
        status = world.status
        if status is None:
            return
        if self.terminal_phase is not None:
            assert status.phase == self.terminal_phase, "a finished run changed phase"
        elif status.phase in TERMINAL:
            self.terminal_phase = status.phase
        if status.workflow is None:
            return
        self._check_outputs_and_usage(world)
        for step in status.workflow.steps:
            self._check_not_lost(step.message or "")
            loop = step.loop
            if loop is None:
                continue
            for record in loop.iterations:
                self._check_not_lost(record.message or "")
            before = self.completed.get(step.name, 0)
            assert loop.completed_iterations >= before, "completedIterations decreased"
            assert loop.completed_iterations <= loop.max_iterations
            self.completed[step.name] = loop.completed_iterations
            assert len(loop.iterations) <= LIMIT + 1
            assert loop.retained_iterations == len(loop.iterations)
            assert loop.retained_iterations + loop.pruned_iterations == loop.current_iteration

    def _check_outputs_and_usage(self, world: PlannerWorld) -> None:
        """Each successful iteration appends its output once, in order; usage sums agree; a budget
        stops the loop at the first iteration that reaches it (never later)."""
        workflow = world.status.workflow if world.status is not None else None
        assert workflow is not None
        work = next(s for s in workflow.steps if s.name == "work")
        collected = (workflow.outputs or {}).get(OUTPUT, [])
        assert collected == list(range(1, len(collected) + 1)), (
            f"outputs appended twice or out of order: {collected}"
        )
        assert len(collected) >= self.collected, "collected outputs were lost"
        self.collected = len(collected)
        spec_loop = world.agentrun().spec.workflow.steps[-1].loop  # type: ignore[union-attr]
        if work.loop is not None and spec_loop is not None and spec_loop.output is not None:
            # the last success may have ended the loop on unusable usage before its output was taken
            done = work.loop.completed_iterations
            assert done - 1 <= len(collected) <= done, (collected, done)
        used = work.usage.tokens if work.usage is not None else 0
        assert used % USAGE_TOKENS == 0
        run_total = workflow.usage.tokens if workflow.usage is not None else 0
        assert run_total == sum(s.usage.tokens for s in workflow.steps if s.usage is not None)
        if spec_loop is not None and spec_loop.budget is not None and spec_loop.budget.max_tokens is not None:
            bound = spec_loop.budget.max_tokens
            assert used - USAGE_TOKENS < bound, f"the loop ran past its budget: {used} of {bound}"
            if work.loop is not None and work.loop.stop_reason == "LoopBudgetExhausted":
                assert used >= bound
        if spec_loop is not None and spec_loop.stall is not None and work.loop is not None:
            # a stalled loop never runs past its window: no iteration after the first stall point
            stall_at = STALL_AT[spec_loop.stall.window]
            assert work.loop.current_iteration <= stall_at, (work.loop.current_iteration, stall_at)
            if work.loop.stop_reason == "LoopStalled":
                assert work.loop.completed_iterations == stall_at

    def _check_not_lost(self, message: str) -> None:
        """A Job that succeeded must never be recorded as vanished (its result would be lost)."""
        for name in self.succeeded_jobs:
            assert f"Job {name} vanished" not in message, f"the result of succeeded {name} was lost"

    def mark_succeeded(self, world: PlannerWorld, name: str) -> None:
        job = world.jobs[name]
        if result_recorded(world.status, job):
            return  # already recorded as failed (e.g. timed out, its deletion lost): too late to count
        self.succeeded.add((job.step_index, job.iteration))
        self.succeeded_jobs.add(name)


def apply_op(world: PlannerWorld, checker: WorldChecker, op: tuple[Any, ...]) -> None:
    kind = op[0]
    live = world.live_jobs()
    if kind == "plan":
        world.plan()
    elif kind == "plan_lost_status":
        world.plan(persist=False)
    elif kind == "plan_lost_actions":
        world.plan(apply=False)
    elif kind == "succeed" and live:
        control = CONTROLS[op[1] % len(CONTROLS)]
        if isinstance(control, bytes):
            world.succeed(live[0], message=envelope_from_bytes(control))
        else:
            world.succeed(live[0], control=control)
        checker.mark_succeeded(world, live[0])
    elif kind == "fail" and live:
        world.fail(live[0])
    elif kind == "deadline" and live:
        world.deadline(live[0])
    elif kind == "vanish" and live:
        world.vanish(live[0])
    elif kind == "settle":
        world.settle()
    elif kind == "advance":
        world.advance(ADVANCES[op[1] % len(ADVANCES)])
    elif kind == "ttl_sweep":
        world.ttl_sweep()
    elif kind == "cancel" and op[1] % 4 == 0:  # rarer than the rest: half of the runs never cancel
        world.spec_manifest["spec"].setdefault("cancel", ["Graceful", "Immediate"][op[1] % 2])


def finish(world: PlannerWorld, checker: WorldChecker, max_plans: int = 400) -> None:
    """A world that keeps completing pods: the run must reach a terminal phase (no wedge)."""
    for _ in range(max_plans):
        world.plan()
        checker.check(world)
        if world.phase in TERMINAL:
            return
        live = world.live_jobs()
        if live:
            world.succeed(live[0], control={"continue": True})
            checker.mark_succeeded(world, live[0])
        else:
            world.settle()
            world.advance(world.last_requeue or 1.0)
        checker.check(world)
    raise AssertionError(f"the run wedged: {world.status}")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=spec_shapes(), ops=st.lists(OPS, min_size=40, max_size=200))
def test_random_worlds_keep_the_invariants_and_always_finish(spec: dict[str, Any], ops: list[Any]) -> None:
    world = PlannerWorld(spec, config=CONFIG)
    checker = Checker()
    for op in ops:
        apply_op(world, checker, op)
        checker.check(world)
    finish(world, checker)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=spec_shapes(), ops=st.lists(OPS, min_size=5, max_size=80))
def test_replanning_without_change_is_quiet(spec: dict[str, Any], ops: list[Any]) -> None:
    """Re-planning a persisted status against an unchanged observation emits no events and no Jobs."""
    world = PlannerWorld(spec, config=CONFIG)
    checker = Checker()
    for op in ops:
        apply_op(world, checker, op)
    world.plan()
    world.plan()  # the second plan may record uids of Jobs the first one created
    before = world.status
    again = world.plan()
    assert again.status == before
    kinds = {type(a).__name__ for a in again.actions}
    assert kinds <= {"Requeue", "DeleteJob", "SetJobTTL"}, kinds


def test_status_stays_under_32_kib_at_1000_iterations_with_limit_50() -> None:
    """Worst case per record: retries with long failure messages, a ~3.5 KiB control payload."""
    config = OperatorConfig(loops_enabled=True, loop_max_iterations=1000, loop_status_history_limit=50)
    step = loop_step(
        "a-step-with-a-rather-long-name",
        1000,
        expression="iteration.last.control.continue == true",
        retries=1,
        retryBackoffSeconds=0,
    )
    world = PlannerWorld(manifest([step], name="r" * 40), config=config)
    big = {"continue": True, "outputs": {"summary": "s" * 3400}}
    attempt = 0

    def outcome(w: PlannerWorld, job: str) -> None:
        nonlocal attempt
        attempt += 1
        if attempt % 2:
            w.fail(job, exit_code=137)
        else:
            w.succeed(job, control=big)
        w.ttl_sweep()

    world.drive(outcome, max_plans=6000)
    assert world.status is not None
    loop = world.step_status().loop
    assert loop.completed_iterations == 1000
    assert loop.pruned_iterations == 950 and loop.retained_iterations == 50
    size = len(json.dumps(world.status.model_dump(by_alias=True, exclude_none=True, mode="json")))
    assert size <= 32 * 1024, size


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=spec_shapes(), ops=st.lists(OPS, min_size=5, max_size=60))
def test_planning_never_mutates_the_run_it_is_given(spec: dict[str, Any], ops: list[Any]) -> None:
    """The shell reuses one parsed run for every reconcile at the same resourceVersion."""
    world = PlannerWorld(spec, config=CONFIG)
    checker = Checker()
    for op in ops:
        apply_op(world, checker, op)
    run = world.agentrun()
    before = run.model_dump(by_alias=True, mode="json")
    plan(run, world.observed(), world.now, CONFIG)
    plan(run, world.observed(), world.now, CONFIG)
    assert run.model_dump(by_alias=True, mode="json") == before
