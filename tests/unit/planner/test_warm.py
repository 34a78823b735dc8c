"""loop.warm in the planner (docs/concepts.md#warm-iterations): the next iteration runs in the pod of
the last one, told through its supervisor; every iteration is recorded as a cold one, and every way
a warm pod can let an iteration down ends in a failed attempt (a new pod for the retry) or a new
pod for the same attempt, never a stuck run or an iteration run twice. The pod's side is
tests/unit/control/test_warm_supervisor.py; the whole path tests/e2e/test_warm.py."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from agentrun_operator import naming
from agentrun_operator.api import parse_agentrun
from agentrun_operator.control.envelope import ControlEnvelope, encode_envelope
from agentrun_operator.planner.actions import CreateJob, DeleteJob, EmitEvent, SetJobTTL, WarmCommand
from agentrun_operator.planner.observed import ObservedPod, ObservedWarm, WarmResult
from agentrun_operator.planner.validate import validate_static
from agentrun_operator.planner.warm import WARM_SILENCE_SECONDS
from agentrun_operator.shell.observe import pod_from_k8s
from tests.unit.planner.world import (
    LOOPS_ON,
    PlannerWorld,
    envelope_found,
    envelope_status,
    loop_step,
    manifest,
)

CONTINUE = "iteration.last.control.continue == true"
COMMAND = {"command": ["sh", "-c"], "args": ["echo work"]}


def warm_world(
    max_iterations: int = 5,
    retries: int = 0,
    timeout: int | None = None,
    workload: dict[str, Any] | None = None,
    **loop: Any,
) -> PlannerWorld:
    extra: dict[str, Any] = {"retries": retries, "retryBackoffSeconds": 0, "workload": workload or COMMAND}
    if timeout is not None:
        extra["timeoutSeconds"] = timeout
    spec = {"warm": {"idleSeconds": 60}, **loop}
    step = loop_step(max_iterations=max_iterations, expression=CONTINUE, loop=spec, **extra)
    world = PlannerWorld(manifest([step]))
    world.plan()
    return world


def pod_of(world: PlannerWorld, job: str) -> str:
    return f"{job}-pod"


def finish(
    world: PlannerWorld, pod: str, id_: str, code: int = 0, control: dict[str, Any] | None = None
) -> None:
    """The supervisor has run `id_`: `main`'s command exited `code`, its control file said `control`."""
    text = envelope_found(control) if control is not None else envelope_status("missing", "no file")
    world.warm[pod] = ObservedWarm(pod, "idle", None, WarmResult(id_, code, text, world.now))


def obey(world: PlannerWorld) -> None:
    """The supervisors take the commands sent so far, as docs/design.md#warm-channel says."""
    for command in world.commands:
        heard = world.warm.get(command.pod, ObservedWarm(command.pod, "idle"))
        result = heard.result
        if command.verb == "start" and heard.running is None and (result is None or result.id != command.id):
            acked = replace(result, acked=True) if result is not None else None
            world.warm[command.pod] = ObservedWarm(command.pod, "running", command.id, acked)
        elif command.verb == "ack" and result is not None and result.id == command.id:
            world.warm[command.pod] = replace(heard, result=replace(result, acked=True))
        elif command.verb == "stop" and heard.running is None:
            world.warm[command.pod] = replace(heard, phase="stopping")
    world.commands.clear()


def starts(world: PlannerWorld) -> list[WarmCommand]:
    return [c for c in world.commands if c.verb == "start"]


def go_on(n: int) -> dict[str, Any]:
    return {"continue": True, "n": n}


