"""The status a plan writes once its Jobs are created: the uids the API server answered with,
recorded by the planner's own rule (planner/job_uids.py), never by the shell editing the plan."""

from __future__ import annotations

from agentrun_operator.api import AgentRunStatus
from agentrun_operator.planner.context import Plan
from agentrun_operator.planner.job_uids import status_with_job_uids


def test_created_job_uids_fill_only_matching_refs_without_uid() -> None:
    status = AgentRunStatus.model_validate(
        {
            "workflow": {
                "steps": [
                    {
                        "name": "outer",
                        "jobRef": {"name": "new"},
                        "loop": {
                            "iterations": [
                                {"index": 1, "phase": "Running", "jobRef": {"name": "new"}},
                                {"index": 2, "phase": "Running", "jobRef": {"name": "old", "uid": "o"}},
                            ]
                        },
                        "steps": [{"name": "child", "jobRef": {"name": "new"}}],
                    },
                    {"name": "untouched", "jobRef": {"name": "elsewhere"}},
                ]
            }
        }
    )
    before = status.model_dump(by_alias=True, exclude_none=True)
    filled = status_with_job_uids(status, {"new": "n-uid", "old": "other"})
    assert filled.workflow is not None and status.workflow is not None
    step = filled.workflow.steps[0]
    assert step.job_ref is not None and step.job_ref.uid == "n-uid"
    assert step.loop is not None
    assert [r.job_ref.uid for r in step.loop.iterations if r.job_ref] == ["n-uid", "o"]
    assert step.steps is not None and step.steps[0].job_ref is not None
    assert step.steps[0].job_ref.uid == "n-uid"
    assert filled.workflow.steps[1] is status.workflow.steps[1]  # nothing to fill: not copied
    assert status.model_dump(by_alias=True, exclude_none=True) == before  # the planner's is untouched
    # What is written validates back to the same model (it is remembered without a parse).
    dumped = filled.model_dump(by_alias=True, exclude_none=True, mode="json")
    assert AgentRunStatus.model_validate(dumped) == filled
    assert status_with_job_uids(status, {}) is status
    assert status_with_job_uids(status, {"nothing": "x"}) is status


def test_a_plan_gives_the_status_after_its_creates_without_changing() -> None:
    status = AgentRunStatus.model_validate({"workflow": {"steps": [{"name": "a", "jobRef": {"name": "j"}}]}})
    decision = Plan(status=status, actions=())
    after = decision.status_after({"j": "u"})
    assert after.workflow is not None and after.workflow.steps[0].job_ref is not None
    assert after.workflow.steps[0].job_ref.uid == "u"
    assert decision.status is status and status.workflow is not None
    assert status.workflow.steps[0].job_ref is not None and status.workflow.steps[0].job_ref.uid is None
    assert decision.status_after({}) is status
