"""`agentrun dev run`'s progress lines: the full path of the step being executed, approval waits with
the exact approve command, and a reason that is always a real value (never `None`)."""

from __future__ import annotations

from agentrun_devcluster.dev import _approval_line, _progress_line
from agentrun_operator.ctl import render
from tests.unit.ctl import runs


def test_the_step_column_is_the_full_path_through_a_loop_body() -> None:
    line = _progress_line(runs.nested())
    assert " develop/iteration 3/test " in line and line.endswith(" 3/5"), line
    assert render.active_path(runs.nested()) == "develop/iteration 3/test"
    assert render.active_path(runs.conditional(0)) is None
    assert render.active_path(runs.conditional(5)) == "implement"  # the last step run


def test_a_gate_that_waits_shows_the_approve_command_with_its_required_inputs() -> None:
    run = runs.awaiting_approval()
    assert " develop/iteration 1/sign-off " in _progress_line(run)
    line = _approval_line(run)
    assert line is not None and line.startswith("  awaiting approval: step develop/iteration 1/sign-off")
    assert "`agentrun approve approval-loop -n e2e --step develop/sign-off --input verdict=VALUE`" in line
    assert _approval_line(runs.nested()) is None


def test_the_reason_is_always_a_real_value() -> None:
    assert render.outcome_reason(runs.conditional(5)) == "Completed"
    assert render.outcome_reason(runs.awaiting_approval()) == (
        "still Running: step develop/iteration 1/sign-off AwaitingApproval"
    )
    assert render.outcome_reason(runs.conditional(0)) == "still Pending: no step has started"
    finished = runs.conditional(5)
    del finished["status"]["reason"]
    assert render.outcome_reason(finished) == "Succeeded"
