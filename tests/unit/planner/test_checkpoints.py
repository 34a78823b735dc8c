"""loop.checkpoint in the planner (docs/concepts.md#checkpoints, #resume): what each attempt's pod is
told to restore and record, the checkpoint a pod reported in the iteration's record, a refused
checkpoint failing the attempt with `CheckpointFailed` (never a run stuck in Running), and the first
pod of a resumed run. The pod's side is tests/unit/control/test_checkpointing.py."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from agentrun_operator.control.checkpointing import CHECKPOINT_ANCHOR, CHECKPOINT_EXIT
from agentrun_operator.control.envelope import ControlEnvelope, encode_envelope
from agentrun_operator.jobs.checkpoint_args import CHECKPOINT_SECURITY_CONTEXT
from agentrun_operator.jobs.reporter_container import READY_HOOK_POLLS, READY_HOOK_POLLS_CHECKPOINT
from agentrun_operator.shell.observe import pod_from_k8s
from tests.unit.planner.world import PlannerWorld, loop_step, manifest

CHECKPOINT = {"mode": "Files", "onFailedAttempt": "Restore", "keep": 5}


def checkpointed(on_failed: str = "Restore", retries: int = 1, **spec: Any) -> PlannerWorld:
    loop = {"checkpoint": dict(CHECKPOINT, onFailedAttempt=on_failed)}
    step = loop_step(max_iterations=3, retries=retries, retryBackoffSeconds=0, loop=loop)
    world = PlannerWorld(manifest([step], **spec))
    world.plan()
    return world


def reporter_args(world: PlannerWorld, job: str) -> list[str]:
    pod = world.manifests[job]["spec"]["template"]["spec"]
    containers = [*(pod.get("initContainers") or []), *pod["containers"]]
    reporter = next(c for c in containers if c["name"] == "reporter")
    return list(reporter.get("args") or [])


def reporter_of(world: PlannerWorld, job: str) -> dict[str, Any]:
    pod = world.manifests[job]["spec"]["template"]["spec"]
    containers = [*(pod.get("initContainers") or []), *pod["containers"]]
    return next(c for c in containers if c["name"] == "reporter")


def hook_polls(world: PlannerWorld, job: str) -> int:
    """How many 20 ms polls the reporter's postStart hook waits for it to be ready."""
    command = reporter_of(world, job)["lifecycle"]["postStart"]["exec"]["command"]
    return int(command[5])


