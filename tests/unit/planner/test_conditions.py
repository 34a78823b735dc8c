"""Condition transitions: every pair of run states, in both directions, and the size warning."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta

import pytest

from agentrun_operator.api import AgentRunStatus, Condition
from agentrun_operator.planner import conditions as C

T0 = datetime(2026, 11, 23, 10, 0, 0, tzinfo=UTC)
T1 = T0 + timedelta(seconds=30)

# (phase, reason, message) of every kind of run state the planner produces.
STATES = {
    "created": (None, None, None),
    "waiting-references": ("Pending", "WaitingForReferences", "waiting for Agent/a to exist"),
    "waiting-claim-binding": ("Pending", "PersistentVolumeClaimPending", "waiting for claim ws to be bound"),
    "claiming-key": ("Pending", "ClaimingIdempotencyKey", "claiming idempotencyKey 'k'"),
    "running": ("Running", None, "step implement: iteration 2 attempt 1 running"),
    "running-quiet": ("Running", None, None),
    "succeeded": ("Succeeded", "Completed", "all 1 steps finished"),
    "invalid": ("Failed", "InvalidSpec", "spec.x: bad"),
    "iteration-failed": ("Failed", "LoopIterationFailed", "step implement: iteration 2 failed"),
    "duplicate": ("Failed", "IdempotencyKeyInUse", "idempotencyKey 'k' belongs to AgentRun 'a'"),
    "timed-out": ("Failed", "WorkflowTimedOut", "the workflow timed out after 60s"),
    "cancelled": ("Cancelled", "Cancelled", "cancelled (Graceful)"),
}

# What each condition's status must be in each phase.
EXPECTED = {
    None: {"Ready": "False", "Succeeded": "Unknown", "Reconciling": "True", "Stalled": "False"},
    "Pending": {"Ready": "False", "Succeeded": "Unknown", "Reconciling": "True", "Stalled": "False"},
    "Running": {"Ready": "False", "Succeeded": "Unknown", "Reconciling": "True", "Stalled": "False"},
    "Succeeded": {"Ready": "True", "Succeeded": "True", "Reconciling": "False", "Stalled": "False"},
    "Failed": {"Ready": "False", "Succeeded": "False", "Reconciling": "False", "Stalled": "True"},
    "Cancelled": {"Ready": "False", "Succeeded": "False", "Reconciling": "False", "Stalled": "False"},
}


def status(state: str, conditions: list[Condition] | None = None) -> AgentRunStatus:
    phase, reason, message = STATES[state]
    return AgentRunStatus(phase=phase, reason=reason, message=message, conditions=list(conditions or []))


def by_type(conds: list[Condition]) -> dict[str, Condition]:
    return {c.type: c for c in conds}


@pytest.mark.parametrize("state", sorted(STATES))
def test_each_state_gives_the_documented_conditions(state: str) -> None:
    phase, reason, message = STATES[state]
    conds = C.derive(status(state), generation=3, now=T0)
    assert [c.type for c in conds] == ["Ready", "Succeeded", "Reconciling", "Stalled"]
    for cond in conds:
        assert cond.status == EXPECTED[phase][cond.type], (state, cond)
        assert cond.reason == (reason or ("Running" if phase == "Running" else "Pending"))
        assert cond.message  # never empty: a person reads it
        if message:
            assert cond.message == message
        assert cond.observed_generation == 3
        assert cond.last_transition_time == T0


@pytest.mark.parametrize(("before", "after"), list(itertools.product(sorted(STATES), repeat=2)))
def test_transition_time_moves_only_when_the_status_changes(before: str, after: str) -> None:
    first = C.derive(status(before), generation=1, now=T0)
    second = C.derive(status(after, first), generation=2, now=T1)
    old, new = by_type(first), by_type(second)
    assert set(new) == set(old)
    for type_, cond in new.items():
        changed = old[type_].status != cond.status
        assert cond.last_transition_time == (T1 if changed else T0), (before, after, type_)
        assert cond.observed_generation == 2
        assert cond.status == EXPECTED[STATES[after][0]][type_]


@pytest.mark.parametrize("state", sorted(STATES))
def test_derive_is_idempotent(state: str) -> None:
    once = C.derive(status(state), generation=1, now=T0)
    twice = C.derive(status(state, once), generation=1, now=T1)
    assert twice == once


def test_admission_conditions_keep_their_place_and_time() -> None:
    invalid = Condition(
        type="InvalidSpec", status="True", reason="InvalidSpec", message="bad", last_transition_time=T0
    )
    conds = C.derive(status("invalid", [invalid]), generation=1, now=T1)
    assert [c.type for c in conds] == ["Ready", "Succeeded", "Reconciling", "Stalled", "InvalidSpec"]
    assert by_type(conds)["InvalidSpec"] == invalid


def test_kubectl_wait_for_succeeded_sees_true_only_on_success() -> None:
    for state, (phase, _, _) in STATES.items():
        succeeded = by_type(C.derive(status(state), generation=1, now=T0))["Succeeded"]
        assert (succeeded.status == "True") == (phase == "Succeeded"), state


BUDGET = 1000


@pytest.mark.parametrize(
    ("sizes", "expected"),
    [
        ([100], None),  # never near: no condition at all
        ([801], ("True", "StatusNearBudget")),
        ([800], None),  # exactly 80 % is not over it
        ([900, 100], ("False", "StatusWithinBudget")),  # back under: False, kept
        ([900, 950], ("True", "StatusNearBudget")),
        ([900, 100, 100], ("False", "StatusWithinBudget")),
    ],
)
def test_status_size_warning(sizes: list[int], expected: tuple[str, str] | None) -> None:
    conds: list[Condition] = []
    times = []
    for i, size in enumerate(sizes):
        conds = C.derive(status("running", conds), 1, T0 + timedelta(seconds=i), size, BUDGET)
        times.append(by_type(conds).get("StatusSizeWarning"))
    warning = by_type(conds).get("StatusSizeWarning")
    if expected is None:
        assert warning is None
        return
    assert warning is not None
    assert (warning.status, warning.reason) == expected
    assert str(BUDGET) in (warning.message or "")
    # the time is that of the last change of its status
    statuses = [t.status if t else None for t in times]
    last_change = max(i for i in range(len(statuses)) if i == 0 or statuses[i] != statuses[i - 1])
    assert warning.last_transition_time == T0 + timedelta(seconds=last_change)


def test_became_true_once() -> None:
    before: list[Condition] = []
    after = C.derive(status("running"), 1, T0, 900, BUDGET)
    assert C.became_true(before, after, "StatusSizeWarning")
    again = C.derive(status("running", after), 1, T1, 950, BUDGET)
    assert not C.became_true(after, again, "StatusSizeWarning")


def test_unbound_claims_wait_names_each_claim_and_its_phase() -> None:
    from agentrun_operator.planner.observed import Observed
    from agentrun_operator.planner.volumes import REASON_CLAIM_PENDING, unbound_claims

    assert unbound_claims(Observed()) is None
    assert unbound_claims(Observed(pvc_names=frozenset({"ws"}))) is None
    one = unbound_claims(Observed(pvc_names=frozenset({"ws"}), pvc_unbound={"ws": "Pending"}))
    assert one is not None and one.reason == REASON_CLAIM_PENDING
    assert "PersistentVolumeClaim ws (phase Pending) to be bound" in one.message
    assert "kubectl describe pvc ws" in one.message
    two = unbound_claims(Observed(pvc_names=frozenset({"a", "b"}), pvc_unbound={"b": "Lost", "a": "Pending"}))
    assert two is not None and "PersistentVolumeClaims a (phase Pending), b (phase Lost)" in two.message


def _long_status(records: int, message: str = "attempt 1: exit 1") -> AgentRunStatus:
    from agentrun_operator.api import IterationRecord, JobRef, LoopStatus, StepStatus, WorkflowStatus

    iterations = [
        IterationRecord(
            index=i,
            phase="Failed",
            attempts=3,
            started_at=T0,
            finished_at=T1 + timedelta(microseconds=123456),
            message=message,
            job_ref=JobRef(name="x" * 63, uid="0123456789abcdef0123456789abcdef0123"),
        )
        for i in range(1, records + 1)
    ]
    loop = LoopStatus(
        current_iteration=records,
        completed_iterations=records,
        max_iterations=1000,
        stop_reason="LoopIterationFailed",
        last_control={"continue": True, "notes": "ü" * 300},
        iterations=iterations,
    )
    step = StepStatus(name="implement", phase="Failed", attempt=3, message="ö" * 500, loop=loop)
    return AgentRunStatus(
        phase="Failed",
        reason="LoopIterationFailed",
        message="x" * 1000,
        workflow=WorkflowStatus(phase="Failed", steps=[step]),
    )


@pytest.mark.parametrize(
    ("records", "message"), [(0, ""), (1, "é" * 1024), (50, "short"), (200, "中" * 1024)]
)
def test_the_size_bound_is_never_below_the_real_size(records: int, message: str) -> None:
    status = _long_status(records, message)
    assert C.size_upper_bound(status) >= C.exact_size(status)


def test_the_exact_size_is_measured_only_near_the_budget_or_after_a_warning() -> None:
    small = _long_status(2)
    assert C.status_size(small, 256 * 1024) is None
    assert C.status_size(small, 4096) == C.exact_size(small)
    warned = C.derive(small, 1, T0, C.exact_size(small), 4096)
    small.conditions = warned
    assert C.status_size(small, 256 * 1024) == C.exact_size(small)  # to lift the warning