def test_a_warm_loops_job_runs_main_in_a_shell_loop_with_the_runs_key() -> None:
    world = warm_world()
    job = world.active()
    created = next(a for p in world.plans for a in p.actions if isinstance(a, CreateJob))
    assert created.warm_secret == naming.warm_secret_name("run") == "run-warm"
    spec = world.manifests[job]["spec"]
    assert "activeDeadlineSeconds" not in spec  # the planner times each iteration itself
    template = spec["template"]
    assert template["metadata"]["labels"][naming.LABEL_WARM] == "true"
    reporter, main = template["spec"]["containers"]
    assert main["command"][:2] == ["sh", "-c"] and main["command"][3:] == [
        "agentrun-warm",
        "sh",
        "-c",
        "echo work",
    ]
    assert "args" not in main
    args = reporter["args"]
    assert args[args.index("--warm-first-id") + 1] == "1-1"
    assert args[args.index("--warm-port") + 1] == "8471"
    assert args[args.index("--warm-idle-seconds") + 1] == "60"
    assert {"name": "AGENTRUN_POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in reporter[
        "env"
    ]
    key = next(v for v in template["spec"]["volumes"] if v["name"] == naming.WARM_KEY_VOLUME)
    assert key["secret"]["secretName"] == "run-warm"
    assert naming.WARM_KEY_VOLUME not in {m["name"] for m in main["volumeMounts"]}  # the reporter's only
    assert world.manifests[job]["metadata"]["annotations"][naming.ANNOTATION_WARM_TEMPLATE]


def test_a_loop_without_warm_keeps_its_job_per_iteration() -> None:
    step = loop_step(max_iterations=2, workload=COMMAND)
    world = PlannerWorld(manifest([step]))
    world.plan()
    job = world.manifests[world.active()]
    assert naming.LABEL_WARM not in job["spec"]["template"]["metadata"]["labels"]
    assert naming.ANNOTATION_WARM_TEMPLATE not in job["metadata"]["annotations"]
    assert job["spec"]["template"]["spec"]["containers"][1]["command"] == ["sh", "-c"]


def test_the_next_iteration_runs_in_the_same_pod_recorded_as_any_iteration() -> None:
    world = warm_world()
    job = world.active()
    pod = pod_of(world, job)
    finish(world, pod, "1-1", control=go_on(1))
    world.plan()
    step = world.step_status()
    first, second = step.loop.iterations
    assert first.phase == "Succeeded" and first.pod == pod and not first.warm
    assert second.phase == "Running" and second.warm is True and second.pod == pod
    assert second.job_ref.name == job and step.job_ref.name == job
    assert step.loop.last_control == go_on(1)
    assert world.created == [job]  # no second Job
    (start,) = starts(world)
    env = dict(start.env)
    assert (start.id, start.pod, start.ip) == ("2-1", pod, "10.244.0.1")
    assert env["AGENTRUN_ITERATION"] == "2" and env["AGENTRUN_ATTEMPT"] == "1"
    assert env["AGENTRUN_PREVIOUS_CONTROL"] == '{"continue":true,"n":1}'
    assert "in warm pod" in step.message
    assert world.event_reasons().count("IterationSucceeded") == 1


def test_a_warm_loop_runs_to_its_end_in_one_job_and_the_job_goes_afterwards() -> None:
    world = warm_world(max_iterations=4)
    job = world.active()
    pod = pod_of(world, job)
    for n in range(1, 5):
        finish(world, pod, f"{n}-1", control=go_on(n) if n < 3 else {"continue": False})
        world.plan()
        if n == 3:
            break
        obey(world)
    assert world.phase == "Succeeded"
    step = world.step_status()
    assert step.loop.stop_reason == "LoopConditionFalse"
    assert [r.index for r in step.loop.iterations] == [1, 2, 3]
    assert [r.warm for r in step.loop.iterations] == [None, True, True]
    assert world.created == [job]
    # The idle pod is told to end (not left waiting for its idleSeconds): its Job completes and is
    # collected as any recorded attempt's, by the run's pod GC policy (its log stays until then).
    assert [(c.verb, c.id) for c in world.commands] == [("stop", "3-1")] and not world.deleted
    obey(world)
    world.plan()
    assert not world.commands and not world.deleted  # told already, and it says it is stopping
    world.pods[pod] = replace(world.pods[pod], phase="Succeeded", main_exit_code=0, containers_ended=True)
    world.jobs[job] = replace(world.jobs[job], outcome="Succeeded", finished_at=world.now)
    world.plan()
    assert world.jobs[job].ttl_seconds_after_finished is not None


