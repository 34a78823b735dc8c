"""`agentrun logs`: which attempts it shows (ctl/attempts.py), and every refusal in one line."""

from __future__ import annotations

from typing import Any

import pytest

from agentrun_operator import naming
from agentrun_operator.ctl.attempts import (
    Selection,
    WarmSlice,
    collected_line,
    from_jobs,
    from_status,
    merged,
    select,
    with_warm_pods,
)
from agentrun_operator.ctl.connect import CtlError

WORKLOADS = frozenset({"dev/implement", "dev/review", "build"})
STEPS = ("dev", "dev/implement", "dev/review", "build")


def job(name: str, step: str, iteration: int, attempt: int, created: str, label: str = "") -> dict[str, Any]:
    labels = {
        naming.LABEL_RUN: "r",
        naming.LABEL_STEP: step.split("/")[-1],
        naming.LABEL_ITERATION: str(iteration),
        naming.LABEL_ATTEMPT: str(attempt),
    }
    annotations = {naming.ANNOTATION_STEP: label} if label else {}
    meta = {"name": name, "labels": labels, "annotations": annotations, "creationTimestamp": created}
    return {"metadata": meta, "spec": {}}


def pod(name: str, job_name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"batch.kubernetes.io/job-name": job_name}}}


STATUS = {
    "status": {
        "workflow": {
            "steps": [
                {
                    "name": "dev",
                    "phase": "Failed",
                    "loop": {
                        "currentIteration": 3,
                        "iterations": [
                            {
                                "index": 1,
                                "attempts": 1,
                                "phase": "Succeeded",
                                "startedAt": "2026-11-28T05:00:00Z",
                                "steps": {"implement": "Succeeded", "review": "Succeeded"},
                            },
                            {
                                "index": 2,
                                "attempts": 1,
                                "phase": "Succeeded",
                                "startedAt": "2026-11-28T05:01:00Z",
                                "steps": {"implement": "Succeeded", "review": "Skipped"},
                            },
                            {
                                "index": 3,
                                "attempts": 1,
                                "phase": "Failed",
                                "startedAt": "2026-11-28T05:02:00Z",
                            },
                        ],
                    },
                    "steps": [
                        {
                            "name": "implement",
                            "phase": "Failed",
                            "attempt": 2,
                            "jobRef": {"name": "r-step-1i3-1-iter-1-attempt-2"},
                            "startedAt": "2026-11-28T05:02:00Z",
                        },
                        {"name": "review", "phase": "Skipped"},
                    ],
                }
            ]
        }
    }
}


def attempts() -> list[Any]:
    jobs = [
        job(
            "r-step-1i3-1-iter-1-attempt-1",
            "dev/implement",
            3,
            1,
            "2026-11-28T05:02:01Z",
            "dev/iteration 3/implement",
        ),
        job(
            "r-step-1i3-1-iter-1-attempt-2",
            "dev/implement",
            3,
            2,
            "2026-11-28T05:02:30Z",
            "dev/iteration 3/implement",
        ),
    ]
    pods = [pod("p2", "r-step-1i3-1-iter-1-attempt-2")]
    return merged(from_jobs(jobs, pods), from_status(STATUS, WORKLOADS))


def test_every_attempt_in_run_order_with_its_phase_and_pod() -> None:
    found = [
        (a.step, a.iteration, a.attempt, a.phase, a.job_name is not None, len(a.pods)) for a in attempts()
    ]
    assert found == [
        ("dev/implement", 1, 0, "Succeeded", False, 0),  # an earlier body iteration: its phase only
        ("dev/review", 1, 0, "Succeeded", False, 0),
        ("dev/implement", 2, 0, "Succeeded", False, 0),  # review was skipped in iteration 2
        ("dev/implement", 3, 1, "Failed", True, 0),  # kept Job, pod gone
        ("dev/implement", 3, 2, "Failed", True, 1),
    ]


def test_the_default_is_the_latest_attempt_and_a_step_selects_its_children() -> None:
    chosen = select("r", attempts(), Selection(workload_steps=STEPS))
    assert [(c.step, c.iteration, c.attempt) for c in chosen] == [("dev/implement", 3, 2)]
    assert len(select("r", attempts(), Selection("dev", workload_steps=STEPS))) == 5
    one = select("r", attempts(), Selection("dev/implement", 3, 1, workload_steps=STEPS))
    assert [(c.iteration, c.attempt) for c in one] == [(3, 1)]


