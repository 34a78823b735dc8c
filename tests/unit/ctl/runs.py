"""AgentRun objects (as the API server returns them) at the moments the CLI renders them."""

from __future__ import annotations

import copy
from typing import Any

META = {
    "name": "conditional-loop",
    "namespace": "e2e",
    "uid": "u-1",
    "resourceVersion": "10",
    "generation": 1,
}


def _iteration(
    index: int, phase: str, start: str, end: str | None = None, attempts: int = 1
) -> dict[str, Any]:
    record: dict[str, Any] = {"index": index, "phase": phase, "attempts": attempts, "startedAt": start}
    if end:
        record["finishedAt"] = end
    record["jobRef"] = {"name": f"conditional-loop-step-1-iter-{index}-attempt-{attempts}"}
    return record


def conditional(stage: int) -> dict[str, Any]:
    """The conditional-loop example at `stage` 0 (just created) .. 5 (Succeeded after 3 iterations)."""
    run: dict[str, Any] = {"apiVersion": "agents.proompteng.ai/v1alpha1", "kind": "AgentRun"}
    run["metadata"] = dict(META)
    if stage == 0:
        return run
    iterations = [_iteration(1, "Running", "2026-11-23T10:00:01Z")]
    loop: dict[str, Any] = {"currentIteration": 1, "completedIterations": 0, "maxIterations": 8}
    if stage >= 2:
        iterations = [
            _iteration(1, "Succeeded", "2026-11-23T10:00:01Z", "2026-11-23T10:00:04Z"),
            _iteration(2, "Running", "2026-11-23T10:00:04Z"),
        ]
        loop.update(currentIteration=2, completedIterations=1, lastControl={"continue": True})
    if stage >= 3:
        iterations[1] = _iteration(2, "Succeeded", "2026-11-23T10:00:04Z", "2026-11-23T10:00:07Z")
        iterations.append(_iteration(3, "Running", "2026-11-23T10:00:07Z"))
        loop.update(currentIteration=3, completedIterations=2)
    if stage >= 4:
        iterations[2] = _iteration(3, "Succeeded", "2026-11-23T10:00:07Z", "2026-11-23T10:00:10Z")
        loop.update(
            completedIterations=3,
            stopReason="LoopConditionFalse",
            lastControl={"continue": False, "outputs": {"iteration": 3, "notes": 3}},
        )
    loop.update(iterations=iterations, retainedIterations=len(iterations), prunedIterations=0)
    step: dict[str, Any] = {
        "name": "implement",
        "phase": "Running",
        "attempt": 1,
        "startedAt": "2026-11-23T10:00:01Z",
        "loop": loop,
    }
    status: dict[str, Any] = {
        "phase": "Running",
        "observedGeneration": 1,
        "startedAt": "2026-11-23T10:00:01Z",
        "currentStep": "implement",
        "iteration": f"{loop['currentIteration']}/8",
        "workflow": {"phase": "Running", "steps": [step]},
        "conditions": [
            _cond("Ready", "False", "Running", "step implement: iteration running"),
            _cond("Succeeded", "Unknown", "Running", "the run is in progress"),
        ],
    }
    if stage >= 4:
        step.update(phase="Succeeded", finishedAt="2026-11-23T10:00:10Z", reason="LoopConditionFalse")
        step["message"] = "iteration 3: condition expression is false"
        status.update(
            phase="Succeeded",
            reason="Completed",
            message="all 1 steps finished",
            finishedAt="2026-11-23T10:00:10Z",
        )
        status["workflow"]["phase"] = "Succeeded"
        status["conditions"] = [
            _cond("Ready", "True", "Completed", "all 1 steps finished"),
            _cond("Succeeded", "True", "Completed", "all 1 steps finished"),
        ]
    run["status"] = status
    return copy.deepcopy(run)


def _cond(type_: str, status: str, reason: str, message: str) -> dict[str, Any]:
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "observedGeneration": 1,
        "lastTransitionTime": "2026-11-23T10:00:01Z",
    }


def invalid() -> dict[str, Any]:
    message = (
        "spec.workload.volumes[0].claimName: PersistentVolumeClaim 'missing-ws' does not exist in the "
        "namespace (value: 'missing-ws'; fix: create the PersistentVolumeClaim 'missing-ws', or name an "
        "existing one; see docs/concepts.md#references)"
    )
    return {
        "metadata": {**META, "name": "no-claim"},
        "status": {
            "phase": "Failed",
            "reason": "InvalidSpec",
            "message": message,
            "finishedAt": "2026-11-23T10:00:31Z",
            "workflow": {
                "phase": "Failed",
                "steps": [
                    {
                        "name": "implement",
                        "phase": "Pending",
                        "attempt": 0,
                        "message": "not started: the run failed (InvalidSpec)",
                    }
                ],
            },
            "conditions": [
                _cond("InvalidSpec", "True", "InvalidSpec", message),
                _cond("Ready", "False", "InvalidSpec", message),
                _cond("Succeeded", "False", "InvalidSpec", message),
                _cond("Stalled", "True", "InvalidSpec", message),
            ],
        },
    }


