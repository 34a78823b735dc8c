"""Properties of approval gates under random worlds (hypothesis): a gate never runs a Job, a decision
is applied exactly once (lost status writes, replays, duplicates, decisions that do not fit), and a
run that keeps being approved always finishes."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrun_operator.celeval import compile_expression
from agentrun_operator.config import OperatorConfig
from agentrun_operator.planner.approval import find_gate
from agentrun_operator.planner.facts import ApprovalDecided
from tests.unit.planner.world import PlannerWorld, manifest

compile_expression("true")

CONFIG = OperatorConfig(loops_enabled=True, loop_status_history_limit=3)
TERMINAL = ("Succeeded", "Failed", "Cancelled")
GATE = {"name": "gate", "approval": {"message": "ok?", "inputs": [{"name": "v", "required": True}]}}
BODY = {
    "name": "dev",
    "loop": {"maxIterations": 4, "condition": {"until": "iteration.last.control.outputs.v == 'final'"}},
    "steps": [{"name": "work", "retries": 1, "retryBackoffSeconds": 1}, GATE],
}
SHAPES = {
    "top": (manifest([{"name": "build"}, GATE, {"name": "ship"}]), "gate"),
    "body": (manifest([BODY]), "dev/gate"),
}
VERDICTS = ["more", "more", "final", "final"]

OPS = st.tuples(
    st.sampled_from(
        ["plan"] * 6
        + ["plan_lost"] * 3
        + ["succeed"] * 4
        + ["fail", "advance", "decide", "decide", "decide_bad", "decide_twice", "reject", "cancel"]
    ),
    st.integers(0, 1000),
)


def _append(world: PlannerWorld, entry: dict[str, Any]) -> None:
    world.spec_manifest["spec"].setdefault("approvals", []).append(entry)


def _waiting_iteration(world: PlannerWorld, path: str) -> int:
    run = world.agentrun()
    found = find_gate(run.spec.workflow.steps if run.spec.workflow else [], world.status, path)
    return int(getattr(found, "iteration", 1))


def _apply(world: PlannerWorld, shape: str, path: str, op: tuple[str, int]) -> bool:
    """One operation; True when a plan's status was persisted."""
    kind, n = op
    live = world.live_jobs()
    if kind == "plan":
        world.plan()
        return True
    if kind == "plan_lost":
        world.plan(persist=False)
    elif kind == "succeed" and live:
        world.succeed(live[0], control={})
    elif kind == "fail" and live:
        world.fail(live[0])
    elif kind == "advance":
        world.settle()
        world.advance(1 + n % 5)
    elif kind in ("decide", "decide_twice", "decide_bad", "reject"):
        iteration = _waiting_iteration(world, path)
        entry: dict[str, Any] = {"step": path, "iteration": iteration, "decision": "Approved"}
        if kind == "decide_bad":
            entry["inputs"] = {"nope": "x"} if n % 2 else {}
            entry["iteration"] = iteration + n % 2
        elif kind == "reject":
            if n % 3:
                return False  # rarer than approvals
            entry.update(decision="Rejected", reason="no")
        else:
            entry["inputs"] = {"v": VERDICTS[n % len(VERDICTS)]}
        _append(world, entry)
        if kind == "decide_twice":
            _append(world, dict(entry))
    elif kind == "cancel" and n % 7 == 0:
        world.spec_manifest["spec"].setdefault("cancel", "Graceful")
    return False


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=st.sampled_from(sorted(SHAPES)), ops=st.lists(OPS, min_size=20, max_size=120))
def test_gates_never_run_jobs_and_apply_each_decision_once(shape: str, ops: list[tuple[str, int]]) -> None:
    spec, path = SHAPES[shape]
    world = PlannerWorld(spec, config=CONFIG)
    world.spec_manifest = {**spec, "spec": dict(spec["spec"])}
    applied: dict[int, int] = {}  # spec.approvals index -> plans (persisted) that applied it
    judged = 0

    def after(persisted: bool) -> None:
        nonlocal judged
        if persisted and world.status is not None and world.status.workflow is not None:
            count = world.status.workflow.approvals_judged or 0
            assert count >= judged, "approvalsJudged went back"
            judged = count
            for fact in world.plans[-1].facts:
                if isinstance(fact, ApprovalDecided) and fact.decision in ("Approved", "Rejected"):
                    assert fact.index is not None
                    applied[fact.index] = applied.get(fact.index, 0) + 1
        for name, job in world.jobs.items():
            assert "gate" not in (job.label or ""), f"a gate ran a Job: {name}"
        assert all("-2-iter-" not in n for n in world.created if "-step-1i" in n), world.created
        if shape == "top":
            assert all("-step-2-" not in n for n in world.created), world.created
        assert all(count == 1 for count in applied.values()), f"a decision was applied twice: {applied}"

    for op in ops:
        after(_apply(world, shape, path, op))
    for _ in range(300):  # keep approving: the run must finish
        world.plan()
        after(True)
        if world.phase in TERMINAL:
            return
        live = world.live_jobs()
        if live:
            world.succeed(live[0], control={})
        elif world.step_status(0).phase != "Pending" and _waiting(world, path):
            entry = {"step": path, "iteration": _waiting_iteration(world, path), "decision": "Approved"}
            _append(world, {**entry, "inputs": {"v": "final"}})
        else:
            world.settle()
            world.advance(world.last_requeue or 1.0)
    raise AssertionError(f"the run wedged: {world.status}")


def _waiting(world: PlannerWorld, path: str) -> bool:
    run = world.agentrun()
    found = find_gate(run.spec.workflow.steps if run.spec.workflow else [], world.status, path)
    return bool(getattr(found, "waiting", False))
