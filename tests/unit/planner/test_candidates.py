"""loop.candidates in the planner (docs/concepts.md#candidates): the iteration's Indexed Job, every
candidate read once all have stopped, every candidate's usage counted, `select` picking the winner,
the promotion Job before the iteration is recorded, and each way it can fail without a stuck run.
The pod's side is tests/unit/control/test_checkpointing.py; the whole path tests/e2e/test_candidates.py."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from agentrun_operator import naming
from agentrun_operator.control.envelope import ControlEnvelope, encode_envelope
from agentrun_operator.planner.validate import validate_static
from tests.unit.planner.world import PlannerWorld, loop_step, manifest

HIGHEST = "candidates.filter(c, candidates.all(o, o.control.score <= c.control.score))[0].index"


def candidates_world(
    count: int = 3, select: str = HIGHEST, retries: int = 1, max_iterations: int = 2, **loop: Any
) -> PlannerWorld:
    spec = {"checkpoint": {"mode": "Files"}, "candidates": {"count": count, "select": select}, **loop}
    step = loop_step(max_iterations=max_iterations, retries=retries, retryBackoffSeconds=0, loop=spec)
    world = PlannerWorld(manifest([step]))
    world.plan()
    return world


def report(start: str, index: int, control: dict[str, Any] | None, *, recorded: bool = True) -> str:
    """A candidate's envelope: its control file, the iteration's start and its copy's end checkpoint."""
    envelope = (
        ControlEnvelope(status="found", path="/workspace/.agentrun/loop-control.json", control=control)
        if control is not None
        else ControlEnvelope(status="missing", path="/workspace/.agentrun/loop-control.json", reason="none")
    )
    end: dict[str, Any] = {"index": index}
    end |= {"id": f"{start}c{index}", "files": 2} if recorded else {"error": "checkpoint: no room"}
    return encode_envelope(envelope.replace(checkpoint={"id": start, "files": 1, "candidate": end}))


def finish(world: PlannerWorld, job: str, outcomes: dict[int, tuple[int, dict[str, Any] | None]]) -> None:
    """Every candidate's `main` ends with its exit code, its reporter reports its control file; the Job
    ends Complete, or Failed when an index failed (backoffLimitPerIndex: 0)."""
    start = f"run_1_{world.jobs[job].iteration}"
    for pod_name, pod in list(world.pods.items()):
        if pod.job_name != job or pod.completion_index is None:
            continue
        code, control = outcomes[pod.completion_index]
        world.pods[pod_name] = replace(
            pod,
            phase="Succeeded" if code == 0 else "Failed",
            finished_at=world.now,
            main_exit_code=code,
            reporter_message=report(start, pod.completion_index, control),
        )
    failed = any(code != 0 for code, _ in outcomes.values())
    world.jobs[job] = replace(
        world.jobs[job], outcome="Failed" if failed else "Succeeded", finished_at=world.now
    )


def scored(*scores: int, tokens: int = 10) -> dict[int, tuple[int, dict[str, Any] | None]]:
    return {i: (0, {"score": s, "usage": {"inputTokens": tokens}}) for i, s in enumerate(scores)}


def promotion_of(job: str) -> str:
    return naming.promotion_job_name(job)


