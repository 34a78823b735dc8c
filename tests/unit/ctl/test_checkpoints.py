"""`agentrun checkpoints` and `agentrun resume` on a run as the API server returns it
(docs/concepts.md#resume): the rows listed, the new run's manifest, and each refusal with its fix.
The commands against a real API server are in tests/e2e/test_checkpoints.py."""

from __future__ import annotations

from typing import Any

import pytest

from agentrun_operator.api import parse_agentrun
from agentrun_operator.ctl.checkpoints import checkpoint_rows, render_rows, resume_manifest
from agentrun_operator.ctl.connect import CtlError


def record(index: int, checkpoint: dict[str, Any] | None) -> dict[str, Any]:
    entry: dict[str, Any] = {"index": index, "phase": "Succeeded", "attempts": 1}
    entry["startedAt"] = f"2026-12-05T10:00:0{index}Z"
    if checkpoint is not None:
        entry["checkpoint"] = checkpoint
    return entry


def source(phase: str = "Succeeded", iterations: int = 4, **spec: Any) -> dict[str, Any]:
    """A finished run of a 4-iteration loop with checkpoints; iteration 3's record lost its checkpoint."""
    records = [
        record(k, None if k == 3 else {"id": f"src_1_{k}", "files": k, "bytes": 1000 * k})
        for k in range(1, iterations + 1)
    ]
    records[1]["checkpoint"]["restored"] = "src_1_2"
    step = {
        "name": "work",
        "loop": {"maxIterations": 4, "checkpoint": {"mode": "Files", "onFailedAttempt": "Restore"}},
    }
    return {
        "apiVersion": "agents.proompteng.ai/v1alpha1",
        "kind": "AgentRun",
        "metadata": {"name": "src", "namespace": "team", "labels": {"team": "a"}, "uid": "u-1"},
        "spec": {
            "runtime": {"type": "workflow"},
            "workload": {
                "image": "busybox",
                "volumes": [{"name": "ws", "type": "pvc", "claimName": "ws", "mountPath": "/workspace"}],
            },
            "workflow": {"steps": [{"name": "prepare"}, step]},
            **spec,
        },
        "status": {
            "phase": phase,
            "workflow": {
                "steps": [
                    {"name": "prepare", "phase": "Succeeded"},
                    {
                        "name": "work",
                        "phase": phase,
                        "loop": {"currentIteration": iterations, "iterations": records},
                    },
                ]
            },
        },
    }


def test_the_rows_are_the_checkpoints_the_status_records() -> None:
    rows = checkpoint_rows(source())
    assert [(r["iteration"], r["id"]) for r in rows] == [(1, "src_1_1"), (2, "src_1_2"), (4, "src_1_4")]
    assert rows[1] == {
        "step": "work",
        "iteration": 2,
        "id": "src_1_2",
        "files": 2,
        "bytes": 2000,
        "addedBytes": None,
        "time": "2026-12-05T10:00:02Z",
        "restored": "src_1_2",
    }
    table = render_rows(rows).splitlines()
    assert table[0].split() == ["STEP", "ITERATION", "ID", "FILES", "SIZE", "ADDED", "TIME", "RESTORED"]
    assert table[2].split() == [
        "work",
        "2",
        "src_1_2",
        "2",
        "2.0",
        "KiB",
        "-",
        "2026-12-05T10:00:02Z",
        "src_1_2",
    ]


def test_a_run_without_checkpoints_lists_none_and_says_why() -> None:
    run = source()
    del run["spec"]["workflow"]["steps"][1]["loop"]["checkpoint"]
    assert checkpoint_rows(run) == []
    assert "loop.checkpoint" in render_rows([])


def test_resume_copies_the_spec_and_names_the_checkpoint_of_the_iterations_end() -> None:
    run = source(cancel="Graceful", idempotencyKey="k")
    manifest = resume_manifest(run, 3, None, None)  # iteration 3's end: iteration 4's start
    assert manifest["metadata"] == {"name": "src-from-3", "namespace": "team", "labels": {"team": "a"}}
    spec = manifest["spec"]
    assert spec["resumeFrom"] == {"run": "src", "iteration": 3, "step": "work"}
    assert "cancel" not in spec and "idempotencyKey" not in spec
    assert spec["workload"] == run["spec"]["workload"]  # the same claim
    parse_agentrun(manifest)  # the API's own model takes it
    assert resume_manifest(run, 1, "again", "work")["metadata"]["name"] == "again"


@pytest.mark.parametrize(
    ("iteration", "step", "said"),
    [
        (4, None, "iteration 4 is its last (it ran 4)"),
        (2, None, "no checkpoint of iteration 3's start is in its status"),  # its record lost it
        (0, None, "--from-iteration must be 1 or more, not 0"),
        (1, "prepare", "has no looping step 'prepare' with loop.checkpoint"),
    ],
)
def test_resume_refuses_what_has_no_checkpoint_naming_the_fix(
    iteration: int, step: str | None, said: str
) -> None:
    with pytest.raises(CtlError) as refused:
        resume_manifest(source(), iteration, None, step)
    assert said in str(refused.value)
    assert "docs/concepts.md#resume" in str(refused.value)


@pytest.mark.parametrize("phase", [None, "Pending", "Running"])
def test_resume_refuses_a_source_that_still_runs_on_the_claim(phase: str | None) -> None:
    run = source(phase=phase or "Running")
    if phase is None:
        del run["status"]["phase"]
    with pytest.raises(CtlError) as refused:
        resume_manifest(run, 1, None, None)
    assert f"while it is {phase or 'Pending'}" in str(refused.value)
    assert "agentrun cancel src" in str(refused.value)


@pytest.mark.parametrize("phase", ["Succeeded", "Failed", "Cancelled"])
def test_resume_takes_a_finished_source_whatever_its_end(phase: str) -> None:
    assert resume_manifest(source(phase=phase), 1, None, None)["spec"]["resumeFrom"]["iteration"] == 1