def test_a_lost_status_write_sends_the_same_start_again() -> None:
    world = warm_world()
    job = world.active()
    pod = pod_of(world, job)
    finish(world, pod, "1-1", control=go_on(1))
    world.plan(persist=False)  # the operator dies before the status is written: nothing is sent
    assert not starts(world)
    world.plan()
    (start,) = starts(world)
    assert start.id == "2-1"
    obey(world)
    world.plan()  # running it: nothing more to say
    assert not starts(world)
    assert world.step_status().loop.iterations[-1].phase == "Running"


def test_a_restarted_operator_that_has_not_heard_from_the_pod_waits() -> None:
    world = warm_world()
    pod = pod_of(world, world.active())
    finish(world, pod, "1-1", control=go_on(1))
    world.plan()
    world.commands.clear()  # sent, and the operator restarts: it has heard nothing yet
    world.warm.clear()
    world.plan()
    assert not starts(world) and world.step_status().loop.iterations[-1].phase == "Running"
    world.warm[pod] = ObservedWarm(pod, "running", "2-1", None)
    world.plan()
    assert not starts(world)
    finish(world, pod, "2-1", control={"continue": False})
    world.plan()
    assert world.phase == "Succeeded" and world.step_status().loop.completed_iterations == 2


def test_the_start_is_sent_again_while_the_pod_is_idle_without_it() -> None:
    world = warm_world()
    pod = pod_of(world, world.active())
    finish(world, pod, "1-1", control=go_on(1))
    world.plan()
    world.commands.clear()  # lost on the way
    world.plan()
    (again,) = starts(world)
    assert again.id == "2-1"


def test_a_failed_warm_iteration_is_a_failed_attempt_whose_retry_is_a_new_pod() -> None:
    world = warm_world(retries=1)
    job = world.active()
    pod = pod_of(world, job)
    finish(world, pod, "1-1", control=go_on(1))
    world.plan()
    obey(world)
    finish(world, pod, "2-1", code=3, control={"continue": True, "usage": {"inputTokens": 5}})
    world.plan()
    step = world.step_status()
    assert step.phase == "Retrying"
    assert "exited with code 3 in warm pod" in step.loop.iterations[-1].message
    assert step.usage.input_tokens == 5  # the failed attempt's usage counts
    assert job in world.deleted
    # Deleted in the foreground: the Job stays, being deleted, until its pod is gone, so the pod (its
    # `main` loop still running) stays in the run's view and holds the gate for the retry.
    (deleted,) = [a for p in world.plans for a in p.actions if isinstance(a, DeleteJob)]
    assert deleted.foreground is True
    world.settle()
    world.plan()
    retry = world.active()
    assert retry == naming.job_name("run", 1, 2, 2) and world.created == [job, retry]
    args = world.manifests[retry]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--warm-first-id") + 1] == "2-2"  # the new pod is warm too
    record = world.step_status().loop.iterations[-1]
    assert record.attempts == 2 and not record.warm


def test_a_pod_that_ends_during_an_iteration_fails_the_attempt() -> None:
    world = warm_world(retries=1)
    job = world.active()
    pod = pod_of(world, job)
    finish(world, pod, "1-1", control=go_on(1))
    world.plan()
    obey(world)
    world.pods[pod] = replace(world.pods[pod], phase="Failed", reason="Evicted", message="node pressure")
    world.plan()
    step = world.step_status()
    assert step.phase == "Retrying"
    assert "ended during iteration 2 (Evicted: node pressure)" in step.loop.iterations[-1].message
    assert step.last_failure.reason == "WarmPodEnded"


def test_a_pod_that_idled_out_before_its_start_runs_the_same_attempt_in_a_new_pod() -> None:
    world = warm_world()
    job = world.active()
    pod = pod_of(world, job)
    finish(world, pod, "1-1", control=go_on(1))
    world.plan()
    world.commands.clear()
    said = '{"v":1,"status":"missing","path":"/p","size":null,"reason":"x","control":null,' + (
        '"warm":{"id":"1-1","exitCode":0}}'
    )
    world.pods[pod] = replace(world.pods[pod], phase="Succeeded", reporter_message=said, main_exit_code=0)
    world.jobs[job] = replace(world.jobs[job], outcome="Succeeded", finished_at=world.now)
    world.warm.clear()
    world.plan()
    cold = naming.job_name("run", 1, 2, 1)
    assert world.created == [job, cold]
    step = world.step_status()
    record = step.loop.iterations[-1]
    assert record.attempts == 1 and record.phase == "Running" and record.job_ref.name == cold
    assert step.last_failure is None


