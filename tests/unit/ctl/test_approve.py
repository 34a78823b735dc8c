"""`agentrun approve|reject`: the pure parts (inputs, bad input before any request) and how `status`
and `watch` show a waiting approval gate."""

from __future__ import annotations

import asyncio
import io
from datetime import UTC, datetime
from typing import Any

import pytest

from agentrun_operator.ctl import commands, render
from agentrun_operator.ctl.connect import CtlError
from agentrun_operator.ctl.main import parse_inputs

NOW = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)


def test_inputs_are_key_value_pairs() -> None:
    assert parse_inputs(["verdict=ship", "note=a=b", "empty="]) == {
        "verdict": "ship",
        "note": "a=b",
        "empty": "",
    }


@pytest.mark.parametrize(
    ("pairs", "fragment"),
    [(["verdict"], "is not KEY=VALUE"), (["=x"], "is not KEY=VALUE"), (["v=1", "v=2"], "is given twice")],
)
def test_bad_inputs_are_refused_naming_the_flag_and_the_fix(pairs: list[str], fragment: str) -> None:
    with pytest.raises(CtlError) as err:
        parse_inputs(pairs)
    text = str(err.value)
    assert text.startswith("--input: ") and fragment in text and "fix:" in text
    assert "docs/concepts.md#approval-gates" in text


def test_a_reject_without_a_reason_is_refused_before_any_request() -> None:
    with pytest.raises(CtlError) as err:
        asyncio.run(commands.decide(None, "r", "a/b", "Rejected", reason="  ", out=io.StringIO()))  # type: ignore[arg-type]
    assert str(err.value).startswith("--reason: a rejection needs a reason")


def _waiting_run() -> dict[str, Any]:
    message = (
        "step develop/iteration 2/sign-off: awaiting approval: Review it; approve with `agentrun approve r`"
    )
    gate = {"name": "sign-off", "phase": "AwaitingApproval", "message": "awaiting approval: Review it"}
    return {
        "metadata": {"name": "r", "namespace": "ns"},
        "status": {
            "phase": "Running",
            "message": message,
            "conditions": [
                {"type": "Ready", "status": "False", "reason": "Running"},
                {
                    "type": "AwaitingApproval",
                    "status": "True",
                    "reason": "AwaitingApproval",
                    "message": message,
                },
            ],
            "workflow": {
                "steps": [
                    {
                        "name": "develop",
                        "phase": "Running",
                        "loop": {"currentIteration": 2, "maxIterations": 5, "iterations": []},
                        "steps": [{"name": "work", "phase": "Succeeded"}, gate],
                    }
                ]
            },
        },
    }


def test_status_shows_the_waiting_gate_and_how_to_decide() -> None:
    text = render.render_status(_waiting_run(), NOW)
    assert "Approval:    awaiting: step develop/iteration 2/sign-off: awaiting approval: Review it" in text
    assert "develop/iteration 2/sign-off  AwaitingApproval" in text


def test_watch_prints_a_line_when_a_gate_starts_waiting() -> None:
    run = _waiting_run()
    before = {
        **run,
        "status": {
            **run["status"],
            "workflow": {
                "steps": [
                    {
                        **run["status"]["workflow"]["steps"][0],
                        "steps": [
                            {"name": "work", "phase": "Succeeded"},
                            {"name": "sign-off", "phase": "Pending"},
                        ],
                    }
                ]
            },
        },
    }
    lines = render.progress_lines(before, run, NOW)
    assert lines == [
        "12:00:00 step develop/iteration 2/sign-off: AwaitingApproval: awaiting approval: Review it"
    ]
