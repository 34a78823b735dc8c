"""The planner's part of operating runs: conditions along a run's life, unbound claims, the size
warning. (The condition rules themselves: test_conditions.py.)"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from agentrun_operator.config import OperatorConfig
from agentrun_operator.planner.actions import CreateJob, EmitEvent, Requeue
from tests.unit.planner.world import LOOPS_ON, T0, PlannerWorld, loop_step, manifest


def conditions(world: PlannerWorld) -> dict[str, tuple[str, str | None]]:
    assert world.status is not None
    return {c.type: (c.status, c.reason) for c in world.status.conditions}


def creates(result: Any) -> list[str]:
    return [a.name for a in result.actions if isinstance(a, CreateJob)]


def test_an_unbound_claim_waits_then_the_run_starts_once_bound() -> None:
    world = PlannerWorld(
        manifest([loop_step(max_iterations=1)]), pvc_names=frozenset({"ws"}), pvc_unbound={"ws": "Pending"}
    )
    world.now = T0 + timedelta(minutes=10)  # long past the grace of missing references: no deadline
    result = world.plan()
    assert world.status is not None
    assert (world.status.phase, world.status.reason) == ("Pending", "PersistentVolumeClaimPending")
    assert "PersistentVolumeClaim ws (phase Pending) to be bound" in (world.status.message or "")
    assert world.status.started_at is None
    assert creates(result) == []
    assert [a.after_seconds for a in result.actions if isinstance(a, Requeue)] == [3.0]
    assert conditions(world)["Ready"] == ("False", "PersistentVolumeClaimPending")
    assert conditions(world)["Reconciling"] == ("True", "PersistentVolumeClaimPending")
    again = world.plan()
    assert creates(again) == [] and not [a for a in again.actions if isinstance(a, EmitEvent)]
    world.pvc_unbound = {}
    started = world.plan()
    assert creates(started) == ["run-step-1-iter-1-attempt-1"]
    assert world.status.phase == "Running"
    assert conditions(world)["Ready"] == ("False", "Running")


def test_a_missing_claim_is_a_reference_problem_not_an_unbound_one() -> None:
    world = PlannerWorld(manifest([loop_step(max_iterations=1)]), pvc_names=frozenset())
    world.plan()
    assert world.status is not None and world.status.reason == "WaitingForReferences"
    world.now = T0 + timedelta(seconds=31)
    world.plan()
    assert (world.status.phase, world.status.reason) == ("Failed", "InvalidSpec")
    assert conditions(world)["InvalidSpec"] == ("True", "InvalidSpec")
    assert conditions(world)["Stalled"] == ("True", "InvalidSpec")


def test_conditions_along_a_successful_run_and_their_transition_times() -> None:
    world = PlannerWorld(manifest([loop_step(max_iterations=2)]))
    world.plan()
    assert conditions(world)["Succeeded"] == ("Unknown", "Running")
    assert world.status is not None
    first = {c.type: c.last_transition_time for c in world.status.conditions}
    assert set(first.values()) == {T0}

    def finish(w: PlannerWorld, job: str) -> None:
        w.now += timedelta(seconds=5)
        w.succeed(job, control={"continue": True})

    world.drive(finish)
    assert world.phase == "Succeeded"
    assert conditions(world) == {
        "Ready": ("True", "Completed"),
        "Succeeded": ("True", "Completed"),
        "Reconciling": ("False", "Completed"),
        "Stalled": ("False", "Completed"),
    }
    times = {c.type: c.last_transition_time for c in world.status.conditions}
    assert times["Stalled"] == T0  # never changed status
    assert times["Ready"] == times["Succeeded"] == times["Reconciling"] > T0
    for cond in world.status.conditions:
        assert cond.observed_generation == world.status.observed_generation


def test_the_status_size_warning_comes_once_with_an_event() -> None:
    # A fresh run's status is about 800 bytes (with its specHash); three iterations pass 80 % of this.
    tiny_budget = OperatorConfig(**{**LOOPS_ON.__dict__, "status_budget_bytes": 1152})
    world = PlannerWorld(manifest([loop_step(max_iterations=3)]), config=tiny_budget)
    world.plan()
    assert "StatusSizeWarning" not in conditions(world)  # a fresh run is below 80 % of it
    world.drive(lambda w, job: w.succeed(job, control={"continue": True}))
    assert world.phase == "Succeeded"
    assert conditions(world)["StatusSizeWarning"] == ("True", "StatusNearBudget")
    assert world.event_reasons().count("StatusSizeWarning") == 1
    warning = next(e for e in world.events if e.reason == "StatusSizeWarning")
    assert warning.type == "Warning" and "1152-byte" in warning.message