def test_a_result_left_in_the_pods_termination_message_is_recorded() -> None:
    world = warm_world()
    job = world.active()
    pod = pod_of(world, job)
    envelope = ControlEnvelope(
        status="found", path="/workspace/.agentrun/loop-control.json", control={"continue": False}
    )
    said = encode_envelope(envelope)[:-1] + ',"warm":{"id":"1-1","exitCode":0}}'
    world.pods[pod] = replace(world.pods[pod], phase="Succeeded", reporter_message=said, main_exit_code=0)
    world.plan()
    assert world.phase == "Succeeded"
    assert world.step_status().loop.last_control == {"continue": False}


def test_a_warm_iteration_times_out_from_its_own_start() -> None:
    world = warm_world(retries=1, timeout=30)
    job = world.active()
    pod = pod_of(world, job)
    world.advance(20)
    finish(world, pod, "1-1", control=go_on(1))
    world.plan()
    obey(world)
    world.advance(25)  # 45 s since the Job started, 25 s since iteration 2 did
    world.plan()
    assert world.step_status().phase == "Running"
    world.advance(5)
    world.plan()
    step = world.step_status()
    assert step.phase == "Retrying" and step.last_failure.reason == "DeadlineExceeded"
    assert "timed out after 30s (a warm iteration" in step.loop.iterations[-1].message
    assert job in world.deleted


def test_a_supervisor_that_stops_answering_fails_the_attempt() -> None:
    world = warm_world(retries=1)
    job = world.active()
    pod = pod_of(world, job)
    finish(world, pod, "1-1", control=go_on(1))
    world.plan()
    obey(world)
    heard = world.warm[pod]
    world.warm[pod] = replace(heard, error="did not answer in 35s", error_since=world.now)
    world.plan()
    assert world.step_status().phase == "Running" and world.last_requeue == WARM_SILENCE_SECONDS
    world.advance(WARM_SILENCE_SECONDS)
    world.plan()
    step = world.step_status()
    assert step.phase == "Retrying" and step.last_failure.reason == "WarmSupervisorUnanswered"
    assert "did not answer for 60s: did not answer in 35s" in step.loop.iterations[-1].message
    assert job in world.deleted


def test_a_pod_template_that_differs_runs_the_next_iteration_in_a_new_pod() -> None:
    world = warm_world()
    job = world.active()
    pod = pod_of(world, job)
    world.jobs[job] = replace(world.jobs[job], warm_template="made by another spec")
    finish(world, pod, "1-1", control=go_on(1))
    world.plan()
    assert not starts(world)
    world.settle()
    assert job in world.deleted  # not the iteration's Job: it goes, and the next is a new pod
    world.plan()
    assert world.active() == naming.job_name("run", 1, 2, 1)


def test_an_immediate_cancel_deletes_the_warm_job() -> None:
    world = warm_world()
    job = world.active()
    pod = pod_of(world, job)
    finish(world, pod, "1-1", control=go_on(1))
    world.plan()
    obey(world)
    world.spec_manifest["spec"]["cancel"] = "Immediate"
    world.plan()
    assert world.phase == "Cancelled" and job in world.deleted
    deleted = next(a for p in world.plans for a in p.actions if isinstance(a, DeleteJob))
    assert deleted.grace_seconds is not None


def test_a_graceful_cancel_lets_the_running_iteration_finish_and_starts_none() -> None:
    world = warm_world()
    job = world.active()
    pod = pod_of(world, job)
    finish(world, pod, "1-1", control=go_on(1))
    world.plan()
    obey(world)
    world.spec_manifest["spec"]["cancel"] = "Graceful"
    world.plan()
    assert world.step_status().phase == "Running" and job not in world.deleted
    finish(world, pod, "2-1", control=go_on(2))
    world.plan()
    assert world.phase == "Cancelled"
    assert world.step_status().loop.iterations[-1].phase == "Succeeded"
    assert [(c.verb, c.id) for c in world.commands] == [("stop", "2-1")]  # ends on its own