def cancelled() -> dict[str, Any]:
    """Two steps: a plain step that succeeded with a control object, a loop cancelled gracefully."""
    return {
        "metadata": {**META, "name": "plan-and-work"},
        "spec": {"cancel": "Graceful"},
        "status": {
            "phase": "Cancelled",
            "reason": "Cancelled",
            "message": "cancelled (Graceful)",
            "startedAt": "2026-11-23T10:00:00Z",
            "finishedAt": "2026-11-23T10:02:05Z",
            "workflow": {
                "phase": "Cancelled",
                "steps": [
                    {
                        "name": "plan",
                        "phase": "Succeeded",
                        "attempt": 1,
                        "startedAt": "2026-11-23T10:00:00Z",
                        "finishedAt": "2026-11-23T10:00:02Z",
                        "control": {"targets": ["a", "b"]},
                    },
                    {
                        "name": "work",
                        "phase": "Cancelled",
                        "attempt": 2,
                        "reason": "LoopCancelled",
                        "startedAt": "2026-11-23T10:00:02Z",
                        "finishedAt": "2026-11-23T10:02:05Z",
                        "message": "cancelled (Graceful) after iteration 2",
                        "loop": {
                            "currentIteration": 2,
                            "completedIterations": 1,
                            "maxIterations": 20,
                            "stopReason": "LoopCancelled",
                            "retainedIterations": 2,
                            "prunedIterations": 0,
                            "iterations": [
                                _iteration(1, "Succeeded", "2026-11-23T10:00:02Z", "2026-11-23T10:01:00Z"),
                                {
                                    **_iteration(
                                        2, "Failed", "2026-11-23T10:01:00Z", "2026-11-23T10:02:05Z", 2
                                    ),
                                    "message": "attempt 2: container main exited 1",
                                },
                            ],
                        },
                    },
                ],
            },
            "conditions": [
                _cond("Ready", "False", "Cancelled", "cancelled (Graceful)"),
                _cond("Succeeded", "False", "Cancelled", "cancelled (Graceful)"),
            ],
        },
    }