def option(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def checkpoint_report(checkpoint_id: str, **facts: Any) -> str:
    """What the reporter reports after main: the control file and the checkpoint it made or restored."""
    envelope = ControlEnvelope(status="found", path="/workspace/.agentrun/loop-control.json", control={})
    return encode_envelope(envelope.replace(checkpoint={"id": checkpoint_id, **facts}))


def test_a_loop_without_checkpoints_tells_its_pods_nothing_of_them() -> None:
    world = PlannerWorld(manifest([loop_step(max_iterations=2)]))
    world.plan()
    job = world.active()
    assert not [a for a in reporter_args(world, job) if a.startswith("--checkpoint")]
    assert reporter_of(world, job).get("securityContext") != CHECKPOINT_SECURITY_CONTEXT
    assert hook_polls(world, job) == READY_HOOK_POLLS


def test_every_attempt_of_an_iteration_names_the_iterations_checkpoint() -> None:
    world = checkpointed()
    first = world.active()
    args = reporter_args(world, first)
    assert option(args, "--checkpoint-id") == "run_1_1"
    assert option(args, "--checkpoint-prefix") == "run_1_"
    assert option(args, "--checkpoint-keep") == "5"
    assert option(args, "--checkpoint-root") == "/workspace"
    assert option(args, "--checkpoint-owner") == "uid-run"
    assert "--checkpoint-restore" not in args and "--checkpoint-from" not in args
    assert reporter_of(world, first)["securityContext"] == CHECKPOINT_SECURITY_CONTEXT
    # the hook waits while the reporter records (a first checkpoint copies the whole workspace)
    assert hook_polls(world, first) == READY_HOOK_POLLS_CHECKPOINT
    world.succeed(first, message=checkpoint_report("run_1_1", files=3, bytes=30, addedBytes=30))
    world.plan()
    second = world.active()
    assert option(reporter_args(world, second), "--checkpoint-id") == "run_1_2"


def test_the_reported_checkpoint_goes_into_the_iterations_record() -> None:
    world = checkpointed()
    world.succeed(message=checkpoint_report("run_1_1", files=3, bytes=30, addedBytes=12))
    world.plan()
    record = world.step_status().loop.iterations[0]
    assert record.checkpoint is not None
    assert (record.checkpoint.id, record.checkpoint.files, record.checkpoint.bytes) == ("run_1_1", 3, 30)
    assert record.checkpoint.added_bytes == 12 and record.checkpoint.restored is None


@pytest.mark.parametrize("on_failed", ["Restore", "Keep"])
def test_a_retry_restores_the_iterations_start_only_with_restore(on_failed: str) -> None:
    world = checkpointed(on_failed)
    first = world.active()
    world.fail(first, report=checkpoint_report("run_1_1", files=3, bytes=30, addedBytes=30))
    world.plan()
    retry = world.active()
    assert retry != first
    args = reporter_args(world, retry)
    assert option(args, "--checkpoint-id") == "run_1_1"
    if on_failed == "Restore":
        # attempt 1 reported it, so it must be there: a missing one is an error, not a new recording
        assert "--checkpoint-restore" in args and "--checkpoint-expected" in args
    else:
        assert "--checkpoint-restore" not in args and "--checkpoint-expected" not in args
    # the failed attempt's checkpoint is in the record already
    assert world.step_status().loop.iterations[0].checkpoint.id == "run_1_1"


def test_a_retry_whose_first_attempt_reported_nothing_restores_without_expecting() -> None:
    """Attempt 1 died before reporting (its pod lost): the checkpoint may or may not exist; the retry
    restores it when it does and records the iteration's start when it does not."""
    world = checkpointed()
    world.fail(world.active())
    world.plan()
    args = reporter_args(world, world.active())
    assert "--checkpoint-restore" in args and "--checkpoint-expected" not in args


def test_a_restore_is_added_to_the_record_of_the_first_recording() -> None:
    world = checkpointed()
    world.fail(report=checkpoint_report("run_1_1", files=3, bytes=30, addedBytes=30))
    world.plan()
    world.succeed(message=checkpoint_report("run_1_1", files=3, bytes=30, restored="run_1_1"))
    world.plan()
    record = world.step_status().loop.iterations[0]
    assert record.attempts == 2 and record.phase == "Succeeded"
    assert record.checkpoint.id == "run_1_1"
    assert record.checkpoint.added_bytes == 30  # the first recording's figure is kept
    assert record.checkpoint.restored == "run_1_1"


def refuse_checkpoint(world: PlannerWorld, job: str, why: str) -> None:
    """The reporter refused to start `main` (control/checkpointing.py), read through the real decode
    of the pod's status."""
    pod = {
        "metadata": {
            "name": f"{job}-pod",
            "namespace": "ns",
            "uid": "pod-uid",
            "labels": {"job-name": job, "batch.kubernetes.io/job-name": job},
        },
        "status": {
            "phase": "Running",
            "initContainerStatuses": [
                {
                    "name": "reporter",
                    "state": {"terminated": {"exitCode": CHECKPOINT_EXIT, "message": why}},
                }
            ],
            "containerStatuses": [{"name": "main", "state": {"waiting": {"reason": "PodInitializing"}}}],
        },
    }
    observed = pod_from_k8s(pod)
    assert observed is not None and observed.reporter_refusal_reason == "CheckpointFailed"
    world.pods[f"{job}-pod"] = replace(observed, name=f"{job}-pod", job_name=job)


WHY = (
    "checkpoint: cannot restore the iteration's start: checkpoint 'run_1_1' is missing from "
    f"/workspace/.agentrun/checkpoints; see {CHECKPOINT_ANCHOR}"
)


def test_a_refused_checkpoint_fails_the_attempt_with_its_reason_and_an_event() -> None:
    world = checkpointed(retries=1)
    first = world.active()
    refuse_checkpoint(world, first, WHY)
    world.plan()
    assert first in world.deleted
    step = world.step_status()
    assert step.last_failure.reason == "CheckpointFailed"
    assert WHY in step.last_failure.message
    assert "CheckpointFailed" in world.event_reasons()
    assert step.phase == "Retrying"  # retries as any failed attempt
    world.settle()  # the refused pod is gone (its Job was deleted)
    world.plan()
    retry = world.active()
    assert retry != first
    refuse_checkpoint(world, retry, WHY)
    world.plan()
    step = world.step_status()
    assert world.phase == "Failed" and step.phase == "Failed"
    assert step.reason == "LoopIterationFailed"
    assert WHY in (step.message or "")
    assert world.live_jobs() == []


def test_a_full_volume_fails_the_attempt_and_the_run_ends() -> None:
    why = (
        "checkpoint: cannot record the iteration's start: the volume is full: needed 209715200 bytes; "
        f"see {CHECKPOINT_ANCHOR}"
    )
    world = checkpointed(retries=0)
    refuse_checkpoint(world, world.active(), why)
    world.plan()
    assert world.phase == "Failed"
    assert world.step_status().last_failure.reason == "CheckpointFailed"
    assert "volume is full" in (world.step_status().message or "")


def resumed(iteration: int = 2, **resume: Any) -> PlannerWorld:
    step = loop_step(max_iterations=3, loop={"checkpoint": CHECKPOINT})
    source = {"run": "source", "iteration": iteration, **resume}
    world = PlannerWorld(manifest([step], name="again", resumeFrom=source))
    world.plan()
    return world


def test_a_resumed_run_starts_from_the_end_of_the_source_runs_iteration() -> None:
    world = resumed(2)
    first = world.active()
    args = reporter_args(world, first)
    assert option(args, "--checkpoint-from") == "source_1_3"  # iteration 2's end is iteration 3's start
    assert option(args, "--checkpoint-id") == "again_1_1"
    world.succeed(first, message=checkpoint_report("again_1_1", files=1, bytes=1, restored="source_1_3"))
    world.plan()
    record = world.step_status().loop.iterations[0]
    assert record.checkpoint.restored == "source_1_3"
    assert "--checkpoint-from" not in reporter_args(world, world.active())


def test_a_resumed_runs_retry_of_iteration_one_restores_its_own_recording() -> None:
    """Once its first attempt recorded `again_1_1` (the source's state), a retry restores that, not
    the source's checkpoint again (which may since have been pruned)."""
    step = loop_step(max_iterations=3, retries=1, retryBackoffSeconds=0, loop={"checkpoint": CHECKPOINT})
    world = PlannerWorld(manifest([step], name="again", resumeFrom={"run": "source", "iteration": 1}))
    world.plan()
    world.fail(report=checkpoint_report("again_1_1", files=1, bytes=1, restored="source_1_2"))
    world.plan()
    args = reporter_args(world, world.active())
    assert "--checkpoint-from" not in args
    assert "--checkpoint-restore" in args and "--checkpoint-expected" in args