def test_between_iterations_of_an_interval_the_pod_is_acknowledged_and_kept() -> None:
    world = warm_world(intervalSeconds=20)
    job = world.active()
    pod = pod_of(world, job)
    finish(world, pod, "1-1", control=go_on(1))
    world.plan()
    assert [(c.verb, c.id) for c in world.commands] == [("ack", "1-1")]
    obey(world)
    world.plan()
    assert not world.commands and job not in world.deleted  # kept for the next iteration
    world.advance(20)
    world.plan()
    (start,) = starts(world)
    assert start.id == "2-1" and world.created == [job]


def run_warm(world: PlannerWorld, iterations: int) -> None:
    """Every iteration succeeds in the first pod; the last one's control file ends the loop."""
    pod = pod_of(world, world.active())
    for n in range(1, iterations + 1):
        finish(world, pod, f"{n}-1", control=go_on(n) if n < iterations else {"continue": False})
        world.plan()
        obey(world)


def plan_events(world: PlannerWorld) -> list[list[tuple[str, bool]]]:
    """Each reconcile's Events that asked for any, as (reason, fold)."""
    events = [[(a.reason, a.fold) for a in p.actions if isinstance(a, EmitEvent)] for p in world.plans]
    return [e for e in events if e]


def test_a_warm_loops_hand_overs_are_routine_its_start_and_end_are_not() -> None:
    """The Events of a hand-over in the warm pod are `fold` (the Event writer holds them,
    docs/operator.md#events); the loop's start (its first pod is a new one) and the run's end are not."""
    world = warm_world(max_iterations=4)
    run_warm(world, 4)
    assert world.phase == "Succeeded"
    hand_over = [("IterationSucceeded", True), ("ConditionEvaluated", True), ("IterationStarted", True)]
    assert plan_events(world) == [
        [("LoopStarted", False), ("IterationStarted", False)],
        hand_over,
        hand_over,
        hand_over,
        [("IterationSucceeded", True), ("LoopCompleted", False), ("RunSucceeded", False)],
    ]


def test_a_warm_loops_failure_its_retry_and_a_start_in_a_new_pod_are_not_routine() -> None:
    world = warm_world(retries=1)
    pod = pod_of(world, world.active())
    finish(world, pod, "1-1", control=go_on(1))
    world.plan()
    obey(world)
    finish(world, pod, "2-1", code=3, control=go_on(2))
    world.plan()
    world.settle()
    world.plan()  # the retry: a new pod
    assert plan_events(world)[-2:] == [[("IterationRetrying", False)], [("IterationStarted", False)]]

    world = warm_world()
    job = world.active()
    pod = pod_of(world, job)
    finish(world, pod, "1-1", control=go_on(1))
    world.plan()
    world.commands.clear()  # the pod idles out before the start reaches it
    said = '{"v":1,"status":"missing","path":"/p","size":null,"reason":"x","control":null,' + (
        '"warm":{"id":"1-1","exitCode":0}}'
    )
    world.pods[pod] = replace(world.pods[pod], phase="Succeeded", reporter_message=said, main_exit_code=0)
    world.jobs[job] = replace(world.jobs[job], outcome="Succeeded", finished_at=world.now)
    world.warm.clear()
    world.plan()
    assert plan_events(world)[-1] == [("IterationStarted", False)]


def test_a_cold_loops_events_are_never_routine() -> None:
    """A loop without `warm` asks for the Events it always did, none of them `fold`."""
    world = PlannerWorld(manifest([loop_step(max_iterations=3, expression=CONTINUE, workload=COMMAND)]))
    world.drive(lambda w, job: w.succeed(job, control=go_on(1)))
    assert world.phase == "Succeeded"
    assert {"IterationStarted", "IterationSucceeded", "ConditionEvaluated"} <= set(world.event_reasons())
    assert not any(e.fold for e in world.events)


