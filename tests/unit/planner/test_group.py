"""Groups and loop bodies (planner/group.py, planner/walk.py), driven through the real planner."""

from __future__ import annotations

import json
from typing import Any

import pytest

from agentrun_operator.planner.actions import CreateJob
from agentrun_operator.planner.facts import IterationFinished, StepEnded
from tests.unit.planner.world import PlannerWorld, manifest

PATH = "/workspace/.agentrun/review.json"


def body(max_iterations: int = 3, until: str | None = None, **extra: Any) -> dict[str, Any]:
    """implement -> test -> review, repeated until review approves (or a fixed count)."""
    loop: dict[str, Any] = {"maxIterations": max_iterations, **extra.pop("loop", {})}
    if until is not None:
        loop["condition"] = {"type": "cel", "until": until, "source": {"path": PATH}}
    children = extra.pop("children", [{"name": "implement"}, {"name": "test"}, {"name": "review"}])
    return {"name": "dev", "loop": loop, "steps": children, **extra}


def env(world: PlannerWorld, job: str) -> dict[str, str]:
    containers = world.manifests[job]["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in containers[-1]["env"] if "value" in e}


def creates(world: PlannerWorld) -> list[str]:
    return [a.name for a in world.plans[-1].actions if isinstance(a, CreateJob)]


def approve_on(iteration: int) -> Any:
    """Every child succeeds; review approves in `iteration`."""

    def outcome(world: PlannerWorld, job: str) -> None:
        index = int(job.split("-step-2i")[1].split("-")[0]) if "-step-2i" in job else 0
        review = "-step-2i" in job and job.split("-")[3] == "3"
        world.succeed(job, control={"approved": review and index == iteration, "from": job})

    return outcome


def test_a_body_repeats_its_children_in_order_until_the_condition_stops_it() -> None:
    world = PlannerWorld(manifest([{"name": "prep"}, body(5, "iteration.steps.review.control.approved")]))
    world.drive(approve_on(2))
    assert world.phase == "Succeeded"
    assert world.created == [
        "run-step-1-iter-1-attempt-1",
        *[f"run-step-2i{k}-{c}-iter-1-attempt-1" for k in (1, 2) for c in (1, 2, 3)],
    ]
    dev = world.step_status(1)
    assert dev.phase == "Succeeded" and dev.reason == "LoopConditionFalse"
    assert dev.loop.completed_iterations == 2 and dev.loop.stop_reason == "LoopConditionFalse"
    assert [r.steps for r in dev.loop.iterations] == [
        {"implement": "Succeeded", "test": "Succeeded", "review": "Succeeded"}
    ] * 2
    assert [c.name for c in dev.steps] == ["implement", "test", "review"]
    assert dev.steps[2].job_ref.name == "run-step-2i2-3-iter-1-attempt-1"


def test_the_condition_reads_the_last_child_that_ran_as_iteration_last_control() -> None:
    children = [{"name": "implement"}, {"name": "review"}, {"name": "notify", "when": "false"}]
    spec = body(4, "iteration.last.control.approved == true", children=children)
    world = PlannerWorld(manifest([{"name": "prep"}, spec]))

    def outcome(w: PlannerWorld, job: str) -> None:
        review_in_2 = job.startswith("run-step-2i2-2-")
        w.succeed(job, control={"approved": review_in_2})

    world.drive(outcome)
    dev = world.step_status(1)
    assert world.phase == "Succeeded" and dev.loop.completed_iterations == 2
    assert dev.loop.last_control == {"approved": True}  # notify was skipped: review ran last
    assert dev.loop.iterations[-1].steps == {
        "implement": "Succeeded",
        "review": "Succeeded",
        "notify": "Skipped",
    }


def test_every_child_pod_reports_the_body_loops_path_and_sees_its_iteration() -> None:
    world = PlannerWorld(manifest([{"name": "prep"}, body(3, "iteration.steps.review.control.approved")]))
    world.drive(approve_on(2))
    child = env(world, "run-step-2i2-1-iter-1-attempt-1")
    assert child["AGENTRUN_LOOP_CONTROL_PATH"] == PATH
    assert child["AGENTRUN_ITERATION"] == "2" and child["AGENTRUN_MAX_ITERATIONS"] == "3"
    assert child["AGENTRUN_STEP"] == "implement"
    assert '"approved":false' in child["AGENTRUN_PREVIOUS_CONTROL"].replace(" ", "")
    labels = world.manifests["run-step-2i2-1-iter-1-attempt-1"]["metadata"]["labels"]
    assert labels["agents.proompteng.ai/step-path"] == "2i2-1"
    assert labels["agents.proompteng.ai/step-index"] == "2"
    assert (
        "agents.proompteng.ai/step-path"
        not in world.manifests["run-step-1-iter-1-attempt-1"]["metadata"]["labels"]
    )


def test_a_failed_child_fails_the_iteration_and_skips_the_rest_unless_always_run() -> None:
    children = [
        {"name": "implement"},
        {"name": "test"},
        {"name": "review"},
        {"name": "report", "alwaysRun": True},
    ]
    spec = body(3, "iteration.steps.review.control.approved", children=children)
    spec["loop"]["output"] = {"name": "notes", "expression": "iteration.index"}
    world = PlannerWorld(manifest([{"name": "prep"}, spec, {"name": "after"}]))

    def outcome(w: PlannerWorld, job: str) -> None:
        if job.startswith("run-step-2i2-2-"):
            w.fail(job)
        else:
            w.succeed(job, control={"approved": False})

    world.drive(outcome)
    dev = world.step_status(1)
    assert world.phase == "Failed" and world.status is not None
    assert world.status.reason == "LoopIterationFailed"
    assert dev.loop.stop_reason == "LoopIterationFailed" and dev.loop.completed_iterations == 1
    assert dev.loop.iterations[-1].phase == "Failed"
    assert dev.loop.iterations[-1].steps == {
        "implement": "Succeeded",
        "test": "Failed",
        "review": "Skipped",
        "report": "Succeeded",
    }
    assert dev.steps[2].reason == "PreviousStepFailed" and "alwaysRun" in (dev.steps[2].message or "")
    assert "iteration 2: step test failed" in (dev.message or "")
    assert world.status.workflow is not None and world.status.workflow.outputs == {"notes": [1]}
    assert world.step_status(2).phase == "Pending"
    assert "run-step-2i2-4-iter-1-attempt-1" in world.created


def test_a_group_without_a_loop_runs_its_children_once_and_hands_on_the_last_control() -> None:
    group = {"name": "g", "steps": [{"name": "a"}, {"name": "b"}]}
    world = PlannerWorld(manifest([group, {"name": "c", "when": "steps.g.control.n == 2"}]))
    world.drive(lambda w, job: w.succeed(job, control={"n": len(w.created)}))
    assert world.phase == "Succeeded"
    assert world.created == [
        "run-step-1i1-1-iter-1-attempt-1",
        "run-step-1i1-2-iter-1-attempt-1",
        "run-step-2-iter-1-attempt-1",
    ]
    assert world.step_status(0).control == {"n": 2}
    assert world.step_status(0).message == "all 2 steps finished"


def test_a_child_reads_its_earlier_siblings_and_the_steps_before_its_group() -> None:
    group = {
        "name": "g",
        "steps": [
            {"name": "a"},
            {"name": "b", "when": "steps.a.control.go && steps.prep.phase == 'Succeeded'"},
        ],
    }
    world = PlannerWorld(manifest([{"name": "prep"}, group]))
    world.drive(lambda w, job: w.succeed(job, control={"go": False}))
    assert world.phase == "Succeeded"
    assert world.step_status(1).steps[1].phase == "Skipped"


def test_a_restart_mid_body_resumes_without_running_a_child_twice() -> None:
    world = PlannerWorld(manifest([body(3)]))
    world.plan()
    world.succeed()
    world.plan()
    assert world.live_jobs() == ["run-step-1i1-2-iter-1-attempt-1"]
    assert world.status is not None
    assert (world.status.current_step, world.status.iteration) == ("dev/test", "1/3")
    world.succeed()
    world.plan(persist=False)  # the status saying test succeeded and review started is lost
    assert world.live_jobs() == ["run-step-1i1-3-iter-1-attempt-1"]
    world.plan()  # a restarted operator: adopts review's Job
    assert creates(world) == []
    world.plan()
    world.drive(lambda w, job: w.succeed(job, control={}))
    assert world.phase == "Succeeded"
    assert len(world.created) == len(set(world.created)) == 9
    assert world.step_status().loop.completed_iterations == 3


@pytest.mark.parametrize("mode", ["Graceful", "Immediate"])
def test_cancel_mid_body_starts_no_further_child(mode: str) -> None:
    world = PlannerWorld(manifest([body(3)]))
    world.plan()
    world.succeed()
    world.plan()
    world.spec_manifest["spec"]["cancel"] = mode
    world.plan()
    if mode == "Graceful":
        world.succeed()
        world.plan()
    assert world.phase == "Cancelled"
    dev = world.step_status()
    assert dev.phase == "Cancelled" and dev.loop.stop_reason == "LoopCancelled"
    record = dev.loop.iterations[-1]
    assert record.phase == "Cancelled"
    assert dev.steps[2].phase == "Pending"
    assert len(world.created) == 2
    if mode == "Graceful":  # the pass stopped between children: the record says how far it got
        assert record.steps == {
            dev.steps[0].name: "Succeeded",
            dev.steps[1].name: "Succeeded",
            dev.steps[2].name: "Pending",
        }
        assert dev.message == (
            "cancelled (Graceful) during iteration 1 after 2 of 3 steps; "
            "no further step, iteration or attempt was started"
        )


def test_a_nested_loop_restarts_in_every_iteration_of_its_body() -> None:
    inner = {"name": "refine", "loop": {"maxIterations": 2}}
    spec = {"name": "modules", "loop": {"maxIterations": 2}, "steps": [{"name": "plan"}, inner]}
    world = PlannerWorld(manifest([spec]))
    world.drive(lambda w, job: w.succeed(job, control={}))
    assert world.phase == "Succeeded"
    assert world.created == [
        "run-step-1i1-1-iter-1-attempt-1",
        "run-step-1i1-2-iter-1-attempt-1",
        "run-step-1i1-2-iter-2-attempt-1",
        "run-step-1i2-1-iter-1-attempt-1",
        "run-step-1i2-2-iter-1-attempt-1",
        "run-step-1i2-2-iter-2-attempt-1",
    ]
    assert world.step_status().steps[1].loop.completed_iterations == 2


def test_the_step_ended_facts_name_path_kind_and_depth() -> None:
    world = PlannerWorld(manifest([body(1)]))
    world.drive(lambda w, job: w.succeed(job, control={}))
    ended = [f for p in world.plans for f in p.facts if isinstance(f, StepEnded)]
    assert [(f.path, f.label, f.kind, f.depth) for f in ended] == [
        ("dev/implement", "dev/iteration 1/implement", "workload", 2),
        ("dev/test", "dev/iteration 1/test", "workload", 2),
        ("dev/review", "dev/iteration 1/review", "workload", 2),
        ("dev", "dev", "group", 1),
    ]
    iterations = [f for p in world.plans for f in p.facts if isinstance(f, IterationFinished)]
    assert IterationFinished("dev", 1, 1, "Succeeded") in iterations
    assert IterationFinished("dev/review", 1, 1, "Succeeded") in iterations


def test_replanning_a_body_without_change_is_quiet() -> None:
    world = PlannerWorld(manifest([body(3)]))
    world.plan()
    world.succeed()
    world.plan()
    world.plan()  # records the new Job's uid
    again = world.plan()
    assert again.status == world.plans[-2].status
    assert not [a for a in again.actions if isinstance(a, CreateJob)]
    assert not again.facts


def test_a_for_each_body_gives_every_child_the_item() -> None:
    spec = {
        "name": "modules",
        "loop": {"maxIterations": 5, "items": "['api', 'ui']"},
        "steps": [{"name": "plan"}, {"name": "refine", "loop": {"maxIterations": 2}}],
    }
    world = PlannerWorld(manifest([spec]))
    world.drive(lambda w, job: w.succeed(job, control={}))
    assert world.phase == "Succeeded"
    items = [(job, env(world, job)["AGENTRUN_ITEM"]) for job in world.created]
    assert items == [
        ("run-step-1i1-1-iter-1-attempt-1", '"api"'),
        ("run-step-1i1-2-iter-1-attempt-1", '"api"'),
        ("run-step-1i1-2-iter-2-attempt-1", '"api"'),
        ("run-step-1i2-1-iter-1-attempt-1", '"ui"'),
        ("run-step-1i2-2-iter-1-attempt-1", '"ui"'),
        ("run-step-1i2-2-iter-2-attempt-1", '"ui"'),
    ]  # for each module, refine until done: the inner loop works on the body's item
    refine = env(world, "run-step-1i2-2-iter-2-attempt-1")
    assert refine["AGENTRUN_ITERATION"] == "2" and refine["AGENTRUN_ITEM_INDEX"] == "1"


def test_a_budget_on_a_body_counts_the_usage_of_its_children() -> None:
    spec = body(10, loop={"budget": {"maxTokens": 250}})
    world = PlannerWorld(manifest([spec]))
    world.drive(lambda w, job: w.succeed(job, control={"usage": {"inputTokens": 40}}))
    dev = world.step_status()
    assert world.phase == "Failed" and dev.reason == "LoopBudgetExhausted"
    assert dev.loop.completed_iterations == 3  # 120, 240, 360 tokens: the third pass reached it
    assert dev.usage is not None and dev.usage.tokens == 360
    assert dev.loop.iterations[0].usage is not None and dev.loop.iterations[0].usage.tokens == 120
    assert world.status is not None and world.status.workflow is not None
    assert world.status.workflow.usage is not None and world.status.workflow.usage.tokens == 360


def test_implementation_specs_of_nested_steps_are_looked_up_and_used() -> None:
    from agentrun_operator.api import parse_agentrun
    from agentrun_operator.resolution import implementation_spec_refs

    switch = {
        "expression": "'x'",
        "cases": [{"value": "x", "steps": [{"name": "c", "implementationSpecRef": {"name": "task-c"}}]}],
    }
    group = {
        "name": "g",
        "steps": [
            {"name": "a", "implementationSpecRef": {"name": "task-a"}},
            {"name": "s", "switch": switch},
        ],
    }
    spec = manifest([group])
    assert list(implementation_spec_refs(parse_agentrun(spec))) == [
        ("spec.workflow.steps[0].steps[0].implementationSpecRef.name", "task-a"),
        ("spec.workflow.steps[0].steps[1].switch.cases[0].steps[0].implementationSpecRef.name", "task-c"),
    ]
    world = PlannerWorld(spec)
    world.implementation_specs = {"task-a": {"text": "do A"}, "task-c": {"text": "do C"}}
    world.drive(lambda w, job: w.succeed(job, control={}))
    assert world.phase == "Succeeded"
    texts = [env(world, job)["AGENTRUN_IMPLEMENTATION_TEXT"] for job in world.created]
    assert texts == ["do A", "do C"]


def test_children_see_the_parameters_of_the_groups_holding_them() -> None:
    inner = {
        "name": "inner",
        "parameters": {"level": "inner"},
        "steps": [{"name": "leaf", "parameters": {"own": "1"}}],
    }
    outer = {"name": "outer", "parameters": {"level": "outer", "team": "core"}, "steps": [inner]}
    check = {"name": "check", "when": "run.parameters.team == 'core'"}
    outer["steps"].append(check)
    world = PlannerWorld(manifest([outer], parameters={"team": "all", "run": "yes"}))
    world.drive(lambda w, job: w.succeed(job, control={}))
    assert world.phase == "Succeeded"
    leaf = env(world, "run-step-1i1-1i1-1-iter-1-attempt-1")
    assert json.loads(leaf["AGENTRUN_PARAMETERS"]) == {
        "team": "core",
        "run": "yes",
        "level": "inner",
        "own": "1",
    }
    assert world.step_status().steps[1].phase == "Succeeded"  # its `when` saw team=core
