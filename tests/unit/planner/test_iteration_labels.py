"""A loop body's children are found by the body's iteration: `-l agents.proompteng.ai/iteration=3`
selects body iteration 3's Jobs and pods, while the planner still reads each child's own iteration
(`step-iteration`) and its Job names stay what they were (docs/migration.md#iteration-labels)."""

from __future__ import annotations

from agentrun_operator import naming
from agentrun_operator.shell.observe import job_from_k8s
from tests.unit.planner.world import PlannerWorld, manifest


def test_a_body_childs_jobs_carry_the_bodys_iteration_and_keep_their_names() -> None:
    body = {"name": "dev", "loop": {"maxIterations": 3}, "steps": [{"name": "implement"}, {"name": "review"}]}
    world = PlannerWorld(manifest([body]))
    world.drive(lambda w, job: w.succeed(job, control={}))
    assert world.phase == "Succeeded"
    seen = []
    for name, job in world.manifests.items():
        labels = job["metadata"]["labels"]
        pod_labels = job["spec"]["template"]["metadata"]["labels"]
        assert pod_labels == labels
        seen.append((name, labels[naming.LABEL_ITERATION], labels[naming.LABEL_STEP_ITERATION]))
        observed = job_from_k8s(job)
        assert observed is not None and observed.iteration == 1  # the child's own iteration
    assert sorted(seen) == sorted(
        (f"run-step-1i{k}-{c}-iter-1-attempt-1", str(k), "1") for k in (1, 2, 3) for c in (1, 2)
    )


def test_a_top_level_loops_jobs_are_labelled_as_before() -> None:
    world = PlannerWorld(manifest([{"name": "a", "loop": {"maxIterations": 2}}]))
    world.drive(lambda w, job: w.succeed(job, control={}))
    for job in world.manifests.values():
        labels = job["metadata"]["labels"]
        assert naming.LABEL_STEP_ITERATION not in labels
        assert job["metadata"]["name"].endswith(f"-iter-{labels[naming.LABEL_ITERATION]}-attempt-1")
    main = next(c for c in job["spec"]["template"]["spec"]["containers"] if c["name"] == "main")
    assert main["terminationMessagePolicy"] == "FallbackToLogsOnError"