def test_warm_is_refused_where_a_pod_cannot_run_the_loop() -> None:
    def problems(step: dict[str, Any]) -> list[str]:
        return [p.path for p in validate_static(parse_agentrun(manifest([step])), LOOPS_ON)]

    no_command = loop_step(max_iterations=2, loop={"warm": {}})
    assert "spec.workload.command" in problems(no_command)
    expanded = loop_step(
        max_iterations=2, loop={"warm": {}}, workload={"command": ["echo"], "args": ["$(AGENTRUN_ITERATION)"]}
    )
    assert "spec.workflow.steps[0].workload.args[0]" in problems(expanded)
    escaped = loop_step(
        max_iterations=2,
        loop={"warm": {}},
        workload={"command": ["echo"], "args": ["$$(AGENTRUN_ITERATION)"]},
    )
    assert problems(escaped) == []
    body = {
        "name": "b",
        "loop": {"maxIterations": 2, "warm": {}},
        "steps": [{"name": "c", "workload": COMMAND}],
    }
    assert problems(body) == []  # a top-level loop body: its workload step has a command


def body_world() -> PlannerWorld:
    """A warm loop body: `implement` (a workload step) then the gate `sign-off`, until it says final."""
    gate = {
        "name": "sign-off",
        "approval": {"message": "ok?", "inputs": [{"name": "verdict", "required": True}]},
    }
    body = {
        "name": "develop",
        "loop": {
            "maxIterations": 4,
            "condition": {"until": "iteration.last.control.outputs.verdict == 'final'"},
            "warm": {"idleSeconds": 300},
        },
        "steps": [{"name": "implement", "workload": COMMAND}, gate],
    }
    world = PlannerWorld(manifest([body]))
    world.plan()
    return world


def approve(world: PlannerWorld, iteration: int, verdict: str) -> None:
    entry = {
        "step": "develop/sign-off",
        "iteration": iteration,
        "decision": "Approved",
        "inputs": {"verdict": verdict},
    }
    world.spec_manifest["spec"].setdefault("approvals", []).append(entry)


def test_a_warm_loop_bodys_workload_step_runs_every_pass_in_one_pod_across_an_approval_gate() -> None:
    world = body_world()
    job = world.active()
    assert job == naming.job_name("run", 1, 1, 1, ("1i1",))
    pod = pod_of(world, job)
    args = world.manifests[job]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--warm-first-id") + 1] == "1-1"
    finish(world, pod, "1-1", control={})
    world.plan()
    body = world.step_status()
    assert body.steps[1].phase == "AwaitingApproval"
    assert [(c.verb, c.id) for c in world.commands] == [("ack", "1-1")]  # its idle clock starts
    obey(world)
    world.plan()
    assert job not in world.deleted and not world.commands  # kept, idle, for the next pass
    approve(world, 1, "revise")
    world.plan()
    (start,) = starts(world)
    assert (start.id, start.pod) == ("2-1", pod) and dict(start.env)["AGENTRUN_ITERATION"] == "2"
    implement = world.step_status().steps[0]
    assert implement.phase == "Running" and implement.warm is True and implement.pod == pod
    assert world.created == [job]
    obey(world)
    finish(world, pod, "2-1", control={})
    world.plan()
    obey(world)
    approve(world, 2, "final")
    world.plan()
    assert world.phase == "Succeeded"
    assert world.created == [job] and [c.verb for c in world.commands] == ["stop"]


def test_validation_of_a_warm_loop_body_checks_each_workload_step_it_covers() -> None:
    body = {
        "name": "develop",
        "loop": {"maxIterations": 2, "warm": {}},
        "steps": [
            {"name": "implement"},
            {"name": "inner", "loop": {"maxIterations": 2, "warm": {}}, "workload": COMMAND},
        ],
    }
    paths = [p.path for p in validate_static(parse_agentrun(manifest([body])), LOOPS_ON)]
    assert "spec.workload.command" in paths  # implement has no command of its own or the run's
    assert "spec.workflow.steps[0].steps[1].loop.warm" in paths  # warm is a top-level loop's