def test_an_iteration_is_one_indexed_job_whose_mains_work_on_their_own_copies() -> None:
    world = candidates_world(count=3)
    job = world.active()
    spec = world.manifests[job]["spec"]
    assert (spec["completions"], spec["parallelism"], spec["completionMode"]) == (3, 3, "Indexed")
    assert spec["backoffLimitPerIndex"] == 0 and "backoffLimit" not in spec
    pod = spec["template"]["spec"]
    reporter, main = pod["containers"]
    workspace = next(m for m in main["volumeMounts"] if m["name"] == "workspace")
    assert workspace["subPathExpr"] == ".agentrun/candidates/run_1_1/$(JOB_COMPLETION_INDEX)"
    assert workspace["mountPath"] == "/workspace"
    assert {"JOB_COMPLETION_INDEX", "AGENTRUN_CANDIDATE"} <= {e["name"] for e in main["env"]}
    args = reporter["args"]
    copy = "/workspace/.agentrun/candidates/run_1_1/$(JOB_COMPLETION_INDEX)"
    assert args[args.index("--path") + 1] == f"{copy}/.agentrun/loop-control.json"
    assert args[args.index("--candidate-dir") + 1] == copy
    assert args[args.index("--candidate-index") + 1] == "$(JOB_COMPLETION_INDEX)"
    assert args[args.index("--candidate-checkpoint") + 1] == "run_1_1c$(JOB_COMPLETION_INDEX)"
    assert "JOB_COMPLETION_INDEX" in {e["name"] for e in reporter["env"]}
    # every candidate on the node of the first (their copies share one claim)
    (term,) = pod["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term == {
        "labelSelector": {"matchLabels": {"batch.kubernetes.io/job-name": job}},
        "topologyKey": "kubernetes.io/hostname",
    }


def test_a_loop_without_candidates_keeps_its_one_pod_job() -> None:
    step = loop_step(max_iterations=2, loop={"checkpoint": {"mode": "Files"}})
    world = PlannerWorld(manifest([step]))
    world.plan()
    spec = world.manifests[world.active()]["spec"]
    assert spec["completions"] == 1 and spec["backoffLimit"] == 0 and "completionMode" not in spec


