"""The whole-status budget: compaction keeps a status under it without failing the run
(docs/concepts.md#status-budget). The per-loop history limit: test_plan.py."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from agentrun_operator.api import (
    AgentRunStatus,
    AttemptFailure,
    IterationRecord,
    LoopStatus,
    StepStatus,
    WorkflowStatus,
)
from agentrun_operator.planner.compaction import (
    BUDGET_RESERVE_BYTES,
    MIN_CLIPPED_MESSAGE_CHARS,
    fit_to_budget,
)
from agentrun_operator.planner.conditions import exact_size
from agentrun_operator.planner.context import working_copy
from tests.unit.planner.world import LOOPS_ON, PlannerWorld, loop_step, manifest

T = datetime(2026, 3, 1, 12, tzinfo=UTC)


def record(
    index: int, phase: str = "Succeeded", message: str = "", minute: int | None = None
) -> IterationRecord:
    at = T + timedelta(minutes=index if minute is None else minute)
    running = phase == "Running"
    return IterationRecord(
        index=index,
        phase=phase,  # type: ignore[arg-type]
        attempts=1,
        started_at=at,
        finished_at=None if running else at + timedelta(seconds=30),
        message=message or None,
    )


def looped(name: str, records: list[IterationRecord]) -> StepStatus:
    loop = LoopStatus(
        current_iteration=records[-1].index if records else 0,
        completed_iterations=sum(r.phase == "Succeeded" for r in records),
        max_iterations=100,
        retained_iterations=len(records),
        iterations=records,
    )
    return StepStatus(name=name, phase="Running", loop=loop)


def status_of(*steps: StepStatus, outputs: dict[str, list[object]] | None = None) -> AgentRunStatus:
    return AgentRunStatus(
        phase="Running", workflow=WorkflowStatus(phase="Running", steps=list(steps), outputs=outputs)
    )


def target(budget: int) -> int:
    return budget - min(BUDGET_RESERVE_BYTES, budget // 10)


def test_a_status_under_its_budget_is_left_alone() -> None:
    status = status_of(looped("a", [record(i) for i in range(1, 6)]))
    before = status.model_dump()
    assert fit_to_budget(status, 256 * 1024) == 0
    assert status.model_dump() == before


def test_oldest_records_go_first_across_loops_and_the_counters_stay_exact() -> None:
    # `a` ran iterations at minutes 1..20, `b` at minutes 10..29 (interleaved in time).
    a = looped("a", [record(i, message="x" * 200) for i in range(1, 21)])
    b = looped("b", [record(i, message="y" * 200, minute=9 + i) for i in range(1, 21)])
    status = status_of(a, b)
    budget = exact_size(status) // 2
    removed = fit_to_budget(status, budget)
    assert removed > 0
    assert exact_size(status) <= target(budget)
    assert a.loop is not None and b.loop is not None
    for loop in (a.loop, b.loop):
        assert loop.retained_iterations == len(loop.iterations)
        assert loop.pruned_iterations + loop.retained_iterations == 20
        kept = [r.index for r in loop.iterations]
        assert kept == list(range(kept[0], 21))  # a suffix: the oldest went
    # a's records are older than b's, so more of a's went
    assert a.loop.pruned_iterations > b.loop.pruned_iterations


def test_the_newest_failure_and_a_running_iteration_are_never_dropped() -> None:
    records = [record(1, "Failed", "old failure"), record(2, "Failed", "the newest failure", minute=2)]
    records += [record(i, message="z" * 300) for i in range(3, 40)]
    records += [record(40, "Running")]
    step = looped("a", records)
    status = status_of(step)
    fit_to_budget(status, 2048)
    assert step.loop is not None
    kept = {r.index: r.phase for r in step.loop.iterations}
    assert kept[2] == "Failed" and kept[40] == "Running"
    assert 1 not in kept  # the older failure is an ordinary old record
    assert exact_size(status) <= target(2048)


def test_outputs_go_oldest_first_when_records_are_not_enough() -> None:
    status = status_of(
        looped("plan", [record(1)]),
        outputs={"tasks": [f"task-{i}-" + "t" * 100 for i in range(30)], "few": ["x"]},
    )
    fit_to_budget(status, 2048)
    assert status.workflow is not None and status.workflow.outputs is not None
    tasks = status.workflow.outputs["tasks"]
    dropped = 30 - len(tasks)
    assert dropped > 0
    assert tasks[0].startswith(f"task-{dropped}-")  # the oldest went, the newest stay in order
    assert status.workflow.pruned_outputs == {"tasks": dropped}
    assert status.workflow.outputs["few"] == ["x"]
    assert exact_size(status) <= target(2048)


@settings(max_examples=60, deadline=None)  # sizes are measured by serializing: no fixed time per example
@given(
    st.lists(st.lists(st.integers(0, 600), min_size=1, max_size=30), min_size=1, max_size=4),
    st.integers(2048, 64 * 1024),
)
def test_any_status_of_finished_records_fits_any_budget(messages: list[list[int]], budget: int) -> None:
    steps = [
        looped(f"s{n}", [record(i + 1, message="m" * size, minute=n + i) for i, size in enumerate(sizes)])
        for n, sizes in enumerate(messages)
    ]
    status = status_of(*steps)
    total = sum(len(s) for s in messages)
    fit_to_budget(status, budget)
    kept = sum(len(s.loop.iterations) for s in steps if s.loop is not None)
    pruned = sum(s.loop.pruned_iterations for s in steps if s.loop is not None)
    assert kept + pruned == total
    assert exact_size(status) <= target(budget)


def _failed_chain(depth: int, cause: str) -> AgentRunStatus:
    """A run failed `depth` groups down: every entry above the failed step repeats its message with a
    prefix, as groups do, and the innermost group is a loop body whose only record is that failure."""
    failure = AttemptFailure(attempt=1, reason="Error", exit_code=1, message=cause)
    step = StepStatus(name="leaf", phase="Failed", message=f"attempt 1 failed: {cause}", last_failure=failure)
    for level in range(depth):
        message = f"step {step.name} failed: {step.message}"
        loop = None
        if level == 0:
            loop = LoopStatus(current_iteration=1, max_iterations=3, retained_iterations=1)
            loop.iterations = [record(1, "Failed", message)]
        step = StepStatus(name=f"group{level}", phase="Failed", message=message, loop=loop, steps=[step])
    return AgentRunStatus(
        phase="Failed",
        message=f"step {step.name}: {step.message}",
        workflow=WorkflowStatus(phase="Failed", steps=[step]),
    )


def _messages(status: AgentRunStatus) -> list[str]:
    found: list[str] = []

    def walk(steps: list[StepStatus]) -> None:
        for entry in steps:
            failure = entry.last_failure
            found.extend(m for m in (entry.message, failure.message if failure else None) if m)
            found.extend(r.message for r in (entry.loop.iterations if entry.loop else []) if r.message)
            walk(entry.steps or [])

    walk(status.workflow.steps if status.workflow else [])
    return found


def test_messages_are_clipped_when_nothing_is_left_to_drop() -> None:
    """A failure deep in the tree is repeated by every entry above it: with no record left that may go
    (the one record is the newest failure) and no outputs, the entries' messages are clipped, the
    run's headline is kept whole while that is enough, and the newest failure stays."""
    status = _failed_chain(4, "main container exited with code 1 (Error): " + "e" * 400)
    assert status.message is not None
    run_message = status.message
    budget = 4096
    assert exact_size(status) > target(budget)
    assert fit_to_budget(status, budget) > 0
    assert exact_size(status) <= target(budget)
    assert status.message == run_message
    clipped = [m for m in _messages(status) if m.endswith("…")]
    assert clipped and all(len(m) >= MIN_CLIPPED_MESSAGE_CHARS for m in _messages(status))
    assert len({len(m) for m in clipped}) == 1  # one length: the longest lost most
    body = status.workflow.steps[0].steps[0].steps[0].steps[0]  # type: ignore[union-attr,index]
    assert body.loop is not None and [r.phase for r in body.loop.iterations] == ["Failed"]
    assert body.loop.iterations[0].message is not None
    assert body.loop.iterations[0].message.startswith("step leaf failed: attempt 1 failed: main container")