def test_a_warm_pod_without_its_ip_yet_is_waited_for_within_the_timeout() -> None:
    world = warm_world(retries=0, timeout=60)
    job = world.active()
    pod = pod_of(world, job)
    world.pods[pod] = replace(world.pods[pod], phase="Pending", warm_ip=None)
    world.plan()
    assert world.step_status().phase == "Running" and world.last_requeue == 60
    del world.pods[pod]  # not even made yet
    world.plan()
    assert world.step_status().phase == "Running"
    world.advance(60)
    world.plan()
    assert world.phase == "Failed" and "timed out after 60s" in world.step_status().message


def test_a_warm_pod_told_to_end_is_given_the_time_to_and_no_more() -> None:
    """The loop ended: the pod is told to stop (its Job completes and is collected by the pod GC
    policy, its log kept meanwhile); while it ends (its `main` loop exited, its supervisor going) the
    Job is not deleted; one that has not ended 30 s after the run did is deleted as a stray."""
    world = warm_world(max_iterations=2)
    job = world.active()
    pod = pod_of(world, job)
    finish(world, pod, "1-1", control={"continue": False})
    world.plan()
    assert world.phase == "Succeeded" and [c.verb for c in world.commands] == ["stop"]
    world.commands.clear()
    world.pods[pod] = replace(world.pods[pod], main_exit_code=0)  # the loop ended; the reporter not yet
    world.warm[pod] = replace(world.warm[pod], error="refused the connection", error_since=world.now)
    world.plan()
    assert not world.deleted and world.last_requeue == 30
    world.advance(30)
    world.plan()
    assert world.deleted == [job]


def test_a_duplicate_pod_of_the_warm_job_is_never_taken_for_the_warm_pod() -> None:
    """The Job controller may make a second pod of a Job; it never gets past its gate and serves
    nothing (docs/concepts.md#exactly-once): the pod that answers is the one the loop runs in."""
    world = warm_world()
    job = world.active()
    pod = pod_of(world, job)
    duplicate = f"{job}-pod-zz"  # sorts after the real pod
    world.pods[duplicate] = replace(world.pods[pod], name=duplicate, warm_ip="10.244.0.99")
    world.warm[duplicate] = ObservedWarm(duplicate, error="refused the connection", error_since=world.now)
    finish(world, pod, "1-1", control=go_on(1))
    world.plan()
    (start,) = starts(world)
    assert start.pod == pod and world.step_status().loop.iterations[-1].pod == pod
    world.advance(WARM_SILENCE_SECONDS)
    obey(world)
    world.plan()
    assert world.step_status().phase == "Running"  # the duplicate's silence fails nothing


def _warm_pod(name: str, job: str, reporter: dict[str, Any]) -> ObservedPod:
    """A warm pod as the shell decodes it from the API (shell/observe.py): its IP from its sandbox
    on, its reporter in `reporter` state."""
    pod = pod_from_k8s(
        {
            "metadata": {"name": name, "labels": {"job-name": job, naming.LABEL_WARM: "true"}},
            "status": {
                "phase": "Running" if "running" in reporter else "Pending",
                "podIP": "10.244.0.9",
                "containerStatuses": [
                    {"name": "reporter", "state": reporter, "image": "op:1"},
                    {"name": "main", "state": {"waiting": {"reason": "PodInitializing"}}},
                ],
            },
        }
    )
    assert pod is not None
    return pod


