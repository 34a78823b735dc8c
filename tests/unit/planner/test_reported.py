"""What a pod reports besides its control file lands in status: each iteration's new commit
(iterations[].commit, status.vcs.commit) and its output artifacts (status.artifacts)."""

from __future__ import annotations

from agentrun_operator.control.envelope import ControlEnvelope, encode_envelope
from agentrun_operator.planner.actions import CreateJob
from tests.unit.planner.world import PlannerWorld, loop_step, manifest

FORGE = {
    "provider": "generic",
    "cloneBaseUrl": "/srv/git",
    "auth": {"method": "none"},
    "defaults": {"baseBranch": "main"},
}
PATH = "/workspace/.agentrun/loop-control.json"


def envelope(commit: str | None = None, artifacts: list[dict[str, object]] | None = None) -> str:
    env = ControlEnvelope(status="missing", path=PATH, reason="no file", commit=commit, artifacts=artifacts)
    return encode_envelope(env)


def world() -> PlannerWorld:
    run = manifest(
        [loop_step(max_iterations=3)],
        vcsRef={"name": "forge"},
        parameters={"repository": "demo/app.git", "head": "agentrun/x"},
    )
    w = PlannerWorld(run, vcs_providers={"forge": FORGE})
    w.plan()
    return w


def test_each_new_commit_is_recorded_on_its_iteration_and_in_status_vcs() -> None:
    w = world()
    status = w.status
    assert status is not None and status.vcs is not None
    assert (status.vcs.provider, status.vcs.repository, status.vcs.head_branch, status.vcs.mode) == (
        "forge",
        "demo/app.git",
        "agentrun/x",
        "read-write",
    )
    job = w.plans[-1].actions
    create = next(a for a in job if isinstance(a, CreateJob))
    env = {
        e["name"]: e.get("value")
        for e in create.manifest["spec"]["template"]["spec"]["containers"][-1]["env"]
    }
    assert env["VCS_CLONE_URL"] == "/srv/git/demo/app.git"
    w.succeed(message=envelope("a" * 40))
    w.plan()
    w.succeed(message=envelope(None))  # iteration 2 committed nothing
    w.plan()
    w.succeed(message=envelope("b" * 40))
    w.plan()
    loop = w.step_status().loop
    assert [r.commit for r in loop.iterations] == ["a" * 40, None, "b" * 40]
    assert w.status is not None and w.status.vcs is not None and w.status.vcs.commit == "b" * 40


def test_artifacts_keep_the_newest_per_step_and_name() -> None:
    w = world()
    fact = {"name": "report", "path": "/workspace/out/report.md", "size": 5, "digest": "sha256:" + "0" * 64}
    w.succeed(message=envelope(artifacts=[fact]))
    w.plan()
    w.succeed(
        message=envelope(
            artifacts=[{**fact, "size": 7}, {"name": "gone", "path": "/workspace/x", "missing": True}]
        )
    )
    w.plan()
    assert w.status is not None
    artifacts = [(a.name, a.size, a.iteration, a.step) for a in w.status.artifacts or []]
    assert artifacts == [("report", 7, 2, "a"), ("gone", None, 2, "a")]