def test_the_highest_score_wins_is_promoted_and_decides_the_iteration() -> None:
    world = candidates_world(count=3)
    job = world.active()
    finish(world, job, scored(1, 7, 3))
    world.plan()
    step = world.step_status()
    record = step.loop.iterations[0]
    assert record.phase == "Running"  # not succeeded before the winner's files are the workspace
    assert record.candidates.model_dump(exclude_none=True) == {
        "count": 3,
        "succeeded": [0, 1, 2],
        "winner": 1,
        "checkpoint": "run_1_1c1",
        "promoted": False,
    }
    assert step.usage.input_tokens == 20  # the two losers' usage counts at once
    assert "CandidateSelected" in world.event_reasons()
    promotion = world.active()
    assert promotion == promotion_of(job) and step.job_ref.name == promotion
    container = world.manifests[promotion]["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["agentrun", "reporter", "promote"]
    args = container["args"]
    assert args[args.index("--checkpoint") + 1] == "run_1_1c1"
    assert args[args.index("--root") + 1] == "/workspace"
    assert args[args.index("--copies") + 1] == "/workspace/.agentrun/candidates/run_1_1"
    assert ".agentrun" in args  # the control directory (which holds the copies) is never restored
    world.succeed(promotion)
    world.plan()
    step = world.step_status()
    record = step.loop.iterations[0]
    assert record.phase == "Succeeded" and record.candidates.promoted is True
    assert step.loop.last_control == {"score": 7, "usage": {"inputTokens": 10}}
    assert step.usage.input_tokens == 30  # the winner's too, once
    following = world.active()
    assert world.jobs[following].iteration == 2
    assert world.manifests[following]["spec"]["completions"] == 3


def test_a_failed_candidate_only_loses_and_its_usage_counts() -> None:
    world = candidates_world(count=3)
    job = world.active()
    outcomes = scored(9, 2, 4)
    outcomes[0] = (1, {"score": 9, "usage": {"inputTokens": 10}})  # the best score, but main failed
    finish(world, job, outcomes)
    world.plan()
    record = world.step_status().loop.iterations[0]
    assert record.candidates.succeeded == [1, 2] and record.candidates.winner == 2
    world.succeed(world.active())
    world.plan()
    assert world.step_status().usage.input_tokens == 30


def test_a_candidate_whose_copy_was_not_recorded_loses() -> None:
    world = candidates_world(count=2)
    job = world.active()
    finish(world, job, scored(5, 1))
    pod = next(n for n, p in world.pods.items() if p.job_name == job and p.completion_index == 0)
    world.pods[pod] = replace(
        world.pods[pod], reporter_message=report("run_1_1", 0, {"score": 5}, recorded=False)
    )
    world.plan()
    assert world.step_status().loop.iterations[0].candidates.winner == 1


def test_no_candidate_succeeded_fails_the_attempt_and_the_retry_runs_them_all_again() -> None:
    world = candidates_world(count=2, retries=1)
    job = world.active()
    finish(world, job, {0: (1, {"usage": {"inputTokens": 4}}), 1: (2, None)})
    world.plan()
    step = world.step_status()
    assert step.attempt == 2 and step.last_failure.reason == "NoCandidateSucceeded"  # no backoff
    assert "candidate 0: main exited with code 1" in step.last_failure.message
    assert "candidate 1: main exited with code 2" in step.last_failure.message
    assert step.usage.input_tokens == 4
    retry = world.active()
    assert retry != job and world.manifests[retry]["spec"]["completions"] == 2
    assert world.step_status().loop.iterations[0].candidates is None
    finish(world, retry, scored(1, 2))
    world.plan()
    world.succeed(world.active())
    world.plan()
    assert world.step_status().loop.iterations[0].phase == "Succeeded"


@pytest.mark.parametrize(
    ("select", "why"),
    [
        ("candidates[0].control.missing", "select:"),
        ("7", "gave 7, not the index of a succeeded candidate [0, 1]"),
        ("'one'", "gave 'one'"),
        ("true", "gave True"),
    ],
)
def test_a_select_that_gives_no_succeeded_candidate_fails_the_attempt(select: str, why: str) -> None:
    world = candidates_world(count=2, select=select, retries=0)
    finish(world, world.active(), scored(1, 2))
    world.plan()
    step = world.step_status()
    assert world.phase == "Failed" and step.reason == "LoopIterationFailed"
    assert step.last_failure.reason == "CandidateSelectFailed" and why in step.last_failure.message
    assert step.usage.input_tokens == 20  # nothing was promoted, everything counted
    assert world.live_jobs() == []


def test_a_failed_promotion_fails_the_attempt_with_its_reason() -> None:
    world = candidates_world(count=2, retries=1)
    job = world.active()
    finish(world, job, scored(1, 2))
    world.plan()
    promotion = world.active()
    world.fail(promotion, message="checkpoint: cannot promote candidate checkpoint 'run_1_1c1': gone")
    world.plan()
    step = world.step_status()
    assert step.attempt == 2 and step.last_failure.reason == "CandidatePromotionFailed"
    assert "cannot promote" in step.last_failure.message
    assert step.usage.input_tokens == 20  # the winner's usage counted once, at the failure
    assert world.jobs[world.active()].attempt == 2


def test_the_pick_is_the_same_after_a_lost_status_write_and_the_promotion_is_adopted() -> None:
    world = candidates_world(count=3)
    job = world.active()
    finish(world, job, scored(3, 1, 8))
    world.plan(persist=False)  # the operator died before its status write: the Job was created
    created = list(world.created)
    world.plan()
    assert world.created == created  # the same deterministic name: adopted, not created twice
    assert world.step_status().loop.iterations[0].candidates.winner == 2
    assert world.step_status().usage.input_tokens == 20


def test_one_reported_candidate_does_not_decide_the_iteration() -> None:
    world = candidates_world(count=2)
    job = world.active()
    pod = next(n for n, p in world.pods.items() if p.job_name == job and p.completion_index == 0)
    world.pods[pod] = replace(
        world.pods[pod],
        containers_ended=True,
        main_exit_code=0,
        finished_at=world.now,
        reporter_message=report("run_1_1", 0, {"score": 1}),
    )
    # The informer has not seen the other candidate's pod yet: the one it has must not decide.
    other = next(n for n, p in world.pods.items() if p.job_name == job and p.completion_index == 1)
    del world.pods[other]
    world.plan()
    assert world.active() == job and world.step_status().loop.iterations[0].candidates is None


def test_an_immediate_cancel_during_the_promotion_deletes_it() -> None:
    world = candidates_world(count=2)
    finish(world, world.active(), scored(1, 2))
    world.plan()
    promotion = world.active()
    world.spec_manifest["spec"]["cancel"] = "Immediate"
    world.plan()
    assert promotion in world.deleted
    assert world.step_status().phase == "Cancelled"


def test_the_winners_control_file_decides_the_loop() -> None:
    world = candidates_world(count=2, max_iterations=5)
    spec = world.spec_manifest["spec"]["workflow"]["steps"][0]["loop"]
    spec["condition"] = {
        "type": "cel",
        "until": "iteration.last.control.done",
        "source": {"onMissing": "stop"},
    }
    world.status = None
    world.plan()
    finish(world, world.active(), {0: (0, {"score": 1, "done": False}), 1: (0, {"score": 2, "done": True})})
    world.plan()
    world.succeed(world.active())
    world.plan()
    step = world.step_status()
    assert step.phase == "Succeeded" and step.loop.stop_reason == "LoopConditionFalse"


def _problems(step: dict[str, Any], volumes: list[dict[str, Any]] | None = None) -> list[str]:
    world = PlannerWorld(manifest([step], volumes=volumes))
    return [f"{p.path}: {p.message}; fix: {p.fix}" for p in validate_static(world.agentrun(), world.config)]


def test_validation_refuses_a_select_that_does_not_compile_and_a_shared_control_file() -> None:
    broken = loop_step(
        loop={"checkpoint": {"mode": "Files"}, "candidates": {"count": 2, "select": "candidates["}}
    )
    assert any(
        ".loop.candidates.select" in p and "and candidates (each {index, control})" in p
        for p in _problems(broken)
    )
    fine = loop_step(loop={"checkpoint": {"mode": "Files"}, "candidates": {"count": 2, "select": HIGHEST}})
    assert _problems(fine) == []
    volumes = [
        {"name": "workspace", "type": "pvc", "claimName": "ws", "mountPath": "/workspace"},
        {"name": "shared", "type": "pvc", "claimName": "sh", "mountPath": "/shared"},
    ]
    shared = loop_step(
        until="iteration.last.control.done",
        loop={
            "checkpoint": {"mode": "Files"},
            "candidates": {"count": 2, "select": HIGHEST},
            "state": {"volumeNames": ["workspace"]},
        },
    )
    shared["loop"]["condition"]["source"]["path"] = "/shared/control.json"
    problems = _problems(shared, volumes)
    assert any(
        p.startswith("spec.workflow.steps[0].loop.candidates:") and "'shared'" in p for p in problems
    ), problems


def test_a_timed_out_iteration_counts_the_usage_of_every_candidate_that_reported() -> None:
    world = candidates_world(count=3, retries=0)
    job = world.active()
    pods = sorted((n for n, p in world.pods.items() if p.job_name == job), key=lambda n: n)
    for index, name in enumerate(pods[:2]):  # two reported before the deadline, one never did
        world.pods[name] = replace(
            world.pods[name],
            phase="Succeeded",
            main_exit_code=0,
            finished_at=world.now,
            reporter_message=report("run_1_1", index, {"score": 1, "usage": {"inputTokens": 10}}),
        )
    world.deadline(job)
    world.plan()
    step = world.step_status()
    assert world.phase == "Failed" and "timed out" in (step.message or "")
    assert step.usage.input_tokens == 20


def test_validation_refuses_candidates_below_the_top_level() -> None:
    child = loop_step(
        "inner", loop={"checkpoint": {"mode": "Files"}, "candidates": {"count": 2, "select": HIGHEST}}
    )
    body = {"name": "outer", "loop": {"maxIterations": 2}, "steps": [child]}
    problems = _problems(body)
    assert any(
        p.startswith("spec.workflow.steps[0].steps[0].loop.candidates:") and "top-level" in p
        for p in problems
    ), problems