def test_a_warm_pod_pulling_its_reporters_image_is_waited_for_not_failed_as_unanswered() -> None:
    """A pod has its IP from its sandbox on, while the kubelet may pull the reporter's image for
    minutes. The channel polls a pod with its address (shell/warm_channels.py `observe`), and its
    refused connections counted as the supervisor's silence: the attempt failed after
    WARM_SILENCE_SECONDS as WarmSupervisorUnanswered while the image was still coming. The address
    is now the pod's once its reporter has started (shell/observe.py `warm_address`)."""
    world = warm_world(retries=0, timeout=600)
    job = world.active()
    pod = pod_of(world, job)
    pulling = {"waiting": {"reason": "ContainerCreating"}}
    world.pods[pod] = _warm_pod(pod, job, pulling)
    if world.pods[pod].warm_ip is not None:  # polled: its supervisor refuses the connection
        world.warm[pod] = ObservedWarm(pod, error="refused the connection", error_since=world.now)
    world.plan()
    world.advance(WARM_SILENCE_SECONDS + 30)
    world.plan()
    assert world.step_status().phase == "Running", world.step_status().message
    assert job not in world.deleted
    world.pods[pod] = _warm_pod(pod, job, {"running": {"startedAt": "2026-12-05T00:00:00Z"}})
    assert world.pods[pod].warm_ip == "10.244.0.9"
    world.warm[pod] = ObservedWarm(pod, "running", "1-1")
    finish(world, pod, "1-1", control=go_on(1))
    world.plan()
    assert [r.phase for r in world.step_status().loop.iterations] == ["Succeeded", "Running"]
    assert [c.id for c in starts(world)] == ["2-1"]


def test_a_warm_job_carries_its_ttl_from_creation_so_the_loops_end_costs_no_job_write() -> None:
    world = warm_world(max_iterations=2)
    job = world.active()
    assert world.manifests[job]["spec"]["ttlSecondsAfterFinished"] == LOOPS_ON.job_ttl_seconds_after_recorded
    pod = pod_of(world, job)
    finish(world, pod, "1-1", control=go_on(1))
    world.plan()
    obey(world)
    finish(world, pod, "2-1", control=go_on(2))
    world.plan()
    assert world.phase == "Succeeded"
    obey(world)  # told to stop: its Job completes
    world.pods[pod] = replace(world.pods[pod], phase="Succeeded", main_exit_code=0, containers_ended=True)
    world.jobs[job] = replace(world.jobs[job], outcome="Succeeded", finished_at=world.now)
    world.plan()
    assert not [a for p in world.plans for a in p.actions if isinstance(a, SetJobTTL)]
    assert world.jobs[job].ttl_seconds_after_finished == LOOPS_ON.job_ttl_seconds_after_recorded


def test_a_warm_job_failed_with_its_pod_is_kept_by_pod_gc_its_creation_ttl_removed_once_recorded() -> None:
    """The Job controller failed the Job (backoffLimit 0) before the operator saw the pod end: the Job
    has ended, so it is no stray to delete; pod GC (OnPodSuccess) keeps a failed attempt's pod, so the
    TTL the warm Job was created with goes, in the plan that records the attempt."""
    world = warm_world(retries=1)
    job = world.active()
    pod = pod_of(world, job)
    finish(world, pod, "1-1", control=go_on(1))
    world.plan()
    obey(world)
    assert world.jobs[job].ttl_seconds_after_finished == LOOPS_ON.job_ttl_seconds_after_recorded
    world.pods[pod] = replace(world.pods[pod], phase="Failed", reason="Evicted", message="node pressure")
    world.jobs[job] = replace(
        world.jobs[job], outcome="Failed", finished_at=world.now, message="BackoffLimitExceeded"
    )
    world.plan()
    assert world.step_status().last_failure.reason == "WarmPodEnded"
    removed = [a for a in world.plans[-1].actions if isinstance(a, SetJobTTL)]
    assert [(a.name, a.seconds) for a in removed] == [(job, None)]
    assert world.jobs[job].ttl_seconds_after_finished is None and job in world.jobs


@pytest.mark.parametrize(
    ("strategy", "ttl", "created_with"),
    [("OnPodCompletion", 300, 300), ("OnRunCompletion", 300, None), ("OnPodSuccess", 30, None)],
)
def test_a_warm_jobs_creation_ttl_follows_the_pod_gc_policy(
    strategy: str, ttl: int, created_with: int | None
) -> None:
    step = loop_step(max_iterations=3, expression=CONTINUE, loop={"warm": {}}, workload=COMMAND)
    config = replace(LOOPS_ON, job_ttl_seconds_after_recorded=ttl)
    world = PlannerWorld(manifest([step], podGC={"strategy": strategy}), config=config)
    world.plan()
    assert world.manifests[world.active()]["spec"].get("ttlSecondsAfterFinished") == created_with
