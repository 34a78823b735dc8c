"""A run the CRD admitted but the models refuse: the planner decides its status (the shell writes it)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from agentrun_operator.api import parse_agentrun
from agentrun_operator.planner.admission import unparseable_status
from tests.unit.planner.world import manifest

NOW = datetime(2026, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)


def error_of(obj: dict[str, object]) -> ValidationError:
    with pytest.raises(ValidationError) as caught:
        parse_agentrun(obj)
    return caught.value


def bad_step_name() -> ValidationError:
    return error_of(manifest([{"name": "Not_A_Label"}]))


def test_an_unparseable_run_fails_with_invalid_spec_naming_the_field() -> None:
    status = unparseable_status("Running", 3, bad_step_name(), NOW)
    assert status is not None
    assert (status.phase, status.reason, status.observed_generation) == ("Failed", "InvalidSpec", 3)
    assert status.message is not None
    assert status.message.startswith("spec is not valid: spec.workflow.steps[0].name: steps[].name must be")
    assert status.message.endswith("See docs/api.md#step-name")
    by_type = {c.type: c for c in status.conditions}
    condition = by_type["InvalidSpec"]
    assert (condition.type, condition.status, condition.reason) == ("InvalidSpec", "True", "InvalidSpec")
    assert condition.message == status.message
    # the same derived conditions as any failed run: kubectl wait and kstatus see it ended
    assert {t: (c.status, c.reason) for t, c in by_type.items() if t != "InvalidSpec"} == {
        "Ready": ("False", "InvalidSpec"),
        "Succeeded": ("False", "InvalidSpec"),
        "Reconciling": ("False", "InvalidSpec"),
        "Stalled": ("True", "InvalidSpec"),
    }


def test_the_condition_time_is_whole_seconds_as_the_shell_wrote_it() -> None:
    status = unparseable_status(None, 1, bad_step_name(), NOW)
    assert status is not None
    dumped = status.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert {c["lastTransitionTime"] for c in dumped["conditions"]} == {"2026-03-01T12:00:00Z"}


def test_an_already_failed_run_is_left_alone() -> None:
    assert unparseable_status("Failed", 1, bad_step_name(), NOW) is None


def test_a_problem_without_an_anchor_points_at_the_api_reference() -> None:
    obj = manifest()
    obj["spec"]["workflow"]["steps"][0]["retries"] = "many"
    status = unparseable_status(None, 1, error_of(obj), NOW)
    assert status is not None and status.message is not None
    assert status.message.startswith("spec is not valid: spec.workflow.steps[0].retries: ")
    assert status.message.endswith(" (see docs/api.md)")