def _child(name: str, start: str, end: str, job: str, **extra: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": name, "phase": "Succeeded", "attempt": 1, "startedAt": start}
    entry.update(finishedAt=end, jobRef={"name": job}, message="succeeded", **extra)
    return entry


def nested() -> dict[str, Any]:
    """The review-loop example (a loop body of three children) in its 3rd iteration, after a switch."""
    children = {"implement": "Succeeded", "review": "Succeeded", "test": "Succeeded"}  # sorted, as served
    body = {
        "name": "develop",
        "phase": "Running",
        "attempt": 0,
        "startedAt": "2026-11-23T10:00:02Z",
        "message": "iteration 3/5 running",
        "loop": {
            "currentIteration": 3,
            "completedIterations": 2,
            "maxIterations": 5,
            "lastControl": {"approved": False, "changes": 2},
            "retainedIterations": 3,
            "prunedIterations": 0,
            "iterations": [
                {
                    "index": 1,
                    "phase": "Succeeded",
                    "attempts": 1,
                    "startedAt": "2026-11-23T10:00:02Z",
                    "finishedAt": "2026-11-23T10:00:05Z",
                    "steps": children,
                },
                {
                    "index": 2,
                    "phase": "Succeeded",
                    "attempts": 1,
                    "startedAt": "2026-11-23T10:00:05Z",
                    "finishedAt": "2026-11-23T10:00:08Z",
                    "steps": children,
                },
                {"index": 3, "phase": "Running", "attempts": 1, "startedAt": "2026-11-23T10:00:08Z"},
            ],
        },
        "steps": [
            _child(
                "implement", "2026-11-23T10:00:08Z", "2026-11-23T10:00:10Z", "r-step-2i3-1-iter-1-attempt-1"
            ),
            {
                "name": "test",
                "phase": "Running",
                "attempt": 1,
                "startedAt": "2026-11-23T10:00:10Z",
                "jobRef": {"name": "r-step-2i3-2-iter-1-attempt-1"},
            },
            {"name": "review", "phase": "Pending", "attempt": 0},
        ],
    }
    route = {
        "name": "route",
        "phase": "Succeeded",
        "attempt": 0,
        "case": "cases[0]",
        "startedAt": "2026-11-23T10:00:01Z",
        "finishedAt": "2026-11-23T10:00:02Z",
        "message": "cases[0]: all 1 steps finished",
        "control": {"fixed": True},
        "steps": [
            _child(
                "fix",
                "2026-11-23T10:00:01Z",
                "2026-11-23T10:00:02Z",
                "r-step-1c1-1-iter-1-attempt-1",
                control={"fixed": True},
            ),
        ],
    }
    return {
        "metadata": {**META, "name": "review-loop"},
        "status": {
            "phase": "Running",
            "startedAt": "2026-11-23T10:00:01Z",
            "workflow": {"phase": "Running", "steps": [route, body]},
        },
    }


def polling() -> dict[str, Any]:
    """A loop waiting between iterations (loop.intervalSeconds: 30): iteration 2 ended at 10:00:07,
    iteration 3 starts at 10:00:37, and no pod runs until then."""
    run = conditional(2)
    step = run["status"]["workflow"]["steps"][0]
    loop = step["loop"]
    loop["iterations"][1] = _iteration(2, "Succeeded", "2026-11-23T10:00:04Z", "2026-11-23T10:00:07Z")
    loop.update(completedIterations=2, lastControl={"ready": False}, nextIterationAt="2026-11-23T10:00:37Z")
    step["message"] = (
        "iteration 2/8 succeeded; iteration 3 starts at 2026-11-23T10:00:37Z (loop.intervalSeconds); "
        "no pod runs until then"
    )
    return run


def _at(seconds: float) -> str:
    """10:00:00Z plus `seconds`, as the status writes it."""
    whole = int(seconds)
    return f"2026-11-23T{10 + whole // 3600:02d}:{whole % 3600 // 60:02d}:{whole % 60:02d}Z"


def forty_with_retries() -> dict[str, Any]:
    """A 40-iteration loop, finished: each iteration 3 s and a 10 s wait (loop.intervalSeconds)
    before the next; every 7th needed 3 attempts (8 s of failed attempts and backoff first), iteration
    20 took 20 s, iteration 40 failed twice and gave up."""
    records: list[dict[str, Any]] = []
    clock = 1.0
    for index in range(1, 41):
        start = clock
        record: dict[str, Any] = {
            "index": index,
            "phase": "Succeeded",
            "attempts": 1,
            "startedAt": _at(start),
        }
        if index % 7 == 0:
            record.update(attempts=3, lastAttemptStartedAt=_at(start + 8))
            clock += 8
        clock += 20 if index == 20 else 3
        if index == 40:
            clock += 4
            record.update(phase="Failed", attempts=2, lastAttemptStartedAt=_at(start + 4))
            record["message"] = "main container exited with code 2 (Error)"
        record["finishedAt"] = _at(clock)
        records.append(record)
        clock += 10
    end = records[-1]["finishedAt"]
    step = {
        "name": "poll",
        "phase": "Failed",
        "attempt": 2,
        "startedAt": _at(1),
        "finishedAt": end,
        "reason": "LoopIterationFailed",
        "loop": {
            "currentIteration": 40,
            "completedIterations": 39,
            "maxIterations": 50,
            "stopReason": "LoopIterationFailed",
            "retainedIterations": 40,
            "prunedIterations": 0,
            "iterations": records,
        },
    }
    return {
        "metadata": {**META, "name": "poller"},
        "status": {
            "phase": "Failed",
            "reason": "LoopIterationFailed",
            "startedAt": _at(1),
            "finishedAt": end,
            "workflow": {"phase": "Failed", "steps": [step]},
        },
    }


def awaiting_approval() -> dict[str, Any]:
    """The approval-loop example waiting at its gate in iteration 1 since 10:00:04."""
    gate = {
        "name": "sign-off",
        "phase": "AwaitingApproval",
        "startedAt": "2026-11-23T10:00:04Z",
        "approval": {"iteration": 1},
        "message": "awaiting approval: Review change.log in /workspace and approve",
    }
    develop = {
        "name": "develop",
        "phase": "Running",
        "startedAt": "2026-11-23T10:00:01Z",
        "loop": {
            "currentIteration": 1,
            "completedIterations": 0,
            "maxIterations": 5,
            "iterations": [
                {"index": 1, "phase": "Running", "attempts": 0, "startedAt": "2026-11-23T10:00:01Z"}
            ],
        },
        "steps": [_child("implement", "2026-11-23T10:00:01Z", "2026-11-23T10:00:04Z", "a-job"), gate],
    }
    command = "agentrun approve approval-loop -n e2e --step develop/sign-off --input verdict=VALUE"
    return {
        "metadata": {**META, "name": "approval-loop"},
        "status": {
            "phase": "Running",
            "startedAt": "2026-11-23T10:00:01Z",
            "workflow": {"phase": "Running", "steps": [develop]},
            "conditions": [
                _cond(
                    "AwaitingApproval",
                    "True",
                    "AwaitingApproval",
                    f"step develop/iteration 1/sign-off: awaiting approval: Review change.log in /workspace "
                    f"and approve; approve with `{command}` (required: verdict: revise (another iteration) "
                    "or final), reject with `agentrun reject approval-loop -n e2e --step develop/sign-off "
                    "--reason TEXT`",
                )
            ],
        },
    }


def best_of() -> dict[str, Any]:
    """The conditional example at stage 3 as a best-of-3 loop: iterations 1 and 2 kept candidates 2
    and 0, iteration 3 picked candidate 1 and is putting its files into the workspace."""
    run = conditional(3)
    records = run["status"]["workflow"]["steps"][0]["loop"]["iterations"]
    records[0]["candidates"] = {"count": 3, "succeeded": [0, 1, 2], "winner": 2, "promoted": True}
    records[1]["candidates"] = {"count": 3, "succeeded": [0, 2], "winner": 0, "promoted": True}
    records[2]["candidates"] = {"count": 3, "succeeded": [1, 2], "winner": 1, "promoted": False}
    return run