def test_the_runs_message_is_clipped_last_and_the_budget_holds() -> None:
    status = _failed_chain(6, "x" * 1000)
    assert status.message is not None and len(status.message) > 1000
    budget = 2048
    fit_to_budget(status, budget)
    assert exact_size(status) <= target(budget)
    assert all(len(m) == MIN_CLIPPED_MESSAGE_CHARS for m in _messages(status))  # every entry's first
    assert status.message.startswith("step group5: step group4 failed: ") and status.message.endswith("…")


def test_finished_entries_are_clipped_before_unfinished_ones_and_the_run_last() -> None:
    def running(n: int) -> AgentRunStatus:
        done = [StepStatus(name=f"done{i}", phase="Failed", message="d" * n) for i in range(3)]
        live = StepStatus(name="live", phase="Running", message="w" * n)
        return AgentRunStatus(
            phase="Running",
            message="r" * n,
            workflow=WorkflowStatus(phase="Running", steps=[*done, live]),
        )

    base = exact_size(running(0))
    # room for the live entry and the run whole, the finished ones clipped
    status = running(800)
    fit_to_budget(status, (base + 2 * 800 + 3 * 300) * 10 // 9 + 20)
    assert status.workflow is not None and status.message == "r" * 800
    *done, live = status.workflow.steps
    assert live.message == "w" * 800
    assert all(s.message is not None and 64 < len(s.message) < 800 for s in done)
    # less room: the finished ones at the floor, the live one clipped, still not the run
    status = running(800)
    budget = (base + 800 + 400 + 3 * 64) * 10 // 9 + 20
    fit_to_budget(status, budget)
    assert exact_size(status) <= target(budget)
    assert status.workflow is not None and status.message == "r" * 800
    *done, live = status.workflow.steps
    assert all(s.message is not None and len(s.message) == MIN_CLIPPED_MESSAGE_CHARS for s in done)
    assert live.message is not None and 64 < len(live.message) < 800


def test_clipping_leaves_the_status_it_was_copied_from_alone() -> None:
    """The planner compacts a working copy that shares old records and last failures with the run's
    persisted status (context.working_copy): those are replaced, never edited."""
    prior = _failed_chain(3, "y" * 600)
    step = prior.workflow.steps[0].steps[0].steps[0]  # type: ignore[union-attr,index]
    assert step.loop is not None
    step.loop.iterations.append(record(2, "Running"))  # the failed record is not the newest
    before = prior.model_dump()
    status = working_copy(prior)
    fit_to_budget(status, 2048)
    assert exact_size(status) <= target(2048)
    assert prior.model_dump() == before


def test_a_long_run_under_a_small_budget_succeeds_within_it() -> None:
    """Through the planner: a history limit far above what the budget holds, every iteration
    leaving a large control payload; the run ends Succeeded, every plan's status within budget."""
    config = dataclasses.replace(LOOPS_ON, status_budget_bytes=4096, loop_status_history_limit=1000)
    world = PlannerWorld(manifest([loop_step(max_iterations=20)]), config=config)
    sizes: list[int] = []

    def finish(w: PlannerWorld, job: str) -> None:
        w.advance(10)
        w.succeed(job, control={"continue": True, "notes": "n" * 500})
        if w.status is not None:
            sizes.append(exact_size(w.status))

    world.drive(finish)
    assert world.phase == "Succeeded"
    loop = world.step_status().loop
    assert loop.completed_iterations == 20
    assert loop.pruned_iterations > 0
    assert loop.pruned_iterations + loop.retained_iterations == 20
    assert loop.iterations[-1].index == 20
    assert world.status is not None and exact_size(world.status) <= target(4096)
    assert max(sizes) <= 4096
    assert "StatusSizeWarning" in {c.type for c in world.status.conditions}
