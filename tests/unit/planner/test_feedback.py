"""AGENTRUN_PREVIOUS (planner/feedback.py): every iteration pod is told what the previous attempt of
its iteration and the previous iteration of its loop did, in at most 4 KiB of JSON."""

from __future__ import annotations

import json
from typing import Any

from agentrun_operator.planner.feedback import MAX_PREVIOUS_BYTES, MAX_TAIL_BYTES, bounded, tail
from tests.unit.planner.world import PlannerWorld, loop_step, manifest


def _previous(world: PlannerWorld, job: str) -> dict[str, Any]:
    containers = world.manifests[job]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in containers[-1]["env"] if "value" in e}
    raw = env["AGENTRUN_PREVIOUS"]
    assert len(raw.encode()) <= MAX_PREVIOUS_BYTES
    result: dict[str, Any] = json.loads(raw)
    return result


def test_the_first_attempt_of_the_first_iteration_is_told_nothing() -> None:
    world = PlannerWorld(manifest([{"name": "a"}]))
    world.plan()
    assert _previous(world, world.active()) == {"attempt": None, "iteration": None}


def test_a_retry_is_told_why_the_attempt_before_failed_with_the_tail_of_its_message() -> None:
    world = PlannerWorld(manifest([{"name": "a", "retries": 2, "retryBackoffSeconds": 0}]))
    world.plan()
    first = world.active()
    world.fail(first, exit_code=3, message="patch rejected: hunk 2 does not apply\n")
    world.plan()
    second = world.active()
    assert second.endswith("attempt-2")
    assert _previous(world, second) == {
        "attempt": {
            "attempt": 1,
            "reason": "Error",
            "exitCode": 3,
            "message": "main container exited with code 3 (Error): patch rejected: hunk 2 does not apply",
        },
        "iteration": None,
    }
    world.fail(second, exit_code=137, reason="OOMKilled")
    world.plan()
    third = _previous(world, world.active())["attempt"]
    assert third == {
        "attempt": 2,
        "reason": "OOMKilled",
        "exitCode": 137,
        "message": "main container exited with code 137 (OOMKilled)",
    }


def test_a_timeout_and_a_vanished_job_are_named_as_such() -> None:
    step = {"name": "a", "retries": 2, "retryBackoffSeconds": 0, "timeoutSeconds": 30}
    world = PlannerWorld(manifest([step]))
    world.plan()
    world.deadline()
    world.settle()
    world.plan()
    told = _previous(world, world.active())["attempt"]
    assert told["reason"] == "DeadlineExceeded" and told["exitCode"] is None
    assert "timed out after 30s" in told["message"]
    world.plan()  # record the Job's uid
    world.vanish()
    world.plan()
    world.plan()
    told = _previous(world, world.active())["attempt"]
    assert told["reason"] == "JobVanished" and "vanished" in told["message"]


def test_the_next_iteration_is_told_the_previous_one_and_no_attempt() -> None:
    world = PlannerWorld(manifest([loop_step("a", 3, retries=1, retryBackoffSeconds=0)]))
    world.plan()
    world.succeed(control={"outputs": {"n": 1}})
    world.plan()
    job = world.active()
    assert _previous(world, job) == {
        "attempt": None,
        "iteration": {"index": 1, "phase": "Succeeded", "control": {"outputs": {"n": 1}}},
    }
    world.fail(job, message="boom")
    world.plan()
    retry = _previous(world, world.active())
    assert retry["attempt"]["attempt"] == 1 and retry["attempt"]["message"].endswith(": boom")
    assert retry["iteration"]["index"] == 1
    world.succeed(control={"outputs": {"n": 2}})
    world.plan()
    assert _previous(world, world.active())["attempt"] is None  # a new iteration starts afresh
    assert world.step_status().last_failure is None


def test_a_child_of_a_loop_body_is_told_the_body_s_previous_pass() -> None:
    body = {"name": "dev", "loop": {"maxIterations": 3}, "steps": [{"name": "work"}, {"name": "check"}]}
    world = PlannerWorld(manifest([body]))
    world.plan()
    world.succeed(control={"w": 1})
    world.plan()
    world.succeed(control={"c": 1})
    world.plan()
    told = _previous(world, world.active())
    assert told == {"attempt": None, "iteration": {"index": 1, "phase": "Succeeded", "control": {"c": 1}}}


def test_a_long_termination_message_keeps_its_tail() -> None:
    world = PlannerWorld(manifest([{"name": "a", "retries": 1, "retryBackoffSeconds": 0}]))
    world.plan()
    world.fail(message="x" * 5000 + "THE ACTUAL ERROR")
    world.plan()
    message = _previous(world, world.active())["attempt"]["message"]
    assert message.endswith("THE ACTUAL ERROR") and "…" in message
    assert len(message.encode()) <= MAX_TAIL_BYTES + 100


def test_the_bound_drops_the_control_first_then_cuts_the_message() -> None:
    big_control = {"blob": "c" * 5000}
    doc = {"attempt": None, "iteration": {"index": 1, "phase": "Succeeded", "control": big_control}}
    out = bounded(doc)
    assert out["iteration"]["control"] is None and out["truncated"] == ["iteration.control"]
    doc = {
        "attempt": {"attempt": 1, "reason": "Error", "exitCode": 1, "message": '\\u00e9"' * 3000 + "END"},
        "iteration": {"index": 1, "phase": "Succeeded", "control": big_control},
    }
    out = bounded(doc)
    size = len(json.dumps(out, separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode())
    assert size <= MAX_PREVIOUS_BYTES
    assert out["truncated"] == ["iteration.control", "attempt.message"]
    assert out["attempt"]["message"].endswith("END")
    small = {"attempt": None, "iteration": None}
    assert bounded(small) == small


def test_tail_cuts_whole_characters() -> None:
    assert tail("abc", 10) == "abc"
    cut = tail("é" * 100, 11)
    assert cut.startswith("…") and set(cut[1:]) == {"é"} and len(cut.encode()) <= 11
