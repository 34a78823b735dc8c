"""The operator's JSON log lines: one object per line, decision fields as fields (not in the text)."""

from __future__ import annotations

import json
import logging

from agentrun_operator.shell.logs import JsonFormatter


def _line(message: str, **extra: object) -> dict[str, object]:
    record = logging.LogRecord("agentrun.reconciler", logging.INFO, __file__, 1, message, (), None)
    record.__dict__.update(extra)
    parsed: dict[str, object] = json.loads(JsonFormatter().format(record))
    return parsed


def test_decision_fields_are_fields() -> None:
    line = _line(
        "job created",
        correlation_id="uid-1",
        run="ns/demo",
        step="implement",
        iteration=3,
        attempt=2,
        decision="create-job",
        job="demo-step-1-iter-3-attempt-2",
    )
    assert line["msg"] == "job created"
    assert line["level"] == "info" and line["logger"] == "agentrun.reconciler"
    assert {k: line[k] for k in ("correlation_id", "run", "step", "iteration", "attempt", "decision")} == {
        "correlation_id": "uid-1",
        "run": "ns/demo",
        "step": "implement",
        "iteration": 3,
        "attempt": 2,
        "decision": "create-job",
    }


def test_a_run_level_decision_has_null_step_fields() -> None:
    line = _line(
        "Completed: all 1 steps finished",
        decision="RunSucceeded",
        step=None,
        path=None,
        iteration=None,
        attempt=None,
    )
    assert line["step"] is None and line["path"] is None
    assert line["iteration"] is None and line["attempt"] is None


def test_other_values_that_are_not_plain_are_left_out() -> None:
    line = _line("kopf", settings=object(), other=None, count=1)
    assert "settings" not in line and "other" not in line and line["count"] == 1