@pytest.mark.parametrize(
    ("selection", "says"),
    [
        (Selection("dev/nope"), "--step: 'dev/nope' is not a step of AgentRun r"),
        (Selection("build"), "step build of AgentRun r has not started yet"),
        (Selection("dev/implement", 4), "--iteration: step dev/implement has no iteration 4"),
        (Selection("dev/implement", 3, 9), "--attempt: step dev/implement has no attempt 9"),
        (Selection(None, 3), "--iteration/--attempt need --step"),
    ],
)
def test_a_choice_that_names_nothing_is_one_line(selection: Selection, says: str) -> None:
    selection.workload_steps = STEPS
    with pytest.raises(CtlError) as caught:
        select("r", attempts(), selection)
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_a_run_without_attempts_says_so() -> None:
    with pytest.raises(CtlError, match="has not started an attempt yet"):
        select("r", [], Selection(workload_steps=STEPS))


def test_a_collected_attempt_says_why() -> None:
    gone = attempts()[0]
    line = collected_line("r", gone, None)
    assert "pod collected" in line and "AGENTS_CONTROLLER_JOB_TTL_SECONDS" in line and "\n" not in line
    kept = attempts()[3]
    assert "has no pod any more" in collected_line("r", kept, "OnPodSuccess")


def test_an_attempt_of_candidates_shows_every_candidates_pod_by_index() -> None:
    from agentrun_operator.ctl.logs import _header, shown_pods

    def candidate(name: str, index: int) -> dict[str, Any]:
        found = pod(name, "r-step-1-iter-1-attempt-1")
        found["metadata"]["annotations"] = {"batch.kubernetes.io/job-completion-index": str(index)}
        return found

    pods = [candidate("p2", 2), candidate("p0", 0), candidate("p1-old", 1), candidate("p1-new", 1)]
    pods.append(pod("promote", "r-step-1-iter-1-attempt-1-promote"))
    jobs = [
        job("r-step-1-iter-1-attempt-1", "build", 1, 1, "t"),
        job("r-step-1-iter-1-attempt-1-promote", "build", 1, 1, "u"),
    ]
    (attempt,) = from_jobs(jobs, pods)  # the promotion Job is no attempt of its own
    shown = shown_pods(attempt)
    assert [p["metadata"]["name"] for p in shown if p is not None] == ["p0", "p1-new", "p2", "promote"]
    assert "· candidate 1 · pod p1-new" in _header(attempt, shown[1])
    assert "· promotion of the winner · pod promote" in _header(attempt, shown[3])
    (plain,) = from_jobs([job("j", "build", 1, 1, "t")], [pod("a", "j"), pod("b", "j")])
    assert [p["metadata"]["name"] for p in shown_pods(plain) if p is not None] == ["b"]


WARM_STATUS = {
    "status": {
        "workflow": {
            "steps": [
                {
                    "name": "build",
                    "phase": "Running",
                    "loop": {
                        "currentIteration": 3,
                        "iterations": [
                            {
                                "index": i,
                                "attempts": 1,
                                "phase": p,
                                "startedAt": f"2026-11-28T05:0{i}:00Z",
                                **w,
                            }
                            for i, p, w in (
                                (1, "Succeeded", {"pod": "warm-pod"}),
                                (2, "Succeeded", {"pod": "warm-pod", "warm": True}),
                                (3, "Running", {"pod": "warm-pod", "warm": True}),
                            )
                        ],
                    },
                }
            ]
        }
    }
}


def test_each_warm_iteration_is_its_own_attempt_on_the_pod_that_ran_it() -> None:
    """docs/operations.md#logs: iterations 2 and 3 ran in iteration 1's pod (one Job): each is listed,
    with that pod and its id in it, so its log is its slice of the pod's `main` log."""
    jobs = [job("b-1", "build", 1, 1, "2026-11-28T05:01:00Z")]
    pods = [pod("warm-pod", "b-1")]
    attempts = with_warm_pods(merged(from_jobs(jobs, pods), from_status(WARM_STATUS, WORKLOADS)), pods)
    assert [(a.iteration, a.warm_id, a.pods[0]["metadata"]["name"]) for a in attempts] == [
        (1, "1-1", "warm-pod"),
        (2, "2-1", "warm-pod"),
        (3, "3-1", "warm-pod"),
    ]
    (second,) = select("r", attempts, Selection(step="build", iteration=2, workload_steps=("build",)))
    assert second.warm_id == "2-1"


def test_a_warm_slice_keeps_one_iterations_lines_whatever_the_chunks() -> None:
    log = (
        "agentrun: iteration 1-1\none\n"
        "agentrun: iteration 2-1\ntwo a\ntwo b\n"
        "agentrun: iteration 3-1\nthree\n"
    )
    for size in (1, 3, 7, len(log)):
        part = WarmSlice("2-1")
        chunks = [log[i : i + size] for i in range(0, len(log), size)]
        kept = "".join(part.feed(chunk) for chunk in chunks) + part.feed("", final=True)
        assert kept == "two a\ntwo b\n" and part.done
    last = WarmSlice("3-1")
    assert last.feed(log) == "three\n" and not last.done  # still running: -f goes on
    assert WarmSlice("9-1").feed(log) == ""
